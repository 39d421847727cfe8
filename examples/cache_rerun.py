"""Reruns in seconds: the result cache (docs/cache.md) on a small analysis.

    python examples/cache_rerun.py [--cache-dir DIR --data DIR]

A three-stage analysis of generated files (read -> select -> histogram, then a sum) runs
four times on one manager with ``cache=True``: first, unchanged, with a new histogram
binning (only the last stage runs again), and after one input file changed (only what
reads it runs again). With ``--cache-dir`` the results also go to disk: run the script twice
with the same ``--data`` (files are made only where missing: a key covers a file's path,
size and modification time) and the second process starts with everything cached. Each
result is checked against Dask's synchronous scheduler.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import dask
import numpy as np
from dask import delayed

from daskvine_py import Manager


def read(path: str) -> np.ndarray:
    return np.load(path)


def select(values: np.ndarray) -> np.ndarray:
    return values[values > 0.1]


def histogram(values: np.ndarray, bins: int) -> np.ndarray:
    counts, _ = np.histogram(values, bins=bins, range=(0.0, 1.0))
    return counts


def analysis(paths: Sequence[str], bins: int) -> object:
    parts = [delayed(histogram)(delayed(select)(delayed(read)(p)), bins) for p in paths]
    return delayed(sum)(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None, help="also keep results in this directory")
    parser.add_argument("--data", default=None, help="where the input files are (made if missing)")
    parser.add_argument("--files", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or scratch
        os.makedirs(data, exist_ok=True)
        paths = []
        for i in range(args.files):
            path = os.path.join(data, f"part{i}.npy")
            if not os.path.exists(path):
                np.save(path, np.random.default_rng(i).random(2_000_000))
            paths.append(path)
        with Manager(cache=True, cache_dir=args.cache_dir) as manager:
            manager.start_workers(2, cores=1)
            steps = [("first run", 50), ("unchanged", 50), ("100 bins", 100)]
            steps.append(("a file changed", 100))
            for what, bins in steps:
                if what == "a file changed":
                    time.sleep(0.01)  # (a modification time that differs, on any clock)
                    np.save(paths[0], np.random.default_rng(99).random(2_000_000))
                graph = analysis(paths, bins)
                started = time.perf_counter()
                (counts,) = dask.compute(graph, scheduler=manager.get)
                elapsed = time.perf_counter() - started
                assert np.array_equal(counts, dask.compute(graph, scheduler="sync")[0])
                cache = manager.last_run.cache
                print(
                    f"{what:15s} {elapsed:6.2f} s  {cache['tasks_run']:3d} tasks run, "
                    f"{cache['hits']:3d} reused, {cache['seconds_saved']:5.2f} s of task time saved"
                )
            print("cached:", manager.cache.info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
