"""The scheduler as a sans-I/O state machine: events in, instructions out.

``SchedulerState.handle(events, now)`` is the only way to change the state. Events are
runs submitted or cancelled, workers joining or lost, and the messages workers send; the
instructions returned are messages to workers (``Send``) and news for the callers of
``get`` (``RunOutput``, ``RunDone``, ``RunFailed``, ``RunAborted``) and for the manager's
accounting (``BytesInlined``). No sockets, threads or clocks: tests drive it with literal
events. Its records are in ``records``, events and instructions in ``messages``. The state
keeps the records and the transitions; its components, each with its own state, do the
rest: ``Dispatch``, ``Saturation``, ``Constraints``, ``Locality``, ``Stealing``, ``Copies``,
``Failures``, ``Relays``, ``Caching``, ``Claims``, ``Churn``, ``Faults`` and ``Sizing``
(docs/architecture.md: what each decides).

A run submitted with ``watched=True`` (a progress bar, a report or an event log) also
yields ``Dispatched`` for each task sent and ``TaskFinished`` for each report taken about
one of its tasks; unwatched runs pay one flag test per task for this. Every run's
``RunDone`` or ``RunFailed`` carries the seconds its tasks ran and serialized (summed from
its ``TaskDone`` reports: ``manager.last_run``).

Every run ends. Events are handled one at a time, and one that raises never takes the
events beside it down: the runs it concerns fail with its exception (``RunAborted``: the
run of the task a report is about, the run a ``SubmitRun``/``ExtendRun`` is about, the runs
with work on a worker being lost) and are dropped the usual way, which tolerates a
half-applied handler; an event that concerns no run is dropped (``EventDropped``, for the
manager to log). ``handle`` itself never raises.

A task moves through these states; every legal edge is in ``_TRANSITIONS`` and any other
raises ``InvalidTransition``. When its run ends, every task goes from whatever state it is
in to "forgotten" (``Failures.dismiss``), which leaves it in no record::

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

The result cache (``caching``) adds waiting -> released (a task its run does not compute:
a hit, or an input only hits read) and waiting -> memory (read from disk). A report from a
worker counts only if its task is processing there (``_held``); any other is stale, or a
false claim if the manager never gave it that task (``claims``: dropped, counted).

Two counters make completion and release O(edges): ``missing`` = inputs not in memory;
``waiters`` = dependents still waiting, ready or processing. A result is released once
``waiters`` is zero, unless it is an output owed to the caller or its run still arrives.
The transitions also count the tasks past "waiting", so that ``waiting()`` (the live
view's) costs nothing per task to ask: a reader of results recomputed after a loss waits
again, whatever its run's reports of tasks done add up to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from daskvine_py.errors import InvalidTransition
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.caching import Caching
from daskvine_py.scheduler.churn import Churn
from daskvine_py.scheduler.claims import Claims
from daskvine_py.scheduler.constraints import Constraints
from daskvine_py.scheduler.copies import Copies
from daskvine_py.scheduler.dispatch import Dispatch
from daskvine_py.scheduler.failures import Failures
from daskvine_py.scheduler.faults import Faults
from daskvine_py.scheduler.locality import CHAIN_AHEAD, SIBLING_INPUTS, Locality, target
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
    Tick,
    ToWorker,
    WorkerId,
    WorkerJoined,
    WorkerLost,
)
from daskvine_py.scheduler.records import RunRecord, TaskRecord, TaskStateName, WorkerRecord, needed
from daskvine_py.scheduler.relays import Relays
from daskvine_py.scheduler.saturation import DurationEstimates, Saturation
from daskvine_py.scheduler.sizing import Sizing
from daskvine_py.scheduler.stealing import Stealing
from daskvine_py.scheduler.submission import Submission
from daskvine_py.scheduler.verify import Verification
from daskvine_py.wire import protocol as p

__all__ = [
    "RUN_PRIORITY_BITS", "AbortRun", "BadReport", "BytesInlined", "CancelRun", "Dispatched",
    "EventDropped", "ExtendRun", "FromWorker", "Key", "NewTask", "RunAborted", "RunDone",
    "RunFailed", "RunOutput", "RunRecord", "SchedulerState", "Send", "SubmitRun",
    "TaskFinished", "TaskRecord", "TaskStateName", "WorkerId", "WorkerJoined", "WorkerLost",
    "WorkerRecord",
]  # fmt: skip

#: A step of the transition table: (state, task, the worker it goes to, if it does).
Step = Callable[["SchedulerState", TaskRecord, "WorkerRecord | None"], None]
#: A report's handler (the worker, the report) or an event's; one signature per type.
Handler = Callable[..., None]


class SchedulerState:
    """All scheduling state of a manager; mutate only through ``handle``.

    The records are heavily correlated (a task in ``processing`` is in its worker's
    ``processing`` set, a result in ``memory`` is in each holder's ``has_what``), which is
    why only the transitions touch them. The components share the records by reference
    and call back the transitions; none is mixed into this class. ``sizing`` and
    ``sizing_categories``: the modes of ``Sizing`` ("fixed", no sizing, unless asked:
    the manager passes its settings, "max" by default).
    """

    def __init__(
        self,
        max_extra_tasks_per_core: int = 16,
        fixed_extra_tasks_per_core: int | None = None,
        story_length: int = 10_000,
        chain_ahead: int = CHAIN_AHEAD,
        sibling_inputs: int = SIBLING_INPUTS,
        sizing: str = "fixed",
        sizing_categories: Mapping[str, str] | None = None,
    ) -> None:
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
        #: tasks of ``tasks`` past "waiting" and not forgotten, kept by ``_transition``
        #: (every task is made waiting, with no transition): ``waiting`` is the rest
        self._past_waiting = 0
        transition, send, held, out = self._transition, self._send, self._held, self._out
        workers, runs, tasks = self.workers, self.runs, self.tasks
        queue, full = self.queue, self.full
        drop_run, abort = self._drop_run, self._abort
        self.constraints = Constraints(workers, runs, full, out, transition, drop_run, abort)
        self.saturation = Saturation(
            self.durations, self.constraints.held_back, max_extra_tasks_per_core,
            fixed_extra_tasks_per_core,
        )  # fmt: skip
        extra = self.saturation.extra
        self.locality = Locality(queue, extra, transition, chain_ahead, sibling_inputs)
        self.stealing = Stealing(workers, queue, self.constraints.room, send, held, transition)
        withdrawing, next_id = self.stealing.withdrawing, lambda: self._next_task_id
        self.claims = Claims(workers, tasks, out, send, held, withdrawing, next_id)
        tell = self.claims.send  # (remembers what takes tasks back: their reports are stale)
        self.failures = Failures(
            workers, runs, tasks, out, queue, self.constraints.placing, transition, tell, held,
            drop_run, self.stealing.settled,
        )  # fmt: skip
        self.caching = Caching(
            workers, runs, tasks, out, transition, tell, self._lose, self._recompute, drop_run,
            self.failures.dismiss,
        )  # fmt: skip
        cache_runs = self.caching.cache_runs
        self.faults = Faults(workers, out, queue, self.durations, transition, tell, held,
                             self.failures.fail, self.stealing.withdrawing)  # fmt: skip
        self.copies = Copies(
            tasks, workers, transition, tell, held, self.caching.lost, self.caching.payload,
            cache_runs,
        )  # fmt: skip
        self.relays = Relays(tasks, workers, out, tell)
        self.churn = Churn(
            workers, tasks, full, queue, transition, held, self.failures.fail, self._lose,
            self.copies.replicate, self.caching.worker_lost,
        )  # fmt: skip
        self._out_of_retries = self.churn.out_of_retries
        self.verification = Verification(
            workers, tasks, transition, self._new_id, self.failures.fail
        )
        self.submission = Submission(
            runs, tasks, transition, self._new_id, self.constraints.mark, self.verification.added,
            self.caching, cache_runs,
        )  # fmt: skip
        self.sizing = Sizing(workers, out, held, self.claims.stale, self.copies.not_held,
                             self.churn.out_of_retries, self.failures.fail, sizing,
                             sizing_categories)  # fmt: skip
        self.dispatch = Dispatch(
            workers, queue, full, out, transition, send, abort, self.constraints, extra,
            self.locality.send_ahead, self.stealing.steal_for_idle_workers,
            self.caching.locations, cache_runs, self.sizing,
        )  # fmt: skip
        #: queries over the workers: tasks ready, processing, running; each one's load
        self.load, self.worker_loads = self.dispatch.load, self.dispatch.worker_loads
        # What the per-task paths call, bound once.
        self._assign = self.dispatch.assign
        self._send_ahead = self.locality.send_ahead
        self._pull_siblings = self.locality.pull_siblings
        self._settled = self.stealing.settled
        self._cache_runs = cache_runs  # (tested for emptiness: any run with a cache plan?)
        checked = self.claims.checked  # what only claims reach: checked first (``claims``)
        self._reports: dict[type, Handler] = {
            p.TaskDone: self._on_task_done,
            p.TaskErred: self._on_task_erred,
            p.TaskCrashed: self._on_task_crashed,
            p.FetchFailed: checked(p.FetchFailed, self.copies.on_fetch_failed),
            p.Replicas: checked(p.Replicas, self.copies.on_replicas),
            p.Lost: checked(p.Lost, self.copies.on_lost),
            p.Relay: checked(p.Relay, self.relays.on_relay),
            p.Uploaded: checked(p.Uploaded, self.relays.on_uploaded, self.caching.uploaded),
            p.Withdrawn: checked(p.Withdrawn, self.stealing.on_withdrawn),
            p.Started: checked(p.Started, self.churn.on_started, self.faults.on_started),
            p.Transfers: self.claims.on_transfers,  # (only those the manager's loop doubts)
            p.DiskFull: self.dispatch.on_disk_full,
            p.TaskExhausted: self.sizing.on_exhausted,
        }
        self._events: dict[type, Handler] = {
            SubmitRun: self.submission.on_submit,
            ExtendRun: self.submission.on_extend,
            CancelRun: self._on_cancel,
            WorkerJoined: self._on_worker_joined,
            WorkerLost: self.churn.on_worker_lost,
            FromWorker: self._on_from_worker,
            BadReport: self.failures.on_bad_report,
            AbortRun: self.failures.on_abort,
            CacheClear: self.caching.on_clear,
            Tick: self.faults.on_tick,
        }

    # -- entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[object], now: float = 0.0) -> list[Any]:
        """Apply ``events`` in order, then dispatch ready work; return the instructions.

        Never raises: an event whose handling raises fails the runs it concerns
        (``RunAborted``) or, concerning none, is dropped (``EventDropped``). Each
        instruction is an ``Instruction``; the list is typed loosely because its reader
        dispatches on ``type(instruction)``, which type checkers do not narrow.
        """
        out = self._out
        out.clear()  # (the list is shared with the components: emptied, never replaced)
        self.now = self.dispatch.now = self.claims.now = self.churn.now = self.faults.now = now
        handlers = self._events
        runs = len(self.runs)
        for event in events:
            if type(event) is not FromWorker:  # may free or need any worker: visit all
                self.dispatch.everyone = True
            handler = handlers.get(type(event))
            if handler is None:
                out.append(
                    EventDropped(f"an unknown event {event!r:.80}", TypeError("unknown event"))
                )
                continue
            # What a worker being lost concerns must be read before its records go.
            lost = self.failures.runs_on(event.worker) if isinstance(event, WorkerLost) else ()
            try:
                handler(event)
            except Exception as exc:
                self.failures.on_handler_error(event, exc, lost)
        if len(self.runs) != runs:  # a run ended or failed: its tasks left their workers
            self.dispatch.everyone = True
            if not self.runs:
                self.sizing.idle()
        try:
            self.dispatch.dispatch()
        except Exception as exc:  # outside any one task: no telling which runs it spared
            for run_id in list(self.runs):
                self._abort(run_id, exc, "dispatching ready tasks")
        self.dispatch.count_inlined()
        instructions = out.copy()
        out.clear()
        return instructions

    # -- queries ----------------------------------------------------------------------

    def runs_of(self, task_ids: Iterable[int]) -> list[int]:
        """The runs of these tasks (those still known), each once."""
        return self.failures.runs_of(task_ids)

    def waiting(self) -> int:
        """Tasks waiting for inputs, over every run: a new run's, and readers whose
        inputs are recomputed after a loss alike (the live view's "waiting")."""
        return len(self.tasks) - self._past_waiting

    @property
    def recomputed(self) -> int:
        """Results brought back after every copy was lost (lineage), since the start."""
        return self.copies.recomputed

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

    # -- event handlers ---------------------------------------------------------------

    def _on_cancel(self, ev: CancelRun) -> None:
        run = self.runs.get(ev.run_id)
        if run is not None:
            self._drop_run(run)

    def _on_worker_joined(self, ev: WorkerJoined) -> None:
        if ev.worker in self.workers:
            return
        self.workers[ev.worker] = WorkerRecord(*ev)  # the same fields, in the same order

    def _on_from_worker(self, ev: FromWorker) -> None:
        worker = self.workers.get(ev.worker)
        if worker is None:
            return  # a message that was in flight when the worker was declared lost
        handler = self._reports.get(type(ev.message))
        if handler is None:
            raise TypeError(f"not a worker report: {ev.message!r}")
        self.dispatch.touch(worker)
        handler(worker, ev.message)

    def _new_id(self) -> int:
        self._next_task_id += 1
        return self._next_task_id - 1

    def _held(self, task_id: int, worker: WorkerRecord) -> TaskRecord | None:
        """The task a report from ``worker`` is about; None: stale (not processing there)."""
        task = self.tasks.get(task_id)
        if task is None or task.state != "processing" or task.worker is not worker:
            return None
        return task

    def _on_task_done(self, worker: WorkerRecord, msg: p.TaskDone) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self.claims.stale_done(worker, msg.task_id)  # stale (released), or a false claim
            return
        run = task.run
        if run.watched:
            self._out.append(TaskFinished(run.id, task.key, worker.name, msg))
        run.serialization_seconds += msg.serialization
        self.sizing.done(task, msg)  # (its category's totals in the run, and its size)
        task.nbytes = msg.nbytes
        if msg.value is not None and task.waiters and p.inlinable(msg.value):
            task.value = msg.value
        if task.unread is None:  # (the cache's) its worker kept it only if too large
            task.unread = task.value is not None
        self.faults.done(task, worker, msg.duration)  # (and the duration estimates)
        if task.sent_idle:
            worker.round_trip.observe(max(0.0, self.now - task.sent_at - msg.duration))
        if task.is_output and not task.delivered:
            if msg.value is None:
                raise ValueError(f"worker {worker.name} sent no value for output {task.key!r}")
            task.delivered = True
            self._out.append(RunOutput(run.id, task.key, msg.value))
            run.undelivered -= 1
        self._transition(task, "memory", worker)
        if task.echo and not self.verification.done(task, worker, msg.value):
            return  # a re-run's result differed: the run failed
        if self._cache_runs:
            self.caching.done(task, msg, worker)
        if not run.undelivered:
            self._out.append(
                RunDone(run.id, run.run_seconds, run.serialization_seconds, run.verified,
                        run.categories)
            )
            self._drop_run(run)

    def _on_task_erred(self, worker: WorkerRecord, msg: p.TaskErred) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            if self.claims.stale(worker, msg.task_id, msg):  # (else a false claim: dropped)
                self.copies.not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        task.run.categories.fail(self.sizing.category(task))
        self.faults.erred(task, worker, msg)  # retried once elsewhere, or the run fails

    def _on_task_crashed(self, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            if self.claims.stale(worker, msg.task_id, msg):  # (else a false claim: dropped)
                self.copies.not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        task.run.categories.fail(self.sizing.category(task))
        self.faults.crashed(task, worker)
        if self._out_of_retries(task):
            attempts = f"{task.attempts} attempt{'' if task.attempts == 1 else 's'}"
            reason = f"{msg.reason} ({attempts})"
            self.failures.fail(task, worker, None, "", reason, crashed=True)


    # -- what the components call back ----------------------------------------------------

    def _send(self, worker: WorkerRecord, message: ToWorker) -> None:
        self._out.append(Send(worker.id, message))

    def _drop_run(
        self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None
    ) -> None:
        if self._cache_runs:
            self.caching.drop(run)  # its cacheable results outlive it
        self.failures.forget_run(run, sweep, failed)

    def _abort(self, run_id: int, error: BaseException, what: str) -> None:
        self.failures.abort(run_id, error, what)

    def _lose(self, lost: list[TaskRecord]) -> None:
        self.copies.lose(lost)

    def _recompute(self, task: TaskRecord) -> None:
        self.copies.recompute(task)

    # -- transitions ------------------------------------------------------------------

    def _transition(
        self, task: TaskRecord, finish: TaskStateName, worker: WorkerRecord | None = None
    ) -> None:
        start = task.state
        step = self._TRANSITIONS.get((start, finish))
        if step is None:
            story = [f"{s} -> {f}" for i, s, f in self.story if i == task.id]
            raise InvalidTransition(task.key, start, finish, story)
        self.story.append((task.id, start, finish))
        if start != "waiting":
            self._past_waiting -= 1
        if finish != "waiting" and finish != "forgotten":
            self._past_waiting += 1
        task.state = finish  # before the step: nested transitions see the new state
        step(self, task, worker)

    def _waiting_to_ready(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        placement = task.placement
        if placement is not None:
            return self.constraints.push(task, placement)
        task.pulled = False
        self.queue.push(task, task.priority, target(task, self.full))

    def _ready_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        self.queue.remove(task)
        self.constraints.remove(task)

    def _ready_to_processing(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        assert worker is not None
        self._assign(task, worker)
        if not task.deps and len(self.workers) > 1:
            self._pull_siblings(task, worker)

    def _waiting_to_processing(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        """Sent ahead: the inputs it misses are being computed on the same worker."""
        assert worker is not None
        self._assign(task, worker)

    def _processing_to_ready(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        self.claims.remember(self._unassign(task), task.id)  # its reports there are stale
        self._recall_sent_ahead(task)
        self._waiting_to_ready(task, None)

    def _processing_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        held = self._unassign(task)
        if held is not None and held.id in self.workers:
            self.claims.send(held, p.Cancel((task.id,)))
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
        task.worker = task.started_at = None
        return worker

    def _processing_to_memory(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
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
        elif self.churn.level:  # workers are being lost: a second copy if worth it
            self.churn.made(task, worker)

    def _memory_to_released(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
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

    def _nothing(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        """released -> waiting (``Copies.recompute`` counted); the cache's waiting ->
        released (not computed unless lineage needs it) and waiting -> memory (read from
        disk: ``Caching``); every state -> forgotten (``Failures.dismiss`` does the rest)."""

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
        ("waiting", "forgotten"): _nothing,
        ("ready", "forgotten"): _nothing,
        ("processing", "forgotten"): _nothing,
        ("memory", "forgotten"): _nothing,
        ("released", "forgotten"): _nothing,
    }
