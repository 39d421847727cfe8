"""The scheduler state's vocabulary: the events it takes and the instructions it emits.

Plain ``NamedTuple`` records, built by the manager's I/O thread (events) and read by it
(instructions); ``state.SchedulerState.handle`` turns a list of the first into a list of
the second. Imported by ``state`` and re-exported there: ``state.SubmitRun`` etc.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

from daskvine_py.plan.annotations import RunSettings
from daskvine_py.scheduler.categories import NO_CATEGORIES, Category
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

Key = Hashable
WorkerId = bytes


#: A deferred task's payload, made when needed: key -> payload, function ids, their bytes.
Encode = Callable[[Key], tuple[bytes, tuple[bytes, ...], dict[bytes, bytes]]]


class CacheStatus(str, enum.Enum):
    """What the caller's plan predicts of a task that will not run (``RunCache.plan``).

    A ``str`` enum: a plan made of the plain strings compares equal, member for member.
    """

    #: only hits read it: it stays released (its lineage, should a hit go)
    SKIP = "skip"
    #: its cache key has a live result (cached, or computed by a run now)
    HIT = "hit"
    #: its value was read from the cache's directory (``RunCache.values``)
    DISK = "disk"


class RunCache:
    """One run's cache plan, made in the caller's thread (``cache.Cache.prepare``) and
    read by the state, and the numbers the state writes back when the run is dropped."""

    __slots__ = ("keys", "plan", "values", "seconds", "persist", "deferred", "encode", "stats")

    def __init__(
        self,
        keys: dict[Key, bytes | None],
        plan: Mapping[Key, CacheStatus] | None = None,
        values: dict[Key, Serialized] | None = None,
        seconds: dict[Key, float] | None = None,
        persist: object = None,
        deferred: frozenset[Key] = frozenset(),
        encode: Encode | None = None,
    ) -> None:
        #: cache key of every task (None, or absent: not cacheable, it always runs); a run
        #: keyed as it is submitted gets them part by part, before each part arrives
        self.keys = keys
        #: the status of tasks predicted not to run; absent: run
        self.plan: Mapping[Key, CacheStatus] = plan or {}
        #: the values of "disk" tasks, read from the cache directory
        self.values = values or {}
        #: original run time of the "disk" tasks (and their skipped inputs), from disk
        self.seconds = seconds or {}
        #: where results go on disk (opaque here: ``CacheWrite.store``); None: nowhere
        self.persist = persist
        #: tasks submitted without their payload (predicted not to run), and how to make
        #: one should lineage need it: ``encode(key)`` -> payload, function ids, and
        #: those functions' bytes
        self.deferred = deferred
        self.encode = encode
        #: hits, misses, uncached, tasks_run, bytes_reused, seconds_saved (``RunInfo.cache``)
        self.stats: dict[str, float] = {}


#: Bits for a task's priority within its run: earlier runs go first, then Dask's order.
RUN_PRIORITY_BITS = 32

# -- events ---------------------------------------------------------------------------


class NewTask(NamedTuple):
    key: Key
    payload: bytes
    functions: tuple[bytes, ...]  #: ids of the functions the payload references
    dependencies: tuple[Key, ...]
    priority: int
    prefix: str = ""  #: the kind of task (``key_split``), for duration estimates
    #: dependents in the whole graph, when the run arrives in several parts; None: count
    #: them from the dependencies that arrive in the same event
    dependents: int | None = None
    #: the URLs of the remote files it reads through the input cache (``cache_inputs``,
    #: found in its arguments): it is placed where they are held, as for its inputs
    inputs: tuple[str, ...] = ()


class SubmitRun(NamedTuple):
    """A new run. Its tasks may come in parts: this one, then ``ExtendRun`` events, each
    task after its dependencies (priority order does that)."""

    run_id: int
    tasks: Sequence[NewTask]
    outputs: Sequence[Key]
    retries: int
    functions: Mapping[bytes, bytes] = {}  #: function id -> its bytes (``TaskEncoder``)
    replicas: int = 1  #: copies kept of each intermediate result (``RunOptions.replicas``)
    #: how its tasks execute (``protocol.RunConfig``); None: the defaults
    config: p.RunConfig | None = None
    #: someone watches it (progress, report, event log): ``Dispatched``/``TaskFinished``
    watched: bool = False
    #: what its tasks' annotations ask for (``annotations.RunSettings``); None: nothing
    settings: RunSettings | None = None
    #: its cache plan (``cache_placement.RunCache``, ``get(cache=True)``); None: no cache
    cache: RunCache | None = None
    #: its tasks come with ``dependents=None`` while the graph is still being read: no
    #: result is released until the ``ExtendRun`` marked ``last`` (a late reader may come)
    arriving: bool = False
    #: share of its tasks re-run on a second worker, results compared (``verify``)
    verify: float = 0.0
    #: its fast-abort multiplier (``RunOptions.fast_abort``); None: the manager's; 0: off
    fast_abort: float | None = None


class ExtendRun(NamedTuple):
    """More tasks of a run: big graphs start running while the rest is still prepared."""

    run_id: int
    tasks: Sequence[NewTask]
    functions: Mapping[bytes, bytes] = {}
    #: the run's last part: an arriving run (``SubmitRun.arriving``) has all its tasks
    last: bool = False


class CancelRun(NamedTuple):
    run_id: int


class WorkerJoined(NamedTuple):
    worker: WorkerId
    name: str
    cores: int
    peer_address: str
    memory: int = 0  #: bytes it offers for results (``--memory``)
    hostname: str = ""
    gpus: int = 0  #: GPUs it offers (``--gpus``)


class WorkerLost(NamedTuple):
    worker: WorkerId
    reason: str


class FromWorker(NamedTuple):
    """A report a worker sent: ``TaskDone``, ``TaskErred``, ``TaskCrashed``, ``FetchFailed``,
    ``Replicas``, ``Withdrawn`` or ``DiskFull``."""

    worker: WorkerId
    message: p.ToManager


class BadReport(NamedTuple):
    """A record from a worker that failed validation (``protocol.check_fields``): the runs
    of the tasks it names that are processing there fail, since their report is lost."""

    worker: WorkerId
    kind: str  #: the record's type name
    task_ids: tuple[int, ...]  #: the ids it names (``protocol.task_ids_named``)
    error: BaseException


class AbortRun(NamedTuple):
    """Fail a run with an exception raised outside the state (the manager's loop)."""

    run_id: int
    error: BaseException
    what: str  #: what was being done, for the message: "a TaskDone from worker w1"


class CacheClear(NamedTuple):
    """Event: forget every cached result (their workers release them)."""


class Tick(NamedTuple):
    """Event: time passed (the manager's timer, about once a second): look for
    stragglers, stuck workers and unanswered ``Withdraw`` (``faults.Faults``)."""


#: Everything ``state.SchedulerState.handle`` takes (anything else is dropped:
#: ``EventDropped``).
Event = (
    SubmitRun
    | ExtendRun
    | CancelRun
    | WorkerJoined
    | WorkerLost
    | FromWorker
    | BadReport
    | AbortRun
    | CacheClear
    | Tick
)


# -- instructions ---------------------------------------------------------------------

#: What the state sends a worker.
ToWorker = (
    p.Execute
    | p.RunConfig
    | p.RunEnded
    | p.FetchInputs
    | p.Function
    | p.Release
    | p.Cancel
    | p.Withdraw
    | p.Upload
    | p.Relayed
    | p.Replicate
    | p.Abort
)


class Send(NamedTuple):
    worker: WorkerId
    message: ToWorker


class RunOutput(NamedTuple):
    run_id: int
    key: Key
    value: Serialized


class RunDone(NamedTuple):
    run_id: int
    #: seconds its tasks ran, and their libraries spent (de)serializing, summed over the
    #: ``TaskDone`` reports the state took (``RunRecord``)
    run_seconds: float = 0.0
    serialization_seconds: float = 0.0
    #: tasks whose result matched a re-run's on another worker (``verify``)
    verified: int = 0
    #: what its tasks took, by category (``RunRecord.categories``)
    categories: Mapping[str, Category] = NO_CATEGORIES


class RunFailed(NamedTuple):
    run_id: int
    key: Key
    worker: str
    exception: Serialized | None  #: the task's own exception, when it could travel
    traceback: str
    message: str  #: what went wrong, for when there is no exception object
    crashed: bool  #: True: crashes/lost workers exhausted the retries
    #: as in ``RunDone``: over the tasks that finished before the run failed
    run_seconds: float = 0.0
    serialization_seconds: float = 0.0
    type_name: str = ""  #: the qualified type of the task's exception (``TaskErred``)
    categories: Mapping[str, Category] = NO_CATEGORIES  #: as in ``RunDone``
    #: the error ``get`` raises as it is, when the scheduler made it (``ResourceExhausted``)
    error: BaseException | None = None


class RunAborted(NamedTuple):
    """A run failed because handling something that concerns it raised ``error``."""

    run_id: int
    error: BaseException
    what: str  #: the event: "a TaskDone about task 'x' (id 3) from worker w1"


class EventDropped(NamedTuple):
    """Handling an event that concerns no run raised ``error``; the event was dropped."""

    what: str
    error: BaseException


class Eject(NamedTuple):
    """This worker cannot be trusted with work (it lies about tasks, ignores ``Withdraw``,
    stops making progress): tell it to leave and lose it, its tasks run elsewhere."""

    worker: WorkerId
    reason: str


class Quarantined(NamedTuple):
    """This worker gets no new tasks (its tasks fail while others' succeed, or it is slow),
    or, with ``reason`` None, no longer (``note`` says why): for ``manager.workers``, the
    log and the report."""

    worker: WorkerId
    name: str
    reason: str | None
    note: str = ""


class BytesRelayed(NamedTuple):
    """A result went from its holder through the manager to a worker that could not reach
    the holder (``protocol.Relay``)."""

    run_id: int
    holder: str
    reader: str
    nbytes: int


class BytesInlined(NamedTuple):
    """Bytes of inputs sent to a worker inside ``Execute``: moved from the manager."""

    worker: WorkerId
    name: str
    nbytes: int


# -- instructions for watched runs only -------------------------------------------------


class Dispatched(NamedTuple):
    """A task of a watched run was sent to a worker."""

    run_id: int
    task_id: int
    key: Key
    prefix: str  #: its category: its key's prefix unless annotated ``category=``
    worker: str  #: the worker's name


class TaskFinished(NamedTuple):
    """The state took a report about a task of a watched run: ``p.TaskDone``,
    ``p.TaskErred`` or ``p.TaskCrashed`` (stale reports yield none)."""

    run_id: int
    key: Key
    worker: str  #: the worker's name
    report: p.TaskDone | p.TaskErred | p.TaskCrashed


class CacheWrite(NamedTuple):
    """Instruction: write this result to the run's cache directory."""

    store: object  #: ``RunCache.persist`` (opaque here)
    key: bytes
    value: Serialized
    seconds: float


#: Everything ``state.SchedulerState.handle`` returns.
Instruction = (
    Send
    | RunOutput
    | RunDone
    | RunFailed
    | RunAborted
    | EventDropped
    | Eject
    | Quarantined
    | BytesRelayed
    | BytesInlined
    | Dispatched
    | TaskFinished
    | CacheWrite
)
