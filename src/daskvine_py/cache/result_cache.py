"""``manager.cache``: the content-addressed result cache, the caller's side of it.

``get(..., cache=True)`` (or ``Manager(cache=True)``) runs through here:

1. ``Cache.prepare``, the cache's pass over the run's plan (the caller's thread: see
   ``cached``), computes every task's cache key (``keys``), then plans top-down from the
   outputs with what it sees: a task whose key a worker holds (or a run computes now) is
   a hit, one whose key is in the cache directory is read from there, and a task only
   hits and read results need is skipped. Only the tasks that run are counted as
   readers of their inputs, and ordered (``plan.graph.ordered``).
2. The state (``scheduler.cache_placement``) checks the plan as the run arrives, links hits to the
   results they stand for, keeps the run's cacheable results on their workers after the
   run, and hands results for the directory back as ``CacheWrite`` instructions.
3. A writer thread writes those (``directory.DiskStore``), so the I/O thread never
   waits on a disk.

``clear()`` forgets every cached result (workers release them, directories are emptied);
``info()`` says what is cached where.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Container, Hashable
from queue import SimpleQueue
from typing import Any

from daskvine_py.cache.directory import DiskStore
from daskvine_py.cache.keys import KeyMaker, code_digests, task_keys
from daskvine_py.plan.annotations import uncached_keys
from daskvine_py.plan.graph import Plan
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.messages import CacheClear, CacheStatus, CacheWrite, RunCache
from daskvine_py.wire.serialize import Serialized, TaskEncoder

logger = logging.getLogger("daskvine_py.manager")

Key = Hashable


class CachedRun:
    """What submission needs of the cache for one run (``Plan.cache``): the cache plan
    for the state (``info``), the run's encoder, and, for a run keyed as it is submitted,
    ``add_key(key, node)`` to call before each task's submission."""

    __slots__ = ("info", "encoder", "_maker", "_off")

    def __init__(
        self, info: RunCache, encoder: TaskEncoder, maker: KeyMaker | None, off: set[Key]
    ) -> None:
        self.info = info
        self.encoder = encoder
        self._maker = maker
        self._off = off

    @property
    def keyed_on_submission(self) -> bool:
        return self._maker is not None

    def add_key(self, key: Key, node: Any) -> None:
        maker = self._maker
        assert maker is not None
        maker.keys[key] = None if key in self._off else maker.key(node)


class Cache:
    """The result cache of one manager (``manager.cache``).

    Results of cacheable tasks stay on the workers that made them (counted against their
    ``--memory``, spilled like any result, at most ``cache_worker_bytes`` per worker) and,
    with ``cache_dir``, go to that directory too (at most ``cache_dir_limit`` bytes), where
    a later manager finds them. See ``docs/cache.md`` for what a cache key covers.
    """

    def __init__(
        self,
        index: CacheIndex,
        send_event: Callable[[Any, threading.Event], None],
        raise_if_dead: Callable[[], None],
        cache_dir: str | os.PathLike[str] | None = None,
        cache_dir_limit: int | None = None,
    ) -> None:
        self._index = index
        self._send_event = send_event
        self._raise_if_dead = raise_if_dead
        self._default_dir = cache_dir
        self._limit = cache_dir_limit
        self._digests = code_digests()
        self._stores: dict[str, DiskStore] = {}
        self._lock = threading.Lock()
        self._writes: SimpleQueue[Any] = SimpleQueue()
        self._writer: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition()

    def __repr__(self) -> str:
        index = self._index
        return (
            f"<Cache {index.entries} results on workers, {index.at_manager} at the manager, "
            f"{len(self._stores)} dirs>"
        )

    # -- public -------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What is cached: results on workers (how many, bytes counting every copy),
        small outputs only the manager holds and, per cache directory this manager used,
        its entries, bytes and limit."""
        stores = list(self._stores.values())
        if not stores and self._default_dir is not None:
            stores = [self.store(self._default_dir)]
        index = self._index
        return {
            "workers": {"entries": index.entries, "bytes": index.nbytes},
            "manager": {"entries": index.at_manager, "bytes": index.manager_bytes},
            "disk": [store.info() for store in stores],
        }

    def clear(self, timeout: float = 30.0) -> None:
        """Forget every cached result: workers release theirs, and the cache
        directories this manager used (its default one included) are emptied. Results
        runs in progress are computing are kept when those runs end."""
        handled = threading.Event()  # set once the state handled it, or the loop died
        self._send_event(CacheClear(), handled)
        if not handled.wait(timeout):
            self._raise_if_dead()
            raise TimeoutError(f"the cache was not cleared within {timeout} s")
        self._raise_if_dead()
        self.flush(timeout)
        if self._default_dir is not None:
            self.store(self._default_dir)
        for store in list(self._stores.values()):
            store.clear()

    # -- for the manager ------------------------------------------------------------------

    def store(self, path: str | os.PathLike[str]) -> DiskStore:
        """The directory ``path`` as a store (one object per directory per manager)."""
        full = os.path.abspath(os.fspath(path))
        with self._lock:
            store = self._stores.get(full)
            if store is None:
                kwargs = {} if self._limit is None else {"limit": self._limit}
                store = self._stores[full] = DiskStore(full, **kwargs)
            return store

    def prepare(self, plan: Plan, cache_dir: str | os.PathLike[str] | None) -> Plan:
        """The cache's pass: ``cached`` with this manager's cache, and the directory
        ``cache_dir`` (None: the manager's own, if any)."""
        directory = cache_dir if cache_dir is not None else self._default_dir
        store = self.store(directory) if directory is not None else None
        if store is not None:
            store.refresh()
        maker = KeyMaker(TaskEncoder(), self._digests)
        return cached(plan, maker, self._index.providers, store)

    def write(self, instruction: CacheWrite) -> None:
        """Queue a result for its directory (the I/O thread calls this: it never waits)."""
        with self._idle:
            self._pending += 1
        self._writes.put(instruction)
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_all, name="daskvine-cache-writer", daemon=True
            )
            self._writer.start()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued result is written."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join(timeout)
            self._writer = None

    def _write_all(self) -> None:
        while True:
            instruction = self._writes.get()
            if instruction is None:
                return
            try:
                instruction.store.put(instruction.key, instruction.value, instruction.seconds)
            except Exception:  # a full or vanished disk must not stop the next writes
                logger.warning("could not write a result to the cache directory", exc_info=True)
            finally:
                with self._idle:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()


def cached(
    plan: Plan, maker: KeyMaker, providers: Container[bytes], store: DiskStore | None
) -> Plan:
    """``plan`` with its cache record (``Plan.cache``, a ``CachedRun``): the cache's pass.

    ``providers`` are the cache keys whose results workers hold or runs compute now
    (``CacheIndex.providers``), ``store`` the run's cache directory. When nothing could
    hit (no provider, nothing in the directory: a first run), nothing is planned and keys
    are computed as the tasks are submitted (``CachedRun.add_key``), so the workers start
    on the first part while the caller's thread hashes the next. Otherwise the plan's
    ``running`` tasks are those it computes, its ``dependents`` count only their reads,
    and the others are submitted without their payloads (``RunCache.deferred``): an
    unchanged rerun pickles nothing. Run before ``ordered``, which orders ``running``.
    """
    off = uncached_keys(plan.annotations) if plan.annotations else set()
    if not providers and (store is None or not len(store)):
        info = RunCache(maker.keys, persist=store)
        return dataclasses.replace(plan, cache=CachedRun(info, maker.encoder, maker, off))
    keys = task_keys(plan, maker, off)
    status: dict[Key, CacheStatus] = {}
    values: dict[Key, Serialized] = {}
    seconds: dict[Key, float] = {}
    readers: dict[Key, int] = {}
    needed = set(plan.outputs)
    dependencies = plan.dependencies
    for key in reversed(plan.order):  # readers before what they read
        ck = keys[key]
        if key not in needed and ck is not None:
            status[key] = CacheStatus.SKIP
            continue
        if ck is not None and ck in providers:
            status[key] = CacheStatus.HIT
            continue
        found = store.get(ck) if ck is not None and store is not None and ck in store else None
        if found is not None:
            status[key] = CacheStatus.DISK
            values[key], seconds[key] = found
            continue
        for dep in dependencies[key]:
            needed.add(dep)
            readers[dep] = readers.get(dep, 0) + 1
    info = RunCache(keys, status, values, seconds, store, deferred=frozenset(status))
    running = {key for key in plan.order if key not in status}
    record = CachedRun(info, maker.encoder, None, off)
    return dataclasses.replace(plan, cache=record, dependents=readers, running=running)
