"""Issue 6: one ``sum`` over many large histograms, with and without tree rewriting.

    python benchmarks/bench_rewrite.py [--tasks 400] [--mb 2] [--scheduler sync|threads|daskvine]
                                       [--workers 2] [--arities none,2,4,8,16] [--repeat 1]
                                       [--smoke]

Each task fills an int64 histogram of ``--mb`` megabytes; one ``sum`` task adds them all up, as
``dask.delayed(sum)(parts)`` writes it. For every arity (``none`` = no rewriting) it prints the
tasks in the graph after rewriting, the wall time of the run and the peak memory traced in this
process, also counted in histograms. Without rewriting the sum must hold every histogram at
once; with a tree, a few arity's worth. The issue's full size is ``--tasks 2000 --mb 8``:
without rewriting that holds 16 GB at once, so try it with ``--arities 2,4,8,16`` first.

A scheduler here is a ``GetWithArity``: ``get(dsk, key, arity)``. Dask's own schedulers do not
rewrite, so ``rewriting(get)`` does it for them before calling them, as ``Manager.get`` will
itself; another scheduler is one more entry in ``SCHEDULERS``. With ``--scheduler daskvine``
the wall time includes starting the workers, and the peak is the busiest worker's.

Every result is compared with the synchronous scheduler's (computed first, untimed, on the
graph rewritten at arity 8 so that it holds a few histograms at a time); a different one
exits non-zero. ``--smoke`` (a test that it still runs, numbers meaningless): 40 histograms
of 10 kB, arities none and 4, on daskvine_py unless ``--scheduler`` names another.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import dask
import dask.threaded
import numpy as np
from dask.local import get_sync

from daskvine_py.plan.graph import build_plan
from daskvine_py.plan.rewrite import DEFAULT_THRESHOLD, rewrite_reductions

#: The arity of the reference run on the synchronous scheduler.
REFERENCE_ARITY = 8

#: ``get(dsk, key, arity)``: computes ``key`` of ``dsk`` with reductions rewritten at ``arity``.
GetWithArity = Callable[[Mapping, Any, int | None], Any]

ARITIES: tuple[int | None, ...] = (None, 2, 4, 8, 16)


def fill_histogram(seed: int, nbins: int) -> np.ndarray:
    """One task's output: ``nbins`` int64 counts from ``nbins`` random entries."""
    rng = np.random.default_rng(seed)
    return np.bincount(rng.integers(0, nbins, size=nbins), minlength=nbins)


def build_graph(tasks: int, nbins: int) -> tuple[dict, str]:
    """``tasks`` histograms reduced by one ``sum``, as ``dask.delayed`` builds it."""
    parts = [
        dask.delayed(fill_histogram)(i, nbins, dask_key_name=f"fill-{i}") for i in range(tasks)
    ]
    total = dask.delayed(sum)(parts, dask_key_name="total")
    return dict(total.__dask_graph__()), "total"


def rewriting(get: Callable[..., Any], threshold: int = DEFAULT_THRESHOLD) -> GetWithArity:
    """A Dask-style ``get(dsk, keys)`` made a ``GetWithArity``: plan, rewrite, then ``get``."""

    def get_with_arity(dsk: Mapping, key: Any, arity: int | None) -> Any:
        plan = build_plan(dsk, [key])
        nodes, _ = rewrite_reductions(
            plan.nodes, plan.dependencies, plan.outputs, arity=arity, threshold=threshold
        )
        return get(nodes, key)

    return get_with_arity


@contextlib.contextmanager
def sync_scheduler(workers: int) -> Iterator[GetWithArity]:
    """Dask's synchronous scheduler: one task at a time in this thread."""
    yield rewriting(get_sync)


@contextlib.contextmanager
def threaded_scheduler(workers: int) -> Iterator[GetWithArity]:
    """Dask's threaded scheduler with ``workers`` threads (numpy releases the GIL)."""
    yield rewriting(functools.partial(dask.threaded.get, num_workers=workers))


class DaskVineGet:
    """``Manager.get`` with ``reduction_arity``, on a fresh manager and workers per run.

    Fresh workers per run, because the peak memory a worker reports (``VmHWM`` of its
    process and of its library processes) is a lifetime maximum. ``peak()`` is the busiest
    worker's: its own peak (the store of results) plus its largest library's (the inputs
    of the task it ran).
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.last_peak = 0

    def __call__(self, dsk: Mapping, key: Any, arity: int | None) -> Any:
        from daskvine_py import Manager

        with Manager(heartbeat_interval=0.2) as manager:
            manager.start_workers(self.workers, cores=1)
            result = manager.get(dsk, key, reduction_arity=arity)
            time.sleep(0.5)  # a heartbeat with each worker's peak memory
            self.last_peak = max(
                info["peak_memory"] + info["peak_library_memory"]
                for info in manager.workers.values()
            )
        return result

    def peak(self) -> int:
        return self.last_peak


@contextlib.contextmanager
def daskvine_scheduler(workers: int) -> Iterator[GetWithArity]:
    """daskvine_py: ``workers`` local one-core workers; it rewrites reductions itself."""
    yield DaskVineGet(workers)


#: name -> (workers -> context manager giving a GetWithArity).
SCHEDULERS: dict[str, Callable[[int], contextlib.AbstractContextManager[GetWithArity]]] = {
    "sync": sync_scheduler,
    "threads": threaded_scheduler,
    "daskvine": daskvine_scheduler,
}


@dataclass(frozen=True)
class Measurement:
    arity: int | None
    tasks: int  # tasks in the graph after rewriting
    wall: float  # seconds
    peak: int  # bytes traced by tracemalloc in this process, numpy buffers included
    result: np.ndarray


def run(
    get: GetWithArity, arity: int | None, *, tasks: int = 400, nbins: int = 262_144
) -> Measurement:
    """Build the graph, run it once with ``get`` at ``arity``, measure time and memory.

    The peak is what ``tracemalloc`` saw in this process (numpy reports its buffers to it):
    the whole run for Dask's local schedulers. A scheduler whose tasks run in other
    processes needs its workers' own peak instead.
    """
    dsk, key = build_graph(tasks, nbins)
    plan = build_plan(dsk, [key])
    ntasks = len(rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs, arity)[0])
    gc.collect()
    tracemalloc.start()
    try:
        start = time.perf_counter()
        result = get(dsk, key, arity)
        wall = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if hasattr(get, "peak"):  # tasks ran in other processes: take their own peak
        peak = get.peak()
    if result.shape != (nbins,) or int(result.sum()) != tasks * nbins:
        raise AssertionError(f"arity {arity}: wrong total {int(result.sum())}")
    return Measurement(arity, ntasks, wall, peak, result)


def parse_arities(text: str) -> list[int | None]:
    return [None if a.strip().lower() == "none" else int(a) for a in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400, help="histograms to sum")
    parser.add_argument("--mb", type=float, default=2.0, help="megabytes per histogram")
    parser.add_argument(
        "--scheduler", choices=sorted(SCHEDULERS), default=None, help="sync (smoke: daskvine)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--arities", type=parse_arities, default=list(ARITIES))
    parser.add_argument("--repeat", type=int, default=1, help="report the median of this many")
    parser.add_argument("--smoke", action="store_true", help="tiny, two arities: still runs?")
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.mb, args.arities, args.repeat = 40, 0.01, [None, 4], 1
    if args.scheduler is None:
        args.scheduler = "daskvine" if args.smoke else "sync"

    nbins = int(args.mb * 2**20) // 8
    size = nbins * 8
    print(
        f"{args.tasks} histograms of {size / 2**20:.1f} MB summed by one task; "
        f"scheduler {args.scheduler}, {args.workers} workers; threshold {DEFAULT_THRESHOLD}"
    )
    print(f"{'arity':>6} {'tasks':>6} {'wall s':>8} {'peak MB':>9} {'peak/hist':>10}")
    reference = rewriting(get_sync)(*build_graph(args.tasks, nbins), REFERENCE_ARITY)
    with SCHEDULERS[args.scheduler](args.workers) as get:
        for arity in args.arities:
            runs = [run(get, arity, tasks=args.tasks, nbins=nbins) for _ in range(args.repeat)]
            wall = statistics.median(m.wall for m in runs)
            peak = statistics.median(m.peak for m in runs)
            for m in runs:
                if not np.array_equal(m.result, reference):
                    raise AssertionError(f"arity {arity}: not the sync scheduler's histogram")
            print(
                f"{arity!s:>6} {runs[0].tasks:>6} {wall:>8.2f} {peak / 2**20:>9.0f} "
                f"{peak / size:>10.1f}"
            )
            del runs
    return 0


if __name__ == "__main__":
    sys.exit(main())
