"""Where a worker's results are that its libraries keep live, and the exports under way.

A library keeps each result it computes as a Python object (``pipe.Call.keep``); the
worker's ``live_tasks.LiveTasks`` records here which library holds it and its estimated size, in
least recently used order. A result may be live and serialized in the store at once (a
small one, an output, or one exported for a reader elsewhere); it is *live only* when the
store has no copy, and then only its library can hand it to a task without an export.

Exports (``pipe.Export``) serialize a live result on demand, once, for everyone that
waits: tasks bound for another library or a task process, peers, and the spill (``drop``:
the library forgets it once sent, and the store keeps the copy). A result whose export
with ``drop`` is under way is *leaving*: no new call may name it live, since the library
may have dropped it before that call runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from daskvine_py.worker.store import Store


class LiveEntry:
    """One live result: its library, its estimated bytes, whether it is leaving (an
    export with ``drop`` is under way) or stuck (it could not be serialized)."""

    __slots__ = ("lib", "nbytes", "leaving", "stuck")

    def __init__(self, lib: int, nbytes: int) -> None:
        self.lib = lib
        self.nbytes = nbytes
        self.leaving = False
        self.stuck = False


class ExportWait:
    """An export under way, and who waits for it: tasks (by id) and peers (by identity)."""

    __slots__ = ("lib", "drop", "tasks", "peers")

    def __init__(self, lib: int, drop: bool) -> None:
        self.lib = lib
        self.drop = drop
        self.tasks: set[int] = set()
        self.peers: list[bytes] = []


class LiveResults:
    """Live results by task id, least recently used first, and their total bytes, which
    ``store`` (a ``store.Store``, if given) counts against its memory limit."""

    __slots__ = ("entries", "nbytes", "leaving_bytes", "store")

    def __init__(self, store: Store | None = None) -> None:
        self.store = store
        self.entries: dict[int, LiveEntry] = {}
        self.nbytes = 0
        #: bytes of the entries leaving: freed once their exports arrive
        self.leaving_bytes = 0

    def __contains__(self, task_id: int) -> bool:
        return task_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def bytes_of(self, task_ids: Iterable[int]) -> int:
        """The estimated bytes of those of these results that are live."""
        entries = self.entries
        return sum(entries[i].nbytes for i in task_ids if i in entries)

    def add(self, task_id: int, lib: int, nbytes: int) -> None:
        self.drop(task_id)
        self.entries[task_id] = LiveEntry(lib, nbytes)
        self.nbytes += nbytes
        self._reserve()

    def drop(self, task_id: int) -> LiveEntry | None:
        entry = self.entries.pop(task_id, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
            if entry.leaving:
                self.leaving_bytes -= entry.nbytes
            self._reserve()
        return entry

    def _reserve(self) -> None:
        if self.store is not None:
            self.store.reserved = self.nbytes

    def held_in(self, task_id: int, lib: int | None) -> bool:
        """Whether a call to library ``lib`` may name this result live."""
        entry = self.entries.get(task_id)
        return entry is not None and entry.lib == lib and not entry.leaving

    def usable(self, task_id: int, lib: int) -> bool:
        """``held_in``, and if so the result counts as just used."""
        if not self.held_in(task_id, lib):
            return False
        self.entries[task_id] = self.entries.pop(task_id)  # most recently used: last
        return True

    def mark_leaving(self, entry: LiveEntry) -> None:
        if not entry.leaving:
            entry.leaving = True
            self.leaving_bytes += entry.nbytes

    def in_library(self, lib: int) -> list[int]:
        return [task_id for task_id, entry in self.entries.items() if entry.lib == lib]

    def eviction_order(self) -> Iterator[tuple[int, LiveEntry]]:
        """Entries that may go to the spill, least recently used first."""
        for task_id, entry in list(self.entries.items()):
            if not entry.leaving and not entry.stuck:
                yield task_id, entry
