"""daskvine_py: a pure-Python scheduler for Dask graphs of many small tasks.

    >>> from daskvine_py import Manager
    >>> with Manager() as manager:                       # doctest: +SKIP
    ...     manager.start_workers(2, cores=1)
    ...     dask.compute(x, scheduler=manager.get)

Layers, lowest first (a module imports only from layers below it; docs/architecture.md
says what each owns): ``errors``, ``options``, ``runinfo``; ``serialize``, ``sharedbuf``,
``fusion``, ``graph``, ``annotations``, ``config``, ``saturation``, ``pooling``,
``security``, ``launch``, ``task``, ``events``, ``report``, ``progress``, ``cache_store``;
``protocol``, ``matching``, ``rewrite``, ``cache_walk``, ``cache_keys``; ``state_messages``,
``state_records``, ``state_failures``, ``state_constraints``, ``state_locality``,
``state_stealing``, ``state_cache``, ``state``, ``store``, ``fetching``, ``live``,
``library``, ``liveness``, ``worker_args``; ``worker_live``, ``worker_state``, ``host``,
``cache``; ``transport``, ``peers``, ``status``, ``watching``, ``callbacks``,
``manager_loop``, ``manager``, ``worker``; ``local``, ``coffea``, ``pool``, ``factory``
and the command line.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    DaskVineError,
    GraphCycleError,
    ImportHoistingError,
    ManagerDied,
    ProtocolError,
    RemoteTraceback,
    RunCancelled,
    SchedulerError,
    SerializationError,
    TaskFailed,
    VersionMismatch,
)
from .options import ManagerOptions, RunOptions

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .cache_keys import uncached
    from .manager import Manager
    from .rewrite import associative

#: Names imported on first use: ``Manager``, ``associative`` and ``uncached`` bring in dask,
#: which a library or task process (``python -m daskvine_py.task``) must not pay for
#: before its task even asks for them.
_LAZY = {"Manager": ".manager", "associative": ".rewrite", "uncached": ".cache_keys"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'daskvine_py' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DaskVineError",
    "GraphCycleError",
    "ImportHoistingError",
    "Manager",
    "ManagerDied",
    "ManagerOptions",
    "ProtocolError",
    "RemoteTraceback",
    "RunCancelled",
    "RunOptions",
    "SchedulerError",
    "SerializationError",
    "TaskFailed",
    "VersionMismatch",
    "__version__",
    "associative",
    "uncached",
]
