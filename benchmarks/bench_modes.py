"""Benchmark of task modes, exec modes and import hoisting (issue 4), same run, same cores.

    python benchmarks/bench_modes.py [--tasks 1000] [--workers 2] [--repeat 1]
                                     [--closure-mb 10] [--closure-tasks 1000]
                                     [--json modes.json] [--quick | --smoke]

For each workload (``trivial``: return the argument; ``numpy``: import numpy inside the
task and use it) and each way of running a task (``tasks``, ``function-calls/direct``,
``function-calls/fork``), with and without ``import_modules=["numpy", "pandas"]``, runs
``--tasks`` independent tasks on ``--workers`` fresh one-core workers (started for that
row only, so nothing one row imported helps the next) and reports:

- µs/task: wall time of the ``get`` divided by the tasks (the median of ``--repeat``);
- x tasks: how many times faster than ``tasks`` mode, same workload, same hoisting;
- import µs: the mean time a task spent in its own ``import numpy`` (numpy workload):
  what hoisting removes from every invocation when tasks run in forked children or
  fresh interpreters (a library in direct mode pays it once, on its first task).

Then the bytes on the wire for ``--closure-tasks`` tasks whose function closes over a
``--closure-mb`` MB numpy array: the closure travels once per worker, not once per task
(``Manager.sent_bytes``), and not at all on a second run.

Every result is checked against Dask's synchronous scheduler; a wrong one exits non-zero.
``--quick`` runs a tiny size; its numbers are noise. ``--smoke`` (a test that it still runs):
every row and the closure, 2 tasks each on one worker shared by every row, a 1 MB closure.
Targets: ``function-calls/direct`` at least 50x faster per task than ``tasks`` on trivial
tasks; hoisting takes the import out of every forked invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import dask
import numpy as np

from daskvine_py import Manager

MODES = [("tasks", "direct"), ("function-calls", "direct"), ("function-calls", "fork")]
HOISTED = ["numpy", "pandas"]


def trivial(i: int) -> int:
    return i


def use_numpy(i: int) -> tuple[float, float]:
    """``sqrt(i)`` with numpy, and the seconds the task spent importing it."""
    start = time.perf_counter()
    import numpy

    spent = time.perf_counter() - start
    return float(numpy.sqrt(numpy.float64(i))), spent


WORKLOADS = {"trivial": trivial, "numpy": use_numpy}


def mode_name(task_mode: str, exec_mode: str) -> str:
    return "tasks" if task_mode == "tasks" else f"function-calls/{exec_mode}"


def graph(func: Any, n: int) -> tuple[dict, list]:
    dsk = {(func.__name__, i): (func, i) for i in range(n)}
    return dsk, list(dsk)


def warm(i: int) -> int:
    return i


def warm_up(manager: Manager, workers: int) -> None:
    """Wait until every library process is up: worker start-up is not per-task cost.

    A trivial task of its own, in the default mode, so it imports nothing a row measures.
    """
    dsk, keys = graph(warm, 8 * workers)
    manager.get(dsk, keys)


@contextlib.contextmanager
def workers(args: argparse.Namespace, shared: Manager | None) -> Iterator[Manager]:
    """``shared`` if given (``--smoke``), else a fresh manager with fresh, warm workers."""
    if shared is not None:
        yield shared
        return
    with Manager() as manager:
        manager.start_workers(args.workers, cores=1)
        warm_up(manager, args.workers)
        yield manager


def run_row(
    args: argparse.Namespace,
    workload: str,
    mode: tuple[str, str],
    hoist: bool,
    shared: Manager | None = None,
) -> dict:
    func = WORKLOADS[workload]
    dsk, keys = graph(func, args.tasks)
    want = dask.get(dsk, keys)
    options: dict[str, Any] = {"task_mode": mode[0], "exec_mode": mode[1]}
    if hoist:
        options["import_modules"] = HOISTED
    seconds, imports = [], []
    with workers(args, shared) as manager:
        for _ in range(args.repeat):
            start = time.perf_counter()
            got = manager.get(dsk, keys, **options)
            seconds.append(time.perf_counter() - start)
            if workload == "numpy":
                values, wanted = [v for v, _ in got], [v for v, _ in want]
                imports.append(statistics.mean(t for _, t in got))
            else:
                values, wanted = list(got), list(want)
            if values != wanted:
                raise AssertionError(f"{workload} in {mode_name(*mode)}: wrong result")
    wall = statistics.median(seconds)
    return {
        "workload": workload,
        "mode": mode_name(*mode),
        "import_modules": HOISTED if hoist else [],
        "tasks": args.tasks,
        "seconds": seconds,
        "us_per_task": wall / args.tasks * 1e6,
        "import_us_per_task": statistics.median(imports) * 1e6 if imports else None,
    }


def closure_bytes(args: argparse.Namespace, shared: Manager | None = None) -> dict:
    """Bytes the manager sends for tasks whose function closes over a large array."""
    array = np.arange(args.closure_mb * 2**20 // 8, dtype=np.float64)

    def scaled(i: int) -> float:
        return float(array[i % array.size] * 2)

    dsk, keys = graph(scaled, args.closure_tasks)
    want = dask.get(dsk, keys)
    with workers(args, shared) as manager:
        runs = []
        for _ in range(2):
            before = manager.sent_bytes
            got = manager.get(dsk, keys)
            if list(got) != list(want):
                raise AssertionError("tasks closing over an array: wrong result")
            runs.append(manager.sent_bytes - before)
    return {
        "closure_bytes": array.nbytes,
        "tasks": args.closure_tasks,
        "workers": args.workers,
        "first_run_bytes": runs[0],
        "first_run_bytes_per_task": runs[0] / args.closure_tasks,
        "closure_sends_first_run": round(runs[0] / array.nbytes, 2),
        "second_run_bytes_per_task": runs[1] / args.closure_tasks,
        "if_sent_per_task_bytes": array.nbytes * args.closure_tasks,
    }


def print_table(rows: list[dict]) -> None:
    base = {
        (r["workload"], bool(r["import_modules"])): r["us_per_task"]
        for r in rows
        if r["mode"] == "tasks"
    }
    print(
        f"{'workload':9} {'mode':24} {'hoisted':14} {'µs/task':>10} {'x tasks':>8} "
        f"{'import µs':>10}"
    )
    for r in rows:
        ratio = base.get((r["workload"], bool(r["import_modules"])))
        ratio_text = f"{ratio / r['us_per_task']:.1f}" if ratio else "-"
        imp = r["import_us_per_task"]
        print(
            f"{r['workload']:9} {r['mode']:24} {','.join(r['import_modules']) or '-':14} "
            f"{r['us_per_task']:10.1f} {ratio_text:>8} {'-' if imp is None else f'{imp:.1f}':>10}"
        )


def machine() -> dict[str, Any]:
    versions = {}
    for package in ("dask", "numpy", "pandas", "cloudpickle", "pyzmq", "daskvine-py"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": __import__("os").cpu_count(),
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--closure-mb", type=int, default=10)
    parser.add_argument("--closure-tasks", type=int, default=1000)
    parser.add_argument("--json", default=None, help="write every run here")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes, numbers are noise")
    sizes.add_argument("--smoke", action="store_true", help="tiny, one worker: still runs?")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.closure_tasks, args.closure_mb = 20, 20, 1
    if args.smoke:
        args.tasks, args.closure_tasks, args.closure_mb = 2, 2, 1
        args.workers, args.repeat = 1, 1
    with contextlib.ExitStack() as stack:
        shared = None
        if args.smoke:  # one manager for every row: fresh workers per row cost seconds each
            shared = stack.enter_context(Manager())
            shared.start_workers(args.workers, cores=1)
            warm_up(shared, args.workers)
        return measure_all(args, shared)


def measure_all(args: argparse.Namespace, shared: Manager | None) -> int:
    rows = []
    for workload in WORKLOADS:
        for hoist in (False, True):
            for mode in MODES:
                print(f"... {workload} {mode_name(*mode)} hoisted={hoist}", file=sys.stderr)
                rows.append(run_row(args, workload, mode, hoist, shared))
    print_table(rows)
    closure = closure_bytes(args, shared)
    print(
        f"\nclosure over {closure['closure_bytes'] / 2**20:.0f} MB, {closure['tasks']} tasks, "
        f"{closure['workers']} workers: first run {closure['first_run_bytes_per_task']:.0f} "
        f"bytes/task sent ({closure['closure_sends_first_run']} closure copies in all), "
        f"second run {closure['second_run_bytes_per_task']:.0f} bytes/task; sent with every "
        f"task it would be {closure['if_sent_per_task_bytes'] / 2**30:.1f} GiB"
    )
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine(), "rows": rows, "closure": closure}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
