"""The worker's libraries and the tasks ready to run on them: which task goes to which
library, when, and with what. ``Dispatch`` is a component of ``state.WorkerState``; like
it, no I/O.

- Queues: ``runnable`` (any library), ``homed`` (one library: their inputs are live there
  only) and ``process_runnable`` (task processes, ``task_mode="tasks"``).
- Requests: ``start_runnable`` fills free slots, one task per slot or a few when tasks are
  tiny (``LIBRARY_BATCH``), and queues one more behind a short running task.
- Chains: a task that waits here only for a task of a request goes with it (``_chain``),
  or behind it when it arrives while that one runs (``follow``): the library runs it on
  the live result, with no round trip through the worker's loop.
- Stealing: an idle library takes a task homed in a busy one, once its inputs are exported.
- GPUs: tasks that ask for some queue in ``gpus.GpuPool``, which sends each alone to a
  library started with devices of its own; other tasks never go to such a library.

The task table and its transitions are the state's: a dispatch reads ``tasks``, moves a
task with ``transition``, and hands a task whose input is held nowhere to ``cannot_run``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from daskvine_py.ema import Ema
from daskvine_py.wire import protocol as p
from daskvine_py.worker import pipe
from daskvine_py.worker.gpus import GpuPool, live_only
from daskvine_py.worker.live_tasks import LiveTasks
from daskvine_py.worker.records import LibraryRecord, TaskStateName, WorkerTask
from daskvine_py.worker.store import Store

#: Tasks a library may be sent at once when tasks are tiny (recent runs under
#: ``TINY_TASK`` seconds). More saves pipe round trips; each queued task is committed to
#: that library, so longer tasks go one at a time and idle libraries are never starved.
LIBRARY_BATCH = 8
TINY_TASK = 0.001
#: Tasks shorter than this (recent runs) get the next task queued in their library's
#: pipe while they run, saving the library a wait for the worker between tasks. Longer
#: tasks do not: a queued task is committed to its library, and another might free up.
SHORT_TASK = 0.05
#: Largest request queued behind a running task, and largest chain of tasks sent with the
#: task they wait for: well within a pipe's buffer, so the worker never blocks writing it
#: while the library is blocked writing a result.
QUEUED_REQUEST_BYTES = 32 * 1024

#: ``start_runnable``'s answer when nothing is runnable: no list made per loop pass.
_NO_REQUESTS: tuple[tuple[LibraryRecord, pipe.Run], ...] = ()


class Dispatch:
    """Libraries (``libraries``), the functions they are sent (``functions``), the queues
    of tasks ready to run and the chains waiting to be sent (``chained``); see the module
    docstring. ``local_waiters`` is the state's (input computed here -> tasks waiting for
    it): a task sent along with its input's producer waits no more."""

    __slots__ = (
        "libraries",
        "functions",
        "runnable",
        "homed",
        "process_runnable",
        "chained",
        "recent_duration",
        "tasks",
        "local_waiters",
        "live_tasks",
        "live",
        "store",
        "transition",
        "cannot_run",
        "gpus",
    )

    def __init__(
        self,
        tasks: dict[int, WorkerTask],
        local_waiters: dict[int, set[int]],
        live_tasks: LiveTasks,
        store: Store,
        transition: Callable[[WorkerTask, TaskStateName], None],
        cannot_run: Callable[[WorkerTask, int], None],
    ) -> None:
        #: library id -> its record, in start order
        self.libraries: dict[int, LibraryRecord] = {}
        #: function id -> cloudpickle bytes: resident for the worker's life
        self.functions: dict[bytes, bytes] = {}
        #: queued tasks for any library, for one library (``homed``: their inputs are
        #: live there only), and for task processes (``task_mode="tasks"``), in order; ids
        #: of tasks forgotten or started meanwhile are skipped when popped
        self.runnable: deque[int] = deque()
        self.homed: dict[int, deque[int]] = {}
        self.process_runnable: deque[int] = deque()
        #: library id -> calls to send it behind the task they wait for (``follow``)
        self.chained: dict[int, list[pipe.Call]] = {}
        #: recent task run times, to decide whether to batch tasks to libraries
        self.recent_duration = Ema()
        self.tasks = tasks
        self.local_waiters = local_waiters
        self.live_tasks = live_tasks
        self.live = live_tasks.live  #: read on every input of every task
        self.store = store
        self.transition = transition
        self.cannot_run = cannot_run
        #: the devices and GPU libraries (``gpus``): GPU tasks queue and start there
        self.gpus = GpuPool()

    # -- libraries and functions ------------------------------------------------------

    def add_library(self, library_id: int, slots: int) -> LibraryRecord:
        """A library process started: it will be sent every function known so far."""
        lib = self.libraries[library_id] = LibraryRecord(library_id, list(self.functions), slots)
        self.gpus.on_added(library_id)
        return lib

    def on_ready(self, lib: LibraryRecord) -> bool:
        """A library finished starting; whether every library is now ready."""
        lib.ready = True
        return all(other.ready for other in self.libraries.values())

    def add_function(self, function_id: bytes, code: bytes) -> None:
        """A function tasks will reference: each library is sent it with its next request."""
        self.functions[function_id] = code
        for lib in self.libraries.values():
            lib.unsent.append(function_id)

    def drop_library(self, library_id: int) -> None:
        """A library died: no more requests for it (its chained calls are in ``sent``)."""
        del self.libraries[library_id]
        self.chained.pop(library_id, None)
        self.gpus.on_dropped(library_id)

    def unhome(self, library_id: int) -> None:
        """The tasks homed in a dead library go first in line (they find their inputs
        gone); after the tasks it was sent are queued again."""
        homed = self.homed.pop(library_id, None)
        if homed:
            self.runnable.extendleft(reversed(homed))

    # -- queues -----------------------------------------------------------------------

    def enqueue(self, task: WorkerTask) -> None:
        """A task now ``queued``: at the back of its queue."""
        if task.gpus:  # (task_mode="tasks" too: forked from a library of its devices)
            self.gpus.queue.append(task.id)
        elif task.config is not None and task.config.task_mode == "tasks":
            self.process_runnable.append(task.id)
        elif task.home is None:
            self.runnable.append(task.id)
        else:
            self.homed.setdefault(task.home, deque()).append(task.id)

    def requeue(self, task: WorkerTask) -> None:
        """Its library died before it started: first in line again (callers go in reverse)."""
        task.home = task.lib = None
        self.runnable.appendleft(task.id)

    def queue(self, task: WorkerTask) -> None:
        """A task whose inputs are all here: queued for the library that holds its live
        inputs (the one with most of their bytes), after exporting those live in others;
        for any library when none are live only."""
        if task.gpus:
            self.gpus.check(task)
        if not task.deps:  # most tasks of wide graphs: no placement to decide
            self.transition(task, "queued")
            return
        home, foreign = self.live_tasks.place(task)
        if home is not None and not self.gpus.fits(task, home):  # its inputs come out
            home, foreign = None, live_only(task, self.live, self.store)
        if foreign:
            self.await_exports(task, foreign)
            return
        task.home = home
        self.transition(task, "queued")

    def await_exports(self, task: WorkerTask, dep_ids: Iterable[int]) -> None:
        """``task`` waits for these live inputs to be exported into the store (held by
        another library, or leaving theirs); it is queued again once they are."""
        if task.state != "waiting":
            self.transition(task, "waiting")
        export = self.live_tasks.export
        for dep_id in dep_ids:
            task.missing.add(dep_id)
            export(dep_id, task_id=task.id)

    # -- requests ---------------------------------------------------------------------

    def start_runnable(self) -> Sequence[tuple[LibraryRecord, pipe.Run]]:
        """Hand runnable tasks to libraries with a free slot: one task per free slot, or a
        few when tasks are tiny, all of one run configuration per request, each task to
        the library that holds its live inputs if any; the requests to write to pipes.

        A library runs the tasks it is sent one after the other (or ``slots`` at once)
        and answers each at once; sending tiny tasks in batches saves pipe round trips,
        and their replies then come back, and go to the manager, in batches too.
        """
        if not self.runnable and not self.homed and not self.chained and not self.gpus.queue:
            return _NO_REQUESTS
        requests: list[tuple[LibraryRecord, pipe.Run]] = []
        for lib_id, calls in self.chained.items():
            lib = self.libraries[lib_id]
            functions = [(fid, self.functions[fid]) for fid in lib.unsent]
            lib.unsent = []
            requests.append((lib, pipe.Run(functions, self.tasks[calls[0].task_id].config, calls)))
        self.chained.clear()
        recent = self.recent_duration.value if self.recent_duration.count else None
        tiny = recent is not None and recent < TINY_TASK
        depth = LIBRARY_BATCH if tiny else 1
        # Libraries with a free slot first. A one-slot library blocked writing results
        # while we write inputs would deadlock on the pipe (a library of several slots
        # keeps reading while its slots write)...
        for lib in [lib for lib in self.libraries.values() if len(lib.sent) < lib.slots]:
            self._fill_library(lib, lib.slots * depth - len(lib.sent), None, requests)
        self.gpus.start(self, requests)
        self._steal()
        # ...then, for short tasks, one small task queued behind the running one: it fits
        # in the pipe's buffer, so writing it cannot block, and the library starts it
        # without waiting for us to hear of the previous one.
        if tiny or recent is None or recent > SHORT_TASK:
            return requests
        for lib in self.libraries.values():
            if lib.slots == 1 and len(lib.sent) == 1 and lib.ready:
                self._fill_library(lib, 1, QUEUED_REQUEST_BYTES, requests)
        return requests

    def _fill_library(
        self,
        lib: LibraryRecord,
        room: int,
        max_bytes: int | None,
        requests: list[tuple[LibraryRecord, pipe.Run]],
    ) -> None:
        """Send ``lib`` up to ``room`` runnable tasks of one run configuration, of at most
        ``max_bytes`` (payloads and inputs) when given: its own (their inputs are live
        there) first, then any; with the tasks that wait here only for them (chains)."""
        if lib.id in self.gpus.bound:  # a GPU library: its tasks are the pool's
            return
        batch: list[WorkerTask] = []
        for queue in (self.homed.get(lib.id), self.runnable):
            while queue and len(batch) < room:
                task = self._next_runnable(queue, lib.id)
                if task is None:
                    break
                if (batch and task.config is not batch[0].config) or (
                    max_bytes is not None and self._request_bytes(task, lib.id) > max_bytes
                ):
                    queue.appendleft(task.id)  # for the next request
                    break
                # Running as it is chosen: an older entry of it still in a queue (it was
                # queued again) is then passed over like any entry that is not queued.
                self.transition(task, "running")
                batch.append(task)
        if not self.homed.get(lib.id, True):
            del self.homed[lib.id]
        if not batch:
            return
        calls = []
        for task in batch:
            task.lib = lib.id
            lib.sent.append(task.id)
            calls.append(self.call(task, lib.id))
        config = batch[0].config
        if lib.slots == 1 and (config is None or config.exec_mode == "direct"):
            self._chain(lib, batch, calls)  # (a forked child's result is not kept live)
        functions = [(fid, self.functions[fid]) for fid in lib.unsent]
        lib.unsent = []
        requests.append((lib, pipe.Run(functions, batch[0].config, calls)))

    def call(
        self, task: WorkerTask, lib: int | None = None, upcoming: Collection[int] = frozenset()
    ) -> pipe.Call:
        """What a library (``lib``) or a task process runs: the task with its inputs'
        values, inline in the ``Execute`` (small ones) or from the store, or named when
        they are live in that library (or made there earlier in the request: ``upcoming``)."""
        store = self.store
        live = self.live
        inputs: list[pipe.Input] = []
        for dep in task.deps:
            dep_id = dep.task_id
            if dep.value is not None:
                inputs.append((dep.key, dep_id, dep.value))
            elif lib is not None and (dep_id in upcoming or live.usable(dep_id, lib)):
                inputs.append((dep.key, dep_id, None))
            else:
                inputs.append((dep.key, dep_id, store.get(dep_id)))
        keep = task.keep and lib is not None
        send = task.want_result or not keep
        return pipe.Call(task.id, task.key, task.payload, inputs, keep, send, task.cores)

    def _available(self, dep: p.DepLocation, lib: int | None) -> bool:
        """Whether a call to ``lib`` (None: a task process) can have this input now."""
        return (
            dep.value is not None
            or dep.task_id in self.store
            or self.live.held_in(dep.task_id, lib)
        )

    def _request_bytes(self, task: WorkerTask, lib: int | None = None) -> int:
        total = len(task.payload)
        live = self.live
        for dep in task.deps:
            if dep.value is not None:
                total += dep.value.nbytes
            elif not live.held_in(dep.task_id, lib):  # (else named, not carried)
                total += self.store.size(dep.task_id)
        return total

    def next_process_task(self) -> WorkerTask | None:
        """The next task to start in a fresh interpreter, if any."""
        return self._next_runnable(self.process_runnable)

    def _next_runnable(self, queue: deque[int], lib: int | None = None) -> WorkerTask | None:
        """The next queued task whose inputs are all here for ``lib``. One whose input is
        held nowhere (released, or its library died) goes to ``cannot_run``; one whose
        input is live in another library, or leaving one, waits for its export."""
        live = self.live
        while queue:
            task = self.tasks.get(queue.popleft())
            if task is None or task.state != "queued":
                continue
            for dep in task.deps:
                if self._available(dep, lib):
                    continue
                dep_id = dep.task_id
                if dep_id not in live:
                    self.cannot_run(task, dep_id)
                    break
                elsewhere = [
                    d.task_id
                    for d in task.deps
                    if not self._available(d, lib) and d.task_id in live
                ]
                self.await_exports(task, elsewhere)  # then queued again
                break
            else:
                return task
        return None

    # -- chains and stealing ----------------------------------------------------------

    def follow(self, task: WorkerTask) -> None:
        """A task that waits only for one running in a one-slot library: sent there at
        once, behind it (calls of a library run in order), so the library runs it on the
        live result without a round trip through this loop (``chained``)."""
        if task.gpus:  # it runs alone, in a library of its own devices
            self.gpus.check(task)
            return
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
            or lib.id in self.gpus.bound
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
        self.transition(task, "running")
        task.lib = lib.id
        lib.sent.append(task.id)
        self.chained.setdefault(lib.id, []).append(
            self.call(task, lib.id, frozenset((producer_id,)))
        )

    def unchain(self, task: WorkerTask) -> bool:
        """Take ``task``'s call back if it is still in ``chained``, not yet written to its
        library's pipe (``follow`` made it running in the pass it arrived in): whether it
        was. A ``Cancel`` in the same pass may then drop it, before a ``Release`` of an
        input it names goes to the library ahead of it."""
        calls = self.chained.get(task.lib) if task.lib is not None else None
        if not calls:
            return False
        for i, call in enumerate(calls):
            if call.task_id == task.id:
                del calls[i]
                if not calls:
                    del self.chained[task.lib]  # type: ignore[arg-type]
                lib = self.libraries.get(task.lib)  # type: ignore[arg-type]
                if lib is not None and task.id in lib.sent:
                    lib.sent.remove(task.id)
                return True
        return False

    def _chain(self, lib: LibraryRecord, batch: list[WorkerTask], calls: list[pipe.Call]) -> None:
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
                if (
                    task is None
                    or task.missing != {producer}
                    or task.config is not config
                    or task.gpus
                ):
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
                self.transition(task, "running")
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
                    self.await_exports(task, exported)
                else:  # its inputs were exported meanwhile: it can go anywhere
                    self.runnable.appendleft(task.id)
                break

    def leaks(self) -> Iterator[str]:
        """What still holds something: names, for tests of a quiet worker."""
        queued = [*self.runnable, *self.process_runnable, *self.gpus.queue]
        queued += [task_id for queue in self.homed.values() for task_id in queue]
        if any(self.tasks.get(t) for t in queued):
            yield "runnable"
        if any(lib.sent for lib in self.libraries.values()):
            yield "libraries"
