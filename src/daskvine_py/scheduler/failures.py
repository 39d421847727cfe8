"""How runs end when something goes wrong, and how every run's tasks are forgotten.

A component of ``state.SchedulerState``: failures of the event handlers themselves
(``RunAborted``, ``EventDropped``), malformed reports, a task's failure ending its run,
and the drop of a run that ended, which takes each of its tasks to the "forgotten" end of
the transition table (``dismiss``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from daskvine_py.scheduler.messages import (
    AbortRun,
    BadReport,
    CancelRun,
    EventDropped,
    ExtendRun,
    FromWorker,
    RunAborted,
    RunFailed,
    SubmitRun,
    WorkerId,
    WorkerJoined,
    WorkerLost,
)
from daskvine_py.scheduler.records import Drop, RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context


class Failures:
    """Aborted, failed and finished runs, and the tasks they leave; see the module
    docstring.

    It shares the context's ``workers``, ``runs``, ``tasks``, ``queue`` and ``placing``
    (``Constraints``) and appends to its ``out``; its messages go through
    ``Claims.send``; ``settled(task)``: a task left its worker (``Stealing.settled``).
    """

    __slots__ = (
        "ctx",
        "workers",
        "runs",
        "tasks",
        "out",
        "queue",
        "placing",
        "transition",
        "send",
        "held",
        "cache_runs",
        "settled",
    )

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.runs = ctx.runs
        self.tasks = ctx.tasks
        self.out = ctx.out
        self.queue = ctx.queue
        self.placing = ctx.constraints.placing
        self.transition = ctx.transition
        self.send = ctx.claims.send
        self.held = ctx.held
        self.cache_runs = ctx.cache_runs
        self.settled = ctx.stealing.settled

    # -- failures of the handlers themselves --------------------------------------------

    def on_handler_error(self, event: object, exc: Exception, lost: Iterable[int]) -> None:
        """Handling ``event`` raised ``exc``: the runs it concerns fail (``lost``: those
        with work on a worker being lost, read before its records went)."""
        what = self.describe(event)
        runs: Iterable[int]
        if isinstance(event, (SubmitRun, ExtendRun, CancelRun, AbortRun)):
            runs = (event.run_id,)
        elif isinstance(event, WorkerLost):
            runs = lost
        elif isinstance(event, FromWorker):
            runs = self.runs_of(p.task_ids_named(event.message))
        elif isinstance(event, BadReport):
            runs = self.runs_of(event.task_ids)
        else:
            runs = ()
        runs = list(runs)
        if not runs:
            self.out.append(EventDropped(what, exc))
        for run_id in runs:
            self.abort(run_id, exc, what)

    def abort(self, run_id: int, error: BaseException, what: str) -> None:
        """Fail a run with ``error`` and drop it, however far a handler got with it."""
        self.out.append(RunAborted(run_id, error, what))
        run = self.runs.get(run_id)
        if run is None:
            return  # over already, or its submission failed before it was recorded
        try:
            self.drop_run(run, True, None)
        except Exception:  # never expected: forget it without cancelling anything
            for task in run.tasks.values():
                self.tasks.pop(task.id, None)
                self.queue.remove(task)
                self.placing.remove(task)
            self.runs.pop(run.id, None)

    def runs_of(self, task_ids: Iterable[int]) -> list[int]:
        """The runs of these tasks (those still known), each once."""
        runs: dict[int, None] = {}
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            if task is not None:
                runs[task.run.id] = None
        return list(runs)

    def runs_on(self, worker_id: WorkerId) -> list[int]:
        """The runs with tasks processing on, or results held by, a worker."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return []
        runs = {task.run.id: None for task in worker.processing}
        runs.update((task.run.id, None) for task in worker.has_what)
        return list(runs)

    def describe(self, event: object) -> str:
        """An event in words, for error messages: its kind, its task and key, its worker."""
        kind = type(event)
        if isinstance(event, (FromWorker, BadReport)):
            worker = self.workers.get(event.worker)
            name = worker.name if worker is not None else f"{event.worker!r:.40} (unknown)"
            ids: tuple[int, ...]
            if isinstance(event, FromWorker):
                record = type(event.message).__name__
                ids = p.task_ids_named(event.message)
            else:
                record, ids = f"malformed {event.kind}", event.task_ids
            about = ""
            if ids:
                task = self.tasks.get(ids[0])
                key = f"{task.key!r} " if task is not None else ""
                more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
                about = f" about task {key}(id {ids[0]}){more}"
            return f"a {record}{about} from worker {name}"
        if isinstance(event, SubmitRun):
            return f"the submission of run {event.run_id}"
        if isinstance(event, ExtendRun):
            return f"more tasks of run {event.run_id}"
        if isinstance(event, CancelRun):
            return f"the cancellation of run {event.run_id}"
        if isinstance(event, AbortRun):
            return event.what
        if isinstance(event, WorkerJoined):
            return f"worker {event.name} joining"
        if isinstance(event, WorkerLost):
            worker = self.workers.get(event.worker)
            name = worker.name if worker is not None else repr(event.worker)
            return f"the loss of worker {name} ({event.reason})"
        return f"a {kind.__name__} event"

    def on_abort(self, ev: AbortRun) -> None:
        self.abort(ev.run_id, ev.error, ev.what)

    def on_bad_report(self, ev: BadReport) -> None:
        """The runs of the tasks a malformed report names, processing on its sender, fail:
        the report was all the manager would have heard of them."""
        worker = self.workers.get(ev.worker)
        if worker is None:
            return  # nothing runs there: nothing waits on it (the manager logged it)
        runs: dict[int, None] = {}
        for task_id in ev.task_ids:
            task = self.held(task_id, worker)
            if task is not None:
                runs[task.run.id] = None
        what = self.describe(ev)
        for run_id in runs:
            self.abort(run_id, ev.error, what)

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
    ) -> None:
        """``task`` failed on ``worker``, and its run with it (``error``: what ``get``
        raises, made here)."""
        run = task.run
        self.out.append(
            RunFailed(
                run.id,
                task.key,
                worker.name,
                exception,
                traceback,
                message,
                crashed,
                run.run_seconds,
                run.serialization_seconds,
                type_name,
                run.categories,
                error,
            )
        )
        self.drop_run(run, False, task)

    def drop_run(
        self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None
    ) -> None:
        """Drop a run that ended (done, failed, cancelled, aborted): the cache keeps its
        cacheable results first (``Caching.drop``), then ``forget_run``."""
        if self.cache_runs:
            self.ctx.caching.drop(run)
        self.forget_run(run, sweep, failed)

    def forget_run(
        self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None
    ) -> None:
        """Forget a finished, failed or cancelled run; cancel and release its work.

        Every task goes to "forgotten" through the transition table. ``failed``: the task
        that failed the run, whose worker is done with it (no ``Cancel``). ``sweep`` (a run
        aborted by an exception, maybe half-way through a transition): also look for its
        tasks in every worker's records, whatever their states say.
        """
        drop = Drop(failed, sweep)
        cancel, release = drop.cancel, drop.release
        for task in run.tasks.values():
            if task.state != "forgotten":  # else a drop that raised half-way went first
                self.dismiss(task, drop)
        if sweep:
            for worker in self.workers.values():
                for task in [t for t in worker.processing if t.run is run]:
                    del worker.processing[task]
                    worker.ahead.discard(task)
                    cancel.setdefault(worker, []).append(task.id)
                for task in [t for t in worker.has_what if t.run is run]:
                    worker.has_what.discard(task)
                    release.setdefault(worker, []).append(task.id)
        for worker, ids in cancel.items():
            if worker.id in self.workers:
                self.send(worker, p.Cancel(tuple(ids)))
        for worker, ids in release.items():
            if worker.id in self.workers:
                self.send(worker, p.Release(tuple(ids)))
        if run.config is not None:
            ended = p.RunEnded(run.id) if run.config.inputs == "run" else None
            for worker in self.workers.values():
                if run.id in worker.configs:
                    worker.configs.discard(run.id)
                    if ended is not None:  # its inputs fetched there go (``cache_inputs``)
                        self.send(worker, ended)
        self.runs.pop(run.id, None)

    # -- the "forgotten" end of every task ----------------------------------------------

    def dismiss(self, task: TaskRecord, drop: Drop) -> None:
        """Take ``task`` to "forgotten" and drop it from every record; what its workers
        must hear goes in ``drop``. With ``drop.sweep`` its state may be wrong, so look
        for it in its worker's records whatever it says."""
        was_processing = task.state == "processing"
        self.transition(task, "forgotten")
        worker = task.worker
        if worker is not None and (was_processing or drop.sweep):
            listed = worker.processing.pop(task, False) is None
            worker.ahead.discard(task)
            if (listed or was_processing) and task is not drop.spared:
                drop.cancel.setdefault(worker, []).append(task.id)
            task.worker = None
        self.settled(task)
        self.queue.remove(task)  # nothing if not queued
        self.placing.remove(task)
        release = drop.release
        for holder in task.who_has:
            holder.has_what.discard(task)
            release.setdefault(holder, []).append(task.id)
        self.tasks.pop(task.id, None)
