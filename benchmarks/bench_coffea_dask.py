"""The Coffea Dask path on real NanoAOD: daskvine_py against Dask's sync scheduler and
dask.distributed, on the same cores, in the same run.

    python benchmarks/bench_coffea_dask.py SAMPLES_DIR [--copies 100] [--chunksize 20]
    python benchmarks/bench_coffea_dask.py --smoke [SAMPLES_DIR]   # does it still run?

``SAMPLES_DIR`` holds ``nano_dy.root`` and ``nano_dimuon.root`` from coffea's sdist
(``pip download --no-binary :all: --no-deps coffea``, then ``tests/samples/``). Each is
linked ``--copies`` times, so the graph has many small partitions, as a real fileset
does. ``examples/coffea_analysis.py``'s dimuon analysis (dask-awkward, hist.dask) is built
once and computed by each system; every result is checked against the sync scheduler's.

Prints wall seconds, the CPU seconds of the processes that run tasks (this process for
sync; the library processes for daskvine_py; the worker processes for distributed), and
daskvine_py's serialization share (``manager.last_run``). A result that differs from the
sync scheduler's exits non-zero.

``--smoke`` (a test that it still runs, numbers meaningless): two copies of each sample in
chunks of 100 events; without ``SAMPLES_DIR``, the samples are two small files written
like ``examples/coffea_analysis.py``'s own (``write_nanoaod``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


def cpu_of(pids: list[int]) -> float:
    """User + system seconds of these processes and all their descendants, now."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for each in procs:
            try:
                times = each.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


def write_samples(directory: str, events: int = 400) -> None:
    """``nano_dy.root`` and ``nano_dimuon.root``, small and NanoAOD-like, in ``directory``."""
    from coffea_analysis import write_nanoaod

    write_nanoaod(os.path.join(directory, "nano_dy.root"), events, 1, 0.7, 20.0)
    write_nanoaod(os.path.join(directory, "nano_dimuon.root"), events, 2, 0.3, 40.0)


def build(
    samples: str | Mapping[str, Sequence[str]],
    copies: int,
    chunksize: int,
    scratch: str,
    schema: Any = None,
) -> Any:
    """The analysis's graphs. ``samples``: the directory of ``nano_dy.root`` and
    ``nano_dimuon.root``, each linked ``copies`` times into ``scratch``; or a fileset
    ``{dataset: [path or URL, ...]}`` (``root://`` URLs, say), taken as it is."""
    from coffea.dataset_tools import DataGroupSpec, apply_to_fileset, preprocess
    from coffea.nanoevents import NanoAODSchema

    from coffea_analysis import DimuonAnalysis

    fileset: dict[str, dict[str, str]] = {}
    if isinstance(samples, str):
        for name in ("nano_dy", "nano_dimuon"):
            source = os.path.join(samples, f"{name}.root")
            files = fileset.setdefault(name, {})
            for i in range(copies):
                path = os.path.join(scratch, f"{name}_{i}.root")
                os.symlink(source, path)
                files[path] = "Events"
    else:
        fileset = {name: dict.fromkeys(files, "Events") for name, files in samples.items()}
    spec = DataGroupSpec.model_validate({n: {"files": f} for n, f in fileset.items()})
    available, _ = preprocess(spec, step_size=chunksize, scheduler="sync")
    return apply_to_fileset(DimuonAnalysis(dask=True), available, schema or NanoAODSchema)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?")
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--chunksize", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="one-core workers")
    parser.add_argument("--no-distributed", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny, once: does it still run?")
    args = parser.parse_args()
    if args.smoke:
        args.copies, args.chunksize = 2, 100
    elif not args.samples:
        parser.error("SAMPLES_DIR is needed (or --smoke, which can write its own)")

    import dask
    from coffea import processor

    from coffea_analysis import same_output
    from daskvine_py import Manager

    with tempfile.TemporaryDirectory() as scratch:
        samples, schema = args.samples, None
        if samples is None:  # --smoke: samples of our own, without the collections they lack
            from coffea_analysis import SmallNanoAODSchema

            samples, schema = os.path.join(scratch, "samples"), SmallNanoAODSchema
            os.mkdir(samples)
            write_samples(samples)
        graphs = build(samples, args.copies, args.chunksize, scratch, schema)

        def merged(per_dataset: dict) -> dict:
            return processor.accumulate(per_dataset.values())

        rows = []
        cpu = time.process_time()
        wall = time.perf_counter()
        (reference,) = dask.compute(graphs, scheduler="sync")
        rows.append(("sync", time.perf_counter() - wall, time.process_time() - cpu, ""))
        reference = merged(reference)

        with Manager() as manager:
            procs = manager.start_workers(args.workers, cores=1)
            pids = [p.pid for p in procs]
            dask.compute(graphs, scheduler=manager.get)  # warm: imports in the libraries
            cpu = cpu_of(pids)
            wall = time.perf_counter()
            (got,) = dask.compute(graphs, scheduler=manager.get)
            elapsed = time.perf_counter() - wall
            used = cpu_of(pids) - cpu
            run = manager.last_run
            tasks = run.tasks
            serialization = getattr(run, "serialization_seconds", None)  # older checkouts
            note = ""
            if serialization is not None:
                share = serialization / max(1e-9, serialization + run.run_seconds)
                note = f"serialization {serialization:.2f} s ({100 * share:.1f}% of run + it)"
            if not same_output(merged(got), reference):
                raise AssertionError("daskvine_py's result differs from the sync scheduler's")
            rows.append(("daskvine_py", elapsed, used, note))

        if not args.no_distributed:
            from distributed import Client, LocalCluster

            with (
                LocalCluster(
                    n_workers=args.workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                ) as cluster,
                Client(cluster) as client,
            ):
                dask.compute(graphs, scheduler=client.get)
                pids = [w.pid for w in cluster.workers.values()]
                cpu = cpu_of(pids)
                wall = time.perf_counter()
                (got,) = dask.compute(graphs, scheduler=client.get)
                elapsed = time.perf_counter() - wall
                used = cpu_of(pids) - cpu
                if not same_output(merged(got), reference):
                    raise AssertionError("distributed's result differs from the sync scheduler's")
                rows.append(("distributed", elapsed, used, ""))

    sync_wall, sync_cpu = rows[0][1], rows[0][2]
    print(
        f"{tasks} tasks (daskvine_py's plan); {args.copies} copies of each sample, chunks of "
        f"{args.chunksize} events; {args.workers} one-core workers; {os.cpu_count()} cores"
    )
    print(f"{'system':12s} {'wall s':>8s} {'sync/wall':>10s} {'task CPU s':>11s} {'CPU/sync':>9s}")
    for name, wall, used, note in rows:
        print(
            f"{name:12s} {wall:8.2f} {sync_wall / wall:10.2f} {used:11.2f} "
            f"{used / sync_cpu:9.2f}  {note}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
