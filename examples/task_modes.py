"""Task modes and import hoisting: the same graph run three ways, checked against sync.

A task that imports numpy in its body pays the import once per library in direct mode,
once per task in fork mode unless numpy is hoisted (``import_modules``), and once per task
in tasks mode (a fresh interpreter each time).
"""

from __future__ import annotations

import time

import dask

from daskvine_py import Manager


def norm(i: int) -> float:
    import numpy as np  # hoisting makes this a dictionary lookup in forked children

    return float(np.linalg.norm(np.arange(i + 1.0)))


def main() -> None:
    dsk = {("norm", i): (norm, i) for i in range(200)}
    keys = list(dsk)
    want = dask.get(dsk, keys)
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        # Fork without hoisting first: once a library has imported numpy (hoisted, or
        # by a direct-mode task), every later child inherits it.
        runs = {
            "function-calls/fork": {"exec_mode": "fork"},
            "function-calls/fork + import_modules": {
                "exec_mode": "fork",
                "import_modules": ["numpy"],
            },
            "function-calls/direct": {},
            "tasks": {"task_mode": "tasks"},
        }
        for name, options in runs.items():
            start = time.perf_counter()
            got = manager.get(dsk, keys, **options)
            seconds = time.perf_counter() - start
            assert got == want
            print(f"{name:40} {seconds / len(keys) * 1e3:8.2f} ms/task")
        print("hoisting candidates:", manager.last_run.hoisting_candidates)


if __name__ == "__main__":
    main()
