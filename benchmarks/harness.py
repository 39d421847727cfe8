"""Benchmark harness (issue 3): daskvine_py against its peers, same run, same cores.

    python benchmarks/harness.py [--repeat 3] [--warmup 1] [--quick | --smoke]
                                 [--only noop,chain,...]
                                 [--systems daskvine_py,distributed,sync,threads,processes]
                                 [--prefetch 0,1,4] [--progress] [--event-log] [--insecure]
                                 [--cache] [--verify F]
                                 [--workers 2] [--wide-workers 50]
                                 [--timeout 600] [--json results.json] [--list]

Runs the workloads of ``workloads.py`` on every system of ``systems.py``, one system at a
time, each started once and kept warm across workloads and repeats. Every result is
checked against Dask's synchronous scheduler (computed once per workload, untimed, before
any system runs). Prints one table (the median of ``--repeat`` runs, tasks/s, µs/task, a
workload's own metric, and how many times faster daskvine_py is than each system) and
with ``--json`` writes every run, the machine and the versions.

Workloads (``--only`` takes names or prefixes of names, e.g. ``noop``, ``sleep``, ``latency``):
``noop-dict noop-bag noop-delayed chain sleep1ms sleep100ms tree10k array dataframe latency-compute
latency-get`` on ``--workers`` one-core workers; ``biggraph`` (one child process per
system, ``biggraph.py``); ``wide`` (50 one-core workers per system, started for it);
``matching`` (``bench_matching.py``, the ready-task structure alone).

``--prefetch 0,1,4`` adds daskvine_py with a fixed prefetch of 0, 1 and 4 extra tasks per
core beside the default (EMA-sized) one. ``--progress`` adds daskvine_py drawing a progress
bar on every call, ``--event-log`` daskvine_py recording and writing every run's event log:
what watching a run costs, e.g. ``--only noop-dict --systems daskvine_py --progress``.
``--insecure`` adds daskvine_py without CurveZMQ (``Manager(security=False)``): what
security costs, e.g. ``--only chain,tree10k,noop-dict --systems daskvine_py --insecure``.
``--verify F`` adds daskvine_py with ``get(verify=F)``: what re-running F of the tasks on
another worker and comparing costs, e.g. ``--only tree10k,noop-dict --verify 0.05``.
``--cache`` adds daskvine_py with ``get(cache=True)``, the cache emptied before every run:
what hashing every task costs a first run (issue 17).
``--quick`` runs every workload at a small size once, as a smoke test (a couple of
minutes); its numbers are noise. ``--smoke`` runs every workload at a tiny size once, without
a warm-up, on daskvine_py and sync unless ``--systems`` says otherwise (a few seconds per
system): a test that the harness still runs and every result is still right.
It exits non-zero when any run failed or computed a wrong result.
Ctrl-C stops every process the harness started, then prints and writes what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

import bench_matching
import systems
import workloads as w

HERE = Path(__file__).resolve().parent
OURS = "daskvine_py"
PHASES = ("biggraph", "wide", "matching")
#: ``--smoke``'s systems: ours and the reference (``--systems distributed`` adds the peer,
#: which costs the smoke run twice as long).
SMOKE_SYSTEMS = ("daskvine_py", "sync")


@dataclass
class Result:
    """Every run of one workload on one system."""

    workload: str
    system: str
    tasks: int | None = None
    seconds: list[float] = field(default_factory=list)
    #: the untimed runs before them
    warmup_seconds: list[float] = field(default_factory=list)
    #: workload-specific numbers (efficiency, busy, first dispatch, peak memory ...), medians
    metrics: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None
    #: every run finished (False: an error, or Ctrl-C part-way)
    complete: bool = False

    @property
    def ok(self) -> bool:
        """Every run finished and was right."""
        return self.complete and bool(self.seconds) and not self.error

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def row(self) -> dict[str, Any]:
        median = self.median
        rate = self.tasks / median if median and self.tasks else None
        return {
            **asdict(self),
            "ok": self.ok,
            "median_s": median,
            "tasks_per_s": rate,
            "us_per_task": 1e6 / rate if rate else None,
        }


@dataclass(frozen=True)
class Runs:
    """How each workload is run on each system."""

    repeat: int  #: timed runs
    warmup: int  #: untimed runs before them (first calls ship functions, import modules)
    timeout: float  #: seconds per run


class RunTimeout(Exception):
    """One run took longer than ``--timeout``."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise ``RunTimeout`` in the main thread after ``seconds`` (SIGALRM).

    Blocking waits in ``get`` (locks, events, sockets) are interrupted by the signal, and
    daskvine_py cancels the run when ``get`` is interrupted.
    """

    def expire(signum: int, frame: Any) -> NoReturn:
        raise RunTimeout(f"no result after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- selection ------------------------------------------------------------------------------


def selected(name: str, only: Sequence[str] | None) -> bool:
    return only is None or any(name.startswith(o) for o in only)


def system_names(args: argparse.Namespace) -> list[str]:
    names = list(args.systems)
    if OURS in names or args.prefetch:
        # The fixed-prefetch variants right after the default, for easy comparison.
        at = names.index(OURS) + 1 if OURS in names else 0
        names[at:at] = [systems.prefetch_name(k) for k in args.prefetch]
    watching = [w for w, on in (("progress", args.progress), ("event-log", args.event_log)) if on]
    if watching:
        at = names.index(OURS) + 1 if OURS in names else 0
        names[at:at] = [systems.watching_name(w) for w in watching]
    if args.insecure:
        at = names.index(OURS) + 1 if OURS in names else 0
        names[at:at] = [systems.INSECURE]
    if args.cache:
        at = names.index(OURS) + 1 if OURS in names else 0
        names[at:at] = [systems.CACHE]
    if args.verify:
        at = names.index(OURS) + 1 if OURS in names else 0
        names[at:at] = [f"daskvine_py[verify={args.verify:g}]"]
    return names


# -- the warm phase: most workloads on --workers workers --------------------------------------


def reference(workload: w.Workload) -> tuple[Any, Any, int]:
    """The graph, Dask's synchronous result and the number of tasks get receives."""
    from dask.local import get_sync

    graph = workload.make()
    if workload.expected is not None:  # known without the (slow) serial run
        return graph, workload.expected(), w.count_tasks(graph[0])
    seen: list[int] = []

    def counting_get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        seen.append(w.count_tasks(dsk))
        return get_sync(dsk, keys, **kwargs)

    result = workload.call(counting_get, graph)
    return graph, result, seen[0]


def run_workload(
    running: systems.Running,
    workload: w.Workload,
    graph: Any,
    expected: Any,
    result: Result,
    runs: Runs,
) -> None:
    """Warm-up and timed runs, each checked; fills ``result`` (raises on timeout)."""
    efficiencies = []
    key = "busy" if workload.name == "wide" else "efficiency"
    for i in range(-runs.warmup, runs.repeat):
        with deadline(runs.timeout * workload.calls):
            seconds, got = workload.measure(running.get, graph, running.settle)
        if not w.same(got, expected):
            raise AssertionError(f"wrong result: {_short(got)}, expected {_short(expected)}")
        if i < 0:
            result.warmup_seconds.append(seconds)
            log(f"  {workload.name} warm-up: {seconds:.4f} s")
            continue
        result.seconds.append(seconds)
        note = ""
        if workload.work_seconds is not None:
            efficiencies.append(w.efficiency(workload.work_seconds, running.cores, seconds))
            note = f", {key} {efficiencies[-1]:.2f}"
        log(f"  {workload.name} run {i + 1}/{runs.repeat}: {seconds:.4f} s{note}")
    if efficiencies:
        result.metrics[key] = statistics.median(efficiencies)
    if workload.name == "sleep1ms":
        # The machine's own sleep, in the same minute: its overshoot is no scheduler's cost.
        result.metrics["possible"] = 0.001 / sleep_overshoot()
    result.complete = True


def warm_phase(
    names: Sequence[str],
    chosen: Sequence[w.Workload],
    workers: int,
    runs: Runs,
    results: list[Result],
) -> None:
    """Run ``chosen`` on each system in turn; a system is restarted after a failed run."""
    prepared = []
    for workload in chosen:
        log(f"reference: {workload.name}: {workload.what}")
        prepared.append((workload, *reference(workload)))
    for name in names:
        pending = list(prepared)
        while pending:
            log(f"starting {name} with {workers} workers")
            try:
                with systems.start(name, workers) as running:
                    log(f"{name} started in {running.startup:.1f} s")
                    while pending:
                        workload, graph, expected, tasks = pending.pop(0)
                        result = Result(workload.name, name, tasks)
                        results.append(result)
                        result.skipped = workload.skip.get(systems.parse(name)[0])
                        if result.skipped:
                            continue
                        log(f"{name}: {workload.name}")
                        try:
                            run_workload(running, workload, graph, expected, result, runs)
                        except Exception as exc:  # wrong result, a failure or RunTimeout
                            result.error = f"{type(exc).__name__}: {exc}"
                            log(f"  {workload.name} on {name} failed: {result.error}")
                            break  # restart the system for the remaining workloads
            except Exception as exc:  # it could not start (or stop) cleanly
                log(f"{name} failed to start or stop: {type(exc).__name__}: {exc}")
                for workload, *_ in pending:
                    results.append(Result(workload.name, name, error=f"system: {exc}"))
                pending.clear()


# -- the big graph: a child process per system --------------------------------------------


def biggraph_phase(
    names: Sequence[str], tasks: int, workers: int, runs: Runs, results: list[Result]
) -> None:
    """Each system in a child process; the child warms up with a small graph of its own."""
    for name in names:
        log(f"biggraph: {name}, about {tasks:,} tasks, in a child process")
        result = Result("biggraph", name)
        results.append(result)
        command = [
            sys.executable,
            str(HERE / "biggraph.py"),
            f"--system={name}",
            f"--tasks={tasks}",
            f"--workers={workers}",
            f"--repeat={runs.repeat}",
        ]
        try:
            out = run_child(command, runs.timeout * (runs.repeat + 1))
        except (RunTimeout, RuntimeError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            continue
        if "error" in out:
            result.error = out["error"]
            continue
        result.tasks = out["tasks"]
        result.complete = True
        done = out["runs"]
        result.seconds = [r["seconds"] for r in done]
        for key in ("first_dispatch_s", "peak_rss_mb", "kb_per_task"):
            values = [r[key] for r in done if r[key] is not None]
            result.metrics[key] = statistics.median(values) if values else None
        # A fresh process's run: later ones peak higher on what the allocator kept (the
        # live Python objects at the peak are the same, measured with tracemalloc).
        result.metrics["kb_per_task_first"] = done[0]["kb_per_task"] if done else None


def run_child(command: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run ``command`` in its own session; kill that whole session whatever happens."""
    # Its own session: Ctrl-C here does not reach it half-way, and killing the group
    # also kills the workers and library processes it started.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RunTimeout(f"no result after {timeout:.0f} s") from exc
    finally:
        _kill_session(proc)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"child exited with code {proc.returncode} and no result")


def _kill_session(proc: subprocess.Popen) -> None:
    with systems.sigint_ignored():
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break  # nothing of it is left
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- output --------------------------------------------------------------------------------


def metric_text(result: Result) -> str:
    m = result.metrics
    parts = []
    if "efficiency" in m:
        text = f"efficiency {m['efficiency']:.2f}"
        if "possible" in m:
            share = m["efficiency"] / m["possible"]
            text += f" ({share:.2f} of the {m['possible']:.2f} that time.sleep allows)"
        parts.append(text)
    if "busy" in m:
        parts.append(f"busy {m['busy']:.2f}")
    if result.workload.startswith("latency") and result.median is not None:
        parts.append(f"{result.median * 1e3:.2f} ms")
    if m.get("first_dispatch_s") is not None:
        parts.append(f"first task {m['first_dispatch_s']:.2f} s")
    if m.get("peak_rss_mb") is not None:
        parts.append(f"peak {m['peak_rss_mb']:.0f} MB")
    if m.get("kb_per_task") is not None:
        parts.append(f"{m['kb_per_task']:.2f} KB/task")
        if m.get("kb_per_task_first") is not None:
            parts[-1] += f" (first run {m['kb_per_task_first']:.2f})"
    return ", ".join(parts)


def table(results: Sequence[Result], repeat: int) -> str:
    header = (
        f"{'workload':<16} {'tasks':>8}  {'system':<24} {'median s':>9} {'tasks/s':>10} "
        f"{'µs/task':>9}  {'daskvine_py is':>14}  metric"
    )
    lines = [
        f"median of {repeat} run(s); 'daskvine_py is Nx' = system's median / daskvine_py's",
        header,
        "-" * len(header),
    ]
    ours = {r.workload: r.median for r in results if r.system == OURS and r.ok}
    # Grouped by workload, in the order they ran (phases run systems in turn).
    workload_order = {name: i for i, name in enumerate(dict.fromkeys(r.workload for r in results))}
    system_order = {name: i for i, name in enumerate(dict.fromkeys(r.system for r in results))}
    ordered = sorted(
        results,
        key=lambda r: (
            workload_order[r.workload],
            not r.system.startswith(OURS),  # ours first, then the peers in --systems order
            system_order[r.system],
        ),
    )
    last = None
    for r in ordered:
        name = r.workload if r.workload != last else ""
        tasks = f"{r.tasks:,}" if r.tasks and name else ""
        last = r.workload
        prefix = f"{name:<16} {tasks:>8}  {r.system:<24}"
        if not r.ok:
            status = (
                f"skipped: {r.skipped}"
                if r.skipped
                else f"ERROR: {r.error}"
                if r.error
                else f"interrupted after {len(r.seconds)} run(s)"
            )
            lines.append(f"{prefix} {status}")
            continue
        row = r.row()
        ratio = ""
        if r.workload in ours:
            ratio = f"{r.median / ours[r.workload]:.2f}x"
        lines.append(
            f"{prefix} {row['median_s']:>9.4f} {row['tasks_per_s'] or 0:>10,.0f} "
            f"{row['us_per_task'] or math.nan:>9.1f}  {ratio:>14}  {metric_text(r)}"
        )
    return "\n".join(lines)


def sleep_overshoot(calls: int = 200) -> float:
    """What ``time.sleep(0.001)`` takes here (median): sleep1ms cannot beat it, so its
    efficiency is at most 1 ms / this on any system."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        time.sleep(0.001)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_start": os.getloadavg(),
        "sleep_1ms_s": sleep_overshoot(),
    }
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        models = [
            line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line
        ]
        info["cpu"] = models[0] if models else None
        meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0]
        info["memory"] = meminfo.split(":", 1)[1].strip()
    info["versions"] = {}
    for package in (
        "daskvine-py",
        "dask",
        "distributed",
        "numpy",
        "pandas",
        "pyzmq",
        "cloudpickle",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info["versions"][package] = metadata.version(package)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        info["commit"] = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    return info


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- command line ----------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints(text: str) -> list[int]:
    return [int(part) for part in _names(text)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per workload (3; quick, smoke 1)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed runs before the timed ones (1; smoke 0)"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes, once")
    sizes.add_argument(
        "--smoke", action="store_true", help="tiny sizes, once, no warm-up: does it still run?"
    )
    parser.add_argument("--only", type=_names, default=None, help="workloads, comma-separated")
    parser.add_argument(
        "--systems",
        type=_names,
        default=None,
        help=f"comma-separated (default {','.join(systems.SYSTEMS)}; smoke "
        f"{','.join(SMOKE_SYSTEMS)})",
    )
    parser.add_argument(
        "--prefetch", type=_ints, default=[], help="also daskvine_py with these fixed prefetches"
    )
    parser.add_argument(
        "--progress", action="store_true", help="also daskvine_py with a progress bar"
    )
    parser.add_argument(
        "--event-log", action="store_true", help="also daskvine_py writing an event log"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="also daskvine_py without CurveZMQ (security=False): what security costs",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="also daskvine_py with get(cache=True), emptied before every run: what hashing costs",
    )
    parser.add_argument(
        "--verify",
        type=float,
        default=0.0,
        help="also daskvine_py with get(verify=F): F of the tasks re-run elsewhere, compared",
    )
    parser.add_argument("--workers", type=int, default=2, help="one-core workers per system")
    parser.add_argument(
        "--wide-workers",
        type=int,
        default=None,
        help="workers of the wide workload (50; quick 10; smoke 3)",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--timeout", type=float, default=None, help="s per run (600; quick, smoke 60)"
    )
    parser.add_argument("--json", default=None, help="also write every run here")
    args = parser.parse_args(argv)
    if args.systems is None:
        args.systems = list(SMOKE_SYSTEMS if args.smoke else systems.SYSTEMS)
    for name in args.systems:
        systems.parse(name)
    known = {*w.workloads().keys(), *PHASES}
    for token in args.only or ():
        if not any(selected(name, [token]) for name in known):
            parser.error(f"--only {token}: no such workload; known: {', '.join(sorted(known))}")
    small = args.quick or args.smoke
    if args.repeat is None:
        args.repeat = 1 if small else 3
    if args.warmup is None:
        args.warmup = 0 if args.smoke else 1
    if args.timeout is None:
        args.timeout = 60.0 if small else 600.0
    args.profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    return args


def _stop(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM: clean up as on Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    profile = args.profile
    if args.list:
        for workload in [*w.workloads(profile).values(), w.wide_workload(profile)[1]]:
            print(f"{workload.name:<16} {workload.what}")
        print(
            f"{'biggraph':<16} about {w.SIZES[profile]['biggraph']:,} trivial tasks: time to "
            "the first task dispatched, total time, peak RSS (biggraph.py)"
        )
        print(f"{'matching':<16} ReadyQueue alone: ns per push, pop, remove (bench_matching.py)")
        return 0
    names = system_names(args)
    results: list[Result] = []
    matching: list[dict[str, Any]] = []
    info = machine()
    begun = time.perf_counter()
    status = 0
    runs = Runs(args.repeat, args.warmup, args.timeout)
    phases: list[Callable[[], None]] = []
    chosen = [x for x in w.workloads(profile).values() if selected(x.name, args.only)]
    if chosen:
        phases.append(lambda: warm_phase(names, chosen, args.workers, runs, results))
    if selected("biggraph", args.only):
        tasks = w.SIZES[profile]["biggraph"]
        phases.append(lambda: biggraph_phase(names, tasks, args.workers, runs, results))
    if selected("wide", args.only):
        wide_workers, wide = w.wide_workload(profile, args.wide_workers)
        phases.append(lambda: warm_phase(names, [wide], wide_workers, runs, results))
    if selected("matching", args.only):
        sizes, ops, rounds = {
            "full": (bench_matching.SIZES, 20_000, 5),
            "quick": ((1_000, 10_000, 100_000), 20_000, 3),
            "smoke": ((1_000,), 200, 1),
        }[profile]

        def matching_phase() -> None:
            log("matching: ReadyQueue, ns per operation")
            matching.extend(bench_matching.run(sizes, ops=ops, rounds=rounds, report=log))

        phases.append(matching_phase)
    try:
        for phase in phases:
            phase()
    except KeyboardInterrupt:
        log("interrupted: every system is stopped; what was measured follows")
        status = 130
    info["loadavg_end"] = os.getloadavg()
    info["elapsed_s"] = time.perf_counter() - begun
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "args": vars(args),
                    "results": [r.row() for r in results],
                    "matching": matching,
                },
                f,
                indent=2,
            )
    print(
        f"\n{info.get('cpu')}, {info['cpus']} cpus, load {info['loadavg_start'][0]:.2f} "
        f"at start; dask {info['versions'].get('dask')}; {profile} sizes; "
        f"{info['elapsed_s']:.0f} s in all, load {info['loadavg_end'][0]:.2f} at the end; "
        f"time.sleep(1 ms) takes {info['sleep_1ms_s'] * 1e3:.3f} ms here, so sleep1ms "
        f"efficiency is at most {0.001 / info['sleep_1ms_s']:.2f}"
    )
    if results:
        print(table(results, args.repeat))
    if matching:
        print("\nmatching (ReadyQueue), ns per operation, median of rounds:")
        for row in matching:
            ns = row["ns"]
            print(
                f"  {row['queued']:>9,} {row['priority']:<7} {row['mode']:<10} "
                + " ".join(
                    f"{op} {'-' if ns[op] is None else f'{ns[op]:.0f}':>6}"
                    for op in bench_matching.OPERATIONS
                )
            )
    if any(r.error for r in results):
        status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
