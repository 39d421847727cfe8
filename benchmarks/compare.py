"""Side-by-side wall time of daskvine_py, dask.distributed and Dask's local schedulers.

    python benchmarks/compare.py [--repeat 3] [--workers 2] [--json out.json]

Every scheduler runs the same graphs on the same cores in the same run; every result is
checked against Dask's synchronous scheduler. Prints the median time of ``--repeat`` runs,
tasks/s, and daskvine_py's speed-up over each peer. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import dask
import dask.array as da
import dask.bag as db


def inc(x: int) -> int:
    return x + 1


def workloads() -> dict[str, Callable[[], object]]:
    def chain():
        dsk = {"x0": 0, **{f"x{i}": (inc, f"x{i - 1}") for i in range(1, 2000)}}
        return dsk, "x1999"

    def tree10k():
        return db.from_sequence(range(10_000), npartitions=1_000).map(inc).sum()

    def array():
        x = da.random.default_rng(0).random((4000, 4000), chunks=250)
        return (x + x.T).mean(axis=0).sum()

    return {"chain2000": chain, "tree10k": tree10k, "array": array}


def count_tasks(obj: object) -> int:
    if isinstance(obj, tuple):
        return len(obj[0])
    return len(dict(obj.__dask_graph__()))


def run(obj: object, get: Callable) -> object:
    if isinstance(obj, tuple):
        dsk, key = obj
        return get(dsk, key)
    return dask.compute(obj, scheduler=get)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="one-core workers per system")
    parser.add_argument("--json", default=None, help="also write the table as JSON here")
    args = parser.parse_args()

    import dask.threaded
    from dask.local import get_sync
    from distributed import Client, LocalCluster

    from daskvine_py import Manager

    results: dict[str, dict[str, float]] = {}
    with (
        Manager() as manager,
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,  # fmt: skip
        Client(cluster) as client,
    ):
        manager.start_workers(args.workers, cores=1)
        systems = {
            "daskvine_py": manager.get,
            "distributed": client.get,
            "sync": get_sync,
            "threads": dask.threaded.get,
        }
        for name, make in workloads().items():
            obj = make()
            expected = run(obj, get_sync)
            ntasks = count_tasks(obj)
            results[name] = {"tasks": ntasks}
            for system, get in systems.items():
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    got = run(obj, get)
                    times.append(time.perf_counter() - start)
                    if got != expected:
                        raise AssertionError(
                            f"{system} computed {got!r} for {name}, not {expected!r}"
                        )
                results[name][system] = statistics.median(times)

    systems = ["daskvine_py", "distributed", "sync", "threads"]
    print(
        f"{'workload':<10} {'tasks':>6} "
        + " ".join(f"{s + ' s':>14}" for s in systems)
        + "   daskvine_py vs distributed"
    )
    for name, row in results.items():
        cells = " ".join(f"{row[s]:>14.3f}" for s in systems)
        ratio = row["distributed"] / row["daskvine_py"]
        rate = row["tasks"] / row["daskvine_py"]
        print(f"{name:<10} {row['tasks']:>6} {cells}   {ratio:5.2f}x faster ({rate:,.0f} tasks/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
