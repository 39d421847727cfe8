"""The functions ``test_modes`` runs as tasks, in a module that imports nothing heavy.

In ``task_mode="tasks"`` every task is a new interpreter, which imports the module its
function comes from: ``test_modes`` itself would bring pytest, pandas and dask.array
into each of them (over a second per task).
"""

from __future__ import annotations

import os
import sys
import tempfile


def inc(x):
    return x + 1


def pid(_):
    return os.getpid()


def getenv(name):
    return os.environ.get(name)


def leave_behind(i):
    """Write into the current directory and the temp dir; say where they were."""
    with open("scratch.txt", "w") as file:
        file.write("x")
    handle, path = tempfile.mkstemp()
    os.close(handle)
    return os.getcwd(), path


def hard_exit(x):
    os._exit(7)


def segfault(x):
    import ctypes

    return ctypes.string_at(0)


def module_loaded(name):
    return name in sys.modules
