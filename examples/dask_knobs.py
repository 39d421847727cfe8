"""Dask's own knobs with manager.get: annotations, dask.config defaults and callbacks.

Two local workers, one of one core and one of two. A few "fit" tasks need two cores each
(``dask.annotate(resources=...)``) and run alone on the two-core worker; the "summary"
task jumps the queue (``priority``); every run may retry crashed tasks five times (a
``dask.config`` default); ``ProgressBar`` and ``Profiler`` from ``dask.diagnostics``
watch the run. The result is checked against Dask's synchronous scheduler.
"""

from __future__ import annotations

import time
from collections import Counter

import dask
from dask.diagnostics import Profiler, ProgressBar
from dask.utils import key_split

from daskvine_py import Manager


def load(i: int) -> list[int]:
    time.sleep(0.02)
    return list(range(i, i + 100))


def fit(part: list[int]) -> float:
    time.sleep(0.1)  # pretend to use both cores
    return sum(part) / len(part)


def summarize(parts: list[list[int]]) -> int:
    return sum(len(p) for p in parts)


def build() -> dask.delayed:
    parts = [dask.delayed(load)(i) for i in range(16)]
    with dask.annotate(resources={"cores": 2}, retries=1):
        fits = [dask.delayed(fit)(part) for part in parts[:4]]
    with dask.annotate(priority=10):
        summary = dask.delayed(summarize)(parts)
    return dask.delayed(combine)(fits, summary)


def combine(fits: list[float], n: int) -> tuple[float, int]:
    return round(sum(fits), 3), n


def main() -> None:
    graph = build()
    dask.config.set({"daskvine_py.get.retries": 5})  # the default of every get from now on
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        manager.start_workers(1, cores=2)
        with ProgressBar(), Profiler() as profiler:
            (result,) = dask.compute(graph, scheduler=manager.get)
        print("retries of this run:", manager.last_run.options["retries"])
    (expected,) = dask.compute(graph, scheduler="sync")
    print(f"result = {result} (synchronous scheduler: {expected})")
    where = Counter((key_split(r.key), r.worker_id) for r in profiler.results)
    for (kind, worker), n in sorted(where.items()):
        print(f"{n:3d} {kind} tasks ran on {worker}")


if __name__ == "__main__":
    main()
