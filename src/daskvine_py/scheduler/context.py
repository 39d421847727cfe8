"""What the scheduler's components share: the records, the clock, the way out, each other.

``SchedulerState`` makes one ``Context`` and builds every component with it, in the order
``SchedulerState.__init__`` lists them; each finds the others by name here
(``ctx.stealing``, ``ctx.failures``), typed by the face it shows them (``StealingPart``,
``FailuresPart``: the few methods the others call; protocols, so that this module imports
none of the components' modules). The records are shared by reference and never
replaced: ``workers``, ``runs``, ``tasks``, the ready ``queue``, the ``full`` workers,
the ``cache_runs``, the ``durations`` and ``out``, the instructions of the ``handle``
call under way. ``now`` is the clock, set once per ``handle``. ``transition`` is the
state's (its table is the state's), ``send`` appends a message to a worker to ``out``,
``held`` finds the task a worker's report is about.

A component keeps what its per-task paths use as its own attributes, bound when it is
built (a record, or a method of a component listed before it), so a task costs no more
lookups than it did when each was handed its callables; it reaches a component listed
after it through ``ctx`` when it needs it, on the paths that do not run per task.

A task's report is one event that components subscribe to by declaring methods of these
names; the state calls each subscriber in the order the parts are listed (``subscribe``):

- ``task_done(task, worker, msg)``: it succeeded; its record is still processing on
  ``worker`` (``TaskDone``; before the result is recorded and released);
- ``result_stored(task, worker, msg) -> bool``: its result is in memory now; False:
  the run ended (failed), and the subscribers after it hear nothing. A part that has
  this hook hears only while it ``listen``s: while a run needs it (a verifying run, a
  cache run), so that the others pay no call per task for it;
- ``task_erred(task, worker, msg)``: user code raised (``TaskErred``);
- ``task_crashed(task, worker, msg)``: its process died (``TaskCrashed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from daskvine_py.scheduler.cache_placement import CacheRun
from daskvine_py.scheduler.category_size import Size
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.messages import Instruction, NewTask, RunCache, Send, ToWorker, WorkerId
from daskvine_py.scheduler.records import (
    Drop,
    DurationEstimates,
    InputFile,
    RunRecord,
    TaskRecord,
    TaskStateName,
    Transition,
    WorkerRecord,
)
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

# -- what each part offers the others (the methods they reach it by) --------------------
# Protocols, not the classes: every part's module imports this one, so this one imports
# none of theirs (no import circle, not even for type checkers). Type checking holds each
# part to its face where the state builds it.


class ConstraintsPart(Protocol):
    placing: ReadyQueue[TaskRecord]

    def __len__(self) -> int: ...
    def pending(self) -> bool: ...
    def dispatch(self) -> None: ...
    def mark(self, run: RunRecord, added: Sequence[tuple[NewTask, TaskRecord]]) -> None: ...
    def held_back(self, worker: WorkerRecord) -> int: ...
    def room(self, worker: WorkerRecord) -> int: ...


class SaturationPart(Protocol):
    def extra(self, worker: WorkerRecord, task: TaskRecord) -> int: ...


class LocalityPart(Protocol):
    def send_ahead(self, task: TaskRecord, worker: WorkerRecord) -> None: ...


class StealingPart(Protocol):
    withdrawing: set[TaskRecord]
    settled: Callable[[TaskRecord], None]

    def steal_for_idle_workers(self) -> None: ...


class ClaimsPart(Protocol):
    def send(self, worker: WorkerRecord, message: ToWorker) -> None: ...
    def stale(self, worker: WorkerRecord, task_id: int, report: object) -> bool: ...


class FailuresPart(Protocol):
    def abort(self, run_id: int, error: BaseException, what: str) -> None: ...
    def drop_run(
        self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None
    ) -> None: ...
    def dismiss(self, task: TaskRecord, drop: Drop) -> None: ...
    def fail(
        self,
        task: TaskRecord,
        worker: WorkerRecord,
        exception: Serialized | None,
        traceback: str,
        message: str,
        crashed: bool,
        type_name: str = "",
        error: BaseException | None = None,
    ) -> None: ...


class SizingPart(Protocol):
    largest: int
    changed: bool

    def size_of(self, task: TaskRecord) -> Size: ...
    def fits(self, worker: WorkerRecord, task: TaskRecord, size: Size, limit: int) -> bool: ...


class FaultsPart(Protocol):
    def suspect(self, worker: WorkerRecord, why: str) -> None: ...


class VerificationPart(Protocol):
    def added(self, run: RunRecord, added: list[TaskRecord]) -> None: ...


class CachingPart(Protocol):
    def open(self, run: RunRecord, info: RunCache) -> None: ...
    def added(self, run: RunRecord, added: Sequence[tuple[NewTask, TaskRecord]]) -> None: ...
    def lost(self, lost: list[TaskRecord]) -> list[TaskRecord]: ...
    def payload(self, task: TaskRecord) -> None: ...
    def worker_lost(self, worker: WorkerRecord) -> None: ...
    def drop(self, run: RunRecord) -> None: ...
    def locations(
        self, task: TaskRecord, deps: tuple[p.DepLocation, ...]
    ) -> tuple[p.DepLocation, ...]: ...


class CopiesPart(Protocol):
    def replicate(
        self, task: TaskRecord, worker: WorkerRecord, copies: int = 0
    ) -> list[WorkerRecord]: ...
    def not_held(self, task_id: int, worker: WorkerRecord) -> None: ...
    def lose(self, lost: list[TaskRecord]) -> None: ...
    def recompute(self, root: TaskRecord) -> None: ...


class ChurnPart(Protocol):
    def out_of_retries(self, task: TaskRecord) -> bool: ...


#: A subscriber to a task's success, error or crash: (the task, its worker, the report).
Hook = Callable[[TaskRecord, WorkerRecord, p.TaskDone], None]
Stored = Callable[[TaskRecord, WorkerRecord, p.TaskDone], bool]
Erred = Callable[[TaskRecord, WorkerRecord, p.TaskErred], None]
Crashed = Callable[[TaskRecord, WorkerRecord, p.TaskCrashed], None]


def _no_transition(
    task: TaskRecord, finish: TaskStateName, worker: WorkerRecord | None = None
) -> None:
    raise RuntimeError("this context has no transition table (give one to Context)")


#: The parts, in the order the state builds them and they hear of tasks' reports
#: (``Context.PARTS``; its slots too).
PARTS = (
    "constraints",
    "saturation",
    "locality",
    "stealing",
    "claims",
    "failures",
    "sizing",
    "faults",
    "verification",
    "caching",
    "copies",
    "relays",
    "churn",
    "submission",
    "dispatch",
)


class Context:
    """The records the scheduler's components share, and the components by name.

    See the module docstring. ``transition``: the state's (a component tested alone may
    be given a stand-in); ``next_id``: the id the next task gets.
    """

    __slots__ = (
        "workers",
        "runs",
        "tasks",
        "queue",
        "full",
        "out",
        "cache_runs",
        "durations",
        "input_files",
        "heard",
        "now",
        "batch",
        "transition",
        "send",
        "next_id",
        # the parts, in the order the state lists them
        *PARTS,
        # the subscribers to a task's report, in the order of the parts
        "done_hooks",
        "stored_hooks",
        "erred_hooks",
        "crashed_hooks",
        "listening",
    )

    constraints: ConstraintsPart
    saturation: SaturationPart
    locality: LocalityPart
    stealing: StealingPart
    claims: ClaimsPart
    failures: FailuresPart
    sizing: SizingPart
    faults: FaultsPart
    verification: VerificationPart
    caching: CachingPart
    copies: CopiesPart
    churn: ChurnPart
    #: (no part reaches these: the state holds them by their classes)
    relays: object
    submission: object
    dispatch: object

    #: The parts, in the order the state builds them and they hear of tasks' reports.
    PARTS = PARTS

    def __init__(self, transition: Transition | None = None) -> None:
        self.workers: dict[WorkerId, WorkerRecord] = {}
        self.runs: dict[int, RunRecord] = {}
        self.tasks: dict[int, TaskRecord] = {}
        self.queue: ReadyQueue[TaskRecord] = ReadyQueue()
        #: workers whose store is full (``DiskFull``): dispatch skips them
        self.full: set[WorkerRecord] = set()
        #: the instructions of the ``handle`` call under way: emptied, never replaced
        self.out: list[Instruction] = []
        #: the runs with a cache plan, by id (``Caching``'s; tested for emptiness on the
        #: per-task paths: any run with one?)
        self.cache_runs: dict[int, CacheRun] = {}
        #: task durations per prefix (``Faults`` observes them, ``Saturation`` reads them)
        self.durations = DurationEstimates()
        #: the remote input files the tasks read, by URL (``InputFile``)
        self.input_files: dict[str, InputFile] = {}
        #: per worker, the latest ``sent_at`` of a task it reported on: it has read every
        #: record the manager sent it before that, one connection keeping their order
        #: (``Faults`` writes it; ``Faults`` and ``Claims`` judge by it, not by the clock)
        self.heard: dict[WorkerRecord, float] = {}
        #: the clock: the ``now`` of the ``handle`` call under way
        self.now = 0.0
        #: ``handle`` calls so far: what one worker says in one batch of events is one
        #: burst (``Claims`` counts a burst of false claims once)
        self.batch = 0
        self.transition: Transition = transition if transition is not None else _no_transition
        #: ``send(worker, message)``: to ``out`` as a ``Send``; replaceable in tests
        self.send: Callable[[WorkerRecord, ToWorker], None] = self._send
        self.next_id = 1
        self.done_hooks: tuple[Hook, ...] = ()
        #: (replaced, never changed: a loop over it is not disturbed by ``listen``)
        self.stored_hooks: tuple[Stored, ...] = ()
        #: the parts that hear of results stored now, by name
        self.listening: set[str] = set()
        self.erred_hooks: tuple[Erred, ...] = ()
        self.crashed_hooks: tuple[Crashed, ...] = ()

    def _send(self, worker: WorkerRecord, message: ToWorker) -> None:
        self.out.append(Send(worker.id, message))

    def held(self, task_id: int, worker: WorkerRecord) -> TaskRecord | None:
        """The task a report from ``worker`` is about; None: stale (not processing there)."""
        task = self.tasks.get(task_id)
        if task is None or task.state != "processing" or task.worker is not worker:
            return None
        return task

    def new_id(self) -> int:
        """A task id never given before."""
        self.next_id += 1
        return self.next_id - 1

    def subscribe(self) -> None:
        """Collect the parts' hooks for tasks' reports, in the order of ``PARTS`` (the
        parts not built, in a test of a few, are skipped)."""
        parts = [getattr(self, name) for name in self.PARTS if hasattr(self, name)]
        self.done_hooks = tuple(part.task_done for part in parts if hasattr(part, "task_done"))
        self.erred_hooks = tuple(part.task_erred for part in parts if hasattr(part, "task_erred"))
        self.crashed_hooks = tuple(
            part.task_crashed for part in parts if hasattr(part, "task_crashed")
        )

    def listen(self, name: str, on: bool = True) -> None:
        """Let the part ``name`` hear of results stored (its ``result_stored``), or no
        more; those that hear do in the order of ``PARTS``."""
        if on:
            self.listening.add(name)
        else:
            self.listening.discard(name)
        self.stored_hooks = tuple(
            getattr(self, part).result_stored for part in self.PARTS if part in self.listening
        )
