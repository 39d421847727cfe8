"""daskvine_py: a pure-Python scheduler for Dask graphs of many small tasks.

    >>> from daskvine_py import Manager
    >>> with Manager() as manager:                       # doctest: +SKIP
    ...     manager.start_workers(2, cores=1)
    ...     dask.compute(x, scheduler=manager.get)

One package per role (docs/architecture.md draws them; import-linter holds the arrows):
``wire`` (bytes on sockets and pipes), ``plan`` (any Dask graph into one plan; pure),
``scheduler`` (the sans-I/O scheduler), ``cache`` (the result cache, the caller's side),
``worker`` (``python -m daskvine_py.worker``), ``batch`` (workers from batch systems),
``report`` (a run's record, event log and HTML report), ``live`` (the dashboard, metrics
and the status command's view) and ``manager`` (the public ``Manager`` and its I/O
thread). ``errors``, ``options``, ``config`` and ``ema`` sit below them all; ``coffea``,
``demo`` and the command lines above.
"""

import importlib
from typing import TYPE_CHECKING, Any

from daskvine_py.errors import (
    BindError,
    DaskVineError,
    EnvironmentUnfit,
    GraphCycleError,
    ImportHoistingError,
    ManagerDied,
    NoWorkersLeft,
    ProtocolError,
    RemoteTaskError,
    RemoteTraceback,
    ResourceExhausted,
    RunCancelled,
    SchedulerError,
    SerializationError,
    TaskFailed,
    VersionMismatch,
    WorkerImportError,
)
from daskvine_py.options import ManagerOptions, RunOptions

__version__ = "0.1.0"

if TYPE_CHECKING:
    from daskvine_py.cache.keys import uncached
    from daskvine_py.manager.manager import Manager
    from daskvine_py.plan.rewrite import associative

#: Names imported on first use: ``Manager``, ``associative`` and ``uncached`` bring in dask,
#: which a library or task process (``python -m daskvine_py.worker.task_process``) must not
#: pay for before its task even asks for them.
_LAZY = {
    "Manager": ".manager.manager",
    "associative": ".plan.rewrite",
    "uncached": ".cache.keys",
    # What every task's payload names (a pickle writes a global's module and name in
    # full): named here, each is ``daskvine_py`` once and its name, instead of dozens of
    # bytes per task of a graph of 10^6 (``wire.serialize.PAYLOAD_MODULE``).
    "LegacyCall": ".plan.legacy",
    "resident": ".wire.serialize",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'daskvine_py' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "BindError",
    "DaskVineError",
    "EnvironmentUnfit",
    "GraphCycleError",
    "ImportHoistingError",
    "Manager",
    "ManagerDied",
    "ManagerOptions",
    "NoWorkersLeft",
    "ProtocolError",
    "RemoteTaskError",
    "RemoteTraceback",
    "ResourceExhausted",
    "RunCancelled",
    "RunOptions",
    "SchedulerError",
    "SerializationError",
    "TaskFailed",
    "VersionMismatch",
    "WorkerImportError",
    "__version__",
    "associative",
    "uncached",
]
