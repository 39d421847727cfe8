"""A million-leaf tree reduction through ``get`` (issue 28, goal "million").

    python benchmarks/bench_million.py [--tasks 1000000] [--systems daskvine_py,sync,distributed]
                                       [--peer-tasks 100000] [--workers 2] [--smoke]

The graph is a raw dict of legacy tasks, as a user would build it by hand: ``--tasks`` leaves
``("leaf", i): (leaf, i)`` and a tree over them of ``FAN_IN`` inputs per task (Dask's
``split_every`` for bags and dataframes), ``("sum", level, j): (add, child, ...)``, up to one
root. 10^6 leaves make 1,142,860 tasks. Every system runs in a fresh child process of its
own (this script with ``--child``), so that its memory figures are its own, and each result
is checked against the closed form (``sum(range(leaves))``). Per system:

- ``seconds``: from calling ``get`` until it returned (graph conversion included);
- ``first_dispatch_s`` (daskvine_py): from calling ``get`` until the manager sent the first
  task to a worker (``systems.FirstDispatch``, which costs nothing per task);
- ``cpu_s``: the CPU time of the process that called ``get`` meanwhile (all its threads:
  the manager's caller and I/O threads, a local scheduler, distributed's scheduler), which
  others' load on the machine changes less than the wall time; for daskvine_py also
  ``worker_cpu_s`` and ``library_cpu_s``, that of its local workers' main processes and
  of their libraries (printed per task below the table);
- ``rss_growth_mb`` and ``bytes_per_task``: the peak resident memory of the process that
  called ``get`` (``VmHWM``, reset just before the call) minus its resident memory just
  before it (the user's graph built already), per task of the graph: the manager, the
  local schedulers and the distributed scheduler all live in that process;
- the ratio of each system's time to the synchronous scheduler's on the same graph.

dask.distributed's scheduler spends hundreds of µs per task, so a 10^6-task graph would take
it many minutes: it runs the same shape at ``--peer-tasks`` leaves (10^5 by default; the
table says so), beside daskvine_py and sync at that size too.
``--smoke``: 10^3 leaves, every system once, in seconds: a test that the script still runs.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from biggraph import _reset_peak, _terminate  # (beside this file)

#: Inputs per task of the reduction: Dask's ``split_every`` for bags and dataframes.
FAN_IN = 8
SMOKE_LEAVES = 1_000
#: Seconds a child may take before it is stopped (10^6 tasks on a loaded machine).
CHILD_TIMEOUT = 1800


def leaf(i: int) -> int:
    return i


def add(*parts: int) -> int:
    return sum(parts)


def tree_graph(leaves: int, fan_in: int = FAN_IN) -> tuple[dict[Any, Any], Any]:
    """``leaves`` leaf tasks and a ``fan_in``-ary reduction over them; the root's key."""
    dsk: dict[Any, Any] = {("leaf", i): (leaf, i) for i in range(leaves)}
    level: list[Any] = [("leaf", i) for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        above = []
        for j, start in enumerate(range(0, len(level), fan_in)):
            key = ("sum", depth, j)
            dsk[key] = (add, *level[start : start + fan_in])
            above.append(key)
        level, depth = above, depth + 1
    return dsk, level[0]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _helper_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of this process's local workers ("worker") and their libraries
    ("library"), by pid."""
    import psutil

    found: dict[int, tuple[str, float]] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
            times = proc.cpu_times()
        except psutil.Error:  # (gone meanwhile)
            continue
        if "-m daskvine_py.worker" in command:
            found[proc.pid] = ("worker", times.user + times.system)
        elif "spawn_main" in command:  # (a library: multiprocessing's spawn of a worker)
            found[proc.pid] = ("library", times.user + times.system)
    return found


def _cpu_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each kind of helper used between two ``_helper_cpu`` readings."""
    used: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        used[kind] = used.get(kind, 0.0) + seconds - before.get(pid, (kind, 0.0))[1]
    return used


def child(system: str, leaves: int, workers: int) -> dict[str, Any]:
    """One system, one run, in this (fresh) process."""
    from systems import FirstDispatch, start

    out: dict[str, Any] = {"system": system, "leaves": leaves}
    with start(system, workers) as running:
        probe = FirstDispatch(running.manager) if running.manager is not None else None
        small, small_root = tree_graph(100)  # untimed: ships the functions
        if running.get(small, small_root) != sum(range(100)):
            raise AssertionError(f"{system} computed a wrong result for the small tree")
        running.settle()
        dsk, root = tree_graph(leaves)
        out["tasks"] = len(dsk)
        import gc

        gc.collect()
        resettable = _reset_peak()
        before = _status_kb("VmRSS")
        if probe is not None:
            probe.reset()
        helpers = _helper_cpu()
        begun, cpu = time.perf_counter(), time.process_time()
        got = running.get(dsk, root)
        out["seconds"] = time.perf_counter() - begun
        out["cpu_s"] = time.process_time() - cpu
        for kind, seconds in _cpu_used(helpers, _helper_cpu()).items():
            out[f"{kind}_cpu_s"] = seconds
        peak = _status_kb("VmHWM")
        if got != sum(range(leaves)):
            raise AssertionError(f"{system} computed {got!r}, not {sum(range(leaves))}")
        if probe is not None:
            if probe.first is None:
                raise AssertionError("FirstDispatch saw no task sent: the probe is broken")
            out["first_dispatch_s"] = probe.first - begun
        out["rss_growth_mb"] = (peak - before) / 1024 if resettable else None
        out["bytes_per_task"] = (peak - before) * 1024 / len(dsk) if resettable else None
    return out


def run_child(system: str, leaves: int, workers: int) -> dict[str, Any]:
    """``child`` in a process of its own, in a session of its own (killed with it)."""
    command = [
        sys.executable,
        __file__,
        "--child",
        system,
        "--tasks",
        str(leaves),
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        stdout = ""
    finally:
        if proc.poll() is None:
            import os

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    return {"system": system, "leaves": leaves, "error": f"no result (exit {proc.returncode})"}


def table(results: Sequence[dict[str, Any]]) -> str:
    sync = {r["leaves"]: r["seconds"] for r in results if r["system"] == "sync" and "seconds" in r}
    lines = [
        f"{'system':<13}{'leaves':>9}{'tasks':>10}{'total s':>9}{'first s':>9}{'cpu s':>8}"
        f"{'MB grown':>10}{'B/task':>8}{'/sync':>7}",
        "-" * 83,
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['system']:<13}{r['leaves']:>9,}  failed: {r['error']}")
            continue
        first = r.get("first_dispatch_s")
        grown, per_task = r.get("rss_growth_mb"), r.get("bytes_per_task")
        ratio = r["seconds"] / sync[r["leaves"]] if r["leaves"] in sync else None
        lines.append(
            f"{r['system']:<13}{r['leaves']:>9,}{r['tasks']:>10,}{r['seconds']:>9.2f}"
            f"{'-' if first is None else f'{first:.2f}':>9}{r.get('cpu_s', 0):>8.1f}"
            f"{'-' if grown is None else f'{grown:.0f}':>10}"
            f"{'-' if per_task is None else f'{per_task:.0f}':>8}"
            f"{'-' if ratio is None else f'{ratio:.2f}':>7}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=None, help="leaves (10^6; smoke: 10^3)")
    parser.add_argument(
        "--peer-tasks", type=int, default=None, help="leaves for distributed (10^5; smoke: 10^3)"
    )
    parser.add_argument("--systems", default="daskvine_py,sync,distributed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="10^3 leaves: does it still run?")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    leaves = args.tasks if args.tasks is not None else SMOKE_LEAVES if args.smoke else 10**6
    if args.child is not None:
        signal.signal(signal.SIGTERM, _terminate)
        try:
            out = child(args.child, leaves, args.workers)
        except Exception as exc:
            out = {"system": args.child, "leaves": leaves, "error": f"{type(exc).__name__}: {exc}"}
        print("RESULT " + json.dumps(out), flush=True)
        return 1 if "error" in out else 0
    peer = args.peer_tasks
    if peer is None:
        peer = leaves if args.smoke else min(leaves, 10**5)
    plan: list[tuple[str, int]] = []
    systems = [name for name in args.systems.split(",") if name]
    sizes = sorted({leaves, peer} if "distributed" in systems else {leaves}, reverse=True)
    for size in sizes:
        for system in systems:
            if system == "distributed" and size != peer:
                continue
            plan.append((system, size))
    results = []
    for system, size in plan:
        print(f"running {system} on {size:,} leaves ...", file=sys.stderr, flush=True)
        results.append(run_child(system, size, args.workers))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(table(results))
    for r in results:  # where daskvine_py's CPU went: its workers' relay is a share of it
        if "worker_cpu_s" in r:
            print(
                f"{r['system']} {r['leaves']:,} leaves, CPU per task: caller's process "
                f"{r['cpu_s'] / r['tasks'] * 1e6:.0f} µs, workers' main processes "
                f"{r['worker_cpu_s'] / r['tasks'] * 1e6:.0f} µs, their libraries "
                f"{r.get('library_cpu_s', 0.0) / r['tasks'] * 1e6:.0f} µs"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
