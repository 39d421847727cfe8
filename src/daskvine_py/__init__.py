"""daskvine_py: a pure-Python scheduler for Dask graphs of many small tasks.

    >>> from daskvine_py import Manager
    >>> with Manager() as manager:                       # doctest: +SKIP
    ...     manager.start_workers(2, cores=1)
    ...     dask.compute(x, scheduler=manager.get)

Layers, lowest first (a module imports only from layers below it): ``errors``,
``options``, ``runinfo``; ``serialize``, ``graph``, ``saturation``, ``events``, ``report``,
``progress``; ``protocol``, ``matching``, ``rewrite``; ``state``, ``store``, ``library``;
``manager``, ``worker``; ``local``, ``coffea`` and the command line.
"""

from .errors import (
    DaskVineError,
    GraphCycleError,
    ProtocolError,
    RemoteTraceback,
    RunCancelled,
    SerializationError,
    TaskFailed,
    VersionMismatch,
    WorkerLost,
)
from .manager import Manager
from .options import ManagerOptions, RunOptions
from .rewrite import associative

__version__ = "0.1.0"

__all__ = [
    "DaskVineError",
    "GraphCycleError",
    "Manager",
    "ManagerOptions",
    "ProtocolError",
    "RemoteTraceback",
    "RunCancelled",
    "RunOptions",
    "SerializationError",
    "TaskFailed",
    "VersionMismatch",
    "WorkerLost",
    "__version__",
    "associative",
]
