"""Each running task's memory allocation, enforced from the worker process.

A task's allocation (``Execute.memory``, bytes) is what its library may grow by while it
runs: the library's limit is its resident size when the task began (``measure.start_task``,
which the library writes next to the task's id in its shared slots) plus the task's
allocation, summed over the tasks it runs at once (``--lib-slots`` > 1). A task of no
allocation of its own (0) may take the worker's budget (``--memory``) less what the
other running tasks are allocated: alone, the whole budget, so that a task larger than
its worker is stopped rather than the worker. The worker's budget holds
the running tasks' allocations and its results together: the store spills to leave the
allocations room (``Store.allocate``).

While the worker has tasks, it looks every ``INTERVAL`` at its libraries' slots in shared
memory; while some running task has an allocation, it reads each busy library's resident
size too (or, with a budget, whenever a task runs), one ``pread`` of
``/proc/PID/statm`` (kept open) each. A library is killed at once (SIGKILL) for one of
two reasons, and the shell has its task reported as ``TaskExhausted`` with the growth
seen and the limit, the other tasks it ran as after a crash, and a fresh library takes
its place:

- ``OWN``: its own use, past what it may use whatever the others do: its tasks'
  allocations, or for a task of no allocation the whole budget;
- ``BUDGET``: the worker's, when the libraries together grew past the budget. Allocated
  tasks within their allocations have the room they were promised; the library blamed
  is the one of no allocation that grew most. That task did nothing wrong: the manager
  retries it with an allocation of its own, and never fails a run for it. (What the
  others *reserved* is no reason: a task of no allocation that used 3 MB beside three
  allocated tasks that had reserved the budget but not used it was once stopped, and
  its run failed.)

With several tasks in one library the most recent is blamed. An export of a live result
(for a peer, a task elsewhere, the spill) makes copies in the library that its running
tasks did not: each raises the library's limit by ``EXPORT_COPIES`` times the result's
size until the library is idle with no export under way (its next task's base then
counts what stays). A forked child (``exec_mode="fork"``) and a task process
(``task_mode="tasks"``) are processes of their own, not watched here.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from daskvine_py.wire.protocol import DropLog
from daskvine_py.worker.live_results import ExportWait
from daskvine_py.worker.measure import resident_bytes
from daskvine_py.worker.records import WorkerTask
from daskvine_py.worker.store import Store

if TYPE_CHECKING:
    from daskvine_py.worker.host import Library

logger = logging.getLogger("daskvine_py.worker")

#: Seconds between looks: a task allocating 1 GB/s grows 20 MB past its limit at most.
INTERVAL = 0.02
_MB = 2**20
#: Copies of a live result an export holds at once in its library: the serialized form,
#: the record's pickle and its framing (``pipe.send``); measured, 3 × 60 MB for a 60 MB
#: ``bytes``, which went past a running task's allocation before exports were counted.
EXPORT_COPIES = 3
_NOTHING: Sequence[Exhausted] = ()


#: Why a library was stopped (``TaskExhausted.resource``): its task's own use, or the
#: worker's budget, which the libraries together went past.
OWN = "memory"
BUDGET = "budget"


class Exhausted(NamedTuple):
    """A library to kill: the task blamed, the growth seen since it began, the limit it
    went past, and why (``OWN`` or ``BUDGET``)."""

    lib: Library
    task: WorkerTask
    peak: int
    limit: int
    kind: str = OWN


class MemoryWatch:
    """Looks at the libraries running tasks and kills those past their limits (``look``);
    see the module docstring.
    ``budget``: the worker's memory in bytes (0: unknown, only allocations are limits);
    ``tasks``: the state's table; ``store``: told the running tasks' allocations."""

    __slots__ = (
        "budget",
        "tasks",
        "store",
        "due",
        "_files",
        "_drops",
        "name",
        "exports",
        "_credit",
    )

    def __init__(
        self,
        budget: int,
        tasks: dict[int, WorkerTask],
        store: Store,
        name: str,
        exports: Mapping[int, ExportWait] | None = None,
    ) -> None:
        self.budget = budget
        self.tasks = tasks
        self.store = store
        self.name = name
        #: the exports under way (``LiveTasks.exports``), by live result id
        self.exports: Mapping[int, ExportWait] = exports if exports is not None else {}
        #: library id -> bytes its exports may hold beyond its tasks' allocations
        self._credit: dict[int, int] = {}
        #: when the next look is due
        self.due = 0.0
        #: library id -> (pid, open ``statm``)
        self._files: dict[int, tuple[int, int]] = {}
        self._drops = DropLog(logger)

    def exporting(self, lib_id: int, nbytes: int) -> None:
        """The library is asked to export live results of ``nbytes``: its limit grows."""
        self._credit[lib_id] = self._credit.get(lib_id, 0) + EXPORT_COPIES * nbytes

    def timeout(self, now: float) -> float:
        """Seconds until the next look (infinite while the worker has no task)."""
        return max(0.0, self.due - now) if self.tasks else math.inf

    def look(self, libraries: dict[int, Library], now: float) -> Sequence[Exhausted]:
        """The libraries past their limits, when a look is due (most calls: none)."""
        if now < self.due:
            return _NOTHING
        if not self.tasks:  # idle: no allocation holds room in the store any more
            if self.store.allocated:
                self.store.allocate(0)
            if self._credit:
                self._end_credits(set())
            return _NOTHING
        self.due = now + INTERVAL
        tasks = self.tasks
        busy: list[tuple[Library, list[tuple[WorkerTask, int]]]] = []
        allocated = 0
        for lib_id, lib in libraries.items():
            slots = lib.running
            running = None
            for at in range(0, len(slots), 2):
                value = slots[at]  # the task's id, then its base: the library wrote both
                if not value:
                    continue
                task = tasks.get(value - 1)
                if task is None or task.lib != lib_id or task.state != "running":
                    continue  # aborted, or its reply is read already
                if running is None:
                    running = []
                running.append((task, slots[at + 1]))
                allocated += task.memory
            if running is not None:
                busy.append((lib, running))
        self.store.allocate(allocated)
        if self._credit:
            self._end_credits({lib.record.id for lib, _ in busy})
        if not allocated and not self.budget:
            return _NOTHING  # no allocation and no budget: nothing is limited
        if len(self._files) > len(libraries):
            self._close_gone(libraries)
        exhausted: list[Exhausted] = []
        grown = 0  # the growth of the busy libraries not killed, together
        #: libraries running a task of no allocation: (growth, library, its tasks)
        shared: list[tuple[int, Library, list[tuple[WorkerTask, int]]]] = []
        for lib, running in busy:
            own = sum(task.memory for task, _ in running) + self._credit.get(lib.record.id, 0)
            unallocated = any(task.memory == 0 for task, _ in running)
            if unallocated and not self.budget:
                continue  # no budget known: nothing limits it
            start = min(base for _, base in running)
            if not start:
                continue  # its library measures nothing (``DASKVINE_PY_MEASURE=0``)
            growth = self._resident(lib) - start
            if unallocated:
                own += self.budget  # alone, it may take the whole budget
            if growth > own:
                task = _blamed(running)
                limit = task.memory or self.budget
                exhausted.append(self._kill(lib, task, growth, limit, OWN, now))
                continue
            grown += max(0, growth)
            if unallocated:
                shared.append((growth, lib, running))
        over = grown - self.budget - sum(self._credit.values())
        if self.budget and over > 0 and shared:
            # Past the worker's budget, the allocated tasks within their allocations: the
            # library of no allocation that grew most makes room, for the budget's sake.
            growth, lib, running = max(shared, key=lambda entry: entry[0])
            left = max(0, growth - over)  # what the others' use left it
            exhausted.append(self._kill(lib, _blamed(running), growth, left, BUDGET, now))
        return exhausted

    def _kill(
        self, lib: Library, task: WorkerTask, growth: int, limit: int, kind: str, now: float
    ) -> Exhausted:
        lib.process.kill()  # at once: before the node runs out
        self._drops.warn(
            kind,
            now,
            "worker %s: task %r went past %s (%.0f MB used, %.0f MB allowed): "
            "its library process was killed",
            self.name,
            task.key,
            "its memory allocation" if kind == OWN else "what the worker's memory budget left it",
            growth / _MB,
            limit / _MB,
        )
        return Exhausted(lib, task, growth, limit, kind)

    def _end_credits(self, busy: set[int]) -> None:
        """Credits end for libraries idle with no export under way."""
        exporting = {wait.lib for wait in self.exports.values()}
        for lib_id in [i for i in self._credit if i not in busy and i not in exporting]:
            del self._credit[lib_id]

    def _resident(self, lib: Library) -> int:
        """The library's resident bytes now (0: unknown)."""
        lib_id = lib.record.id
        pid = lib.process.pid
        entry = self._files.get(lib_id)
        if entry is None or entry[0] != pid:
            if entry is not None:
                os.close(entry[1])
                del self._files[lib_id]
            try:
                fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return 0
            entry = self._files[lib_id] = (pid or 0, fd)
        try:
            return resident_bytes(entry[1])
        except (OSError, ValueError, IndexError):
            return 0

    def _close_gone(self, libraries: Iterable[int]) -> None:
        alive = set(libraries)
        for lib_id in [lib_id for lib_id in self._files if lib_id not in alive]:
            os.close(self._files.pop(lib_id)[1])

    def close(self) -> None:
        self._close_gone(())


def _blamed(running: list[tuple[WorkerTask, int]]) -> WorkerTask:
    """Of the tasks a library runs at once, the most recent."""
    return max(running, key=lambda pair: pair[0].id)[0]
