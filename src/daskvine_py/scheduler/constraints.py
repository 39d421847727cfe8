"""Placement of annotated tasks: resources, worker restrictions, per-task retries.

A component of ``state.SchedulerState``. Tasks without a ``Placement`` never come here: they
wait in the context's ``queue`` and take one slot wherever they go. A task with one waits
in ``placing``, one lane per distinct placement, and is placed only on a worker it may
run on (``workers``, ``allow_other_workers``) with room for it:

- room is slots (``cores``), reserved memory and GPUs. A worker's free slots are its
  cores, less the tasks it holds, less what annotated tasks there take beyond one slot
  each; its free memory is its ``--memory``, less what annotated tasks there reserve; its
  free GPUs its ``--gpus``, less those of the annotated tasks it runs;
- while an annotated task takes more than one slot on a worker, nothing else goes there
  beyond its slots (no saturation extras; only the links of a chain, which each wait for
  the one before), so whatever the worker can run at once fits;
- a task that fits nowhere now holds back the worker closest to holding it from new
  work (a reservation, renewed each dispatch round), so a stream of small tasks cannot
  starve it;
- a run with a task no connected worker could ever hold (too many cores, too much
  memory, too many GPUs, nobody of that name) fails as it starts, with an error naming
  the key and what it asked for. Without any worker connected it waits, as every run
  does, and is judged by the first workers to join. A task whose every capable worker
  leaves later (a preemption) waits for one to join, like any task on a manager without
  workers.

Annotated tasks are dispatched before the others in each round, best priority first.
A worker's ``holding`` lists the annotated tasks placed or reserved there and is pruned
as it is read, so no path that takes a task off a worker needs to know about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from daskvine_py.plan.annotations import Placement
from daskvine_py.scheduler.locality import target
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.messages import EventDropped, NewTask, RunFailed
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context


def retries_of(task: TaskRecord) -> int:
    """Re-runs allowed after crashes and lost workers: its annotation, else its run's."""
    run = task.run
    if run.settings is None:
        return run.retries
    return run.settings.retries.get(task.key, run.retries)


def _placement(task: TaskRecord) -> Placement:
    """An annotated task's placement (every task this component holds has one)."""
    placement = task.placement
    assert placement is not None
    return placement


class Constraints:
    """The annotated tasks of every run, and where they may go; see the module docstring.

    It reads the context's ``workers``, ``runs`` and ``full`` (workers whose store is
    full) and appends to its ``out``; a run that cannot be placed is dropped or aborted
    by ``ctx.failures``.
    """

    __slots__ = (
        "ctx",
        "workers",
        "runs",
        "full",
        "out",
        "transition",
        "placing",
        "placements",
        "unchecked",
        "reserved",
    )

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.runs = ctx.runs
        self.full = ctx.full
        self.out = ctx.out
        self.transition = ctx.transition
        #: ready annotated tasks, one lane per distinct placement
        self.placing: ReadyQueue[TaskRecord] = ReadyQueue()
        #: the placements with tasks in ``placing``
        self.placements: set[Placement] = set()
        #: runs whose placements are still to be checked against the connected workers
        self.unchecked: list[RunRecord] = []
        #: tasks waiting for room, and the worker held back for each this round
        self.reserved: dict[TaskRecord, WorkerRecord] = {}

    def __len__(self) -> int:
        """Annotated tasks ready here (``SchedulerState.load``)."""
        return len(self.placing)

    def pending(self) -> bool:
        """Whether a dispatch round has anything to do here."""
        return bool(self.placing or self.unchecked)

    # -- hooks called by the state --------------------------------------------------------

    def mark(self, run: RunRecord, added: Sequence[tuple[NewTask, TaskRecord]]) -> None:
        """New tasks of an annotated run get their placement before they are queued."""
        if run.settings is None or not run.settings.placements:
            return
        placements = run.settings.placements
        for _, record in added:
            placement = placements.get(record.key)
            if placement is not None:  # (a rare field: written where it differs)
                record.placement = placement
        if run not in self.unchecked:
            self.unchecked.append(run)

    def push(self, task: TaskRecord, placement: Placement) -> None:
        """Queue a ready annotated task (``placement`` is its own)."""
        self.placing.push(task, task.priority, placement)
        self.placements.add(placement)

    def remove(self, task: TaskRecord) -> None:
        """It is no longer ready (nothing if it was not queued here)."""
        self.placing.remove(task)

    def held_back(self, worker: WorkerRecord) -> int:
        """Slots of ``worker`` that annotated tasks take beyond one each, or all of them
        while it is reserved for one; pruning what no longer holds anything there."""
        held = 0
        for task in list(worker.holding):
            if task.worker is worker and task.state == "processing":
                held += _placement(task).cores - 1
            elif self.reserved.get(task) is worker:
                held += worker.cores
            else:
                del worker.holding[task]
        return held

    def room(self, worker: WorkerRecord) -> int:
        """Tasks ``worker`` could start now without going beyond its slots (none when it
        is quarantined: ``faults``)."""
        if worker.quarantined is not None:
            return 0
        held = self.held_back(worker) if worker.holding else 0
        return worker.cores - worker.startable() - held

    # -- dispatch ---------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Fail new runs asking what no worker offers; place ready annotated tasks where
        they fit, best priority first; hold back a worker for each that fits nowhere yet."""
        if self.unchecked and self.workers:
            runs, self.unchecked = self.unchecked, []
            for run in runs:
                self._check_run(run)
        self.reserved.clear()
        if not self.workers:
            return
        waiting: dict[Placement, TaskRecord] = {}
        while self.placing:
            best: tuple[TaskRecord, WorkerRecord] | None = None
            for placement in list(self.placements):
                task = self._front(placement)
                if task is None:
                    continue
                if best is not None and task.priority > best[0].priority:
                    waiting[placement] = task
                    continue
                worker = self._fitting_worker(task)
                if worker is not None:
                    best = (task, worker)
                else:
                    waiting[placement] = task
            if best is None:
                break
            task, worker = best
            waiting.pop(_placement(task), None)
            self.placing.remove(task)
            worker.holding[task] = None
            try:
                self.transition(task, "processing", worker)
            except Exception as exc:
                what = f"sending task {task.key!r} (id {task.id}) to worker {worker.name}"
                self.ctx.failures.abort(task.run.id, exc, what)
        for task in waiting.values():
            if task.state == "ready":
                self._reserve(task)

    def _front(self, placement: Placement) -> TaskRecord | None:
        """The best ready task of a placement's lane (stale entries dropped)."""
        while True:
            task = self.placing.peek_for(placement, False)
            if task is None:
                self.placements.discard(placement)
                return None
            if task.state == "ready":
                return task
            self.placing.pop_for(placement, False)

    def _allowed(self, placement: Placement) -> list[WorkerRecord]:
        """The connected workers ``placement`` lets its task run on (full ones last resort)."""
        workers = list(self.workers.values())
        names = placement.workers
        if names is not None:
            named = [w for w in workers if w.name in names or w.hostname in names]
            if placement.loose:  # (a verification's re-run) not on one that takes no tasks
                named = [w for w in named if w.quarantined is None]
            if named or not placement.loose:
                workers = named
        return [w for w in workers if not w.full] or workers

    def _holders(self, placement: Placement) -> list[WorkerRecord]:
        """The allowed workers big enough to ever hold the task."""
        return [
            w
            for w in self._allowed(placement)
            if w.cores >= placement.cores
            and w.memory >= placement.memory
            and w.gpus >= placement.gpus
        ]

    def _fitting_worker(self, task: TaskRecord) -> WorkerRecord | None:
        """A worker with room for ``task`` now: where most of its inputs are, else the
        one with most free slots."""
        placement = _placement(task)
        near = target(task, self.full)
        best: WorkerRecord | None = None
        best_room = 0
        for worker in self._allowed(placement):
            memory, gpus = self._reserved(worker)
            if worker.memory - memory < placement.memory or worker.gpus - gpus < placement.gpus:
                continue
            room = self.room(worker)
            if room < placement.cores:
                continue
            if worker.id == near:
                return worker
            if best is None or room > best_room:
                best, best_room = worker, room
        return best

    def _reserved(self, worker: WorkerRecord) -> tuple[int, int]:
        """The memory allotted to the tasks processing there (annotated or sized), and
        the GPUs its annotated ones take."""
        memory = sum(task.allotted() for task in worker.processing)
        if not worker.holding:
            return memory, 0
        self.held_back(worker)  # prune
        gpus = 0
        for task in worker.holding:
            if task.worker is worker and task.state == "processing":
                gpus += _placement(task).gpus
        return memory, gpus

    def _reserve(self, task: TaskRecord) -> None:
        """Hold back, from new work, the worker that will soonest have room for ``task``."""
        taken = set(self.reserved.values())
        candidates = [w for w in self._holders(_placement(task)) if w not in taken]  # maybe none
        if not candidates:
            return
        worker = max(candidates, key=self.room)
        self.reserved[task] = worker
        worker.holding[task] = None

    # -- what nobody offers -------------------------------------------------------------------

    def _check_run(self, run: RunRecord) -> None:
        """Fail a new run at once if one of its placements fits no connected worker."""
        settings = run.settings
        if self.runs.get(run.id) is not run or settings is None:
            return
        for placement, key in settings.examples.items():
            if not self._holders(placement):
                task = run.tasks.get(key)
                if task is not None:
                    self._fail_unplaceable(task)
                return

    def _fail_unplaceable(self, task: TaskRecord) -> None:
        run = task.run
        if self.runs.get(run.id) is not run:
            return
        offers = ", ".join(
            _offer(w) for w in sorted(self.workers.values(), key=lambda w: w.name)[:8]
        )
        more = len(self.workers) - 8
        if more > 0:
            offers += f" and {more} more"
        message = (
            f"it asks for {_placement(task).describe()}, which no connected worker can hold "
            f"(workers: {offers})"
        )
        self.out.append(
            RunFailed(
                run.id,
                task.key,
                "",
                None,
                "",
                message,
                False,
                run.run_seconds,
                run.serialization_seconds,
                categories=run.categories,
            )
        )
        try:
            self.ctx.failures.drop_run(run)
        except Exception as exc:
            self.out.append(EventDropped(f"dropping run {run.id}", exc))


def _offer(worker: WorkerRecord) -> str:
    """``w1 (2 cores, 3000 MB, 1 GPU)``: what a worker offers, for errors."""
    gpus = f", {worker.gpus} GPU{'' if worker.gpus == 1 else 's'}" if worker.gpus else ""
    cores = f"{worker.cores} core{'' if worker.cores == 1 else 's'}"
    return f"{worker.name} ({cores}, {worker.memory / 2**20:.0f} MB{gpus})"
