"""Task modes and import hoisting: the same graph run four ways, checked against sync.

A task that imports numpy in its body pays the import once per library in direct mode,
once per task in fork mode unless numpy is hoisted (``import_modules``), and once per task
in tasks mode (a fresh interpreter each time).

    python examples/task_modes.py           # 24 tasks a mode: well under 30 s
    python examples/task_modes.py --full    # 200 tasks a mode: a minute or two
"""

from __future__ import annotations

import argparse
import time

import dask

from daskvine_py import Manager

#: Tasks a mode by default, and with ``--full``: tasks mode starts an interpreter per task
#: (about half a second each on a loaded machine), so it dominates the run.
QUICK_TASKS = 24
FULL_TASKS = 200

#: Each mode's options and what it shows. Fork without hoisting runs first: once a
#: library has imported numpy (hoisted, or by a direct-mode task), every later child
#: inherits it.
MODES = {
    "function-calls/fork": (
        {"exec_mode": "fork"},
        "a forked child per task, which imports numpy each time",
    ),
    "function-calls/fork + import_modules": (
        {"exec_mode": "fork", "import_modules": ["numpy"]},
        "numpy imported once by the library; children inherit it",
    ),
    "function-calls/direct": (
        {},
        "tasks called in the library process: numpy is imported already",
    ),
    "tasks": (
        {"task_mode": "tasks"},
        "a fresh interpreter per task: imports daskvine_py and numpy each time",
    ),
}


def norm(i: int) -> float:
    import numpy as np  # hoisting makes this a dictionary lookup in forked children

    return float(np.linalg.norm(np.arange(i + 1.0)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--full", action="store_true", help=f"{FULL_TASKS} tasks a mode, not {QUICK_TASKS}"
    )
    args = parser.parse_args(argv)
    ntasks = FULL_TASKS if args.full else QUICK_TASKS
    dsk = {("norm", i): (norm, i) for i in range(ntasks)}
    keys = list(dsk)
    want = dask.get(dsk, keys)
    print(f"{ntasks} tasks of norm(i), each importing numpy, on 2 local workers of 1 core;")
    print("each mode's results are checked against Dask's synchronous scheduler.\n")
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        for name, (options, what) in MODES.items():
            print(f"{name}: {what} ...", flush=True)
            start = time.perf_counter()
            got = manager.get(dsk, keys, progress=False, **options)
            seconds = time.perf_counter() - start
            assert got == want, f"{name}: the results differ from the synchronous scheduler's"
            print(f"    {seconds / len(keys) * 1e3:8.2f} ms/task, {seconds:.2f} s, results match")
        assert manager.last_run is not None
        print(
            "\nmodules the tasks imported (candidates for import_modules):",
            manager.last_run.hoisting_candidates,
        )


if __name__ == "__main__":
    main()
