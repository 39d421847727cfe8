"""The scheduler as a sans-I/O state machine: events in, instructions out.

``SchedulerState.handle(events, now)`` is the only way to change the state. Events are
runs submitted or cancelled, workers joining or lost, and the messages workers send; the
returned instructions are protocol messages to send to workers (``Send``) and news for the
callers of ``get`` (``RunOutput``, ``RunDone``, ``RunFailed``, ``RunAborted``) and for the
manager's accounting (``BytesInlined``). No sockets, no threads, no clocks: tests drive it
with literal events. The records live in ``state_records``, the events and instructions in
``state_messages`` (re-exported here), and failure handling and the end of runs in
``state_failures``.

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
in to "forgotten" (``state_failures``), which leaves it in no record::

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

Runs with the result cache (``state_cache``) add waiting -> released (a task its run does
not compute: a hit, or an input only hits read) and waiting -> memory (read from disk).

A report from a worker counts only if its task is processing on that worker
(``_held``); any other is stale (cancelled, moved, or its run over).

Two counters make completion and release O(edges):
``missing`` = inputs not in memory; ``waiters`` = dependents still waiting, ready or
processing. A result is released as soon as ``waiters`` is zero and it is not an output
still owed to the caller.
"""

from __future__ import annotations

import heapq
import pickle
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from daskvine_py.errors import InvalidTransition
from daskvine_py.scheduler.cache_placement import CacheClear, CacheHandling
from daskvine_py.scheduler.constraints import Constraints
from daskvine_py.scheduler.failures import FailureHandling
from daskvine_py.scheduler.locality import CHAIN_AHEAD, SIBLING_INPUTS, Locality
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.messages import (
    RUN_PRIORITY_BITS,
    AbortRun,
    BadReport,
    BytesInlined,
    CancelRun,
    Dispatched,
    EventDropped,
    ExtendRun,
    FromWorker,
    Key,
    NewTask,
    RunAborted,
    RunDone,
    RunFailed,
    RunOutput,
    Send,
    SubmitRun,
    TaskFinished,
    WorkerId,
    WorkerJoined,
    WorkerLost,
)
from daskvine_py.scheduler.records import RunRecord, TaskRecord, TaskStateName, WorkerRecord
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


class SchedulerState(Constraints, Locality, Stealing, FailureHandling, CacheHandling):
    """All scheduling state of a manager; mutate only through ``handle``.

    The attributes are heavily correlated (a task in ``processing`` is in its worker's
    ``processing`` set, a result in ``memory`` is in each holder's ``has_what``), which is
    why only the transition methods touch them.
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
        #: links of a linear chain sent ahead beyond saturation (``_send_ahead``)
        self.chain_ahead = chain_ahead
        #: input-less tasks are queued for the worker of a sibling when their reader has
        #: at most this many inputs (``_pull_siblings``; 0: never)
        self.sibling_inputs = sibling_inputs
        self.durations = DurationEstimates()
        self.now = 0.0
        self.workers: dict[WorkerId, WorkerRecord] = {}
        self.runs: dict[int, RunRecord] = {}
        self.tasks: dict[int, TaskRecord] = {}
        self.queue: ReadyQueue[TaskRecord] = ReadyQueue()
        #: recent transitions (task id, start, finish), for ``InvalidTransition`` messages
        self.story: deque[tuple[int, str, str]] = deque(maxlen=story_length)
        self._next_task_id = 1
        self._out: list[Any] = []
        #: workers whose store is full (``DiskFull``): dispatch skips them
        self._full = 0
        #: results brought back after every copy was lost (lineage), since the start
        self.recomputed = 0
        #: input id -> workers waiting for it through the manager (``Relay``); the
        #: (holder, reader) names already reported unable to reach each other
        self.relays: dict[int, set[WorkerRecord]] = {}
        self.unreachable_pairs: set[tuple[str, str]] = set()
        #: tasks asked back from their worker for an idle one (``Withdraw``), unanswered
        self._withdrawing: set[TaskRecord] = set()
        #: bytes of inputs sent inside ``Execute`` per worker in this ``handle`` call
        self._inlined: dict[WorkerRecord, int] = {}
        self._init_constraints()  # annotated tasks: resources, restrictions
        self._init_cache()  # results kept across runs (``state_cache``)

    # -- entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[Any], now: float = 0.0) -> list[Any]:
        """Apply ``events`` in order, then dispatch ready work; return the instructions.

        Never raises: an event whose handling raises fails the runs it concerns
        (``RunAborted``) or, concerning none, is dropped (``EventDropped``).
        """
        out = self._out = []
        self.now = now
        handlers = self._EVENT_HANDLERS
        for event in events:
            handler = handlers.get(type(event))
            if handler is None:
                self._out.append(
                    EventDropped(f"an unknown event {event!r:.80}", TypeError("unknown event"))
                )
                continue
            # What a worker being lost concerns must be read before its records go.
            lost = self._runs_on(event.worker) if type(event) is WorkerLost else ()
            try:
                handler(self, event)
            except Exception as exc:
                self._on_handler_error(event, exc, lost)
        try:
            self._dispatch()
        except Exception as exc:  # outside any one task: no telling which runs it spared
            for run_id in list(self.runs):
                self._abort(run_id, exc, "dispatching ready tasks")
        if self._inlined:
            for worker, nbytes in self._inlined.items():
                out.append(BytesInlined(worker.id, worker.name, nbytes))
            self._inlined = {}
        self._out = []
        return out

    # -- queries ----------------------------------------------------------------------

    def load(self) -> tuple[int, int, int]:
        """Tasks ready (queued here), processing (sent to workers) and running (those of
        them that have a core), over every run."""
        processing = running = 0
        for worker in self.workers.values():
            held = len(worker.processing)
            processing += held
            running += min(held, worker.cores)
        return len(self.queue) + len(self.placing), processing, running

    def worker_loads(self) -> dict[WorkerId, tuple[int, int]]:
        """Each worker's cores and the tasks it holds (queued there, fetching or running)."""
        return {wid: (worker.cores, len(worker.processing)) for wid, worker in self.workers.items()}

    # -- event handlers ---------------------------------------------------------------

    def _on_submit(self, ev: SubmitRun) -> None:
        if ev.run_id in self.runs:
            raise ValueError(f"run {ev.run_id} was submitted twice")
        run = self.runs[ev.run_id] = RunRecord(
            ev.run_id, ev.retries, ev.outputs, ev.replicas, ev.config, ev.watched, ev.settings
        )
        if ev.cache is not None:
            self._cache_open(run, ev.cache)
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
        self._mark_placements(run, added)  # annotated runs only
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
            self._cache_added(run, added)  # hits, skipped inputs, results read from disk
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
        if worker.full:
            self._full -= 1
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
            if task.attempts > self._retries_of(task):
                self._fail(
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
        self._cache_worker_lost(worker)

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
        self._transition(task, "memory", worker=worker)
        if self._cache_runs:
            self._cache_done(task, msg, worker)
        if not run.undelivered:
            self._out.append(RunDone(run.id, run.run_seconds, run.serialization_seconds))
            self._drop_run(run)

    def _on_task_erred(self, worker: WorkerRecord, msg: p.TaskErred) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        self._fail(task, worker, msg.exception, msg.traceback, msg.message, crashed=False)

    def _on_task_crashed(self, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._not_held(msg.task_id, worker)
            return
        if task.run.watched:
            self._out.append(TaskFinished(task.run.id, task.key, worker.name, msg))
        task.attempts += 1
        if task.attempts > self._retries_of(task):
            self._fail(
                task, worker, None, "", f"{msg.reason} ({task.attempts} attempts)", crashed=True
            )
        else:
            self._requeue(task)

    def _on_fetch_failed(self, worker: WorkerRecord, msg: p.FetchFailed) -> None:
        task = self._held(msg.task_id, worker)
        if task is None:
            self._not_held(msg.task_id, worker)
            return
        dep = self.tasks.get(msg.dep_id)
        if dep is None or (dep.run is not task.run and dep not in task.deps):  # (or cached)
            # Not one of its inputs: all that is known is that the worker dropped the task.
            self._requeue(task)
            return
        # Whoever could not serve it has lost it (or is unreachable): forget that copy.
        failed = [w for w in dep.who_has if w.peer_address in msg.peers]
        for holder in failed:
            dep.who_has.discard(holder)
            holder.has_what.discard(dep)
            self._send(holder, p.Release((dep.id,)))
        if dep.state == "memory" and not dep.who_has:
            self._lose([dep])
        if task.state == "processing":  # its inputs still exist elsewhere: try again
            self._requeue(task)

    def _not_held(self, task_id: int, worker: WorkerRecord) -> None:
        """``worker`` could not run ``task`` (it erred, crashed or lacked an input), which
        the state believes it holds: the ``TaskDone`` that said so was false, and the
        copy does not exist. Without this, tasks sent ahead to wait for it there would
        wait forever. (An honest worker runs a task again only once its result is gone.)"""
        task = self.tasks.get(task_id)
        if task is None or task.state != "memory" or worker not in task.who_has:
            return
        task.who_has.discard(worker)
        worker.has_what.discard(task)
        if not task.who_has:
            self._lose([task])

    def _requeue(self, task: TaskRecord) -> None:
        """A processing task its worker gave up: queue it, or, when it was sent ahead of an
        input still missing, let it wait for that input here."""
        self._transition(task, "ready" if task.missing == 0 else "waiting")

    def _on_disk_full(self, worker: WorkerRecord, msg: p.DiskFull) -> None:
        """A full worker finishes what it holds and serves peers, but gets no new work."""
        full = msg.full
        if full is worker.full:
            return
        worker.full = full
        self._full += 1 if full else -1
        if full:
            self.queue.forget_target(worker.id)

    # -- shared steps -----------------------------------------------------------------

    def _replicate(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Ask other workers for copies until ``task.run.replicas`` would exist."""
        others = [w for w in self.workers.values() if w is not worker and not w.full]
        wanted = task.run.replicas - len(task.who_has)
        for other in heapq.nsmallest(wanted, others, key=lambda w: len(w.has_what)):
            self._send(other, p.Replicate(task.id, (worker.peer_address,)))

    def _on_replicas(self, worker: WorkerRecord, msg: p.Replicas) -> None:
        """Record inputs ``worker`` fetched from peers; release those nobody needs now."""
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is not None and task.state == "memory":
                task.who_has.add(worker)
                worker.has_what.add(task)
            else:
                self._send(worker, p.Release((task_id,)))

    def _lose(self, lost: list[TaskRecord]) -> None:
        """Results whose every copy is gone: forget them, then recompute what is needed."""
        lost = self._cache_lost(lost)  # cached ones are forgotten; their readers recompute
        for task in lost:
            self._transition(task, "released")
        for task in lost:
            if task.state == "released" and self._needed(task):
                self._recompute(task)

    def _recompute(self, root: TaskRecord) -> None:
        """Bring a released result back, recomputing released inputs first (lineage)."""
        stack = [root]
        while stack:
            task = stack.pop()
            if task.state != "released":
                continue
            missing = 0
            for dep in task.deps:
                dep.waiters += 1
                if dep.state != "memory":
                    missing += 1
                    if dep.state == "released":
                        stack.append(dep)
            task.missing = missing
            self.recomputed += 1
            if not task.payload and self._cache_runs:
                self._cache_payload(task)  # submitted without it: lineage needs it now
            self._transition(task, "ready" if missing == 0 else "waiting")

    @staticmethod
    def _needed(task: TaskRecord) -> bool:
        return task.waiters > 0 or (task.is_output and not task.delivered)

    def _send(self, worker: WorkerRecord, message: Any) -> None:
        self._out.append(Send(worker.id, message))

    # -- dispatch ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Give ready tasks to workers below their saturation, one per worker per round.

        Workers first take their own (targeted) and untargeted work, and only then work
        targeted elsewhere: when both are free, a task runs where its inputs are. Then,
        if cores are idle and no task is queued here, take back tasks that wait
        unstarted on a worker with more tasks than cores.
        """
        if self.placing or self._unchecked:
            self._dispatch_placed()
        workers = list(self.workers.values())
        if self._full:
            # When every worker is full, waiting for room could wait forever: overflow.
            workers = [w for w in workers if not w.full] or workers
        for steal in (False, True):
            hungry = workers
            while hungry and self.queue:
                still_hungry = []
                for worker in hungry:
                    task = self.queue.peek_for(worker.id, steal)
                    if task is None:
                        continue
                    if len(worker.processing) >= worker.cores + self._extra(worker, task):
                        continue
                    self.queue.pop_for(worker.id, steal)
                    try:
                        self._transition(task, "processing", worker=worker)
                        self._send_ahead(task, worker)
                    except Exception as exc:
                        what = f"sending task {task.key!r} (id {task.id}) to worker {worker.name}"
                        self._abort(task.run.id, exc, what)
                        continue
                    still_hungry.append(worker)
                hungry = still_hungry
        if not self.queue:
            try:
                self._steal_for_idle_workers()
            except Exception as exc:  # stealing is an optimisation: runs go on without it
                self._out.append(EventDropped("taking queued tasks back for idle workers", exc))

    def _extra(self, worker: WorkerRecord, task: TaskRecord) -> int:
        if worker.holding and (held := self._held_back(worker)):  # annotated tasks there
            return -held
        if self.fixed_extra_tasks_per_core is not None:
            return worker.cores * self.fixed_extra_tasks_per_core
        trip = worker.round_trip.value if worker.round_trip.count else None
        return extra_tasks(
            worker.cores, self.durations.get(task.prefix), trip, self.max_extra_tasks_per_core
        )

    # -- transitions ------------------------------------------------------------------

    def _transition(self, task: TaskRecord, finish: TaskStateName, **kwargs: Any) -> None:
        start = task.state
        step = self._TRANSITIONS.get((start, finish))
        if step is None:
            story = [f"{s} -> {f}" for i, s, f in self.story if i == task.id]
            raise InvalidTransition(task.key, start, finish, story)
        self.story.append((task.id, start, finish))
        task.state = finish  # before the step: nested transitions see the new state
        step(self, task, **kwargs)

    def _waiting_to_ready(self, task: TaskRecord) -> None:
        if task.placement is not None:
            return self._queue_placed(task)
        task.pulled = False
        self.queue.push(task, task.priority, self._target(task))

    def _ready_to_waiting(self, task: TaskRecord) -> None:
        self.queue.remove(task)
        self.placing.remove(task)

    def _ready_to_processing(self, task: TaskRecord, worker: WorkerRecord) -> None:
        self._assign(task, worker)
        if not task.deps and self.sibling_inputs and len(self.workers) > 1:
            self._pull_siblings(task, worker)

    def _waiting_to_processing(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Sent ahead: the inputs it misses are being computed on the same worker."""
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
            deps = self._cache_locations(task, deps)  # results of other runs, by our keys
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

    def _processing_to_ready(self, task: TaskRecord) -> None:
        self._unassign(task)
        self._recall_sent_ahead(task)
        self._waiting_to_ready(task)

    def _processing_to_waiting(self, task: TaskRecord) -> None:
        worker = self._unassign(task)
        if worker is not None and worker.id in self.workers:
            self._send(worker, p.Cancel((task.id,)))
        self._recall_sent_ahead(task)

    def _recall_sent_ahead(self, task: TaskRecord) -> None:
        """Dependents sent ahead to wait for ``task`` there must wait here again."""
        for dependent in task.dependents:
            if dependent.state == "processing":
                self._transition(dependent, "waiting")

    def _unassign(self, task: TaskRecord) -> WorkerRecord | None:
        self._withdrawing.discard(task)
        worker = task.worker
        if worker is not None:
            worker.processing.pop(task, None)
        task.worker = None
        return worker

    def _processing_to_memory(self, task: TaskRecord, worker: WorkerRecord) -> None:
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
            if dep.state == "memory" and not self._needed(dep):
                self._transition(dep, "released")
        if not self._needed(task):
            self._transition(task, "released")
        elif task.run.replicas > 1:
            self._replicate(task, worker)

    def _memory_to_released(self, task: TaskRecord) -> None:
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

    def _released_to_waiting(self, task: TaskRecord) -> None:
        pass

    _released_to_ready = _waiting_to_ready

    _TRANSITIONS: dict[tuple[str, str], Any] = {
        ("waiting", "ready"): _waiting_to_ready,
        ("ready", "waiting"): _ready_to_waiting,
        ("ready", "processing"): _ready_to_processing,
        ("waiting", "processing"): _waiting_to_processing,
        ("processing", "ready"): _processing_to_ready,
        ("processing", "waiting"): _processing_to_waiting,
        ("processing", "memory"): _processing_to_memory,
        ("memory", "released"): _memory_to_released,
        ("released", "waiting"): _released_to_waiting,
        ("released", "ready"): _released_to_ready,
        ("waiting", "released"): CacheHandling._waiting_to_released,
        ("waiting", "memory"): CacheHandling._waiting_to_memory,
        ("waiting", "forgotten"): FailureHandling._to_forgotten,
        ("ready", "forgotten"): FailureHandling._to_forgotten,
        ("processing", "forgotten"): FailureHandling._processing_to_forgotten,
        ("memory", "forgotten"): FailureHandling._to_forgotten,
        ("released", "forgotten"): FailureHandling._to_forgotten,
    }

    _REPORT_HANDLERS: dict[type, Any] = {
        p.TaskDone: _on_task_done,
        p.TaskErred: _on_task_erred,
        p.TaskCrashed: _on_task_crashed,
        p.FetchFailed: _on_fetch_failed,
        p.Replicas: _on_replicas,
        p.Lost: FailureHandling._on_lost,
        p.Relay: FailureHandling._on_relay,
        p.Uploaded: FailureHandling._on_uploaded,
        p.Withdrawn: Stealing._on_withdrawn,
        p.DiskFull: _on_disk_full,
    }

    _EVENT_HANDLERS: dict[type, Any] = {
        SubmitRun: _on_submit,
        ExtendRun: _on_extend,
        CancelRun: _on_cancel,
        WorkerJoined: _on_worker_joined,
        WorkerLost: _on_worker_lost,
        FromWorker: _on_from_worker,
        BadReport: FailureHandling._on_bad_report,
        AbortRun: FailureHandling._on_abort,
        CacheClear: CacheHandling._on_cache_clear,
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
