"""Workers that come and go: what a lost worker costs its tasks, and temporary replicas
while workers keep being lost.

A component of ``state.SchedulerState``.

- **Only a running task pays for a lost worker.** A worker says which tasks began running
  (``Started``: sent to a library or a task process); the state stamps
  ``TaskRecord.started_at`` (what the fault watch times stragglers from). When a worker is
  lost, a task that had started there uses one of its retries: it may be what killed the
  worker. A task queued or fetching inputs there, sent ahead, or a result held there uses
  none: the task is queued again, the result recomputed from its lineage. A worker that
  left on its own (``Goodbye``: a preemption's SIGTERM, a pool retiring it) or that the
  manager ejected costs no task a retry. A task whose process crashed uses one too
  (``task_crashed``, a subscriber to the task's report): past its last, its run fails.
- **Temporary replicas.** Each worker lost adds one to a count of recent losses that
  halves every ``LOSS_HALF_LIFE`` seconds. While it is at least ``CHURN_LEVEL``, results
  whose loss would cost much get a second copy on another worker (the one holding fewest
  results, through ``Copies.replicate``): results at least ``MANY_READERS`` tasks still
  read, and results whose loss would recompute at least ``LONG_LINEAGE`` released tasks
  (a partial sum high in a tree reduction). They are copied as they are made and, at each
  loss, among those left with one copy. At most ``REPLICAS_PER_WORKER`` per worker and
  ``REPLICA_MEMORY_SHARE`` of the workers' memory are such copies at a time. When losses
  stop, none is made any more; the ones made go with their results, released when no
  task needs them. Without losses this costs one test per finished task.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from daskvine_py.scheduler.constraints import retries_of
from daskvine_py.scheduler.locality import files_lost
from daskvine_py.scheduler.messages import WorkerLost
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: How a loss's reason begins when it is no task's doing: the worker said goodbye (the
#: manager's ``_lose_worker``: "it left: ..."), or the manager told it to go.
NO_FAULT = ("it left", "ejected")
#: Seconds over which the count of recent losses halves.
LOSS_HALF_LIFE = 30.0
#: The count of recent losses at which results worth it get a second copy: one loss
#: keeps it on for one half-life.
CHURN_LEVEL = 0.5
#: The count never goes above this, so that it falls below ``CHURN_LEVEL`` within
#: three half-lives of the last loss, however long the losses went on.
MAX_LEVEL = 4.0
#: Tasks still reading a result that make it worth a second copy under churn.
MANY_READERS = 4
#: Released tasks a result's loss would recompute (its lineage) that make it worth a
#: second copy under churn.
LONG_LINEAGE = 4
#: Temporary replicas at a time, per connected worker.
REPLICAS_PER_WORKER = 256
#: Share of the workers' memory (``--memory``) temporary replicas may take at a time, and
#: the bytes they may take when no worker said how much it has.
REPLICA_MEMORY_SHARE = 0.05
REPLICA_BYTES = 1 << 30
#: Seconds between two looks for replicas gone (their results released) while the
#: bounds are reached: each look visits every replica.
PRUNE_PERIOD = 1.0


class Churn:
    """Lost workers, started tasks and temporary replicas; see the module docstring.

    It shares the context's ``workers``, ``tasks``, ``full`` and ``queue``, and its
    clock; ``fail``: ``Failures.fail``; ``lose(results)``: ``Copies.lose``;
    ``replicate(task, worker, copies)``: ``Copies.replicate``; a worker lost, the result
    cache forgets what it kept there (``Caching.worker_lost``). It hears of every
    crash: a crash uses one of the task's retries.
    """

    __slots__ = (
        "ctx",
        "workers",
        "tasks",
        "full",
        "queue",
        "transition",
        "held",
        "fail",
        "lose",
        "replicate",
        "level",
        "last_loss",
        "extra",
        "extra_bytes",
        "max_extra",
        "max_bytes",
        "pruned_at",
        "replicas",
    )

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.tasks = ctx.tasks
        self.full = ctx.full
        self.queue = ctx.queue
        self.transition = ctx.transition
        self.held = ctx.held
        self.fail = ctx.failures.fail
        self.lose = ctx.copies.lose
        self.replicate = ctx.copies.replicate
        #: recent losses, halving every ``LOSS_HALF_LIFE`` s from ``last_loss``; 0.0: calm
        #: (the state tests it as each result is made)
        self.level = 0.0
        self.last_loss = 0.0
        #: temporary replicas asked for: result -> (the holder copied from, the worker
        #: asked to copy it); an entry goes once the result, or either worker, is gone
        self.extra: dict[TaskRecord, tuple[WorkerRecord, WorkerRecord]] = {}
        self.extra_bytes = 0
        #: bounds on ``extra``, set at each loss from the workers left
        self.max_extra = 0
        self.max_bytes = 0
        self.pruned_at = 0.0
        #: temporary replicas asked for since the start
        self.replicas = 0

    # -- tasks that began running -------------------------------------------------------

    def on_started(self, worker: WorkerRecord, msg: p.Started) -> None:
        """Tasks ``worker`` began running: a loss of it now costs them a retry, and the
        fault watch times them from ``started_at``."""
        now = self.ctx.now
        held = self.held
        for task_id in msg.task_ids:
            task = held(task_id, worker)
            if task is not None and task.started_at is None:
                task.started_at = now

    def out_of_retries(self, task: TaskRecord) -> bool:
        """One more crash or lost worker for ``task``: fail it (True), or try it again."""
        task.attempts += 1
        if task.attempts > retries_of(task):
            return True
        self.transition(task, "ready" if task.missing == 0 else "waiting")
        return False

    def task_crashed(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        """A crash uses one of ``task``'s retries; with none left, its run fails."""
        if self.out_of_retries(task):
            attempts = f"{task.attempts} attempt{'' if task.attempts == 1 else 's'}"
            reason = f"{msg.reason} ({attempts})"
            self.fail(task, worker, None, "", reason, crashed=True)

    # -- a worker lost ------------------------------------------------------------------

    def on_worker_lost(self, ev: WorkerLost) -> None:
        """Its results are forgotten (recomputed where still needed) and its tasks queued
        again; only those that had started there use a retry, unless it left on its own."""
        worker = self.workers.pop(ev.worker, None)
        if worker is None:
            return
        self.full.discard(worker)
        lost = []
        for task in worker.has_what:
            task.unhold(worker)
            if not task.who_has and task.state == "memory":
                lost.append(task)
        worker.has_what.clear()
        files_lost(worker)
        no_fault = ev.reason.startswith(NO_FAULT)
        for task in list(worker.processing):
            if self.tasks.get(task.id) is not task:
                continue  # its run was dropped by an earlier failure in this loop
            if task.state != "processing":
                continue  # sent ahead, and already recalled with the task it waited for
            if task.missing:
                self.transition(task, "waiting")
            elif no_fault or task.started_at is None:
                self.transition(task, "ready")  # it never ran there: no retry used
            elif self.out_of_retries(task):
                times = "once" if task.attempts == 1 else f"{task.attempts} times"
                reason = f"its worker was lost while running it {times}; last: {ev.reason}"
                self.fail(task, worker, None, "", reason, True)
        self.lose([task for task in lost if task.id in self.tasks])
        self.queue.forget_target(worker.id)
        self.ctx.caching.worker_lost(worker)
        self._count_loss()

    # -- temporary replicas -------------------------------------------------------------

    def made(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """``task``'s result was just made on ``worker``, under churn (``level`` set): a
        second copy if it is worth one and there is room."""
        if not self._churning():
            self.level = 0.0  # calm again: the state stops calling
            self.extra.clear()  # (those made go with their results; the next churn counts anew)
            self.extra_bytes = 0
            return
        if self._worth_a_copy(task) and self._room(task):
            self._copy(task, worker)

    def _count_loss(self) -> None:
        """One more loss: the bounds from the workers left, and a second copy for the
        results worth one that now have a single copy."""
        self.level = min(MAX_LEVEL, self._decayed() + 1.0)
        self.last_loss = self.ctx.now
        workers = self.workers
        memory = sum(w.memory for w in workers.values())
        self.max_bytes = int(memory * REPLICA_MEMORY_SHARE) if memory else REPLICA_BYTES
        self.max_extra = REPLICAS_PER_WORKER * len(workers)
        self._prune()
        if len(workers) < 2 or not self._churning():
            return
        extra = self.extra
        for holder in list(workers.values()):
            for task in list(holder.has_what):
                if len(extra) >= self.max_extra:
                    return
                if len(task.who_has) == 1 and task not in extra and self._worth_a_copy(task):
                    if self._room(task):  # (a result too large for the bytes left is not)
                        self._copy(task, holder)

    def _decayed(self) -> float:
        return self.level * math.pow(0.5, (self.ctx.now - self.last_loss) / LOSS_HALF_LIFE)

    def _churning(self) -> bool:
        return self._decayed() >= CHURN_LEVEL

    def _worth_a_copy(self, task: TaskRecord) -> bool:
        if task.state != "memory" or task.run.replicas > 1:
            return False  # (a run asking for replicas has them already)
        if task.waiters >= MANY_READERS:
            return True
        # Released ancestors its loss would recompute, counted up to LONG_LINEAGE.
        count = 0
        stack = [task]
        while stack:
            for dep in stack.pop().deps:
                if dep.state == "released":
                    count += 1
                    if count >= LONG_LINEAGE:
                        return True
                    stack.append(dep)
        return False

    def _room(self, task: TaskRecord) -> bool:
        """Whether one more temporary replica of ``task`` fits the bounds."""
        if len(self.extra) < self.max_extra and self.extra_bytes + task.nbytes <= self.max_bytes:
            return True
        if self.ctx.now - self.pruned_at < PRUNE_PERIOD:
            return False
        self._prune()
        return len(self.extra) < self.max_extra and self.extra_bytes + task.nbytes <= self.max_bytes

    def _copy(self, task: TaskRecord, holder: WorkerRecord) -> None:
        targets = self.replicate(task, holder, 2)
        if targets:
            self.extra[task] = (holder, targets[0])
            self.extra_bytes += task.nbytes
            self.replicas += 1

    def _prune(self) -> None:
        """Forget the replicas whose result was released or whose workers are gone."""
        workers, tasks, extra = self.workers, self.tasks, self.extra
        gone = [
            task
            for task, pair in extra.items()
            if task.state != "memory"
            or tasks.get(task.id) is not task
            or any(workers.get(w.id) is not w for w in pair)
        ]
        for task in gone:
            del extra[task]
        self.extra_bytes = sum(task.nbytes for task in extra)
        self.pruned_at = self.ctx.now
