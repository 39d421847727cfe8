"""Issue 17: reruns with the result cache, timed, three runs per workload.

    python benchmarks/bench_cache.py coffea SAMPLES_DIR [--copies 100] [--chunksize 20]
    python benchmarks/bench_cache.py array [--size 6000] [--chunks 500]
    python benchmarks/bench_cache.py --smoke     # array, 200x200 in chunks of 50, once
    python benchmarks/bench_cache.py coffea --smoke [SAMPLES_DIR]

One manager with ``--workers`` one-core workers, ``get(..., cache=True)``:

1. the first run (the cache empty), with and without the cache, ``--firsts`` times each,
   alternated: what hashing and keeping results cost a first run;
2. the same analysis rebuilt and run again, unchanged;
3. again with only the last stage changed: the mass histogram's binning (coffea), the
   final reduction (array).

Each run's result is checked against Dask's synchronous scheduler. Printed: wall seconds,
the share of the first run with the cache, tasks run, and the cache's numbers
(``last_run.cache``). A warm-up on other data first imports what the tasks need.
``coffea`` is ``examples/coffea_analysis.py``'s dimuon analysis on coffea's real NanoAOD
samples (see ``bench_coffea_dask.py``). ``--smoke`` (a test that the script still runs,
numbers meaningless) runs ``array`` (unless another workload is named) at a tiny size with
one first run each way, and ``coffea`` on one copy of each sample in chunks of 100 events,
on small samples of its own when none are given (``bench_coffea_dask.write_samples``). A
result that differs from the sync scheduler's exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import dask

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


def coffea_workload(args: argparse.Namespace, scratch: str) -> tuple[Callable, Callable, Any]:
    from coffea import processor
    from coffea.dataset_tools import DataGroupSpec, apply_to_fileset, preprocess
    from coffea.nanoevents import NanoAODSchema

    from coffea_analysis import DimuonAnalysis, same_output

    samples, schema = args.samples, NanoAODSchema
    if samples is None:  # --smoke: small samples of our own, without the collections they lack
        from bench_coffea_dask import write_samples
        from coffea_analysis import SmallNanoAODSchema

        samples, schema = os.path.join(scratch, "samples"), SmallNanoAODSchema
        os.mkdir(samples)
        write_samples(samples)

    def fileset(prefix: str, copies: int) -> Any:
        files: dict[str, dict[str, str]] = {}
        for name in ("nano_dy", "nano_dimuon"):
            source = os.path.join(samples, f"{name}.root")
            for i in range(copies):
                path = os.path.join(scratch, f"{prefix}{name}_{i}.root")
                os.symlink(source, path)
                files.setdefault(name, {})[path] = "Events"
        spec = DataGroupSpec.model_validate({n: {"files": f} for n, f in files.items()})
        return preprocess(spec, step_size=args.chunksize, scheduler="sync")[0]

    available = fileset("", args.copies)
    warm = fileset("warm-", 1)

    def build(bins: int, which: Any = None) -> Any:
        analysis = DimuonAnalysis(dask=True, mass_bins=bins)
        return apply_to_fileset(analysis, available if which is None else which, schema)

    def same(a: Any, b: Any) -> bool:
        return same_output(processor.accumulate(a.values()), processor.accumulate(b.values()))

    return build, same, lambda: build(120, warm)


def array_workload(args: argparse.Namespace, scratch: str) -> tuple[Callable, Callable, Any]:
    import dask.array as da
    import numpy as np

    def build(last: str, size: int = args.size) -> Any:
        x = da.random.default_rng(7).random((size, size), chunks=args.chunks)
        normal = (x - x.mean(axis=0)) / x.std(axis=0)
        smooth = (normal[1:, :] + normal[:-1, :]) / 2
        squared = smooth**2
        return squared.sum(axis=1) if last == "sum" else squared.max(axis=1)

    def same(a: Any, b: Any) -> bool:
        return bool(np.allclose(a, b))

    return build, same, lambda: build("sum", args.chunks * 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", nargs="?", choices=("coffea", "array"))
    parser.add_argument("samples", nargs="?", help="coffea: the directory of the samples")
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--chunksize", type=int, default=20)
    parser.add_argument("--size", type=int, default=6000, help="array: rows and columns")
    parser.add_argument("--chunks", type=int, default=500, help="array: chunk edge")
    parser.add_argument("--workers", type=int, default=2, help="one-core workers")
    parser.add_argument(
        "--firsts", type=int, default=3, help="first runs with and without the cache, each"
    )
    parser.add_argument(
        "--worker-bytes", type=int, default=None, help="Manager(cache_worker_bytes=...)"
    )
    parser.add_argument("--smoke", action="store_true", help="array, tiny, once: still runs?")
    args = parser.parse_args()
    if args.smoke:
        args.workload = args.workload or "array"
        args.size, args.chunks, args.firsts, args.copies, args.chunksize = 200, 50, 1, 1, 100
    if args.workload is None:
        parser.error("name a workload: coffea or array")
    if args.workload == "coffea" and not args.samples and not args.smoke:
        parser.error("coffea needs SAMPLES_DIR")

    from daskvine_py import Manager

    with tempfile.TemporaryDirectory() as scratch:
        workload = coffea_workload if args.workload == "coffea" else array_workload
        build, same, warm = workload(args, scratch)
        first, changed = (120, 240) if args.workload == "coffea" else ("sum", "max")
        settings = {} if args.worker_bytes is None else {"cache_worker_bytes": args.worker_bytes}
        with Manager(**settings) as manager:
            manager.start_workers(args.workers, cores=1)
            dask.compute(warm(), scheduler=manager.get)  # imports, in every library
            rows = []
            references: dict[Any, Any] = {}

            def run(label: str, stage: Any, cache: bool) -> float:
                graph = build(stage)
                if stage not in references:
                    (references[stage],) = dask.compute(graph, scheduler="sync")
                reference = references[stage]
                wall = time.perf_counter()
                (got,) = dask.compute(graph, scheduler=manager.get, cache=cache)
                elapsed = time.perf_counter() - wall
                if not same(got, reference):
                    raise AssertionError(f"{label}: differs from the sync scheduler's result")
                info = manager.last_run
                rows.append((label, elapsed, info.tasks, info.cache))
                return elapsed

            # First runs with and without the cache, alternated (the cache emptied before
            # each): the medians, so that the host's drift falls on both.
            firsts: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.firsts):
                for cache in (False, True) if i % 2 == 0 else (True, False):
                    manager.cache.clear()
                    firsts[cache].append(run(f"first run, cache={cache}", first, cache))
            first_rows = rows[:]
            rows.clear()
            for cache in (False, True):
                times = sorted(firsts[cache])
                label, _, tasks, info = next(r for r in first_rows if r[0].endswith(str(cache)))
                median = times[len(times) // 2]
                rows.append((f"{label} (median of {len(times)})", median, tasks, info))
            base = rows[-1][1]
            run("rerun, unchanged", first, True)
            run("rerun, last stage changed", changed, True)

    print(f"{args.workload}: {args.workers} one-core workers, {os.cpu_count()} cores")
    print(
        f"{'run':40s} {'wall s':>8s} {'of 1st':>7s} {'tasks':>6s} {'run':>6s} "
        f"{'hits':>6s} {'reused':>9s} {'saved s':>8s}"
    )
    for label, elapsed, tasks, cache in rows:
        cache = cache or {}
        print(
            f"{label:40s} {elapsed:8.2f} {elapsed / base:7.0%} {tasks:6d} "
            f"{cache.get('tasks_run', tasks):6d} {cache.get('hits', 0):6d} "
            f"{cache.get('bytes_reused', 0):9,d} {cache.get('seconds_saved', 0.0):8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
