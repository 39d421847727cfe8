"""Thread pools sized to a library's cores.

OpenMP, BLAS and numexpr each start one thread per core of the node by default, so a
worker of 12 one-core libraries would run 144 threads fighting over 12 cores. A library
process sets their variables to the cores of one of its tasks (``--lib-cores`` //
``--lib-slots``, at least 1) before it imports anything that reads them; a variable the
worker's environment already sets is the user's choice and is kept. Pools loaded before
that (a worker started from a script that imports numpy: spawn re-imports it) are
limited through ``threadpoolctl`` when it is installed.

A task allocated more cores than its library's share (``Execute.cores``) has the pools
grown to them while it runs, and the next task of fewer has them shrunk back (``fit``):
only when the cores asked differ from the last task's, so the common case costs one
comparison. In a library of several slots the pools are the process's: the last task to
start sets them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: The variables that size the pools, by the ``threadpoolctl`` API each governs.
VARIABLES = {
    "OMP_NUM_THREADS": "openmp",
    "OPENBLAS_NUM_THREADS": "blas",
    "MKL_NUM_THREADS": "blas",
    "BLIS_NUM_THREADS": "blas",
    "VECLIB_MAXIMUM_THREADS": "blas",
    "NUMEXPR_NUM_THREADS": "",
    "NUMEXPR_MAX_THREADS": "",
}

#: In a library: the cores the last task asked for (``pipe.Call.cores``), its share of
#: the library's cores (no task gets fewer), the pools' size now and the variables that
#: were ours to set (``set_thread_env``).
asked = 1
share = 1
current = 1
ours: list[str] = []


def task_cores(lib_cores: int, lib_slots: int) -> int:
    """Cores of one task in a library of ``lib_cores`` cores running ``lib_slots`` at once."""
    return max(1, lib_cores // lib_slots)


def set_thread_env(cores: int, environ: MutableMapping[str, str]) -> list[str]:
    """Set every pool variable ``environ`` lacks to ``cores``; the names set."""
    added = [name for name in VARIABLES if name not in environ]
    for name in added:
        environ[name] = str(cores)
    return added


def limit_loaded(cores: int, added: list[str]) -> None:
    """Limit pools already loaded in this process whose variables were ours to set."""
    apis = {VARIABLES[name] for name in added} - {""}
    if not apis:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    try:
        threadpool_limits(limits=dict.fromkeys(apis, cores))
    except Exception:  # a library threadpoolctl cannot drive must not stop this one
        pass


def fit(cores: int) -> None:
    """Size this library's pools to a task of ``cores`` (at least its share)."""
    global asked, current
    asked = cores
    wanted = max(cores, share)
    if wanted == current:
        return
    current = wanted
    for name in ours:
        os.environ[name] = str(wanted)  # for pools not loaded yet
    limit_loaded(wanted, ours)
    numexpr = sys.modules.get("numexpr")
    if numexpr is not None and "NUMEXPR_NUM_THREADS" in ours:
        try:
            numexpr.set_num_threads(wanted)
        except Exception:
            pass


def start(cores: int) -> None:
    """This process is a library whose tasks get ``cores`` each (at least): size its pools."""
    global share, current, ours
    share = current = cores
    ours = set_thread_env(cores, os.environ)
    limit_loaded(cores, ours)
