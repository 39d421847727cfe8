"""How runs end when something goes wrong, and how every run's tasks are forgotten.

A mixin of ``state.SchedulerState`` (it uses the state's records and ``_transition``):
failures of the event handlers themselves (``RunAborted``, ``EventDropped``), malformed
reports, a task's failure ending its run, and the drop of a run that ended, which takes
each of its tasks to the "forgotten" end of the transition table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from daskvine_py.scheduler.messages import (
    AbortRun,
    BadReport,
    BytesRelayed,
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
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

logger = logging.getLogger("daskvine_py.manager")


class FailureHandling:
    """The failure and drop half of ``SchedulerState``; see the module docstring."""

    # Provided by SchedulerState.
    workers: dict[WorkerId, WorkerRecord]
    runs: dict[int, RunRecord]
    tasks: dict[int, TaskRecord]
    _out: list[Any]
    _transition: Any
    _send: Any
    _held: Any
    _withdrawing: set[TaskRecord]
    queue: Any
    placing: Any
    _cache_runs: dict[int, Any]
    _cache_drop: Any
    _cache_uploaded: Any

    # -- failures of the handlers themselves --------------------------------------------

    def _on_handler_error(self, event: Any, exc: Exception, lost: Iterable[int]) -> None:
        what = self._describe(event)
        kind = type(event)
        if kind in (SubmitRun, ExtendRun, CancelRun, AbortRun):
            runs: Iterable[int] = (event.run_id,)
        elif kind is WorkerLost:
            runs = lost
        elif kind is FromWorker:
            runs = self.runs_of(p.task_ids_named(event.message))
        elif kind is BadReport:
            runs = self.runs_of(event.task_ids)
        else:
            runs = ()
        runs = list(runs)
        if not runs:
            self._out.append(EventDropped(what, exc))
        for run_id in runs:
            self._abort(run_id, exc, what)

    def _abort(self, run_id: int, error: BaseException, what: str) -> None:
        """Fail a run with ``error`` and drop it, however far a handler got with it."""
        self._out.append(RunAborted(run_id, error, what))
        run = self.runs.get(run_id)
        if run is None:
            return  # over already, or its submission failed before it was recorded
        try:
            self._drop_run(run, sweep=True)
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

    def _runs_on(self, worker_id: WorkerId) -> list[int]:
        """The runs with tasks processing on, or results held by, a worker."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return []
        runs = {task.run.id: None for task in worker.processing}
        runs.update((task.run.id, None) for task in worker.has_what)
        return list(runs)

    def _describe(self, event: Any) -> str:
        """An event in words, for error messages: its kind, its task and key, its worker."""
        kind = type(event)
        if kind is FromWorker or kind is BadReport:
            worker = self.workers.get(event.worker)
            name = worker.name if worker is not None else f"{event.worker!r:.40} (unknown)"
            if kind is FromWorker:
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
        if kind is SubmitRun:
            return f"the submission of run {event.run_id}"
        if kind is ExtendRun:
            return f"more tasks of run {event.run_id}"
        if kind is CancelRun:
            return f"the cancellation of run {event.run_id}"
        if kind is AbortRun:
            return event.what
        if kind is WorkerJoined:
            return f"worker {event.name} joining"
        if kind is WorkerLost:
            worker = self.workers.get(event.worker)
            name = worker.name if worker is not None else repr(event.worker)
            return f"the loss of worker {name} ({event.reason})"
        return f"a {kind.__name__} event"

    def _on_abort(self, ev: AbortRun) -> None:
        self._abort(ev.run_id, ev.error, ev.what)

    def _on_bad_report(self, ev: BadReport) -> None:
        """The runs of the tasks a malformed report names, processing on its sender, fail:
        the report was all the manager would have heard of them."""
        worker = self.workers.get(ev.worker)
        if worker is None:
            return  # nothing runs there: nothing waits on it (the manager logged it)
        runs: dict[int, None] = {}
        for task_id in ev.task_ids:
            task = self._held(task_id, worker)
            if task is not None:
                runs[task.run.id] = None
        what = self._describe(ev)
        for run_id in runs:
            self._abort(run_id, ev.error, what)

    def _fail(
        self,
        task: TaskRecord,
        worker: WorkerRecord,
        exception: Serialized | None,
        traceback: str,
        message: str,
        crashed: bool,
    ) -> None:
        run = task.run
        self._out.append(
            RunFailed(
                run.id, task.key, worker.name, exception, traceback, message, crashed,
                run.run_seconds, run.serialization_seconds,
            )
        )  # fmt: skip
        self._drop_run(run, failed=task)

    def _drop_run(
        self, run: RunRecord, sweep: bool = False, failed: TaskRecord | None = None
    ) -> None:
        """Forget a finished, failed or cancelled run; cancel and release its work.

        Every task goes to "forgotten" through the transition table. ``failed``: the task
        that failed the run, whose worker is done with it (no ``Cancel``). ``sweep`` (a run
        aborted by an exception, maybe half-way through a transition): also look for its
        tasks in every worker's records, whatever their states say.
        """
        if self._cache_runs:
            self._cache_drop(run)  # its cacheable results outlive it
        cancel: dict[WorkerRecord, list[int]] = {}
        release: dict[WorkerRecord, list[int]] = {}
        for task in run.tasks.values():
            if task.state != "forgotten":  # else a drop that raised half-way went first
                self._transition(
                    task, "forgotten", cancel=None if task is failed else cancel,
                    release=release, sweep=sweep,
                )  # fmt: skip
        if sweep:
            for worker in self.workers.values():
                for task in [t for t in worker.processing if t.run is run]:
                    del worker.processing[task]
                    cancel.setdefault(worker, []).append(task.id)
                for task in [t for t in worker.has_what if t.run is run]:
                    worker.has_what.discard(task)
                    release.setdefault(worker, []).append(task.id)
        for worker, ids in cancel.items():
            if worker.id in self.workers:
                self._send(worker, p.Cancel(tuple(ids)))
        for worker, ids in release.items():
            if worker.id in self.workers:
                self._send(worker, p.Release(tuple(ids)))
        if run.config is not None:
            for worker in self.workers.values():
                worker.configs.discard(run.id)
        self.runs.pop(run.id, None)

    # -- the "forgotten" end of every task (steps of the transition table) ---------------

    def _processing_to_forgotten(
        self, task: TaskRecord, cancel: dict | None, release: dict, sweep: bool
    ) -> None:
        self._forget(task, cancel, release, True, sweep)

    def _to_forgotten(
        self, task: TaskRecord, cancel: dict | None, release: dict, sweep: bool
    ) -> None:
        self._forget(task, cancel, release, False, sweep)

    def _forget(
        self,
        task: TaskRecord,
        cancel: dict | None,
        release: dict,
        was_processing: bool,
        sweep: bool,
    ) -> None:
        """Drop the task from every record; what its workers must hear goes in ``cancel``
        (None: nothing) and ``release``. ``sweep``: its state may be wrong, so look for it
        in its worker's records whatever it says."""
        worker = task.worker
        if worker is not None and (was_processing or sweep):
            listed = worker.processing.pop(task, False) is None
            if (listed or was_processing) and cancel is not None:
                cancel.setdefault(worker, []).append(task.id)
            task.worker = None
        self._withdrawing.discard(task)
        self.queue.remove(task)  # nothing if not queued
        self.placing.remove(task)
        for holder in task.who_has:
            holder.has_what.discard(task)
            release.setdefault(holder, []).append(task.id)
        self.tasks.pop(task.id, None)

    # -- copies that cannot be had (a dead library, unreachable peers) ---------------

    def _on_relay(self, worker: WorkerRecord, msg: p.Relay) -> None:
        """``worker`` could reach no holder of these inputs: one holder uploads each to
        the manager, which forwards it (``_on_uploaded``). Slower than a peer transfer,
        but it does not fail the task."""
        for dep_id in msg.task_ids:
            dep = self.tasks.get(dep_id)
            holders = [] if dep is None or dep.state != "memory" else list(dep.who_has)
            holders = [h for h in holders if h is not worker]
            if not holders:
                self._send(worker, p.Relayed(dep_id, None))
                continue
            waiting = self.relays.get(dep_id)
            if waiting is None:
                waiting = self.relays[dep_id] = set()
                holder = min(holders, key=lambda h: h.name)
                self._send(holder, p.Upload((dep_id,)))
                pair = (holder.name, worker.name)
                if pair not in self.unreachable_pairs:
                    self.unreachable_pairs.add(pair)
                    logger.warning(
                        "worker %s cannot fetch results from worker %s (%s); they go "
                        "through the manager", worker.name, holder.name, holder.peer_address,
                    )  # fmt: skip
            waiting.add(worker)

    def _on_uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> None:
        task = self.tasks.get(msg.task_id)
        run_id = task.run.id if task is not None else 0
        for reader in self.relays.pop(msg.task_id, ()):
            if self.workers.get(reader.id) is reader:
                self._send(reader, p.Relayed(msg.task_id, msg.value))
                if msg.value is not None:
                    nbytes = msg.value.nbytes
                    self._out.append(BytesRelayed(run_id, worker.name, reader.name, nbytes))
        self._cache_uploaded(worker, msg)  # outputs of the cache, results for its disk

    def _on_lost(self, worker: WorkerRecord, msg: p.Lost) -> None:
        """Results ``worker`` no longer holds (a library process died with them)."""
        lost = []
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is None or worker not in task.who_has:
                continue
            task.who_has.discard(worker)
            worker.has_what.discard(task)
            if not task.who_has and task.state == "memory":
                lost.append(task)
        self._lose(lost)
