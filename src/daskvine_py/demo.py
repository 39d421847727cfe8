"""Running everything on this machine: the demo behind ``python -m daskvine_py demo``."""

from __future__ import annotations

import time

from daskvine_py.manager.manager import Manager


def run_demo(workers: int = 2, cores: int = 1, size: int = 4000, chunks: int = 250) -> int:
    """Compute a seeded random array's statistics on local workers; check and report."""
    import dask
    import dask.array as da

    x = da.random.default_rng(0).random((size, size), chunks=chunks)
    y = (x + x.T).mean(axis=0).sum()
    graph = y.__dask_graph__()
    with Manager() as manager:
        started = time.perf_counter()
        manager.start_workers(workers, cores=cores)
        ready = time.perf_counter()
        (result,) = dask.compute(y, scheduler=manager.get)
        elapsed = time.perf_counter() - ready
        print(
            f"manager {manager.address}: {_count(workers, 'local worker')} x "
            f"{_count(cores, 'core')}, "
            f"started in {ready - started:.2f} s"
        )
    (expected,) = dask.compute(y, scheduler="sync")
    ntasks = len(graph)
    print(
        f"(x + x.T).mean(axis=0).sum() of a {size}x{size} array in {chunks}x{chunks} "
        f"chunks = {result:.6f} (synchronous scheduler: {expected:.6f})"
    )
    print(f"{ntasks} tasks in {elapsed:.3f} s: {ntasks / elapsed:,.0f} tasks/s")
    return 0 if abs(result - expected) <= 1e-9 * abs(expected) else 1


def _count(n: int, word: str) -> str:
    """``1 core``, ``2 cores``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
