"""Coffea's processor path on daskvine_py: ``DaskVinePyExecutor`` for ``processor.Runner``.

::

    from coffea import processor
    from daskvine_py.coffea import DaskVinePyExecutor

    with DaskVinePyExecutor() as executor:          # a manager and one local worker per core
        out = processor.Runner(executor=executor)(fileset, MyProcessor(), treename="Events")

``Runner`` calls its executor twice, on copies (``ExecutorBase.copy``): once to read file
metadata (preprocessing, a set of ``FileMeta`` into a ``set_accumulator``) and once per run to
process the chunks. Each call becomes one Dask graph: a task per item, then a tree of
``accumulate`` tasks ``treereduction`` wide, run with ``Manager.get``. Partial results stay on
the workers that made them and are merged there; only the final accumulator travels to the
client (coffea's ``DaskExecutor`` builds the same tree out of futures).

The copies share one ``_Shared`` handle, an init field like every other piece of state (``copy``
rebuilds an executor from its ``__dict__``). The handle starts the manager on first use and keeps
it, with its workers and their already imported modules, warm for both phases and for later runs
of the same executor, until ``close()``, the end of a ``with`` block, or the executor being
dropped. coffea's ``TaskVineExecutor`` keeps its manager in a module global instead; here nothing
outlives the executor that owns it.

With ``provider=`` (any Parsl execution provider: ``SlurmProvider``, ``CondorProvider``...) the
workers come from a batch system instead of this machine: the handle starts a worker pool on
the manager (``manager.scale``), sized to the work between ``min_workers`` and ``max_workers``,
and closes it, cancelling its jobs, when the executor closes::

    executor = DaskVinePyExecutor(provider=SlurmProvider(...), max_workers=50, cores=12)

This module imports coffea; ``import daskvine_py`` never imports this module.
"""

from __future__ import annotations

import os
import pickle
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle

try:
    from coffea.processor import accumulate
    from coffea.processor.executor import ExecutorBase
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("daskvine_py.coffea needs coffea: pip install 'daskvine-py[coffea]'") from exc

from daskvine_py.errors import TaskFailed
from daskvine_py.manager.manager import Manager
from daskvine_py.wire.protocol import split_address

if TYPE_CHECKING:
    from daskvine_py.batch.pool import WorkerPool

__all__ = ["DaskVinePyExecutor", "accumulation_graph"]

#: a key of the accumulation graph: its name and its place, at each level of the tree
Key = tuple[Any, ...]


class Compressed:
    """An LZ4-compressed pickle of a partial result, as it waits in a worker's store.

    A marker type, not bare ``bytes``, so an accumulator that happens to be bytes is never
    mistaken for a compressed one. With pickle protocol 5 the payload travels out of band.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if isinstance(protocol, int) and protocol >= 5:
            return (Compressed, (pickle.PickleBuffer(self.data),))
        return (Compressed, (bytes(self.data),))

    def __repr__(self) -> str:
        return f"Compressed({memoryview(self.data).nbytes} bytes)"


def compress(value: Any, level: int | None) -> Any:
    """``value`` compressed at LZ4 ``level``; ``None`` (no result, or no compression) passes."""
    if value is None or level is None:
        return value
    import lz4.frame

    # cloudpickle: accumulators may hold lambdas (defaultdict factories) that pickle refuses
    return Compressed(lz4.frame.compress(cloudpickle.dumps(value), compression_level=level))


def decompress(value: Any) -> Any:
    if type(value) is not Compressed:
        return value
    import lz4.frame

    return pickle.loads(lz4.frame.decompress(value.data))


def _compressing(function: Callable[[Any], Any], level: int | None) -> Callable[[Any], Any]:
    # A plain function object, so the task encoder ships it (and the processor inside
    # Runner's closure) once per worker, not once per task as it would a functools.partial.
    def run_item(item: Any) -> Any:
        return compress(function(item), level)

    return run_item


def merge_partials(level: int | None, parts: list[Any]) -> Any:
    """Accumulate ``parts`` (skipping ``None``: files skipped as bad) and compress the sum.

    Parts are decompressed one at a time, so a merge holds the running sum and one part.
    ``accumulate`` adds into a new object, never into a part, which may be read again if a
    worker is lost and the merge re-runs.
    """
    total = accumulate(decompress(part) for part in parts if part is not None)
    return compress(total, level)


def accumulation_graph(
    items: Sequence[Any],
    function: Callable[[Any], Any],
    *,
    treereduction: int = 20,
    compression: int | None = None,
    name: str = "coffea-item",
) -> tuple[dict[Key, tuple[Any, ...]], Key]:
    """A Dask graph computing ``function`` on each item and accumulating the results.

    Returns the graph (legacy tuple tasks, so this module needs no Dask imports) and the key
    of the final accumulator, compressed if ``compression`` is a level. Item ``i`` is key
    ``(f"{name}-{token}", i)``: the name is the task prefix by which the manager keeps its
    duration estimates. Each ``accumulate-{token}`` task reads at most ``treereduction``
    results, so no worker ever holds more than that many partial results of one level.
    """
    if treereduction < 2:
        raise ValueError(f"treereduction must be at least 2, not {treereduction}")
    if not items:
        raise ValueError("no items to process")
    token = uuid.uuid4().hex
    run_item = _compressing(function, compression)
    level: list[Key] = [(f"{name}-{token}", i) for i in range(len(items))]
    graph: dict[Key, tuple[Any, ...]] = {
        key: (run_item, item) for key, item in zip(level, items, strict=True)
    }
    depth = 0
    while len(level) > 1:
        depth += 1
        groups = [level[i : i + treereduction] for i in range(0, len(level), treereduction)]
        level = [(f"accumulate-{token}", depth, j) for j in range(len(groups))]
        for key, group in zip(level, groups, strict=True):
            graph[key] = (merge_partials, compression, group)
    return graph, level[0]


class _Shared:
    """The manager that all copies of one executor use: started once, kept warm."""

    __slots__ = (
        "lock",
        "manager",
        "finalizer",
        "local_workers",
        "pool",
        "pool_finalizer",
        "__weakref__",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.manager: Manager | None = None
        #: closes a manager we started; runs at close(), when the handle is dropped, or at exit
        self.finalizer: weakref.finalize[Any, Any] | None = None
        self.local_workers = 0
        #: the worker pool on a batch system (``provider=``), and what closes it
        self.pool: WorkerPool | None = None
        self.pool_finalizer: weakref.finalize[Any, Any] | None = None

    def start(
        self,
        spec: Manager | str | None,
        workers: int,
        cores: int,
        pool: dict[str, Any] | None = None,
    ) -> Manager:
        with self.lock:
            if self.manager is None:
                if isinstance(spec, Manager):
                    manager = spec
                else:
                    # Jobs of a batch system land on other nodes: listen where they reach.
                    default = "0.0.0.0" if pool is not None else "127.0.0.1"
                    host, port = (default, 0) if spec is None else split_address(spec)
                    manager = Manager(host=host, port=port)
                    self.finalizer = weakref.finalize(self, manager.close)
                self.manager = manager
            manager = self.manager
            # The embedded manager's workers are all ours: replace those that died since
            # the last run (out of memory, killed). Elsewhere, start ours once.
            embedded = spec is None and pool is None
            alive = len(manager.workers) if embedded else self.local_workers
            if workers > alive:
                manager.start_workers(workers - alive, cores=cores)
                self.local_workers = workers
            if pool is not None and self.pool is None:
                options = dict(pool)
                self.pool = manager.scale(options.pop("provider"), cores=cores, **options)
                self.pool_finalizer = weakref.finalize(self, self.pool.close)
            return manager

    def close(self) -> None:
        with self.lock:
            if self.pool_finalizer is not None:
                self.pool_finalizer()  # its jobs cancelled, also on a manager we were given
            if self.finalizer is not None:
                self.finalizer()
            self.manager = None
            self.finalizer = None
            self.local_workers = 0
            self.pool = None
            self.pool_finalizer = None


def local_cores() -> int:
    """Cores this process may use (its affinity mask, as a batch slot sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class DaskVinePyExecutor(ExecutorBase):
    """Run coffea's ``processor.Runner`` on daskvine_py workers.

    Parameters
    ----------
    manager
        Where the workers are. ``None`` (default): an embedded manager on 127.0.0.1 with
        ``workers`` local workers. A ``Manager``: use it and the workers connected to it
        (it stays yours to close). An address such as ``"tcp://0.0.0.0:9123"``: start a
        manager listening there, for workers started on other nodes with
        ``python -m daskvine_py.worker --connection-file PATH`` (``PATH``: the
        ``connection_file`` of ``start()``'s manager); a graph submitted before any
        worker joins waits for one.
    workers
        Local worker processes to start. Default: one per core with the embedded manager
        and no ``provider``, none otherwise.
    cores
        Cores (library processes) of each local worker, and of each worker of the pool.
    provider
        A Parsl execution provider (``SlurmProvider``, ``CondorProvider``, ``LocalProvider``
        ...; ``pip install 'daskvine-py[batch]'``): the manager gets a worker pool on it
        (``manager.scale``), closed with the executor, which cancels its jobs. Without
        ``manager``, the manager then listens on every interface (``tcp://0.0.0.0``, a
        free port), since the jobs run on other nodes; give ``manager`` an address to
        choose the port (a firewall's) or ``127.0.0.1`` for jobs on this machine.
    min_workers, max_workers, idle_timeout
        The pool's bounds on its jobs, and how long a worker of it may sit idle before it
        leaves (seconds), as for ``manager.scale``.
    pool_options
        The pool's other options (``memory``, ``disk``, ``poll_interval``, ``python``,
        ``manager_timeout``; see ``batch.pool.WorkerPool``).
    treereduction
        Partial results merged per ``accumulate`` task. Smaller bounds the memory of a
        merging worker more tightly, at the cost of more tasks and a deeper tree.
    retries
        Re-runs of a task whose process crashed or whose worker was lost (``Manager.get``'s
        ``retries``). ``Runner`` also reads it: it retries exceptions raised in a chunk
        that many times on the worker, as with coffea's other executors.
    status
        Whether ``Manager.get`` draws its progress bar (tasks done / total, rate) on stderr
        (from ``ExecutorBase``; ``desc`` and ``unit`` are not shown).
    compression
        LZ4 level at which partial results are compressed on the workers, in their stores
        and on the wire (from ``ExecutorBase``, default 1); ``None`` keeps them as objects.
        ``Runner`` turns it off for preprocessing, whose results are tiny.

    Examples
    --------
    >>> with DaskVinePyExecutor() as executor:                     # doctest: +SKIP
    ...     run = processor.Runner(executor=executor, chunksize=100_000)
    ...     out = run(fileset, MyProcessor(), treename="Events")
    """

    manager: Manager | str | None = None
    workers: int | None = None
    cores: int = 1
    treereduction: int = 20
    retries: int = 3
    provider: Any = None
    min_workers: int = 0
    max_workers: int = 1
    idle_timeout: float = 60.0
    pool_options: dict[str, Any] = field(default_factory=dict)
    #: shared by the copies Runner makes; not a user option
    _shared: _Shared | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.treereduction < 2:
            raise ValueError(f"treereduction must be at least 2, not {self.treereduction}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a non-negative integer, not {self.retries!r}")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0, not {self.workers}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, not {self.cores}")
        if self.provider is not None:
            if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
                raise ValueError(
                    "need 0 <= min_workers <= max_workers and max_workers >= 1, not "
                    f"{self.min_workers} and {self.max_workers}"
                )
            if not self.idle_timeout > 0:
                raise ValueError(f"idle_timeout must be > 0, not {self.idle_timeout}")
            reserved = {"provider", "cores", "min_workers", "max_workers", "idle_timeout"}
            if reserved & set(self.pool_options):
                raise ValueError(
                    f"give {sorted(reserved & set(self.pool_options))} as the executor's "
                    "own arguments, not in pool_options"
                )
        if isinstance(self.manager, str):
            split_address(self.manager)  # fail at construction, not in the middle of a run
        elif self.manager is not None and not isinstance(self.manager, Manager):
            raise TypeError(
                "manager must be None, a daskvine_py.Manager or an address to listen on, "
                f"not {type(self.manager).__name__}"
            )
        if self._shared is None:
            self._shared = _Shared()

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> Manager:
        """Start the manager and local workers now, if not yet started; return the manager.

        Calls start them on demand anyway; call this to learn ``manager.address`` first.
        """
        assert self._shared is not None
        if self.workers is not None:
            workers = self.workers
        else:
            workers = local_cores() if self.manager is None and self.provider is None else 0
        pool = None
        if self.provider is not None:
            pool = {
                **self.pool_options,
                "provider": self.provider,
                "min_workers": self.min_workers,
                "max_workers": self.max_workers,
                "idle_timeout": self.idle_timeout,
            }
        return self._shared.start(self.manager, workers, self.cores, pool)

    @property
    def pool(self) -> WorkerPool | None:
        """The worker pool of ``provider``, once started (``pool.status()``: its jobs)."""
        return None if self._shared is None else self._shared.pool

    def close(self) -> None:
        """Stop a manager this executor started, with its workers, and cancel the jobs of
        its pool (a given manager is kept)."""
        if self._shared is not None:
            self._shared.close()

    def __enter__(self) -> DaskVinePyExecutor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the executor protocol ------------------------------------------------------------

    def __call__(
        self, items: Iterable[Any], function: Callable[[Any], Any], accumulator: Any
    ) -> tuple[Any, int]:
        """Apply ``function`` to every item on the workers; accumulate into ``accumulator``."""
        items = list(items)
        if not items:
            return accumulator, 0
        graph, final = accumulation_graph(
            items,
            function,
            treereduction=self.treereduction,
            compression=self.compression,
            name=_task_name(self.function_name),
        )
        manager = self.start()
        try:
            result = manager.get(graph, final, retries=self.retries, progress=self.status)
        except TaskFailed as exc:
            _name_item(exc, graph)
            raise
        return accumulate([decompress(result)], accumulator), 0


def _task_name(function_name: str | None) -> str:
    """The key prefix of the item tasks: what Runner says it runs, made key-safe."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in function_name or "")
    return name or "coffea_item"


def _name_item(exc: TaskFailed, graph: dict[Key, tuple[Any, ...]]) -> None:
    """Say which coffea work item a crashed task was processing (a note, as get adds)."""
    task = graph.get(exc.key)
    if task is None or not hasattr(exc, "add_note"):
        return
    if task[0] is merge_partials:
        exc.add_note("daskvine_py.coffea: while accumulating partial results")
    else:
        exc.add_note(f"daskvine_py.coffea: work item {task[1]!r}")
