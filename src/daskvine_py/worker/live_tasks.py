"""The worker's live results from the tasks' side: where a task must run for the inputs a
library keeps live, exports of them (for tasks bound elsewhere, peers, the manager and the
spill) and forgetting them. ``LiveTasks`` is a component of ``state.WorkerState``; like
it, no I/O.

``live_results`` holds the records (which library keeps what, and how large), and
docs/architecture.md ("Live results") the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized
from daskvine_py.worker import pipe
from daskvine_py.worker.live_results import ExportWait, LiveResults
from daskvine_py.worker.messages import AnswerPeer, Instruction, ToLibrary
from daskvine_py.worker.records import WorkerTask
from daskvine_py.worker.store import Store

#: Stands for the manager among the peers waiting for an export (an ``Upload``).
MANAGER_IDENT = b""

#: ``place``'s answer for a task with no input live only: anywhere, nothing to export.
_ANYWHERE: tuple[None, tuple[int, ...]] = (None, ())


class LiveTasks:
    """The live results (``live``) and the exports under way (``exports``).

    Instructions go to the owner's one list, ``out``: ``Export`` and ``Forget`` requests
    for libraries (``ToLibrary``); answers to peers that waited for an export
    (``AnswerPeer``), and to the manager (``MANAGER_IDENT``) as ``Uploaded``. An export
    that arrives goes to ``store``, the copy every later reader gets.
    """

    __slots__ = ("live", "exports", "store", "out")

    def __init__(self, store: Store, out: list[Instruction]) -> None:
        #: results the libraries keep live, counted against the store's memory limit
        self.live = LiveResults(store)
        #: live result id -> its export under way, and who waits for it
        self.exports: dict[int, ExportWait] = {}
        self.store = store
        self.out = out

    def place(self, task: WorkerTask) -> tuple[int | None, Sequence[int]]:
        """Where a task whose inputs are all here runs: the library that keeps the most
        bytes of its live-only inputs (None: any), and the live-only inputs it must wait
        for to be exported first: those kept by another library or leaving theirs (none:
        it runs at ``home``). A task process (``task_mode="tasks"``) has no home."""
        by_library: dict[int, int] = {}
        live = self.live.entries
        store = self.store
        for dep in task.deps:
            if dep.value is None and dep.task_id in live and dep.task_id not in store:
                entry = live[dep.task_id]
                by_library[entry.lib] = by_library.get(entry.lib, 0) + entry.nbytes + 1
        if not by_library:
            return _ANYWHERE
        processes = task.config is not None and task.config.task_mode == "tasks"
        home = None if processes else max(by_library, key=by_library.__getitem__)
        foreign = [
            dep.task_id
            for dep in task.deps
            if dep.value is None
            and dep.task_id in live
            and dep.task_id not in store
            and (live[dep.task_id].lib != home or live[dep.task_id].leaving)
        ]
        return home, foreign

    def export(
        self,
        dep_id: int,
        task_id: int | None = None,
        peer: bytes | None = None,
        drop: bool = False,
    ) -> None:
        """Have a live result serialized by its library, once for all who wait for it:
        task ``task_id``, ``peer``; with ``drop`` its library forgets it once sent (the
        spill)."""
        wait = self.exports.get(dep_id)
        entry = self.live.entries[dep_id]
        if wait is None:
            wait = self.exports[dep_id] = ExportWait(entry.lib, drop)
            self.out.append(ToLibrary(entry.lib, pipe.Export([dep_id], drop)))
            if drop:
                self.live.mark_leaving(entry)
        if task_id is not None:
            wait.tasks.add(task_id)
        if peer is not None:
            wait.peers.append(peer)

    def unwait(self, dep_id: int, task_id: int) -> None:
        """Task ``task_id`` no longer waits for the export of ``dep_id`` (which still
        arrives, into the store)."""
        wait = self.exports.get(dep_id)
        if wait is not None:
            wait.tasks.discard(task_id)

    def keep(self, task_id: int, lib: int, nbytes: int) -> None:
        """Library ``lib`` keeps the result it computed, live. A task computed again while
        another library still keeps its first result (sent again after a ``Cancel`` that
        crossed its ``TaskDone``) leaves two copies: the first stays (an export of it may
        be under way), ``lib`` forgets its own, else nothing would ever release it."""
        entry = self.live.entries.get(task_id)
        if entry is not None and entry.lib != lib:
            self.out.append(ToLibrary(lib, pipe.Forget([task_id])))
            return
        self.live.add(task_id, lib, nbytes)

    def forget(self, task_ids: Iterable[int]) -> None:
        """Have their libraries forget these live results: one ``Forget`` per library
        (a release of thousands of results is as many pipe writes otherwise)."""
        forget: dict[int, list[int]] = {}
        drop = self.live.drop
        for task_id in task_ids:
            entry = drop(task_id)
            if entry is not None:
                forget.setdefault(entry.lib, []).append(task_id)
        for lib, ids in forget.items():
            self.out.append(ToLibrary(lib, pipe.Forget(ids)))

    def evict(self, excess: int) -> None:
        """Past ``--memory``: live results go to the store (least recently used first),
        which spills. One the store already holds is just forgotten by its library."""
        for task_id, entry in self.live.eviction_order():
            if excess <= 0:
                return
            excess -= entry.nbytes
            if task_id in self.store:
                self.forget((task_id,))
            else:
                self.export(task_id, drop=True)

    def serve_peer(self, task_id: int, peer: bytes) -> bool:
        """A peer asks for a result held live only: export it, and answer the peer when
        it arrives (``AnswerPeer``). False when it is not live here."""
        entry = self.live.entries.get(task_id)
        if entry is None or entry.stuck:
            return False
        self.export(task_id, peer=peer)
        return True

    def answer_peers(self, task_id: int, peers: list[bytes], value: Serialized | None) -> None:
        """Answer the peers (and the manager) that waited for an export."""
        for peer in peers:
            if peer is MANAGER_IDENT:  # an upload for a worker that cannot reach us
                self.out.append(p.Uploaded(task_id, value))
            else:
                self.out.append(AnswerPeer(peer, p.Data(task_id, value)))

    def on_exported(self, reply: pipe.Exported) -> ExportWait | None:
        """A live result, serialized: into the store, and to the peers that waited for
        it; the export it answers, whose tasks are the caller's to tell (None: none).
        A result that could not be serialized stays in its library, stuck."""
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
        if wait is not None:
            self.answer_peers(task_id, wait.peers, reply.value)
        return wait

    def lose(self, lib: int, stored: Store) -> list[int]:
        """Library ``lib`` died: its live results are gone; those not in ``stored``,
        in order."""
        lost = []
        for task_id in self.live.in_library(lib):
            self.live.drop(task_id)
            if task_id not in stored:
                lost.append(task_id)
        return lost

    def abandon(self, lib: int) -> list[tuple[int, ExportWait]]:
        """Library ``lib`` died: its exports will not come; their waits, for the caller
        to answer (``answer_peers`` with None) and to fail the tasks."""
        abandoned = [(t, w) for t, w in self.exports.items() if w.lib == lib]
        for task_id, _ in abandoned:
            del self.exports[task_id]
        return abandoned

    def leaks(self) -> Iterator[str]:
        """What still holds something: names, for tests of a quiet worker."""
        if self.exports:
            yield "exports"
