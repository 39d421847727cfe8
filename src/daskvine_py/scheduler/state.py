"""The scheduler as a sans-I/O state machine: events in, instructions out.

``SchedulerState.handle(events, now)`` is the only way to change the state. Events are
runs submitted or cancelled, workers joining or lost, and the messages workers send; the
instructions returned are messages to workers (``Send``) and news for the callers of
``get`` (``RunOutput``, ``RunDone``, ``RunFailed``, ``RunAborted``) and for the manager's
accounting (``BytesInlined``). No sockets, threads or clocks: tests drive it with literal
events. Its records are in ``records``, events and instructions in ``messages``. The state
keeps the transitions; the records and the components, each with its own state, share one
``context.Context``: ``Constraints``, ``Saturation``, ``Locality``, ``Stealing``,
``Claims``, ``Failures``, ``Sizing``, ``Faults``, ``Verification``, ``Caching``,
``Copies``, ``Relays``, ``Churn``, ``Submission`` and ``Dispatch`` (docs/architecture.md:
what each decides). A task's report is one event the components subscribe to
(``Context``: ``task_done``, ``result_stored``, ``task_erred``, ``task_crashed``).

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
worker counts only if its task is processing there (``Context.held``); any other is
stale, or a false claim if the manager never gave it that task (``claims``: dropped, counted).

Two counters make completion and release O(edges): ``missing`` = inputs not in memory;
``waiters`` = dependents still waiting, ready or processing. A result is released once
``waiters`` is zero, unless it is an output owed to the caller or its run still arrives.
The transitions also count the tasks past "waiting", so that ``waiting()`` (the live
view's) costs nothing per task to ask: a reader of results recomputed after a loss waits
again, whatever its run's reports of tasks done add up to.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

from daskvine_py.errors import InvalidTransition
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.caching import Caching
from daskvine_py.scheduler.churn import Churn
from daskvine_py.scheduler.claims import Claims
from daskvine_py.scheduler.constraints import Constraints
from daskvine_py.scheduler.context import Context
from daskvine_py.scheduler.copies import Copies
from daskvine_py.scheduler.dispatch import Dispatch
from daskvine_py.scheduler.failures import Failures
from daskvine_py.scheduler.faults import Faults
from daskvine_py.scheduler.locality import (
    CHAIN_AHEAD,
    SIBLING_INPUTS,
    Locality,
    files_held,
    target,
)
from daskvine_py.scheduler.messages import (
    RUN_PRIORITY_BITS,
    AbortRun,
    BadReport,
    BytesInlined,
    CacheClear,
    CancelRun,
    Dispatched,
    Event,
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
    WorkerId,
    WorkerJoined,
    WorkerLost,
)
from daskvine_py.scheduler.records import RunRecord, TaskRecord, TaskStateName, WorkerRecord, needed
from daskvine_py.scheduler.relays import Relays
from daskvine_py.scheduler.saturation import Saturation
from daskvine_py.scheduler.sizing import Sizing
from daskvine_py.scheduler.stealing import Stealing
from daskvine_py.scheduler.submission import Submission
from daskvine_py.scheduler.verify import Verification
from daskvine_py.wire import protocol as p

__all__ = [
    "RUN_PRIORITY_BITS",
    "AbortRun",
    "BadReport",
    "BytesInlined",
    "CancelRun",
    "Dispatched",
    "Event",
    "EventDropped",
    "ExtendRun",
    "FromWorker",
    "Key",
    "NewTask",
    "RunAborted",
    "RunDone",
    "Instruction",
    "RunFailed",
    "RunOutput",
    "RunRecord",
    "SchedulerState",
    "Send",
    "SubmitRun",
    "TaskFinished",
    "TaskRecord",
    "TaskStateName",
    "WorkerId",
    "WorkerJoined",
    "WorkerLost",
    "WorkerRecord",
]

#: The pace (``SchedulerState.pace``): the loop lets reports gather after a pass for this
#: fraction of the shortest recent task's duration, and never longer than ``PACE_MAX``
#: seconds. Tasks that finish one by one (a long DV3's) cost a pass each otherwise, and a
#: pass has fixed costs (a dispatch round, a poll, a send per worker); 1% of a task's time
#: is what waiting may add to it.
PACE_FRACTION = 0.01
PACE_MAX = 0.005
#: A shorter pace is none: a sleep takes some 60 µs however short it is asked to be, and
#: tasks under 50 ms come in batches large enough already.
PACE_MIN = 0.0005
#: How fast the basis of the pace follows longer tasks (a shorter one sets it at once).
PACE_RISE = 0.1

#: A step of the transition table: (state, task, the worker it goes to, if it does).
Step = Callable[["SchedulerState", TaskRecord, "WorkerRecord | None"], None]
#: A report's handler (the worker, the report) or an event's; one signature per type.
Handler = Callable[..., None]


class SchedulerState:
    """All scheduling state of a manager; mutate only through ``handle``.

    The records are heavily correlated (a task in ``processing`` is in its worker's
    ``processing`` set, a result in ``memory`` is in each holder's ``has_what``), which is
    why only the transitions touch them. The records live in one ``Context`` (``ctx``)
    with the components, which share them by reference and call back the transitions;
    none is mixed into this class. ``sizing`` and ``sizing_categories``: the modes of
    ``Sizing`` ("fixed", no sizing, unless asked: the manager passes its settings, "max"
    by default).
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
        #: recent transitions (task id, start, finish), for ``InvalidTransition`` messages
        self.story: deque[tuple[int, str, str]] = deque(maxlen=story_length)
        #: tasks of ``tasks`` past "waiting" and not forgotten, kept by ``_transition``
        #: (every task is made waiting, with no transition): ``waiting`` is the rest
        self._past_waiting = 0
        #: seconds the loop may let reports gather after a pass before the next (``pace``)
        self.pace = 0.0
        #: the shortest task of this pass (inf: none finished), and what the pace follows:
        #: the shortest recent duration, rising slowly as longer tasks finish
        self._shortest = math.inf
        self._pace_basis: float | None = None
        ctx = self.ctx = Context(self._transition)
        # The parts, in the order of ``Context.PARTS``: each may bind, as it is built,
        # what the parts above it offer; the order is also the order in which they hear
        # of a task's result (``Context``: sizing and faults before it is stored,
        # verification before the cache after). The state keeps them by their classes.
        ctx.constraints = constraints = Constraints(ctx)
        ctx.saturation = Saturation(ctx, max_extra_tasks_per_core, fixed_extra_tasks_per_core)
        ctx.locality = locality = Locality(ctx, chain_ahead, sibling_inputs)
        ctx.stealing = stealing = Stealing(ctx)
        ctx.claims = claims = Claims(ctx)
        ctx.failures = self._failures = Failures(ctx)
        ctx.sizing = self._sizing = Sizing(ctx, sizing, sizing_categories)
        ctx.faults = self._faults = Faults(ctx)
        ctx.verification = Verification(ctx)
        ctx.caching = self._caching = Caching(ctx)
        ctx.copies = self._copies = Copies(ctx)
        ctx.relays = relays = Relays(ctx)
        ctx.churn = self._churn = Churn(ctx)
        ctx.submission = submission = Submission(ctx)
        ctx.dispatch = self._dispatch = Dispatch(ctx)
        ctx.subscribe()
        failures, copies, caching = self._failures, self._copies, self._caching
        faults, churn, dispatch = self._faults, self._churn, self._dispatch
        # The records, by their usual names (the same objects as the context's).
        self.workers, self.runs, self.tasks = ctx.workers, ctx.runs, ctx.tasks
        self.queue, self.full, self.durations = ctx.queue, ctx.full, ctx.durations
        self._out = ctx.out
        #: queries over the workers: tasks ready, processing, running; each one's load
        self.load, self.worker_loads = dispatch.load, dispatch.worker_loads
        # What the per-task paths call, bound once.
        self._held = ctx.held
        self._send = ctx.send
        self._assign = dispatch.assign
        self._send_ahead = locality.send_ahead
        self._pull_siblings = locality.pull_siblings
        self._pull_readers = locality.pull_readers
        self._settled = stealing.settled
        self._remember = claims.remember
        self._tell = claims.send
        self._stale_done = claims.stale_done
        self._stale = claims.stale
        self._push_placed = constraints.push
        self._unqueue_placed = constraints.remove
        self._replicate = copies.replicate
        self._done_hooks = ctx.done_hooks
        self._erred_hooks = ctx.erred_hooks
        self._crashed_hooks = ctx.crashed_hooks
        checked = claims.checked  # what only claims reach: checked first (``claims``)
        self._reports: dict[type, Handler] = {
            p.TaskDone: self._on_task_done,
            p.TaskErred: self._on_task_erred,
            p.TaskCrashed: self._on_task_crashed,
            p.FetchFailed: checked(p.FetchFailed, copies.on_fetch_failed),
            p.Replicas: checked(p.Replicas, copies.on_replicas, faults.on_fetching),
            p.Lost: checked(p.Lost, copies.on_lost),
            p.Relay: checked(p.Relay, relays.on_relay, faults.on_fetching),
            p.Uploaded: checked(p.Uploaded, relays.on_uploaded, caching.uploaded),
            p.Withdrawn: checked(p.Withdrawn, stealing.on_withdrawn),
            p.Started: checked(p.Started, churn.on_started, faults.on_started),
            p.Transfers: claims.on_transfers,  # (only those the manager's loop doubts)
            p.DiskFull: dispatch.on_disk_full,
            p.TaskExhausted: self._sizing.on_exhausted,
            p.InputServer: self._on_input_server,
            p.InputsDropped: self._on_inputs_dropped,
        }
        self._events: dict[type, Handler] = {
            SubmitRun: submission.on_submit,
            ExtendRun: submission.on_extend,
            CancelRun: self._on_cancel,
            WorkerJoined: self._on_worker_joined,
            WorkerLost: churn.on_worker_lost,
            FromWorker: self._on_from_worker,
            BadReport: failures.on_bad_report,
            AbortRun: failures.on_abort,
            CacheClear: caching.on_clear,
            Tick: faults.on_tick,
        }

    # -- entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[Event], now: float = 0.0) -> list[Instruction]:
        """Apply ``events`` in order, then dispatch ready work; return the instructions.

        Never raises: an event whose handling raises fails the runs it concerns
        (``RunAborted``) or, concerning none, is dropped (``EventDropped``); so does an
        object that is no ``Event``.
        """
        ctx = self.ctx
        out = self._out
        out.clear()  # (the list is shared with the components: emptied, never replaced)
        ctx.now = now
        ctx.batch += 1
        dispatch, failures = self._dispatch, self._failures
        handlers = self._events
        runs = len(self.runs)
        for event in events:
            if type(event) is not FromWorker:  # may free or need any worker: visit all
                dispatch.everyone = True
            handler = handlers.get(type(event))
            if handler is None:
                out.append(
                    EventDropped(f"an unknown event {event!r:.80}", TypeError("unknown event"))
                )
                continue
            # What a worker being lost concerns must be read before its records go.
            lost = failures.runs_on(event.worker) if isinstance(event, WorkerLost) else ()
            try:
                handler(event)
            except Exception as exc:
                failures.on_handler_error(event, exc, lost)
        if len(self.runs) != runs:  # a run ended or failed: its tasks left their workers
            dispatch.everyone = True
            if not self.runs:
                self._sizing.idle()
                self._shrink()
        self._set_pace()
        try:
            dispatch.dispatch()
        except Exception as exc:  # outside any one task: no telling which runs it spared
            for run_id in list(self.runs):
                failures.abort(run_id, exc, "dispatching ready tasks")
        dispatch.count_inlined()
        instructions = out.copy()
        out.clear()
        return instructions

    def _shrink(self) -> None:
        """No run is left: give back the tables a big run grew (a dict keeps its size
        once emptied; ``clear`` frees it): 92 B per task of the largest run so far."""
        ctx = self.ctx
        if not ctx.tasks:
            ctx.tasks.clear()
        self.queue.shrink()
        for worker in self.workers.values():
            if not worker.has_what:
                worker.has_what.clear()

    def _set_pace(self) -> None:
        """The pace after this pass: none without runs; else a fraction of the shortest
        recent task's duration (one shorter task brings it down at once)."""
        shortest, self._shortest = self._shortest, math.inf
        if not self.runs:
            self.pace, self._pace_basis = 0.0, None
            return
        if shortest == math.inf:
            return  # no task finished: as it was
        basis = self._pace_basis
        if basis is None or shortest < basis:
            basis = shortest
        else:
            basis += PACE_RISE * (shortest - basis)
        self._pace_basis = basis
        pace = min(PACE_MAX, PACE_FRACTION * basis)
        self.pace = pace if pace >= PACE_MIN else 0.0

    # -- the parts the manager and tools reach ---------------------------------------------

    @property
    def now(self) -> float:
        """The clock: the ``now`` of the last ``handle`` call."""
        return self.ctx.now

    @property
    def faults(self) -> Faults:
        """Fast aborts, ejections, quarantines (the manager sets their options)."""
        return self._faults

    @property
    def churn(self) -> Churn:
        """Lost workers and temporary replicas (the churn benchmark reads its counts)."""
        return self._churn

    # -- queries ----------------------------------------------------------------------

    def runs_of(self, task_ids: Iterable[int]) -> list[int]:
        """The runs of these tasks (those still known), each once."""
        return self._failures.runs_of(task_ids)

    def waiting(self) -> int:
        """Tasks waiting for inputs, over every run: a new run's, and readers whose
        inputs are recomputed after a loss alike (the live view's "waiting")."""
        return len(self.tasks) - self._past_waiting

    @property
    def recomputed(self) -> int:
        """Results brought back after every copy was lost (lineage), since the start."""
        return self._copies.recomputed

    @property
    def cache(self) -> CacheIndex:
        """What the result cache publishes to other threads (``Caching.index``)."""
        return self._caching.index

    @property
    def cache_worker_bytes(self) -> int:
        """Cached bytes each worker keeps (``CacheBudget.worker_bytes``)."""
        return self._caching.budget.worker_bytes

    @cache_worker_bytes.setter
    def cache_worker_bytes(self, nbytes: int) -> None:
        self._caching.budget.worker_bytes = nbytes

    # -- event handlers ---------------------------------------------------------------

    def _on_cancel(self, ev: CancelRun) -> None:
        run = self.runs.get(ev.run_id)
        if run is not None:
            self._failures.drop_run(run)

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
        self._dispatch.touch(worker)
        handler(worker, ev.message)

    # -- a task's result: the state's records, then the parts that subscribe ------------

    def _on_task_done(self, worker: WorkerRecord, msg: p.TaskDone) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._stale_done(worker, msg.task_id)  # stale (released), or a false claim
            self._faults.stale_done(worker, msg.task_id, msg.duration)  # (crossed an Abort?)
            return
        run = task.run
        if run.watched:
            self._out.append(TaskFinished(run.id, task.key, worker.name, msg))
        if msg.duration < self._shortest:
            self._shortest = msg.duration
        if msg.inputs:
            files_held(self.ctx.input_files, worker, msg.inputs)
        run.serialization_seconds += msg.serialization
        for hook in self._done_hooks:  # (sizing, faults: the task is still processing)
            hook(task, worker, msg)
        if task.state != "processing":
            return  # its run failed: its worker succeeded where others raised (``faults``)
        task.nbytes = msg.nbytes
        if msg.value is not None and task.waiters and p.inlinable(msg.value):
            task.value = msg.value
        if task.unread is None:  # (the cache's) its worker kept it only if too large
            task.unread = task.value is not None
        if task.sent_idle:
            worker.round_trip.observe(max(0.0, self.ctx.now - task.sent_at - msg.duration))
        if task.is_output and not task.delivered:
            if msg.value is None:
                raise ValueError(f"worker {worker.name} sent no value for output {task.key!r}")
            task.delivered = True
            self._out.append(RunOutput(run.id, task.key, msg.value))
            run.undelivered -= 1
        self._transition(task, "memory", worker)
        for stored in self.ctx.stored_hooks:  # (verification, then the cache: ``listen``)
            if not stored(task, worker, msg):
                return  # a re-run's result differed: the run failed
        if not run.undelivered:
            self._out.append(
                RunDone(
                    run.id, run.run_seconds, run.serialization_seconds, run.verified, run.categories
                )
            )
            self._failures.drop_run(run)

    def _on_input_server(self, worker: WorkerRecord, msg: p.InputServer) -> None:
        """What ``worker``'s node's input cache holds, and where it serves it to peers
        (``FetchInputs``; "": it does not)."""
        worker.file_address, worker.file_cache = msg.address, msg.cache
        if msg.files:
            held = tuple(
                (url, size, p.INPUT_FROM_CACHE, version) for url, size, version in msg.files
            )
            files_held(self.ctx.input_files, worker, held)

    def _on_inputs_dropped(self, worker: WorkerRecord, msg: p.InputsDropped) -> None:
        """Files ``worker``'s node let go as their lifetimes ended: no longer held there."""
        gone = tuple((url, 0, p.INPUT_DROPPED, version) for url, version in msg.files)
        files_held(self.ctx.input_files, worker, gone)

    def _on_task_erred(self, worker: WorkerRecord, msg: p.TaskErred) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._stale_report(worker, msg.task_id, msg)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        for hook in self._erred_hooks:  # (sizing; faults: retried elsewhere, or it fails)
            hook(task, worker, msg)

    def _on_task_crashed(self, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._stale_report(worker, msg.task_id, msg)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        for hook in self._crashed_hooks:  # (sizing, faults; churn: retried, or it fails)
            hook(task, worker, msg)

    def _stale_report(self, worker: WorkerRecord, task_id: int, msg: object) -> None:
        """A failure reported about a task not processing there (else a false claim:
        dropped)."""
        if self._stale(worker, task_id, msg):
            self._copies.not_held(task_id, worker)
            self._faults.stale_done(worker, task_id, None)  # (it ended there: no proof)

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
            return self._push_placed(task, placement)
        task.pulled = False
        self.queue.push(task, task.priority, target(task, self.full))

    def _ready_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        self.queue.remove(task)
        self._unqueue_placed(task)

    def _ready_to_processing(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        assert worker is not None
        self._assign(task, worker)
        if task.reads:
            self._pull_readers(task, worker)
        if not task.deps and len(self.workers) > 1:
            self._pull_siblings(task, worker)

    def _waiting_to_processing(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        """Sent ahead: the inputs it misses are being computed on the same worker."""
        assert worker is not None
        self._assign(task, worker)
        worker.ahead.add(task)
        for file in task.reads:
            file.readers.pop(task, None)

    def _processing_to_ready(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        self._remember(self._unassign(task), task.id)  # its reports there are stale
        self._recall_sent_ahead(task)
        for file in task.reads:
            file.readers[task] = None
        self._waiting_to_ready(task, None)

    def _processing_to_waiting(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        held = self._unassign(task)
        if held is not None and held.id in self.workers:
            self._tell(held, p.Cancel((task.id,)))
        self._recall_sent_ahead(task)
        for file in task.reads:
            file.readers[task] = None

    def _unread(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        """Forgotten before it was sent anywhere: no file waits for it to be read."""
        for file in task.reads:
            file.readers.pop(task, None)

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
            if worker.ahead:
                worker.ahead.discard(task)
        task.worker = task.started_at = None
        return worker

    def _processing_to_memory(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        assert worker is not None
        held = self._unassign(task)
        if held is not None and held is not worker and held.id in self.workers:
            # Done where it ran before it was taken back (a copy the report of which
            # crossed the move): the worker it was moved to need not run it, and what
            # it says of it is stale, not false (seen in the simulator: a Started of it
            # judged a false claim).
            self._tell(held, p.Cancel((task.id,)))
        if not task.unread:  # an unread output is not kept: nothing to release later
            task.hold(worker)
            worker.has_what.add(task)
        for dependent in task.dependents:
            dependent.missing -= 1
            if dependent.missing == 0:
                if dependent.state == "waiting":
                    self._transition(dependent, "ready")
                elif dependent.state == "processing" and dependent.worker is not None:
                    # It was sent ahead and starts now: extend the chain behind it.
                    dependent.worker.ahead.discard(dependent)
                    self._send_ahead(dependent, dependent.worker)
        for dep in task.deps:
            dep.waiters -= 1
            if dep.state == "memory" and not needed(dep):
                self._transition(dep, "released")
        if not needed(task):
            self._transition(task, "released")
        elif task.run.replicas > 1:
            self._replicate(task, worker)
        elif self._churn.level:  # workers are being lost: a second copy if worth it
            self._churn.made(task, worker)

    def _memory_to_released(self, task: TaskRecord, worker: WorkerRecord | None) -> None:
        """Drop every copy; dependents that counted on it must wait for it again."""
        task.value = None
        for holder in task.who_has:
            holder.has_what.discard(task)
            if holder.id in self.workers:
                self._send(holder, p.Release((task.id,)))
        task.unheld()
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
        ("waiting", "forgotten"): _unread,
        ("ready", "forgotten"): _unread,
        ("processing", "forgotten"): _nothing,
        ("memory", "forgotten"): _nothing,
        ("released", "forgotten"): _nothing,
    }
