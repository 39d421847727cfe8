"""The worker's live results: where each task runs among the libraries, chains sent whole,
exports, uploads and the spill of live results. A part of ``worker_state.WorkerState``
(which inherits it), kept apart to keep each module readable; like it, no I/O.

See ``live.py`` for the records, and docs/architecture.md ("Live results") for the rules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from daskvine_py.errors import SerializationError
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps_exception
from daskvine_py.worker import pipe
from daskvine_py.worker.live_results import ExportWait
from daskvine_py.worker.records import LibraryRecord, WorkerTask

#: Largest request queued behind a running task, and largest chain of tasks sent with the
#: task they wait for: well within a pipe's buffer, so the worker never blocks writing it
#: while the library is blocked writing a result.
QUEUED_REQUEST_BYTES = 32 * 1024
#: Where a fetch goes once no holder answered (``Fetch.current``, and the source of its
#: bytes in ``Transfers``): the manager, which relays it from a holder.
RELAY = "manager"
#: Stands for the manager among the peers waiting for an export (an ``Upload``).
MANAGER_IDENT = b""


class LiveHandling:
    """``WorkerState``'s methods about live results; they use its attributes."""

    # Attributes of WorkerState this part reads and writes (for type checkers).
    tasks: dict[int, WorkerTask]
    libraries: dict[int, LibraryRecord]
    local_waiters: dict[int, set[int]]
    homed: dict[int, deque[int]]
    runnable: deque[int]
    chained: dict[int, list[Any]]
    exports: dict[int, ExportWait]
    library_outbox: list[tuple[int, Any]]
    peer_replies: list[tuple[bytes, Any]]
    outbox: list[Any]
    name: str
    _transition: Any
    _available: Any
    _request_bytes: Any
    _next_runnable: Any
    _input_arrived: Any
    call: Any

    def _evict(self, excess: int) -> None:
        """Past ``--memory``: live results go to the store (least recently used first),
        which spills. One the store already holds is just forgotten by its library."""
        for task_id, entry in self.live.eviction_order():
            if excess <= 0:
                return
            excess -= entry.nbytes
            if task_id in self.store:
                self._drop_live((task_id,))
            else:
                self._export(task_id, drop=True)

    def _follow(self, task: WorkerTask) -> None:
        """A task that waits only for one running in a one-slot library: sent there at
        once, behind it (calls of a library run in order), so the library runs it on the
        live result without a round trip through this loop (``chained``)."""
        if len(task.missing) != 1:
            return
        (producer_id,) = task.missing
        producer = self.tasks.get(producer_id)
        if producer is None or producer.state != "running" or producer.lib is None:
            return
        lib = self.libraries.get(producer.lib)
        config = task.config
        if (
            lib is None
            or lib.slots != 1
            or producer.config is not config
            or not (config is None or config.exec_mode == "direct")
            or not producer.keep
            or not all(d.task_id == producer_id or self._available(d, lib.id) for d in task.deps)
            or self._request_bytes(task, lib.id) > QUEUED_REQUEST_BYTES
        ):
            return
        waiters = self.local_waiters[producer_id]
        waiters.discard(task.id)
        if not waiters:
            del self.local_waiters[producer_id]
        task.missing.clear()
        self._transition(task, "running")
        task.lib = lib.id
        lib.sent.append(task.id)
        self.chained.setdefault(lib.id, []).append(
            self.call(task, lib.id, frozenset((producer_id,)))
        )

    def _chain(self, lib: LibraryRecord, batch: list[WorkerTask], calls: list) -> None:
        """Send along the tasks that wait here only for a task of this request: the
        library runs them right after it, on its live result, without waiting for us
        (or the manager). Calls of a request run in order, so the input is there."""
        config = batch[0].config
        budget = QUEUED_REQUEST_BYTES
        producers = deque(task.id for task in batch)
        upcoming = set(producers)
        while producers:
            producer = producers.popleft()
            waiters = self.local_waiters.get(producer)
            if not waiters:
                continue
            for task_id in sorted(waiters):
                task = self.tasks.get(task_id)
                if task is None or task.missing != {producer} or task.config is not config:
                    continue
                if not all(
                    dep.task_id in upcoming or self._available(dep, lib.id) for dep in task.deps
                ):
                    continue
                size = self._request_bytes(task, lib.id)
                if size > budget:
                    continue
                budget -= size
                waiters.discard(task_id)
                task.missing.clear()
                self._transition(task, "running")
                task.lib = lib.id
                lib.sent.append(task_id)
                calls.append(self.call(task, lib.id, upcoming))
                upcoming.add(task_id)
                producers.append(task_id)
            if not waiters:
                del self.local_waiters[producer]

    def _steal(self) -> None:
        """An idle library takes a task waiting for a busy one: the inputs it has live
        are exported (serialized once, kept in the store) and the task goes anywhere."""
        idle = sum(1 for lib in self.libraries.values() if not lib.sent and lib.ready)
        for _ in range(idle):
            for home, queue in list(self.homed.items()):
                owner = self.libraries.get(home)
                if owner is None or len(owner.sent) < owner.slots or len(queue) < 2:
                    continue
                task = self._next_runnable(queue, home)
                if task is None:
                    continue
                task.home = None
                exported = [
                    dep.task_id
                    for dep in task.deps
                    if dep.value is None and dep.task_id not in self.store
                ]
                if exported:
                    self._await_exports(task, exported)
                else:  # its inputs were exported meanwhile: it can go anywhere
                    self.runnable.appendleft(task.id)
                break

    def _queue(self, task: WorkerTask) -> None:
        """A task whose inputs are all here: queued for the library that holds its live
        inputs (the one with most of their bytes), after exporting those live in others;
        for any library when none are live only."""
        if not task.deps:  # most tasks of wide graphs: no placement to decide
            self._transition(task, "queued")
            return
        by_library: dict[int, int] = {}
        live = self.live.entries
        for dep in task.deps:
            if dep.value is None and dep.task_id in live and dep.task_id not in self.store:
                entry = live[dep.task_id]
                by_library[entry.lib] = by_library.get(entry.lib, 0) + entry.nbytes + 1
        home = None
        if by_library:
            processes = task.config is not None and task.config.task_mode == "tasks"
            home = None if processes else max(by_library, key=by_library.__getitem__)
            foreign = [
                dep.task_id
                for dep in task.deps
                if dep.value is None
                and dep.task_id in live
                and dep.task_id not in self.store
                and (live[dep.task_id].lib != home or live[dep.task_id].leaving)
            ]
            if foreign:
                self._await_exports(task, foreign)
                return
        task.home = home
        self._transition(task, "queued")

    def _await_exports(self, task: WorkerTask, dep_ids: list[int]) -> None:
        """``task`` waits for these live inputs to be exported into the store (held by
        another library, or leaving theirs); it is queued again once they are."""
        if task.state != "waiting":
            self._transition(task, "waiting")
        for dep_id in dep_ids:
            task.missing.add(dep_id)
            self._export(dep_id, task_id=task.id)

    def _export(
        self, dep_id: int, task_id: int | None = None, peer: bytes | None = None,
        drop: bool = False,
    ) -> None:  # fmt: skip
        """Have a live result serialized by its library, once for all who wait for it."""
        wait = self.exports.get(dep_id)
        entry = self.live.entries[dep_id]
        if wait is None:
            wait = self.exports[dep_id] = ExportWait(entry.lib, drop)
            self.library_outbox.append((entry.lib, pipe.Export([dep_id], drop)))
            if drop:
                self.live.mark_leaving(entry)
        if task_id is not None:
            wait.tasks.add(task_id)
        if peer is not None:
            wait.peers.append(peer)

    def _drop_live(self, task_ids: Iterable[int]) -> None:
        """Have their libraries forget these live results: one ``Forget`` per library
        (a release of thousands of results is as many pipe writes otherwise)."""
        forget: dict[int, list[int]] = {}
        drop = self.live.drop
        for task_id in task_ids:
            entry = drop(task_id)
            if entry is not None:
                forget.setdefault(entry.lib, []).append(task_id)
        for lib, ids in forget.items():
            self.library_outbox.append((lib, pipe.Forget(ids)))

    def serve_peer(self, task_id: int, peer: bytes) -> bool:
        """A peer asks for a result held live only: export it, and answer the peer when
        it arrives (``peer_replies``). False when it is not live here."""
        entry = self.live.entries.get(task_id)
        if entry is None or entry.stuck:
            return False
        self._export(task_id, peer=peer)
        return True

    def _answer_peers(self, task_id: int, peers: list[bytes], value: Any) -> None:
        for peer in peers:
            if peer is MANAGER_IDENT:  # an upload for a worker that cannot reach us
                self.outbox.append(p.Uploaded(task_id, value))
            else:
                self.peer_replies.append((peer, p.Data(task_id, value)))

    def on_exported(self, lib: LibraryRecord, reply: pipe.Exported) -> None:
        """A live result, serialized: into the store (the copy every later reader gets),
        then to the tasks and peers that waited for it."""
        task_id = reply.task_id
        wait = self.exports.pop(task_id, None)
        entry = self.live.entries.get(task_id)
        if reply.value is not None:
            if entry is not None:  # not released meanwhile
                if wait is not None and wait.drop:
                    self.live.drop(task_id)  # the library forgot it; the store spills it
                self.store.put(task_id, reply.value)
        elif entry is not None:  # it cannot be serialized: it stays in its library
            entry.stuck = True
            if entry.leaving:
                entry.leaving = False
                self.live.leaving_bytes -= entry.nbytes
        if wait is None:
            return
        self._answer_peers(task_id, wait.peers, reply.value)
        if reply.value is not None and task_id in self.store:
            self._input_arrived(task_id, wait.tasks)
            return
        for waiter in wait.tasks:  # it could not be serialized: they cannot run elsewhere
            task = self.tasks.get(waiter)
            if task is None:
                continue
            dep_key = next((d.key for d in task.deps if d.task_id == task_id), task_id)
            error = SerializationError(
                dep_key, "an input", f"{reply.error} (moving it out of its library process "
                f"on worker {self.name})",
            )  # fmt: skip
            exception, text = dumps_exception(error)
            self.outbox.append(p.TaskErred(waiter, exception, text, str(error)))
            task.missing.discard(task_id)
            self._transition(task, "forgotten")
