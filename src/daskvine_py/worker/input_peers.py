"""Input files between nodes: this node's input cache served to peers, and the files the
manager names fetched from them (``FetchInputs``) rather than from their storage.

As it joins (where the node has a cache) or with its first run with ``cache_inputs``,
the worker tells the manager what its node's cache holds already (``InputServer``: files
of earlier runs, of other workers of the node, of a worker before a restart, for the
manager's placement); with ``input_peers`` (the default) it also starts an
``ArchiveServer`` over that cache and says where. From then on, when the manager sends
this worker a task reading a file its node lacks and another node holds, a
``FetchInputs`` naming those holders comes first: a thread here pulls the file from one
of them into the node's cache, under the entry's lock, as the libraries fetch from
storage (the same key: the URL with the size and version its server reported; the same
size check; nothing kept of a failed pull). The entry's lock is taken as the
``FetchInputs`` arrives, before the task reaches a library: the task's library, reading
the file, waits on that lock while the pull ends, then finds the file there and counts a
cache hit, which the worker reports as a read from a peer (``relabel``). If every holder
fails, or the server's copy has changed since (its version differs: another key), the
library fetches from storage as it always could.

Nothing here raises into the worker's loop: a failed pull is logged and forgotten.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import threading
from typing import NamedTuple

from daskvine_py.inputs import OWNER_VARIABLE, cache_limit
from daskvine_py.inputs.store import Identity, InputCache, claim, default_root
from daskvine_py.software import transfer
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security

logger = logging.getLogger("daskvine_py.worker")

#: Seconds a pull waits for another process of the node holding the entry's lock (a
#: library fetching it from storage meanwhile): then it is theirs.
LOCK_WAIT = 600.0
#: URLs pulled from peers and not yet reported by a task (``relabel``), at most.
PEERED_KEPT = 4096


class InputPeers:
    """This worker's side of input files between nodes; see the module docstring."""

    def __init__(self, name: str, host: str, keys: security.Keys | None) -> None:
        self.name = name
        self.host = host  #: the interface peers reach this worker on
        self.keys = keys
        self.server: transfer.ArchiveServer | None = None
        #: the manager was told what the cache holds (``announce``)
        self.announced = False
        self.cache: InputCache | None = None
        #: URLs pulled from a peer, until a task's report names them (``relabel``)
        self.peered: dict[str, None] = {}
        #: what pulls evicted to make room, said with the next ``TaskDone`` (``relabel``)
        self.drops: list[Identity] = []
        #: bytes pulled from peers, and pulls that failed
        self.bytes_pulled = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Pull | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: set when the worker closes: pulls queued are let go, the one under way stops
        self._stop = threading.Event()
        #: pulls queued or under way, by key: the same file named for many tasks is
        #: pulled once
        self._pending: set[str] = set()

    def announce(self, peers: bool | None) -> p.InputServer | None:
        """The record that tells the manager what the node's cache holds (the first
        time) and where this worker serves it (once it does); None when there is no news.
        ``peers``: a run with ``cache_inputs`` arrived that lets peers serve inputs, or
        not; None: the worker just joined (news only if the node has a cache already)."""
        if peers is None and not os.path.isdir(os.path.join(default_root(), "entries")):
            return None  # (nothing made on a node that never cached an input)
        cache = self._open()
        if cache is None:
            return None
        started = bool(peers) and self.server is None and self._serve(cache)
        if self.announced and not started:
            return None
        held: tuple[tuple[str, int, str], ...] = ()
        if not self.announced:
            try:
                found = cache.holds()
            except OSError as exc:
                logger.warning("worker %s cannot list its input cache: %s", self.name, exc)
                found = []
            held = tuple((i.url, i.size, i.version) for i in found[: p.MAX_INPUT_FILES])
        self.announced = True
        address = self.server.address if self.server is not None else ""
        return p.InputServer(address, f"{socket.gethostname()}:{cache.root}", held)

    def _serve(self, cache: InputCache) -> bool:
        """Start serving the node's input cache to peers; whether it could."""
        try:
            self.server = transfer.ArchiveServer(
                cache.entry_file,
                self.keys,
                host=self.host,
                name=f"worker {self.name}'s input server",
            )
        except Exception as exc:  # no port, a broken context: peers fetch from storage
            logger.warning("worker %s cannot serve its input cache: %s", self.name, exc)
            return False
        return True

    def fetch(self, message: p.FetchInputs) -> None:
        """Pull ``message``'s files beside the work, on a thread of its own. Each entry's
        lock is taken here first, before the tasks that read it reach a library: one
        asking for it meanwhile waits for the pull rather than fetch from storage too."""
        cache = self.cache if self.cache is not None else self._open()
        if cache is None:
            return
        for url, size, version, sources in message.files:
            identity = Identity(url, size, version)
            key = identity.key
            with self._lock:
                if key in self._pending:
                    continue  # (named for several tasks: pulled once)
            try:
                if cache.lookup(identity) is not None:
                    continue
                reserved = cache.reserve(key)
            except OSError as exc:
                logger.warning("worker %s cannot pull %s: %s", self.name, url, exc)
                continue
            if reserved is None:
                continue  # a process of the node fetches it now
            with self._lock:
                self._pending.add(key)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="daskvine-input-peers", daemon=True
                )
                self._thread.start()
            self._queue.put(_Pull(identity, sources, message.lifetime, message.run_id, reserved))

    def relabel(self, done: p.TaskDone) -> p.TaskDone:
        """``done`` with its reads of files pulled from a peer said to be so (its library
        found them in the cache, where the pull had put them), and what pulls evicted."""
        if not (self.peered and done.inputs) and not self.drops:
            return done
        reads = []
        with self._lock:
            for read in done.inputs:
                if read[2] == p.INPUT_FROM_CACHE and read[0] in self.peered:
                    del self.peered[read[0]]
                    read = (read[0], read[1], p.INPUT_FROM_PEER, read[3])
                reads.append(read)
            room = p.MAX_INPUT_FILES - len(reads)
            for gone in self.drops[:room]:
                reads.insert(0, (gone.url, 0, p.INPUT_DROPPED, gone.version))
            del self.drops[:room]
        return done._replace(inputs=tuple(reads))

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()  # (a pull waiting on a silent peer would hold it 30 s)
            self._queue.put(None)
            self._thread.join(timeout=5.0)
            self._thread = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    # -- the thread ---------------------------------------------------------------------

    def _open(self) -> InputCache | None:
        if self.cache is None:
            try:
                self.cache = InputCache(default_root(), cache_limit())
            except (OSError, ValueError) as exc:
                logger.warning("worker %s cannot use its input cache: %s", self.name, exc)
        return self.cache

    def _run(self) -> None:
        while True:
            pull = self._queue.get()
            if pull is None:
                return
            if self._stop.is_set():  # closing: its tasks' libraries are gone too
                os.close(pull.reserved)
                with self._lock:
                    self._pending.discard(pull.identity.key)
                continue
            try:
                self._pull(pull)
            except Exception:  # never into the loop: the task reads from storage
                logger.exception(
                    "worker %s could not pull %s from a peer", self.name, pull.identity.url
                )
            finally:
                with self._lock:
                    self._pending.discard(pull.identity.key)

    def _pull(self, pull: _Pull) -> None:
        cache = self.cache
        assert cache is not None
        identity = pull.identity
        reserved: int | None = pull.reserved
        try:
            cache.use(identity.key, LOCK_WAIT)  # (not evicted between the pull and the claim)
            cache.evict(room=identity.size)
            dropped, cache.dropped = cache.dropped, []
            with self._lock:
                self.drops.extend(dropped)
            for source in pull.sources:
                if self._stop.is_set():
                    return
                fetch = functools.partial(
                    transfer.pull_file,
                    source,
                    identity.key,
                    identity.size,
                    keys=self.keys,
                    stop=self._stop,
                )
                try:
                    _, pulled = cache.fill(identity, fetch, LOCK_WAIT, reserved)
                except (OSError, TimeoutError) as exc:
                    if self._stop.is_set():
                        return  # (stopped, not failed: the worker closes)
                    self.failed += 1
                    logger.warning(
                        "worker %s could not pull %s from %s: %s",
                        self.name,
                        identity.url,
                        source,
                        exc,
                    )
                    continue
                finally:
                    reserved = None  # (``fill`` let go of it: the next source locks anew)
                owner = os.environ.get(OWNER_VARIABLE, "")
                if owner:  # kept as the run's own fetches would be (``inputs.using``)
                    cache.claim(identity.key, [claim(pull.lifetime, owner, pull.run_id)])
                if pulled:
                    with self._lock:
                        self.bytes_pulled += identity.size
                        self.peered[identity.url] = None
                        while len(self.peered) > PEERED_KEPT:
                            del self.peered[next(iter(self.peered))]
                return
        finally:
            if reserved is not None:
                os.close(reserved)  # (no source tried: the lock goes)
            cache.release()


class _Pull(NamedTuple):
    """One file to pull (``FetchInputs``), its entry's lock taken (``reserved``)."""

    identity: Identity
    sources: tuple[str, ...]
    lifetime: str
    run_id: int
    reserved: int
