"""Hundreds to thousands of simulated workers against one real manager (issue 28).

    python benchmarks/swarm.py --workload dv3-large --workers 200 --cores 12 \\
        --preempt 0.01 --json OUT.json [--report OUT.html] [--system both]

The manager is the real one, embedded in this process as a user's would be, with
CurveZMQ; the workers are ``swarm_workers.py`` processes, each hosting a share of the
simulated workers (see its docstring: real sockets, the real protocol and the worker's
own state; only the libraries are simulated, a task "running" for the seconds its graph
declares). The graph is a real Dask graph (``swarm_workloads``) passed to ``manager.get``.

Faulty workers (issue 29): ``--black-holes F`` makes that share of the workers fail every
task within about 10 ms, ``--stragglers F`` that share run every task 10x slower
(``swarm_workers``); ``--fast-abort X`` sets the manager's ``fast_abort`` (default: its
own). The JSON then also gives ``black_holes``, ``stragglers`` (their names),
``quarantined`` (the workers the manager quarantined, by the end), ``tasks_failed`` (the
black holes' errors) and ``tasks_killed`` (straggling calls aborted while running).

``--sizing MODE`` sets the manager's sizing mode (docs/resources.md; default "max", in
which a worker holds one task of a category not measured yet, so the first wave of each
category runs one task a worker); "fixed" sizes nothing, to tell that wave's cost apart.

``--system distributed`` runs the same graph, with tasks that really sleep, on
dask.distributed with in-process workers (``swarm_distributed``); ``both`` runs the two in
turn and prints their makespans side by side.

The JSON holds ``workers``, ``workers_registered``, ``join_s`` (first connection to last
registration), ``tasks``, ``tasks_done``, ``tasks_lost``, ``tasks_rerun`` (simulated
completions beyond one per task: what preemption cost), ``result_ok``, ``makespan_s``
(the call of ``get`` to its return, graph conversion included), ``ideal_s`` (the larger
of total work / cores and the critical path), ``busy_fraction`` (task-seconds run ÷
(cores × makespan)), ``manager_cpu_us_per_task`` (this process's CPU time during ``get``
÷ tasks: the manager's I/O thread and the caller's graph conversion),
``manager_batches_per_task`` (batches it sent workers during ``get`` ÷ tasks),
``manager_rss_mb``, and ``dashboard`` (with ``--dashboard``: what the page poller
asked), ``swarm_lag_s`` (the 99th percentile of how late the swarm delivered its
simulated completions; ``swarm_lag_max_s`` the worst): a lag near the makespan's excess
over the ideal says the swarm, not the manager, was the limit.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import swarm_workloads  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

#: The first argument that makes this script one of the swarm's processes.
SWARM_PROCESS = "--swarm-process"

#: Simulated workers per swarm process at most (fewer if open files are short): enough
#: processes to spread the sockets' CPU, few enough to leave the manager its core.
WORKERS_PER_PROCESS = 500


def workers_per_process(links: int) -> int:
    """Simulated workers one swarm process can hold: each may keep a socket to ``links``
    peers besides its own two, within the open files allowed."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return WORKERS_PER_PROCESS
    return max(1, min(WORKERS_PER_PROCESS, (hard - 1024) // (links + 4)))


def _rss_mb() -> float:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def list_schedule_s(workload: swarm_workloads.Workload, cores: int) -> float:
    """The makespan of greedy list scheduling with no overhead at all: whenever a core is
    free it takes the ready task Dask's ``order`` ranks first, and every task takes exactly
    its declared seconds. What any scheduler that does not know durations in advance can
    hope for (``ideal_s`` assumes perfect packing, which needs to know them)."""
    import heapq

    from dask.order import order

    graph = workload.graph
    priority = order(graph)
    deps = {key: [a for a in task[3:] if a in graph] for key, task in graph.items()}
    waiting = {key: len(d) for key, d in deps.items()}
    readers: dict[Any, list[Any]] = {}
    for key, inputs in deps.items():
        for dep in inputs:
            readers.setdefault(dep, []).append(key)
    ready = [(priority[k], k) for k, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    running: list[tuple[float, int, Any]] = []
    now, free, sequence = 0.0, cores, 0
    while ready or running:
        while ready and free:
            _, key = heapq.heappop(ready)
            free -= 1
            sequence += 1
            heapq.heappush(running, (now + graph[key][1], sequence, key))
        now, _, key = heapq.heappop(running)
        free += 1
        for reader in readers.get(key, ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (priority[reader], reader))
    return now


def _thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread called ``name`` (0 if none): the manager's
    I/O thread, told apart from the caller's graph conversion."""
    import threading

    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                return 0.0
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class _GcClock:
    """Seconds this process spent in the garbage collector's collections, and how many
    full (generation 2) collections ran, while it is installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info.get("generation") == 2

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def _profile_io_thread(path: str) -> None:
    """Run the manager's I/O thread under cProfile, its figures written to ``path``."""
    import cProfile

    from daskvine_py.manager import loop

    original = loop.IOLoop.run

    def profiled(self: Any) -> None:
        profile = cProfile.Profile()
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()
            profile.dump_stats(path)

    loop.IOLoop.run = profiled  # type: ignore[method-assign]


def start_swarm(
    connection_file: str, args: argparse.Namespace, directory: str
) -> list[tuple[subprocess.Popen[bytes], str]]:
    """The swarm processes, each with its share of the workers: (process, stats file)."""
    per_process = workers_per_process(args.peer_links)
    processes = args.processes or max(1, math.ceil(args.workers / per_process))
    share, extra = divmod(args.workers, processes)
    started = []
    first = 0
    for index in range(processes):
        count = share + (1 if index < extra else 0)
        if count == 0:
            continue
        stats = os.path.join(directory, f"swarm-{index}.json")
        command = [
            sys.executable,
            os.path.abspath(__file__),
            SWARM_PROCESS,
            "--connection-file",
            connection_file,
            "--workers",
            str(count),
            "--cores",
            str(args.cores),
            "--first-index",
            str(first),
            "--byte-scale",
            str(args.byte_scale),
            "--preempt",
            str(args.preempt),
            "--preempt-window",
            str(args.preempt_window),
            "--replace-after",
            str(args.replace_after),
            "--seed",
            str(args.seed + index),
            "--peer-links",
            str(args.peer_links),
            "--black-holes",
            str(args.black_holes),
            "--stragglers",
            str(args.stragglers),
            "--jitter",
            str(args.jitter),
            "--stats",
            stats,
        ]
        if args.profile_swarm:
            command += ["--profile", os.path.join(args.profile_swarm, f"swarm-{index}.prof")]
        started.append((subprocess.Popen(command), stats))
        first += count
    return started


def wait_registered(manager: Any, workers: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = len(manager.workers)
        if count >= workers:
            return count
        time.sleep(0.05)
    return len(manager.workers)


def stop_swarm(swarm: list[tuple[subprocess.Popen[bytes], str]], timeout: float) -> list[dict]:
    """Wait for the swarm processes (the manager told their workers to leave), then
    their figures."""
    deadline = time.monotonic() + timeout
    for process, _ in swarm:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    stats = []
    for _, path in swarm:
        try:
            with open(path) as file:
                stats.append(json.load(file))
        except (OSError, ValueError):
            stats.append({})
    return stats


def run_daskvine(workload: swarm_workloads.Workload, args: argparse.Namespace) -> dict[str, Any]:
    from daskvine_py import Manager

    cores = args.workers * args.cores
    if args.profile_manager:
        _profile_io_thread(args.profile_manager)
    if args.gc_threshold:
        gc.set_threshold(*args.gc_threshold)
    with tempfile.TemporaryDirectory(prefix="daskvine-swarm-") as directory:
        faults = {} if args.fast_abort is None else {"fast_abort": args.fast_abort}
        manager = Manager(
            port=0,
            worker_timeout=args.worker_timeout,
            heartbeat_interval=1.0,
            sizing=args.sizing,
            **faults,
        )
        swarm: list[tuple[subprocess.Popen[bytes], str]] = []
        result: dict[str, Any] = {"system": "daskvine_py", "workload": workload.name}
        quarantined: list[str] = []
        poller: subprocess.Popen[str] | None = None
        polled = ""
        try:
            swarm = start_swarm(manager.connection_file, args, directory)
            registered = wait_registered(manager, args.workers, args.join_timeout)
            if args.dashboard:  # a page left open on the dashboard, as a browser's tab
                poller = subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "page_poller.py"), manager.dashboard_link],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                time.sleep(1.5)
            cpu0, t0 = _cpu(), time.monotonic()
            io0 = _thread_cpu("daskvine-manager")
            batches0 = getattr(manager, "sent_batches", None)  # (None: an older checkout)
            error = None
            value: Any = None
            gc_clock = _GcClock()
            try:
                options: dict[str, Any] = {"progress": False}
                if args.report:
                    options["report"] = args.report
                if args.event_log:
                    options["event_log"] = args.event_log
                with gc_clock:
                    value = manager.get(workload.graph, workload.keys, **options)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            makespan = time.monotonic() - t0
            cpu = _cpu() - cpu0
            io_cpu = _thread_cpu("daskvine-manager") - io0
            batches = None if batches0 is None else manager.sent_batches - batches0
            run = manager.last_run
            rss = _rss_mb()
            quarantined = sorted(n for n, info in manager.workers.items() if info["quarantined"])
        finally:
            if poller is not None:
                poller.terminate()
                polled = poller.communicate(timeout=30)[0].strip()
            manager.close()
            stats = stop_swarm(swarm, 60.0)
    tasks = run.tasks if run is not None else workload.tasks
    done = sum(s.get("tasks_done", 0) for s in stats)
    task_seconds = sum(s.get("task_seconds", 0.0) for s in stats)
    starts = [s["connect_started"] for s in stats if s.get("connect_started")]
    welcomes = [t for s in stats for t in s.get("welcomes", [])]
    ok = error is None and workload.result_ok(value)
    result.update(
        workers=args.workers,
        cores=cores,
        workers_registered=registered,
        join_s=round(max(welcomes) - min(starts), 3) if welcomes and starts else None,
        tasks=tasks,
        tasks_done=tasks if ok else None,
        tasks_lost=0 if ok else None,
        tasks_rerun=max(0, done - tasks),
        result_ok=ok,
        makespan_s=round(makespan, 3),
        ideal_s=round(workload.ideal_s(cores), 3),
        list_schedule_s=round(list_schedule_s(workload, cores), 3),
        busy_fraction=round(task_seconds / (cores * makespan), 4) if makespan > 0 else None,
        manager_cpu_us_per_task=round(cpu / max(1, tasks) * 1e6, 2),
        manager_io_cpu_us_per_task=round(io_cpu / max(1, tasks) * 1e6, 2),
        manager_batches_per_task=None if batches is None else round(batches / max(1, tasks), 3),
        manager_rss_mb=round(rss, 1),
        manager_gc_s=round(gc_clock.seconds, 3),
        manager_gc_full=gc_clock.full,
        swarm_lag_s=round(max((s.get("lag_p99_s", 0.0) for s in stats), default=0.0), 4),
        swarm_lag_max_s=round(max((s.get("lag_max_s", 0.0) for s in stats), default=0.0), 4),
        swarm_cpu_s=round(sum(s.get("cpu_s", 0.0) for s in stats), 2),
        preempted=sum(len(s.get("preempted", [])) for s in stats),
        black_holes=sorted(n for s in stats for n in s.get("black_holes", [])),
        stragglers=sorted(n for s in stats for n in s.get("stragglers", [])),
        quarantined=quarantined,
        tasks_failed=sum(s.get("tasks_failed", 0) for s in stats),
        tasks_killed=sum(s.get("tasks_killed", 0) for s in stats),
        workers_gave_up=sum(s.get("gave_up", 0) for s in stats),
        workers_failed_to_join=sum(s.get("failed_to_join", 0) for s in stats),
        ejected=sorted(n for s in stats for n in s.get("ejected", [])),
        missing_inputs=sum(len(s.get("missing_inputs", [])) for s in stats),
        swarm_processes=len(stats),
        swarm_exits=[process.returncode for process, _ in swarm],
        error=error,
        dashboard=polled or None,
    )
    return result


def run_distributed(workload: swarm_workloads.Workload, args: argparse.Namespace) -> dict:
    """The same workload on dask.distributed, in a process of its own
    (``swarm_distributed.py``): hundreds of in-process workers can jam a process past any
    timeout of its own, so this one is bounded from outside and killed past it."""
    with tempfile.TemporaryDirectory(prefix="daskvine-swarm-") as directory:
        path = os.path.join(directory, "distributed.json")
        command = [
            sys.executable,
            os.path.join(HERE, "swarm_distributed.py"),
            "--workload",
            workload.name,
            "--workers",
            str(args.workers),
            "--threads",
            str(args.cores),
            "--scale",
            str(args.scale / args.speedup),
            "--seed",
            str(args.seed),
            "--timeout",
            str(args.timeout),
            "--json",
            path,
        ]
        if args.tasks is not None:
            command += ["--tasks", str(args.tasks)]
        if args.task_seconds is not None:
            command += ["--task-seconds", str(args.task_seconds)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            process.wait(args.timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        try:
            with open(path) as file:
                result: dict = json.load(file)
        except (OSError, ValueError):
            result = {
                "system": "distributed",
                "workload": workload.name,
                "workers": args.workers,
                "result_ok": False,
                "makespan_s": None,
                "error": f"killed: no result {args.timeout + 60:g} s after it started",
            }
        return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workload", default="flat", choices=["dv3-large", "dv3-huge", "flat", "million"]
    )
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--cores", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--task-seconds", type=float, default=None)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every declared task duration"
    )
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="run the swarm's clock this many times faster: every task duration, the "
        "preemption window and the replacement delay divided by it (what a machine with "
        "more cores than this one shows: replies sooner, relative to the manager's work)",
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="a random delay of up to this many seconds added to each simulated task",
    )
    parser.add_argument(
        "--preempt",
        type=float,
        default=0.0,
        help="fraction of workers that vanish without a goodbye",
    )
    parser.add_argument(
        "--preempt-window",
        type=float,
        default=None,
        help="seconds after registration within which they vanish "
        "(default: half the ideal makespan)",
    )
    parser.add_argument("--replace-after", type=float, default=5.0)
    parser.add_argument(
        "--black-holes",
        type=float,
        default=0.0,
        help="fraction of workers that fail every task within about 10 ms",
    )
    parser.add_argument(
        "--stragglers",
        type=float,
        default=0.0,
        help="fraction of workers that run every task 10x slower",
    )
    parser.add_argument(
        "--fast-abort",
        type=float,
        default=None,
        help="the manager's fast_abort multiplier (0: off; default: the manager's own)",
    )
    parser.add_argument(
        "--peer-links",
        type=int,
        default=8,
        help="sockets to peers each simulated worker keeps at most",
    )
    parser.add_argument(
        "--byte-scale",
        type=float,
        default=0.001,
        help="bytes carried per declared byte of a result",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help=f"swarm processes (default: one per {WORKERS_PER_PROCESS} workers)",
    )
    parser.add_argument("--worker-timeout", type=float, default=30.0)
    parser.add_argument("--join-timeout", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--system", default="daskvine_py", choices=["daskvine_py", "distributed", "both"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sizing",
        default="max",
        help="the manager's sizing mode (docs/resources.md); 'fixed': no category waits "
        "for its first measurement",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        nargs=3,
        default=None,
        help="the garbage collector's thresholds for this run (experiments)",
    )
    parser.add_argument("--report", default=None, help="write the run's HTML report here")
    parser.add_argument("--event-log", default=None, help="write the run's event log here")
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="a dashboard page open during the run (page_poller.py: status and task stream "
        "asked once a second)",
    )
    parser.add_argument(
        "--profile-manager",
        default=None,
        help="write cProfile's figures of the manager's I/O thread here",
    )
    parser.add_argument(
        "--profile-swarm",
        default=None,
        help="a directory for the swarm processes' cProfile figures",
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument(
        "--smoke", action="store_true", help="a few workers, a few seconds: does it all still work?"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.workers, args.cores = min(args.workers, 4), min(args.cores, 2)
        args.tasks = args.tasks or 60
        args.scale = min(args.scale, 0.01)
        args.replace_after = min(args.replace_after, 0.1)
        if args.preempt_window is None:
            args.preempt_window = 0.2
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SWARM_PROCESS]:
        import swarm_workers

        return swarm_workers.main(argv[1:])
    args = parse_args(argv)
    workload = swarm_workloads.build(
        args.workload,
        tasks=args.tasks,
        task_seconds=args.task_seconds,
        seed=args.seed,
        scale=args.scale / args.speedup,
    )
    if args.preempt_window is None:
        args.preempt_window = max(1.0, workload.ideal_s(args.workers * args.cores) / 2)
    else:
        args.preempt_window /= args.speedup
    args.replace_after /= args.speedup
    results = []
    if args.system in ("daskvine_py", "both"):
        results.append(run_daskvine(workload, args))
    if args.system in ("distributed", "both"):
        results.append(run_distributed(workload, args))
    for result in results:
        print(json.dumps(result))
    if len(results) == 2 and all(r.get("makespan_s") for r in results):
        ours, theirs = results[0]["makespan_s"], results[1]["makespan_s"]
        print(
            f"makespan: daskvine_py {ours:.2f} s, distributed {theirs:.2f} s, "
            f"ratio {theirs / ours:.2f}x; ideal {results[0]['ideal_s']:.2f} s"
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results if len(results) > 1 else results[0], file, indent=1)
    # The swarm's workers are honest: an ejection or a call without its inputs is a
    # scheduler's bug, whatever the result.
    clean = all(not r.get("ejected") and not r.get("missing_inputs") for r in results)
    return 0 if clean and all(r.get("result_ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
