"""The README's example: a dask.array reduction on two local workers, checked against sync."""

from __future__ import annotations

import dask
import dask.array as da

from daskvine_py import Manager


def main() -> None:
    x = da.random.default_rng(0).random((4000, 4000), chunks=500)
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        (mean,) = dask.compute(x.mean(), scheduler=manager.get)
    (expected,) = dask.compute(x.mean(), scheduler="sync")
    print(f"mean = {mean:.8f} (synchronous scheduler: {expected:.8f})")


if __name__ == "__main__":
    main()
