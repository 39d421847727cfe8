"""One tiny task through ``get`` and through ``dask.compute``: the latency, and where its
CPU goes, thread by thread (issue 41, goal "one-task ``compute`` ≤ 2× sync").

    python benchmarks/bench_latency.py [--calls 2000] [--workers 2] [--smoke]

A manager with ``--workers`` local one-core workers runs ``--calls`` calls of a one-task
graph, each way, after a warm-up; Dask's synchronous scheduler runs the same calls in the
same process right after (its ``compute`` is the limit to approach: nothing crosses a
thread). Printed: the median call of each, the ratio, and for the ``get`` calls the CPU
time per call of every thread of every process involved, read from ``/proc`` before and
after (the caller's thread, the manager's I/O thread, ZeroMQ's I/O threads, each
worker's main thread, the libraries), counted in the kernel's ticks (10 ms: over 2,000
calls of about 1 ms, some 5 µs per call). A one-task call is a chain of wake-ups across
those threads and processes: what each costs, and how many there are, is what the
latency is made of. ``--smoke``: a few calls, a test that it still runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import dask

from workloads import inc  # (beside this file: a function of a module, as users' are)

#: The kinds of thread, by the name the kernel has for them (``/proc/.../comm``).
_ZMQ = "ZMQbg/"
_TICKS = os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (thread name, CPU seconds so far) of every thread of ``pid``."""
    found: dict[tuple[int, int], tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:  # (gone meanwhile)
            continue
        found[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / _TICKS)
    return found


def _children(pid: int) -> list[int]:
    """Every process below ``pid``, from ``/proc``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    below, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, p in parents.items() if p == parent]
        below += kids
        frontier += kids
    return below


def _role(pid: int, tid: int, me: int, name: str, io_thread: int | None) -> str:
    """What a thread is, for the table (read while its process lives)."""
    if name.startswith(_ZMQ):
        where = "caller's process" if pid == me else "workers"
        return f"ZeroMQ I/O threads ({where})"
    main_thread = pid == tid
    if pid == me:
        if tid == io_thread:
            return "manager's I/O thread"
        return "caller's thread" if main_thread else "caller's process, other threads"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode()
    except OSError:
        command = ""
    if "-m daskvine_py.worker" in command:
        return "workers' main threads" if main_thread else f"workers: {name}"
    return "libraries"


def _median_call(call: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few calls: does it run?")
    args = parser.parse_args(argv)
    calls = 20 if args.smoke else args.calls
    from daskvine_py import Manager

    graph = {"x": (inc, 1)}
    delayed = dask.delayed(inc)(1)
    me = os.getpid()
    with Manager() as manager:
        manager.start_workers(args.workers, cores=1, timeout=120)
        get = manager.get
        for _ in range(max(10, calls // 10)):  # warm: functions sent, imports done
            assert get(graph, "x") == 2
        pids = [me, *_children(me)]
        before: dict[tuple[int, int], tuple[str, float]] = {}
        for pid in pids:
            before.update(_thread_cpu(pid))
        start = time.perf_counter()
        got = _median_call(lambda: get(graph, "x"), calls)
        wall = (time.perf_counter() - start) / calls
        after: dict[tuple[int, int], tuple[str, float]] = {}
        for pid in pids:
            after.update(_thread_cpu(pid))
        io_thread = next(
            (t.native_id for t in threading.enumerate() if t.name == "daskvine-manager"), None
        )
        roles = {key: _role(*key, me, name, io_thread) for key, (name, _) in after.items()}
        computed = _median_call(lambda: dask.compute(delayed, scheduler=get), calls)
        assert dask.compute(delayed, scheduler=get) == (2,)
    sync_get = _median_call(lambda: dask.get(graph, "x"), calls)
    sync_compute = _median_call(lambda: dask.compute(delayed, scheduler="sync"), calls)
    assert dask.compute(delayed, scheduler="sync") == (2,)

    print(f"one-task latency, median of {calls:,} calls ({args.workers} one-core workers)")
    print(f"{'call':10} {'daskvine_py':>12} {'sync':>10} {'ratio':>8}")
    for name, ours, theirs in (("get", got, sync_get), ("compute", computed, sync_compute)):
        print(f"{name:10} {ours * 1e3:9.3f} ms {theirs * 1e3:7.3f} ms {ours / theirs:7.2f}x")
    per_role: dict[str, float] = {}
    for key, (name, seconds) in after.items():
        used = seconds - before.get(key, (name, 0.0))[1]
        per_role[roles[key]] = per_role.get(roles[key], 0.0) + used
    print(f"CPU per get call, by thread (µs; wall {wall * 1e6:,.0f} µs per call, mean):")
    total = 0.0
    for role, seconds in sorted(per_role.items(), key=lambda item: -item[1]):
        print(f"  {role:36} {seconds / calls * 1e6:8.1f}")
        total += seconds
    print(f"  {'all of them':36} {total / calls * 1e6:8.1f}")


if __name__ == "__main__":
    main()
