"""What ``cache=True`` costs a first run, on the harness's workloads, interleaved.

    python benchmarks/bench_cache_overhead.py [--only noop-dict,chain,...] [--rounds 11]
                                              [--smoke]

One manager with two one-core workers. For each workload, ``--rounds`` rounds each run it
once without the cache and once with it (the cache emptied before every run, so each is a
first run: every task hashed, every result kept, and the workers given ``SETTLE`` seconds
to drop what it held), alternating which goes first; printed:
the median of each side and their ratio. ``harness.py --cache`` measures the same
variant one system after the other, which a drifting host skews more than this.
Every result is checked against Dask's synchronous scheduler (computed once per workload,
untimed); a wrong one exits non-zero. ``--smoke`` (a test that it still runs, numbers
meaningless): the harness's smoke sizes, one round, no settling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from dask.local import get_sync

import workloads as w
from daskvine_py import Manager

#: Seconds between emptying the cache and the next run.
SETTLE = 0.3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="noop-dict,chain,tree10k,array,dataframe")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, once: still runs?")
    args = parser.parse_args()
    settle = SETTLE
    if args.smoke:
        args.rounds, settle = 1, 0.0
    workloads = w.workloads("smoke" if args.smoke else "full")
    print(f"{'workload':12s} {'off s':>8s} {'on s':>8s} {'on/off':>7s}")
    with Manager() as manager:
        manager.start_workers(2, cores=1)

        # Runs with the cache do not fuse chains (``get(fuse=None)``): neither side fuses
        # here, so the difference is the cache's.
        def cached(*a: Any, **k: Any) -> Any:
            return manager.get(*a, cache=True, fuse=False, **k)

        def uncached(*a: Any, **k: Any) -> Any:
            return manager.get(*a, fuse=False, **k)

        for name in args.only.split(","):
            workload = workloads[name]
            graph = workload.make()
            expected = workload.call(get_sync, graph)
            _, got = workload.measure(uncached, graph)  # warm: imports, in every library
            if not w.same(got, expected):
                raise AssertionError(f"{name}: differs from the sync scheduler's result")
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.rounds):
                for cache in (False, True) if i % 2 == 0 else (True, False):
                    manager.cache.clear()
                    # Workers drop what the cache held as they read the release: let them
                    # finish before the clock starts, or the next run (either side) pays.
                    time.sleep(settle)
                    seconds, got = workload.measure(cached if cache else uncached, graph)
                    if not w.same(got, expected):
                        raise AssertionError(f"{name}, cache={cache}: differs from sync")
                    times[cache].append(seconds)
            off, on = statistics.median(times[False]), statistics.median(times[True])
            print(f"{name:12s} {off:8.4f} {on:8.4f} {on / off:7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
