"""Memory-hungry and small tasks mixed on two workers: sizing on against one task per core.

    python benchmarks/bench_resources.py [--hungry 16] [--small 48] [--hungry-mb 600]
                                         [--small-mb 10] [--seconds 1.0] [--memory-mb 2000]
                                         [--modes max,fixed] [--smoke]

Two workers of ``--cores 4`` and ``--memory`` ``--memory-mb``: sized so that four hungry
tasks cannot fit at once. Each hungry task fills ``--hungry-mb`` of memory and holds it
for ``--seconds``; each small one ``--small-mb`` for a fifth of that. For each mode of
``Manager(sizing=...)`` given (``max``: every category sized from its measured tasks;
``fixed``: no allocations, one task per core, as before sizing) it prints the total time,
each worker's peak resident memory above its idle size (the worker and its libraries
together, sampled every 10 ms from ``/proc``; ``--memory`` counts growth, not the
processes' own start) against its limit, the workers lost, the tasks stopped past their
allocation, each category's measured peak against what its tasks allocated, and whether
the result equals Dask's synchronous scheduler's. Last, one task that allocates more than
a whole worker: the run must fail with ``ResourceExhausted`` naming it.
``--smoke``: small sizes (a test that it still runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import dask

import daskvine_py
from daskvine_py import Manager

MB = 2**20


def hungry(i: int, mb: int, seconds: float) -> int:
    """Hold ``mb`` MB of touched memory for ``seconds``; a small checksum."""
    block = bytearray(mb * MB)
    for at in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[at] = 1
    time.sleep(seconds)
    return i + block.count(1) // (mb * MB // 4096 or 1)


def small(i: int, mb: int, seconds: float) -> int:
    return hungry(i, mb, seconds)


def total(*parts: int) -> int:
    return sum(parts)


def graph(args: argparse.Namespace) -> tuple[dict[Any, Any], str]:
    dsk: dict[Any, Any] = {}
    keys = []
    for i in range(max(args.hungry, args.small)):
        if i < args.hungry:
            dsk[("hungry", i)] = (hungry, i, args.hungry_mb, args.seconds)
            keys.append(("hungry", i))
        for j in range(args.small // max(args.hungry, 1) or 1):
            n = i * (args.small // max(args.hungry, 1) or 1) + j
            if n < args.small:
                dsk[("small", n)] = (small, n, args.small_mb, args.seconds / 5)
                keys.append(("small", n))
    dsk["total"] = (total, *keys)
    return dsk, "total"


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    rss, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        one = todo.pop()
        todo.extend(children.get(one, ()))
        try:
            with open(f"/proc/{one}/statm", "rb") as f:
                rss += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return rss


class Sampler:
    """Each worker's peak resident memory (its process tree), sampled every 10 ms."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peaks = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for name, pid in self.pids.items():
                self.peaks[name] = max(self.peaks[name], tree_rss(pid))

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def run_mode(mode: str, args: argparse.Namespace, expected: int) -> None:
    dsk, key = graph(args)
    with Manager(sizing=mode) as manager:
        manager.start_workers(2, cores=4, memory=args.memory_mb)
        pids = {name: info["pid"] for name, info in manager.workers.items()}
        idle = {name: tree_rss(pid) for name, pid in pids.items()}  # what --memory leaves out
        sampler = Sampler(pids)
        start = time.perf_counter()
        error = ""
        try:
            got = manager.get(dsk, key)
        except Exception as exc:  # what a user would see: reported, not hidden
            got, error = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        peaks = sampler.stop()
        lost = [name for name in pids if name not in manager.workers]
        run = manager.last_run
        print(
            f"\nmode {mode}: {seconds:.1f} s, result "
            f"{'right' if got == expected else 'WRONG ' + error[:200]}"
        )
        for name, peak in peaks.items():
            grew = peak - idle[name]
            over = "OVER its limit" if grew > args.memory_mb * MB else "under its limit"
            print(
                f"  {name}: peak {grew / MB:.0f} MB above idle ({idle[name] / MB:.0f} MB) "
                f"of --memory {args.memory_mb} MB ({over})"
            )
        print(f"  workers lost: {len(lost)}")
        for name, cat in sorted(run.categories.items()):
            print(
                f"  category {name}: {cat.tasks} tasks, peak {cat.peak_memory_mb:.0f} MB, "
                f"allocated {cat.allocated_memory_mb:.0f} MB, "
                f"exhausted {cat.exhausted}"
            )


def too_big(args: argparse.Namespace) -> None:
    dsk = {"whale": (hungry, 0, args.memory_mb + args.memory_mb // 4, 0.0)}
    with Manager() as manager:
        manager.start_workers(1, cores=2, memory=args.memory_mb)
        try:
            manager.get(dsk, "whale")
        except daskvine_py.ResourceExhausted as exc:
            print(f"\na task larger than a worker: ResourceExhausted: {exc}")
        else:
            print("\na task larger than a worker: NOT refused")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hungry", type=int, default=16)
    parser.add_argument("--small", type=int, default=48)
    parser.add_argument("--hungry-mb", type=int, default=600)
    parser.add_argument("--small-mb", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--memory-mb", type=int, default=2000)
    parser.add_argument("--modes", default="max,fixed")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hungry, args.small, args.hungry_mb, args.small_mb = 4, 8, 120, 5
        args.seconds, args.memory_mb = 0.2, 400
    # The reference without the waits (the results do not depend on them).
    dsk, key = graph(argparse.Namespace(**{**vars(args), "seconds": 0.0}))
    expected = dask.get(dsk, key)
    for mode in args.modes.split(","):
        run_mode(mode, args, expected)
    too_big(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
