"""The scheduler state's records of workers, runs and tasks, and of task durations.

Mutated only by ``state.SchedulerState``'s transitions; ``__slots__`` because there is
one ``TaskRecord`` per task of every run. ``DurationEstimates`` (per task prefix) is fed
by ``Faults`` and read by ``Saturation``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence, Set
from typing import TYPE_CHECKING, Literal, Protocol, cast

from daskvine_py.ema import Ema
from daskvine_py.plan.annotations import Placement, RunSettings
from daskvine_py.scheduler.categories import Categories
from daskvine_py.scheduler.messages import Key, SubmitRun, WorkerId
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

if TYPE_CHECKING:
    from daskvine_py.scheduler.category_size import Size

TaskStateName = Literal["waiting", "ready", "processing", "memory", "released", "forgotten"]

#: ``TaskRecord.who_has`` of a result held nowhere: one shared empty set, not an empty
#: ``set()`` (216 B) per task of every run; ``hold`` makes a task's own set.
NOWHERE: frozenset[WorkerRecord] = frozenset()
#: The readers of a task that has none yet (``TaskRecord.add_dependent``).
NO_DEPENDENTS: tuple[TaskRecord, ...] = ()


class WorkerRecord:
    __slots__ = (
        "id",
        "name",
        "cores",
        "peer_address",
        "processing",
        "ahead",
        "has_what",
        "round_trip",
        "functions",
        "full",
        "configs",
        "memory",
        "hostname",
        "holding",
        "quarantined",
        "errors",
        "gpus",
        "files",
        "file_address",
        "file_cache",
    )

    def __init__(
        self,
        id: WorkerId,
        name: str,
        cores: int,
        peer_address: str,
        memory: int = 0,
        hostname: str = "",
        gpus: int = 0,
    ) -> None:
        self.id = id
        self.name = name
        self.cores = cores
        self.peer_address = peer_address
        #: bytes of memory it offers for results (``--memory``), and its host's name:
        #: what annotated tasks are placed by (``constraints``)
        self.memory = memory
        self.hostname = hostname
        #: GPUs it offers (``--gpus``): annotated tasks asking for some go only here
        self.gpus = gpus
        #: annotated tasks placed or waiting for room here (``constraints``)
        self.holding: dict[TaskRecord, None] = {}
        #: tasks sent to this worker and not finished, oldest first (a dict as ordered set)
        self.processing: dict[TaskRecord, None] = {}
        #: those of them sent ahead of inputs still being computed here (``missing``
        #: > 0): they hold no core yet, so no saturation bound counts them
        self.ahead: set[TaskRecord] = set()
        #: overhead of a task beyond its run time, measured on tasks that found a free core
        self.round_trip = Ema()
        #: ids of the functions this worker has been sent: each travels once
        self.functions: set[bytes] = set()
        #: runs whose ``RunConfig`` this worker has been sent
        self.configs: set[int] = set()
        #: results this worker holds
        self.has_what: set[TaskRecord] = set()
        #: its store has no room left (``DiskFull``): it gets no new work meanwhile
        self.full = False
        #: why it gets no new tasks (``faults``); None: it gets them
        self.quarantined: str | None = None
        #: its tasks' errors and crashes since its last task done: while any, it is no
        #: thief (``stealing``), and retries go elsewhere first (``faults``)
        self.errors = 0
        #: input files its node's input cache holds, as its tasks reported them, and
        #: where it serves them to peers and which cache that is (``InputServer``; "":
        #: it does not)
        self.files: set[InputFile] = set()
        self.file_address = ""
        self.file_cache = ""

    def __repr__(self) -> str:
        return f"<Worker {self.name} processing={len(self.processing)}>"

    def startable(self) -> int:
        """Tasks it holds that can run now or run already: not waiting for inputs."""
        return len(self.processing) - len(self.ahead)


class InputFile:
    """A remote file tasks read through their nodes' input cache (``cache_inputs``): its
    bytes and version, as the last report said (0: unknown yet), and the workers whose
    node holds it (that copy: a changed copy reported replaces them).
    The readers of a file go where it is (``locality.target``), as readers of a result do.
    """

    __slots__ = ("url", "nbytes", "version", "holders", "readers", "drawn_to")

    def __init__(self, url: str) -> None:
        self.url = url
        self.nbytes = 0
        #: what its server reported of the copy the holders hold (``inputs.store.Identity``)
        self.version = ""
        self.holders: set[WorkerRecord] = set()
        #: its readers waiting or ready (not yet sent anywhere), and the worker that took
        #: the first of them while no node held it, where the others are queued too
        #: (``Locality.pull_readers``)
        self.readers: dict[TaskRecord, None] = {}
        self.drawn_to: WorkerRecord | None = None

    def __repr__(self) -> str:
        return f"<InputFile {self.url} {self.nbytes} bytes on {len(self.holders)}>"


class RunRecord:
    __slots__ = (
        "id",
        "tasks",
        "outputs",
        "undelivered",
        "retries",
        "functions",
        "replicas",
        "config",
        "watched",
        "serialization_seconds",
        "settings",
        "arriving",
        "verify",
        "verified",
        "fast_abort",
        "categories",
    )

    def __init__(
        self,
        id: int,
        retries: int,
        outputs: Sequence[Key],
        replicas: int = 1,
        config: p.RunConfig | None = None,
        watched: bool = False,
        settings: RunSettings | None = None,
        arriving: bool = False,
        verify: float = 0.0,
        fast_abort: float | None = None,
    ) -> None:
        self.id = id
        #: share of its tasks re-run on a second worker and compared (``verify``), and
        #: how many of them matched so far
        self.verify = verify
        self.verified = 0
        #: its fast-abort multiplier; None: the manager's (``faults``)
        self.fast_abort = fast_abort
        #: more tasks are coming whose readers are not counted yet: nothing is released
        #: until the last part (``SubmitRun.arriving``)
        self.arriving = arriving
        #: what its tasks' annotations ask for (``annotations.RunSettings``); None: nothing
        self.settings = settings
        #: someone watches it: the state emits ``Dispatched`` and ``TaskFinished``
        self.watched = watched
        #: how its tasks execute, sent to each worker before its first task there
        self.config = config
        #: copies to keep of each intermediate result, on different workers
        self.replicas = replicas
        #: function id -> bytes, for the tasks of this run
        self.functions: dict[bytes, bytes] = {}
        #: every task of the run, by key
        self.tasks: dict[Key, TaskRecord] = {}
        self.outputs = frozenset(outputs)
        #: outputs whose value has not reached the manager yet
        self.undelivered = len(self.outputs)
        self.retries = retries
        #: the sum of ``TaskDone.serialization`` of its tasks, for ``RunDone``/``RunFailed``
        self.serialization_seconds = 0.0
        #: what its tasks took, by their keys' prefix (every run: one lookup per task)
        self.categories = Categories()

    @property
    def run_seconds(self) -> float:
        """The sum of ``TaskDone.duration`` of its tasks (kept by category)."""
        return sum(category.wall_s for category in self.categories.values())

    @classmethod
    def of(cls, ev: SubmitRun) -> RunRecord:
        """The record of a run just submitted."""
        return cls(
            ev.run_id,
            ev.retries,
            ev.outputs,
            ev.replicas,
            ev.config,
            ev.watched,
            ev.settings,
            ev.arriving,
            ev.verify,
            ev.fast_abort,
        )

    def arrived(self) -> list[TaskRecord]:
        """An arriving run has all its tasks: its results in memory that nothing needs."""
        self.arriving = False
        return [t for t in self.tasks.values() if t.state == "memory" and not needed(t)]


class TaskRecord:
    # What most tasks set has a slot; what few set is a class attribute below, the
    # default, which a task overrides in its ``__dict__``, made at its first such write
    # (none for most tasks: 8 bytes each instead of a slot per field, on graphs of 10^6).
    # Write those only where they differ from the default.
    __slots__ = (
        "id",
        "key",
        "run",
        "payload",
        "priority",
        "deps",
        "dependents",
        "state",
        "missing",
        "waiters",
        "who_has",
        "nbytes",
        "worker",
        "value",
        "prefix",
        "sent_at",
        "sent_idle",
        "functions",
        "started_at",
        "size",
        "memory",
        "made_by",
        "pulled",
        "__dict__",
    )

    #: a result its run asked for
    is_output: bool = False
    #: an output no task of its run reads: its worker sends the value and keeps no
    #: copy; None (an output the cache keeps): its worker keeps it only when it is too
    #: large to travel inline, else the manager holds it (settled in ``TaskDone``)
    unread: bool | None = False
    #: the value reached the manager (outputs only)
    delivered: bool = False
    #: runs that ended in a crash or a lost worker
    attempts: int = 0
    #: where it may run and what it holds there (annotations); None: anywhere, 1 slot
    placement: Placement | None = None
    #: its worker sends its value back: to compare with a re-run (``verify``)
    echo: bool = False
    #: what it asks for itself, its category's allocation aside: annotated memory, or
    #: more after it ran out (0: its category's)
    asks: int = 0
    #: the remote files it reads (``NewTask.inputs``): placed beside them too
    reads: tuple[InputFile, ...] = ()

    def __init__(
        self,
        id: int,
        key: Key,
        run: RunRecord,
        payload: bytes,
        functions: tuple[bytes, ...],
        priority: int,
        prefix: str,
    ) -> None:
        self.id = id
        self.key = key
        self.run = run
        self.payload = payload
        self.functions = functions
        self.priority = priority
        self.prefix = prefix
        #: when it was sent to its worker, and whether a core was free there then
        self.sent_at = 0.0
        self.sent_idle = False
        #: when its worker said it began running there (``Started``); None: not yet, or
        #: not processing. A lost worker costs a retry only to tasks started there; the
        #: fault watch times stragglers from it.
        self.started_at: float | None = None
        #: its inputs, in the order of its graph's node (set once, at submission)
        self.deps: tuple[TaskRecord, ...] = ()
        #: its readers (``add_dependent``); the shared empty tuple until the first
        self.dependents: Sequence[TaskRecord] = NO_DEPENDENTS
        self.state: TaskStateName = "waiting"
        #: inputs not in memory
        self.missing = 0
        #: dependents in waiting, ready or processing: they still need this result
        self.waiters = 0
        #: the workers holding its result (read-only here: ``hold``, ``unhold``, ``unheld``)
        self.who_has: Set[WorkerRecord] = NOWHERE
        self.nbytes = 0
        #: the result itself while in memory, when small (``protocol.inlinable``): tasks
        #: on other workers get it inside their ``Execute`` instead of fetching it
        self.value: Serialized | None = None
        #: the worker it is processing on
        self.worker: WorkerRecord | None = None
        #: its category's sizing (``sizing.Size``, found at its first dispatch), and the
        #: bytes of memory allotted where it is processing (``Execute.memory``: 0, none)
        self.size: Size | None = None
        self.memory = 0
        #: the worker that computed the result it holds (its last run's; ``faults``: a
        #: failure caused by an input implicates the input's producer); None: not
        #: computed yet, or read from the cache
        self.made_by: WorkerRecord | None = None
        #: an input-less task queued for the worker that took a sibling (one that feeds
        #: the same task): see ``Locality.pull_siblings`` (a slot: set on many tasks of
        #: a reduction)
        self.pulled = False

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"

    def add_dependent(self, reader: TaskRecord) -> None:
        """``reader`` reads its result."""
        dependents = self.dependents
        if dependents is NO_DEPENDENTS:
            self.dependents = [reader]  # (a list of one: most tasks have one reader)
        else:
            cast("list[TaskRecord]", dependents).append(reader)

    def hold(self, worker: WorkerRecord) -> None:
        """``worker`` holds its result."""
        if self.who_has is NOWHERE:
            self.who_has = {worker}
        else:
            cast("set[WorkerRecord]", self.who_has).add(worker)

    def unhold(self, worker: WorkerRecord) -> None:
        """``worker`` no longer holds its result (nothing if it did not)."""
        holders = self.who_has
        if worker in holders:
            if len(holders) == 1:
                self.who_has = NOWHERE
            else:
                cast("set[WorkerRecord]", holders).discard(worker)

    def unheld(self) -> None:
        """No worker holds its result."""
        self.who_has = NOWHERE

    def allotted(self) -> int:
        """The memory it holds where it is processing: its allocation, or, sent with
        none (its category unmeasured then), its category's once that is measured: its
        worker lets it take what the others leave, so the others must leave that."""
        size = self.size
        if self.memory or size is None or self.worker is None:
            return self.memory
        return min(size.allocation, self.worker.memory)


def needed(task: TaskRecord) -> bool:
    """Whether a result must be kept: a task still reads it, it is an output owed, or
    its run is still arriving (a reader may be on its way)."""
    return task.waiters > 0 or (task.is_output and not task.delivered) or task.run.arriving


class Drop:
    """What the drop of a run collects as its tasks are forgotten: the task ids each
    worker must cancel and release; ``spared``, a task whose worker is done with it (the
    one that failed the run: no ``Cancel``); ``sweep``, look for the tasks in their
    workers' records whatever their states say (a run aborted half-way through)."""

    __slots__ = ("cancel", "release", "spared", "sweep")

    def __init__(self, spared: TaskRecord | None = None, sweep: bool = False) -> None:
        self.cancel: dict[WorkerRecord, list[int]] = {}
        self.release: dict[WorkerRecord, list[int]] = {}
        self.spared = spared
        self.sweep = sweep


class Transition(Protocol):
    """``SchedulerState._transition``, as components call it: move ``task`` to ``finish``
    (``worker``: where it goes to processing or memory)."""

    def __call__(
        self, task: TaskRecord, finish: TaskStateName, worker: WorkerRecord | None = None
    ) -> None: ...


class DurationEstimates:
    """EMA of task run times per task prefix, and of all tasks as the prior for new ones.

    A prefix seen for the first time (graphs whose keys are all distinct, like ``x1``,
    ``x2``, ...) borrows the estimate of recent tasks of any kind rather than none.
    """

    __slots__ = ("_by_prefix", "_all")

    def __init__(self) -> None:
        self._by_prefix: dict[Hashable, Ema] = {}
        self._all = Ema()

    def observe(self, prefix: Hashable, duration: float) -> None:
        ema = self._by_prefix.get(prefix)
        if ema is None:
            ema = self._by_prefix[prefix] = Ema()
        ema.observe(duration)
        self._all.observe(duration)

    def get(self, prefix: Hashable) -> float | None:
        ema = self._by_prefix.get(prefix)
        if ema is not None:
            return ema.value
        return self._all.value if self._all.count else None
