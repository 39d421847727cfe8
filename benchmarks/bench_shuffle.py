"""Shuffles: daskvine_py against ``distributed.LocalCluster`` in the same run.

Two workloads, each checked against Dask's synchronous scheduler:

- ``rechunk``: a seeded ``size x size`` array in row chunks rechunked into column chunks,
  then each column sorted (which needs whole columns); the middle row comes back.
- ``set_index``: a seeded dataframe shuffled by ``set_index("key")`` with a task-based
  shuffle into known divisions; per-partition key range, row count and value sum come back.

For each system it reports the median wall time of ``--repeat`` runs and the bytes moved:
for daskvine_py ``last_run.transfers`` (per source and destination, the manager included),
for distributed the growth of its workers' ``transfer_outgoing_bytes_total`` (to peers
and to the client). Prints a table, the daskvine_py (source, destination) matrices and
one JSON line.

    python benchmarks/bench_shuffle.py                       # 2000x2000, 2 workers
    python benchmarks/bench_shuffle.py --size 400 --repeat 1 # a quick check
    python benchmarks/bench_shuffle.py --smoke               # does it still run? (seconds)

A result that differs from the synchronous scheduler's exits non-zero. ``--smoke``: a
100x100 array in chunks of 25, 2,000 rows in 4 partitions, one run per system.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import dask
import numpy as np
import pandas as pd

# -- workloads -------------------------------------------------------------------------


def rechunk_workload(size: int, chunk: int) -> Any:
    import dask.array as da

    x = da.random.default_rng(0).random((size, size), chunks=(chunk, size))
    y = x.rechunk((size, chunk))
    return y.map_blocks(np.sort, axis=0)[size // 2]


def partition_stats(part: pd.DataFrame) -> pd.DataFrame:
    index = part.index
    return pd.DataFrame(
        {
            "min_key": [index.min() if len(part) else -1],
            "max_key": [index.max() if len(part) else -1],
            "rows": [len(part)],
            "value_sum": [float(part["value"].sum())],
        }
    )


def set_index_workload(rows: int, partitions: int) -> Any:
    import dask.dataframe as dd

    per = rows // partitions

    def make(seed: int) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        return pd.DataFrame({"key": rng.integers(0, 1000, per), "value": rng.random(per)})

    df = dd.from_map(make, list(range(partitions)))
    divisions = list(range(0, 1000, 1000 // partitions)) + [999]
    shuffled = df.set_index("key", divisions=divisions, shuffle_method="tasks")
    meta = partition_stats(pd.DataFrame({"value": []}, index=pd.Index([], name="key")))
    return shuffled.map_partitions(partition_stats, meta=meta)


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, pd.DataFrame):
        got = got.reset_index(drop=True)
        expected = expected.reset_index(drop=True)
        return got.shape == expected.shape and np.allclose(got.values, expected.values)
    return np.allclose(got, expected)


# -- systems ----------------------------------------------------------------------------


def time_runs(
    get: Callable, collection: Any, repeat: int, expected: Any, after: Callable[[], dict]
) -> dict:
    times = []
    moved: dict = {}
    for _ in range(repeat):
        start = time.perf_counter()
        (got,) = dask.compute(collection, scheduler=get)
        times.append(time.perf_counter() - start)
        if not same(got, expected):
            raise AssertionError("result differs from the synchronous scheduler's")
        moved = after()
    return {"seconds": statistics.median(times), "runs": times, **moved}


def run_daskvine(workloads: dict, workers: int, repeat: int, expected: dict) -> dict:
    from daskvine_py import Manager

    results = {}
    with Manager() as manager:
        manager.start_workers(workers, cores=1)

        def moved() -> dict:
            transfers = manager.last_run.transfers
            return {
                "bytes_moved": sum(transfers.values()),
                "matrix": {f"{src} -> {dst}": n for (src, dst), n in sorted(transfers.items())},
            }

        for name, collection in workloads.items():
            results[name] = time_runs(manager.get, collection, repeat, expected[name], moved)
    return results


def run_distributed(workloads: dict, workers: int, repeat: int, expected: dict) -> dict:
    from distributed import Client, LocalCluster

    results = {}
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):

        def counted() -> int:
            per_worker = client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
            return sum(per_worker.values())

        for name, collection in workloads.items():
            before = [counted()]

            def moved(before: list = before) -> dict:
                now = counted()
                grown, before[0] = now - before[0], now
                return {"bytes_moved": grown, "matrix": None}

            results[name] = time_runs(client.get, collection, repeat, expected[name], moved)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2000, help="array side")
    parser.add_argument("--chunk", type=int, default=100, help="rows per chunk, then columns")
    parser.add_argument("--rows", type=int, default=2_000_000, help="dataframe rows")
    parser.add_argument("--partitions", type=int, default=20, help="dataframe partitions")
    parser.add_argument("--workers", type=int, default=2, help="one-core workers per system")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per workload")
    parser.add_argument("--systems", default="daskvine_py,distributed")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, once: still runs?")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.chunk, args.rows, args.partitions, args.repeat = 100, 25, 2_000, 4, 1

    workloads = {
        "rechunk": rechunk_workload(args.size, args.chunk),
        "set_index": set_index_workload(args.rows, args.partitions),
    }
    expected = {n: dask.compute(c, scheduler="sync")[0] for n, c in workloads.items()}
    runners = {"daskvine_py": run_daskvine, "distributed": run_distributed}
    report: dict[str, Any] = {"args": vars(args), "results": {}}
    for system in args.systems.split(","):
        report["results"][system] = runners[system](workloads, args.workers, args.repeat, expected)

    print(f"{'workload':<10} {'system':<12} {'median s':>9} {'MB moved':>9}")
    for system, per_workload in report["results"].items():
        for name, result in per_workload.items():
            mb = result["bytes_moved"] / 2**20
            print(f"{name:<10} {system:<12} {result['seconds']:>9.3f} {mb:>9.1f}")
    for name, result in report["results"].get("daskvine_py", {}).items():
        print(f"\ndaskvine_py {name}: bytes moved per (source -> destination), last run")
        for pair, nbytes in result["matrix"].items():
            print(f"  {pair:<28} {nbytes / 2**20:>9.2f} MB")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
