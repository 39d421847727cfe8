"""Thread pools sized to a library's cores.

OpenMP, BLAS and numexpr each start one thread per core of the node by default, so a
worker of 12 one-core libraries would run 144 threads fighting over 12 cores. A library
process sets their variables to the cores of one of its tasks (``--lib-cores`` //
``--lib-slots``, at least 1) before it imports anything that reads them; a variable the
worker's environment already sets is the user's choice and is kept. Pools loaded before
that (a worker started from a script that imports numpy: spawn re-imports it) are
limited through ``threadpoolctl`` when it is installed.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from daskvine_py.worker import library

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


def library_main(cores: int, *args: Any) -> None:
    """A library process (``library.main`` with ``args``) whose pools fit ``cores``."""
    limit_loaded(cores, set_thread_env(cores, os.environ))
    library.main(*args)
