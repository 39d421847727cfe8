"""The scheduler as a sans-I/O state machine: events in, instructions out.

``SchedulerState.handle(events, now)`` is the only way to change the state. Events are
runs submitted or cancelled, workers joining or lost, and the messages workers send; the
returned instructions are protocol messages to send to workers (``Send``) and news for the
callers of ``get`` (``RunOutput``, ``RunDone``, ``RunFailed``, ``RunAborted``) and for the
manager's accounting (``BytesInlined``). No sockets, no threads, no clocks: tests drive it
with literal events. The records live in ``records``, the events and instructions in
``messages`` (re-exported here). The state keeps the records and the transitions; its
components, each with its own state, do the rest: ``Constraints`` (annotated tasks),
``Locality`` (targets, sending ahead), ``Stealing`` (``Withdraw``), ``Copies`` (replicas,
losses, lineage), ``Failures`` (the end of runs), ``Relays`` and ``Caching``.

A run submitted with ``watched=True`` (a progress bar, a report or an event log) also
yields ``Dispatched`` for each task sent and ``TaskFinished`` for each report the state
takes about one of its tasks; unwatched runs pay one flag test per task for this. Every
run's ``RunDone`` or ``RunFailed`` carries the seconds its tasks ran and serialized, summed
from the ``TaskDone`` reports taken (``manager.last_run``).

Every run ends. Events are handled one at a time, and one that raises never takes the
events beside it down: the runs it concerns fail with its exception (``RunAborted``: the
run of the task a report is about, the run a ``SubmitRun``/``ExtendRun`` is about, the runs
with work on a worker being lost) and are dropped the usual way, which tolerates a
half-applied handler; an event that concerns no run is dropped (``EventDropped``, for the
manager to log). ``handle`` itself never raises.

A task moves through these states; every legal edge is in ``_TRANSITIONS`` and any other
raises ``InvalidTransition``. When its run ends, every task goes from whatever state it is
in to "forgotten" (``Failures.forget``), which leaves it in no record::

    waiting ──► ready ──► processing ──► memory ──► released
       ▲          │  ▲        │  │          │          │
       └──────────┘  └────────┘  │          │          │ (recompute: lineage)
       ▲                         │          │          ▼
       └─────────────────────────┴──────────┴──── waiting / ready

- waiting: some input is not in memory.
- ready: all inputs are in memory somewhere; queued in the ``ReadyQueue``.
- processing: sent to a worker (queued there, fetching inputs, or running).
- memory: the result exists on at least one worker (``who_has``); an output no task
  reads passes through with no copy kept (its value went to the manager).
- released: no copy is kept, because nothing still needs it (or every copy was lost).
- forgotten: its run ended (done, failed, cancelled or aborted); the end of every task.

Runs with the result cache (``caching``) add waiting -> released (a task its run does
not compute: a hit, or an input only hits read) and waiting -> memory (read from disk).

A report from a worker counts only if its task is processing on that worker
(``_held``); any other is stale (cancelled, moved, or its run over).

Two counters make completion and release O(edges):
``missing`` = inputs not in memory; ``waiters`` = dependents still waiting, ready or
processing. A result is released as soon as ``waiters`` is zero and it is not an output
still owed to the caller.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar

from daskvine_py.errors import InvalidTransition
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.caching import Caching
from daskvine_py.scheduler.constraints import Constraints, retries_of
from daskvine_py.scheduler.copies import Copies
from daskvine_py.scheduler.failures import Failures
from daskvine_py.scheduler.locality import CHAIN_AHEAD, SIBLING_INPUTS, Locality
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.messages import (
    RUN_PRIORITY_BITS,
    AbortRun,
    BadReport,
    BytesInlined,
    CacheClear,
    CancelRun,
    Dispatched,
    EventDropped,
    ExtendRun,
    FromWorker,
    Instruction,
    Key,
    NewTask,
    RunAborted,
    RunDone,
    RunFailed,
    RunOutput,
    Send,
    SubmitRun,
    TaskFinished,
    ToWorker,
    WorkerId,
    WorkerJoined,
    WorkerLost,
)
from daskvine_py.scheduler.records import (
    Drop,
    RunRecord,
    TaskRecord,
    TaskStateName,
    WorkerRecord,
    needed,
)
from daskvine_py.scheduler.relays import Relays
from daskvine_py.scheduler.saturation import DurationEstimates, extra_tasks
from daskvine_py.scheduler.stealing import Stealing
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import OUT_OF_BAND_MIN_BYTES

__all__ = [
    "RUN_PRIORITY_BITS", "AbortRun", "BadReport", "BytesInlined", "CancelRun", "Dispatched",
    "EventDropped", "ExtendRun", "FromWorker", "Key", "NewTask", "RunAborted", "RunDone",
    "RunFailed", "RunOutput", "RunRecord", "SchedulerState", "Send", "SubmitRun",
    "TaskFinished", "TaskRecord", "TaskStateName", "WorkerId", "WorkerJoined", "WorkerLost",
    "WorkerRecord",
]  # fmt: skip

#: A step of the transition table: the task (its new state set), and where it goes to
#: processing or memory (``worker``) or what its run's drop collects ("forgotten").
Step = Callable[["SchedulerState", TaskRecord, "WorkerRecord | None", "Drop | None"], None]


class SchedulerState:
    """All scheduling state of a manager; mutate only through ``handle``.

    The records are heavily correlated (a task in ``processing`` is in its worker's
    ``processing`` set, a result in ``memory`` is in each holder's ``has_what``), which is
    why only the transitions touch them. The components share the records by reference
    and call back the state's transitions; none of them is part of this class.
    """

    def __init__(
        self,
        max_extra_tasks_per_core: int = 16,
        fixed_extra_tasks_per_core: int | None = None,
        story_length: int = 10_000,
        chain_ahead: int = CHAIN_AHEAD,
        sibling_inputs: int = SIBLING_INPUTS,
    ) -> None:
        #: bound on the tasks a worker holds beyond one per core (see ``saturation``)
        self.max_extra_tasks_per_core = max_extra_tasks_per_core
        #: when set, every worker holds exactly this many extra per core (no EMA sizing)
        self.fixed_extra_tasks_per_core = fixed_extra_tasks_per_core
        self.durations = DurationEstimates()
        self.now = 0.0
        self.workers: dict[WorkerId, WorkerRecord] = {}
        self.runs: dict[int, RunRecord] = {}
        self.tasks: dict[int, TaskRecord] = {}
        self.queue: ReadyQueue[TaskRecord] = ReadyQueue()
        #: recent transitions (task id, start, finish), for ``InvalidTransition`` messages
        self.story: deque[tuple[int, str, str]] = deque(maxlen=story_length)
        self._next_task_id = 1
        #: the instructions of the ``handle`` call under way (the components append too)
        self._out: list[Instruction] = []
        #: workers whose store is full (``DiskFull``): dispatch skips them
        self.full: set[WorkerRecord] = set()
        #: bytes of inputs sent inside ``Execute`` per worker in this ``handle`` call
        self._inlined: dict[WorkerRecord, int] = {}
        transition, send, held, out = self._transition, self._send, self._held, self._out
        self.locality = Locality(
            self.queue, self.full, self._extra, transition, chain_ahead, sibling_inputs
        )
        self.constraints = Constraints(
            self.workers, self.runs, out, transition, self.locality.target, self._drop_run,
            self._abort,
        )  # fmt: skip
        self.stealing = Stealing(
            self.workers, self.queue, self.constraints.room, send, held, transition
        )
        self.caching = Caching(
            self.workers, self.runs, self.tasks, out, transition, send, self._lose,
            self._recompute, self._drop_run,
        )  # fmt: skip
        self.copies = Copies(
            self.tasks, self.workers, transition, send, held, self.caching.lost,
            self.caching.payload, self.caching.cache_runs,
        )  # fmt: skip
        self.failures = Failures(
            self.workers, self.runs, self.tasks, out, self.queue, self.constraints.placing,
            transition, send, held, self.caching.drop, self.stealing.settled,
        )  # fmt: skip
        self.relays = Relays(self.tasks, self.workers, out, send)
        # What the per-task paths call, bound once.
        self._target = self.locality.target
        self._send_ahead = self.locality.send_ahead
        self._pull_siblings = self.locality.pull_siblings
        self._settled = self.stealing.settled
        #: runs with a cache plan (``Caching.cache_runs``): tested for emptiness per task
        self._cache_runs = self.caching.cache_runs

    # -- entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[object], now: float = 0.0) -> list[Instruction]:
        """Apply ``events`` in order, then dispatch ready work; return the instructions.

        Never raises: an event whose handling raises fails the runs it concerns
        (``RunAborted``) or, concerning none, is dropped (``EventDropped``).
        """
        out = self._out
        out.clear()  # (the list is shared with the components: emptied, never replaced)
        self.now = now
        handlers = self._EVENT_HANDLERS
        for event in events:
            handler = handlers.get(type(event))
            if handler is None:
                out.append(
                    EventDropped(f"an unknown event {event!r:.80}", TypeError("unknown event"))
                )
                continue
            # What a worker being lost concerns must be read before its records go.
            lost = self.failures.runs_on(event.worker) if isinstance(event, WorkerLost) else ()
            try:
                handler(self, event)
            except Exception as exc:
                self.failures.on_handler_error(event, exc, lost)
        try:
            self._dispatch()
        except Exception as exc:  # outside any one task: no telling which runs it spared
            for run_id in list(self.runs):
                self._abort(run_id, exc, "dispatching ready tasks")
        if self._inlined:
            for worker, nbytes in self._inlined.items():
                out.append(BytesInlined(worker.id, worker.name, nbytes))
            self._inlined = {}
        instructions = out.copy()
        out.clear()
        return instructions

    # -- queries ----------------------------------------------------------------------

    def load(self) -> tuple[int, int, int]:
        """Tasks ready (queued here), processing (sent to workers) and running (those of
        them that have a core), over every run."""
        processing = running = 0
        for worker in self.workers.values():
            held = len(worker.processing)
            processing += held
            running += min(held, worker.cores)
        return len(self.queue) + len(self.constraints), processing, running

    def worker_loads(self) -> dict[WorkerId, tuple[int, int]]:
        """Each worker's cores and the tasks it holds (queued there, fetching or running)."""
        return {wid: (worker.cores, len(worker.processing)) for wid, worker in self.workers.items()}

    def runs_of(self, task_ids: Iterable[int]) -> list[int]:
        """The runs of these tasks (those still known), each once."""
        return self.failures.runs_of(task_ids)

    @property
    def cache(self) -> CacheIndex:
        """What the result cache publishes to other threads (``Caching.index``)."""
        return self.caching.index

    @property
    def cache_worker_bytes(self) -> int:
        """Cached bytes each worker keeps (``CacheBudget.worker_bytes``)."""
        return self.caching.budget.worker_bytes

    @cache_worker_bytes.setter
    def cache_worker_bytes(self, nbytes: int) -> None:
        self.caching.budget.worker_bytes = nbytes

    @property
    def cache_manager_bytes(self) -> int:
        """Bytes of small cached outputs the manager keeps (``CacheBudget``)."""
        return self.caching.budget.manager_bytes

    @cache_manager_bytes.setter
    def cache_manager_bytes(self, nbytes: int) -> None:
        self.caching.budget.manager_bytes = nbytes

    # -- event handlers ---------------------------------------------------------------

    def _on_submit(self, ev: SubmitRun) -> None:
        if ev.run_id in self.runs:
            raise ValueError(f"run {ev.run_id} was submitted twice")
        run = self.runs[ev.run_id] = RunRecord(
            ev.run_id, ev.retries, ev.outputs, ev.replicas, ev.config, ev.watched, ev.settings
        )
        if ev.cache is not None:
            self.caching.open(run, ev.cache)
        self._add_tasks(run, ev.tasks, ev.functions)

    def _on_extend(self, ev: ExtendRun) -> None:
        run = self.runs.get(ev.run_id)
        if run is not None:  # else it failed or was cancelled meanwhile
            self._add_tasks(run, ev.tasks, ev.functions)

    def _add_tasks(
        self, run: RunRecord, tasks: Sequence[NewTask], functions: Mapping[bytes, bytes]
    ) -> None:
        run.functions.update(functions)
        records = run.tasks
        added = []
        for new in tasks:
            record = TaskRecord(
                self._next_task_id,
                new.key,
                run,
                new.payload,
                new.functions,
                run.id << RUN_PRIORITY_BITS | new.priority,
                new.prefix,
            )
            self._next_task_id += 1
            record.is_output = new.key in run.outputs
            if new.dependents is not None:
                record.waiters = new.dependents
                record.unread = record.is_output and not new.dependents
            records[new.key] = record
            self.tasks[record.id] = record
            added.append((new, record))
        if run.settings is not None:
            self.constraints.mark(run, added)  # annotated runs only
        for new, record in added:
            missing = 0
            for dep_key in new.dependencies:
                dep = records[dep_key]
                record.deps.append(dep)
                dep.dependents.append(record)
                if new.dependents is None:
                    dep.waiters += 1
                if dep.state != "memory":
                    missing += 1
            record.missing = missing
        if self._cache_runs:
            self.caching.added(run, added)  # hits, skipped inputs, results read from disk
        for _, record in added:
            if record.missing == 0 and record.state == "waiting":
                self._transition(record, "ready")

    def _on_cancel(self, ev: CancelRun) -> None:
        run = self.runs.get(ev.run_id)
        if run is not None:
            self._drop_run(run)

    def _on_worker_joined(self, ev: WorkerJoined) -> None:
        if ev.worker in self.workers:
            return
        self.workers[ev.worker] = WorkerRecord(*ev)  # the same fields, in the same order

    def _on_worker_lost(self, ev: WorkerLost) -> None:
        worker = self.workers.pop(ev.worker, None)
        if worker is None:
            return
        self.full.discard(worker)
        lost = []
        for task in worker.has_what:
            task.who_has.discard(worker)
            if not task.who_has and task.state == "memory":
                lost.append(task)
        worker.has_what.clear()
        for task in list(worker.processing):
            if self.tasks.get(task.id) is not task:
                continue  # its run was dropped by an earlier failure in this loop
            if task.state != "processing":
                continue  # sent ahead, and already recalled with the task it waited for
            if task.missing:
                self._transition(task, "waiting")
                continue
            task.attempts += 1
            if task.attempts > retries_of(task):
                self.failures.fail(
                    task,
                    worker,
                    None,
                    "",
                    f"its worker was lost {task.attempts} times; last: {ev.reason}",
                    crashed=True,
                )
            else:
                self._transition(task, "ready")
        self._lose([task for task in lost if task.id in self.tasks])
        self.queue.forget_target(worker.id)
        self.caching.worker_lost(worker)

    def _on_from_worker(self, ev: FromWorker) -> None:
        worker = self.workers.get(ev.worker)
        if worker is None:
            return  # a message that was in flight when the worker was declared lost
        handler = self._REPORT_HANDLERS.get(type(ev.message))
        if handler is None:
            raise TypeError(f"not a worker report: {ev.message!r}")
        handler(self, worker, ev.message)

    def _held(self, task_id: int, worker: WorkerRecord) -> TaskRecord | None:
        """The task a report from ``worker`` is about, if it is processing there; None if
        the report is stale (cancelled, re-assigned, or its run is over)."""
        task = self.tasks.get(task_id)
        if task is None or task.state != "processing" or task.worker is not worker:
            return None
        return task

    def _on_task_done(self, worker: WorkerRecord, msg: p.TaskDone) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            # Nothing needs this copy (unless it is known to be there already).
            known = self.tasks.get(msg.task_id)
            if known is None or worker not in known.who_has:
                self._send(worker, p.Release((msg.task_id,)))
            return
        run = task.run
        if run.watched:
            self._out.append(TaskFinished(run.id, task.key, worker.name, msg))
        run.run_seconds += msg.duration
        run.serialization_seconds += msg.serialization
        task.nbytes = msg.nbytes
        if msg.value is not None and task.waiters and p.inlinable(msg.value):
            task.value = msg.value
        if task.unread is None:  # (the cache's) its worker kept it only if too large
            task.unread = task.value is not None
        self.durations.observe(task.prefix, msg.duration)
        if task.sent_idle:
            worker.round_trip.observe(max(0.0, self.now - task.sent_at - msg.duration))
        if task.is_output and not task.delivered:
            if msg.value is None:
                raise ValueError(f"worker {worker.name} sent no value for output {task.key!r}")
            task.delivered = True
            self._out.append(RunOutput(run.id, task.key, msg.value))
            run.undelivered -= 1
        self._transition(task, "memory", worker)
        if self._cache_runs:
            self.caching.done(task, msg, worker)
        if not run.undelivered:
            self._out.append(RunDone(run.id, run.run_seconds, run.serialization_seconds))
            self._drop_run(run)

    def _on_task_erred(self, worker: WorkerRecord, msg: p.TaskErred) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self.copies.not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        self.failures.fail(task, worker, msg.exception, msg.traceback, msg.message, False)

    def _on_task_crashed(self, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self.copies.not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        task.attempts += 1
        if task.attempts > retries_of(task):
            reason = f"{msg.reason} ({task.attempts} attempts)"
            self.failures.fail(task, worker, None, "", reason, crashed=True)
        else:  # queued again, or, sent ahead of an input still missing, waiting for it
            self._transition(task, "ready" if task.missing == 0 else "waiting")

    def _on_disk_full(self, worker: WorkerRecord, msg: p.DiskFull) -> None:
        """A full worker finishes what it holds and serves peers, but gets no new work."""
        full = msg.full
        if full is worker.full:
            return
        worker.full = full
        if full:
            self.full.add(worker)
            self.queue.forget_target(worker.id)
        else:
            self.full.discard(worker)

    def _on_uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> None:
        self.relays.on_uploaded(worker, msg)
        self.caching.uploaded(worker, msg)  # outputs of the cache, results for its disk

    # The components' reports, through the state's table (which tests patch).

    def _on_fetch_failed(self, worker: WorkerRecord, msg: p.FetchFailed) -> None:
        self.copies.on_fetch_failed(worker, msg)

    def _on_replicas(self, worker: WorkerRecord, msg: p.Replicas) -> None:
        self.copies.on_replicas(worker, msg)

    def _on_lost(self, worker: WorkerRecord, msg: p.Lost) -> None:
        self.copies.on_lost(worker, msg)

    def _on_relay(self, worker: WorkerRecord, msg: p.Relay) -> None:
        self.relays.on_relay(worker, msg)

    def _on_withdrawn(self, worker: WorkerRecord, msg: p.Withdrawn) -> None:
        self.stealing.on_withdrawn(worker, msg)

    def _on_bad_report(self, ev: BadReport) -> None:
        self.failures.on_bad_report(ev)

    def _on_abort(self, ev: AbortRun) -> None:
        self.failures.on_abort(ev)

    def _on_cache_clear(self, ev: CacheClear) -> None:
        self.caching.on_clear(ev)

    # -- what the components call back ----------------------------------------------------

    def _send(self, worker: WorkerRecord, message: ToWorker) -> None:
        self._out.append(Send(worker.id, message))

    def _drop_run(self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None) -> None:
        self.failures.drop_run(run, sweep, failed)

    def _abort(self, run_id: int, error: BaseException, what: str) -> None:
        self.failures.abort(run_id, error, what)

    def _lose(self, lost: list[TaskRecord]) -> None:
        self.copies.lose(lost)

    def _recompute(self, task: TaskRecord) -> None:
        self.copies.recompute(task)

    # -- dispatch ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Give ready tasks to workers below their saturation, one per worker per round.

        Workers first take their own (targeted) and untargeted work, and only then work
        targeted elsewhere: when both are free, a task runs where its inputs are. Then,
        if cores are idle and no task is queued here, take back tasks that wait
        unstarted on a worker with more tasks than cores.
        """
        if self.constraints.pending():
            self.constraints.dispatch()
        workers = list(self.workers.values())
        if self.full:
            # When every worker is full, waiting for room could wait forever: overflow.
            workers = [w for w in workers if not w.full] or workers
        queue = self.queue
        for steal in (False, True):
            hungry = workers
            while hungry and queue:
                still_hungry = []
                for worker in hungry:
                    task = queue.peek_for(worker.id, steal)
                    if task is None:
                        continue
                    if len(worker.processing) >= worker.cores + self._extra(worker, task):
                        continue
                    queue.pop_for(worker.id, steal)
                    try:
                        self._transition(task, "processing", worker)
                        self._send_ahead(task, worker)
                    except Exception as exc:
                        what = f"sending task {task.key!r} (id {task.id}) to worker {worker.name}"
                        self._abort(task.run.id, exc, what)
                        continue
                    still_hungry.append(worker)
                hungry = still_hungry
        if not queue:
            try:
                self.stealing.steal_for_idle_workers()
            except Exception as exc:  # stealing is an optimisation: runs go on without it
                self._out.append(EventDropped("taking queued tasks back for idle workers", exc))

    def _extra(self, worker: WorkerRecord, task: TaskRecord) -> int:
        if worker.holding and (held := self.constraints.held_back(worker)):  # annotated there
            return -held
        if self.fixed_extra_tasks_per_core is not None:
            return worker.cores * self.fixed_extra_tasks_per_core
        trip = worker.round_trip.value if worker.round_trip.count else None
        return extra_tasks(
            worker.cores, self.durations.get(task.prefix), trip, self.max_extra_tasks_per_core
        )

    # -- transitions ------------------------------------------------------------------

    def _transition(
        self,
        task: TaskRecord,
        finish: TaskStateName,
        worker: WorkerRecord | None = None,
        drop: Drop | None = None,
    ) -> None:
        start = task.state
        step = self._TRANSITIONS.get((start, finish))
        if step is None:
            story = [f"{s} -> {f}" for i, s, f in self.story if i == task.id]
            raise InvalidTransition(task.key, start, finish, story)
        self.story.append((task.id, start, finish))
        task.state = finish  # before the step: nested transitions see the new state
        step(self, task, worker, drop)

    def _waiting_to_ready(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        placement = task.placement
        if placement is not None:
            return self.constraints.push(task, placement)
        task.pulled = False
        self.queue.push(task, task.priority, self._target(task))

    def _ready_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        self.queue.remove(task)
        self.constraints.remove(task)

    def _ready_to_processing(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        assert worker is not None
        self._assign(task, worker)
        if not task.deps and len(self.workers) > 1:
            self._pull_siblings(task, worker)

    def _waiting_to_processing(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        """Sent ahead: the inputs it misses are being computed on the same worker."""
        assert worker is not None
        self._assign(task, worker)

    def _assign(self, task: TaskRecord, worker: WorkerRecord) -> None:
        task.worker = worker
        task.sent_at = self.now
        # Only tasks that can start at once measure the round trip.
        task.sent_idle = task.missing == 0 and len(worker.processing) < worker.cores
        worker.processing[task] = None
        run = task.run
        config_id = 0  # the defaults: nothing to announce
        if run.config is not None:
            config_id = run.id
            if run.id not in worker.configs:
                worker.configs.add(run.id)
                self._send(worker, run.config)
        for fid in task.functions:
            if fid not in worker.functions:
                worker.functions.add(fid)
                self._send(worker, p.Function(fid, _out_of_band(run.functions[fid])))
        deps = tuple(_location(dep, worker) for dep in task.deps)
        if self._cache_runs:
            deps = self.caching.locations(task, deps)  # results of other runs, by our keys
        for dep in deps:
            if dep.value is not None:  # inline: bytes moved from the manager
                self._inlined[worker] = self._inlined.get(worker, 0) + len(dep.value.header)
        self._send(
            worker,
            p.Execute(
                task.id, task.key, task.payload, deps, task.is_output, config_id,
                None if task.unread is None else not task.unread,
            ),
        )  # fmt: skip
        if run.watched:
            self._out.append(Dispatched(run.id, task.id, task.key, task.prefix, worker.name))

    def _processing_to_ready(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        self._unassign(task)
        self._recall_sent_ahead(task)
        self._waiting_to_ready(task, None, None)

    def _processing_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        held = self._unassign(task)
        if held is not None and held.id in self.workers:
            self._send(held, p.Cancel((task.id,)))
        self._recall_sent_ahead(task)

    def _recall_sent_ahead(self, task: TaskRecord) -> None:
        """Dependents sent ahead to wait for ``task`` there must wait here again."""
        for dependent in task.dependents:
            if dependent.state == "processing":
                self._transition(dependent, "waiting")

    def _unassign(self, task: TaskRecord) -> WorkerRecord | None:
        self._settled(task)
        worker = task.worker
        if worker is not None:
            worker.processing.pop(task, None)
        task.worker = None
        return worker

    def _processing_to_memory(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        assert worker is not None
        self._unassign(task)
        if not task.unread:  # an unread output is not kept: nothing to release later
            task.who_has.add(worker)
            worker.has_what.add(task)
        for dependent in task.dependents:
            dependent.missing -= 1
            if dependent.missing == 0:
                if dependent.state == "waiting":
                    self._transition(dependent, "ready")
                elif dependent.state == "processing" and dependent.worker is not None:
                    # It was sent ahead and starts now: extend the chain behind it.
                    self._send_ahead(dependent, dependent.worker)
        for dep in task.deps:
            dep.waiters -= 1
            if dep.state == "memory" and not needed(dep):
                self._transition(dep, "released")
        if not needed(task):
            self._transition(task, "released")
        elif task.run.replicas > 1:
            self.copies.replicate(task, worker)

    def _memory_to_released(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        """Drop every copy; dependents that counted on it must wait for it again."""
        task.value = None
        for holder in task.who_has:
            holder.has_what.discard(task)
            if holder.id in self.workers:
                self._send(holder, p.Release((task.id,)))
        task.who_has.clear()
        for dependent in task.dependents:
            if dependent.state in ("waiting", "ready", "processing"):
                dependent.missing += 1
                if dependent.state != "waiting":
                    self._transition(dependent, "waiting")

    def _nothing(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        """released -> waiting (lineage counts first); and the cache's waiting ->
        released (a task its run will not compute unless lineage needs it) and
        waiting -> memory (read from the cache's directory: ``Caching`` sets its value)."""

    def _processing_to_forgotten(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        assert drop is not None
        self.failures.forget(task, drop, True)

    def _to_forgotten(self, task: TaskRecord, worker: WorkerRecord | None, drop: Drop | None) -> None:
        assert drop is not None
        self.failures.forget(task, drop, False)

    _TRANSITIONS: ClassVar[dict[tuple[TaskStateName, TaskStateName], Step]] = {
        ("waiting", "ready"): _waiting_to_ready,
        ("ready", "waiting"): _ready_to_waiting,
        ("ready", "processing"): _ready_to_processing,
        ("waiting", "processing"): _waiting_to_processing,
        ("processing", "ready"): _processing_to_ready,
        ("processing", "waiting"): _processing_to_waiting,
        ("processing", "memory"): _processing_to_memory,
        ("memory", "released"): _memory_to_released,
        ("released", "waiting"): _nothing,
        ("released", "ready"): _waiting_to_ready,
        ("waiting", "released"): _nothing,
        ("waiting", "memory"): _nothing,
        ("waiting", "forgotten"): _to_forgotten,
        ("ready", "forgotten"): _to_forgotten,
        ("processing", "forgotten"): _processing_to_forgotten,
        ("memory", "forgotten"): _to_forgotten,
        ("released", "forgotten"): _to_forgotten,
    }

    # Handlers take (state, worker, report) and (state, event): one signature per type.
    _REPORT_HANDLERS: ClassVar[dict[type, Callable[..., None]]] = {
        p.TaskDone: _on_task_done,
        p.TaskErred: _on_task_erred,
        p.TaskCrashed: _on_task_crashed,
        p.FetchFailed: _on_fetch_failed,
        p.Replicas: _on_replicas,
        p.Lost: _on_lost,
        p.Relay: _on_relay,
        p.Uploaded: _on_uploaded,
        p.Withdrawn: _on_withdrawn,
        p.DiskFull: _on_disk_full,
    }

    _EVENT_HANDLERS: ClassVar[dict[type, Callable[..., None]]] = {
        SubmitRun: _on_submit,
        ExtendRun: _on_extend,
        CancelRun: _on_cancel,
        WorkerJoined: _on_worker_joined,
        WorkerLost: _on_worker_lost,
        FromWorker: _on_from_worker,
        BadReport: _on_bad_report,
        AbortRun: _on_abort,
        CacheClear: _on_cache_clear,
    }


def _out_of_band(code: bytes) -> bytes | pickle.PickleBuffer:
    """Large function bytes (big closures) travel as their own frame."""
    return pickle.PickleBuffer(code) if len(code) >= OUT_OF_BAND_MIN_BYTES else code


def _location(dep: TaskRecord, worker: WorkerRecord) -> p.DepLocation:
    """Where ``worker`` finds an input of a task: inline when small and not held there."""
    if dep.value is not None and worker not in dep.who_has:
        return p.DepLocation(dep.id, dep.key, (), dep.value)
    return p.DepLocation(dep.id, dep.key, _peers(dep, worker))


def _peers(dep: TaskRecord, worker: WorkerRecord) -> tuple[str, ...] | None:
    """Where ``worker`` finds an input: () it holds it, None it is computing it, else peers."""
    if worker in dep.who_has:
        return ()
    if dep.state == "processing":
        return None
    return tuple(holder.peer_address for holder in dep.who_has)
