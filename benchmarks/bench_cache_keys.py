"""What hashing costs: the cache keys of the harness's workloads, timed alone.

    python benchmarks/bench_cache_keys.py [--only noop-dict,chain,...] [--repeat 5] [--smoke]

For each workload, the graph ``get`` receives is captured (through Dask, as the harness
runs it), planned once (``graph.build_plan``), then keyed ``--repeat`` times with a fresh
``cache.keys.KeyMaker`` each (the code digests kept, as a manager keeps them): the median
seconds, per task. ``bench_cache_overhead.py`` gives the run times to set them against.
Nothing is computed; every repeat must give the same keys, and at least one task must be
cacheable, or it exits non-zero. ``--smoke`` (a test that it still runs): the harness's
smoke sizes, keyed twice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import workloads as w
from daskvine_py.cache.keys import KeyMaker, code_digests, task_keys
from daskvine_py.plan.annotations import annotated_off
from daskvine_py.plan.graph import build_plan
from daskvine_py.wire.serialize import TaskEncoder


class _Captured(Exception):
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="noop-dict,chain,tree10k,array,dataframe")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, twice: still runs?")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 2
    workloads = w.workloads("smoke" if args.smoke else "full")
    digests = code_digests()
    print(f"{'workload':12s} {'tasks':>7s} {'keys s':>8s} {'µs/task':>8s}")
    for name in args.only.split(","):
        workload = workloads[name]
        captured: dict[str, Any] = {}

        def get(dsk: Any, keys: Any, captured: dict = captured, **kwargs: Any) -> Any:
            captured["plan"] = build_plan(dsk, keys)
            captured["dsk"] = dsk
            raise _Captured

        try:
            workload.call(get, workload.make())
        except _Captured:
            pass
        plan, dsk = captured["plan"], captured["dsk"]
        times = []
        first = None
        for _ in range(args.repeat):
            started = time.perf_counter()
            keys = task_keys(plan, KeyMaker(TaskEncoder(), digests), annotated_off(dsk))
            times.append(time.perf_counter() - started)
            if first is None:
                first = keys
            elif keys != first:
                raise AssertionError(f"{name}: the same plan keyed twice gave other keys")
        if first is None or not any(first.values()):
            raise AssertionError(f"{name}: no task got a cache key")
        median = statistics.median(times)
        print(f"{name:12s} {len(plan):7,d} {median:8.4f} {1e6 * median / len(plan):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
