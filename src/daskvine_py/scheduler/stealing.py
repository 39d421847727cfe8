"""Taking queued tasks back from busy workers for idle ones (``Withdraw``).

A component of ``state.SchedulerState``. Workers hold more tasks than cores (saturation), so
when the manager's queue runs dry an idle core may face a neighbour with several tasks
waiting unstarted. The manager only asks for them back: a task moves once its worker
confirms it dropped it unstarted (``Withdrawn``), so none ever runs twice because of this.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context


class Stealing:
    """Withdrawals asked of busy workers and their answers; see the module docstring.

    It reads the context's ``workers`` and ``queue``; ``room(worker)``: tasks ``worker``
    could start now (``Constraints.room``).
    """

    __slots__ = (
        "workers",
        "queue",
        "room",
        "send",
        "held",
        "transition",
        "withdrawing",
        "kept",
        "settled",
        "asks",
    )

    def __init__(self, ctx: Context) -> None:
        self.workers = ctx.workers
        self.queue = ctx.queue
        self.room = ctx.constraints.room
        self.send = ctx.send
        self.held = ctx.held
        self.transition = ctx.transition
        #: tasks asked back from their worker for an idle one (``Withdraw``), unanswered
        self.withdrawing: set[TaskRecord] = set()
        #: tasks their worker said it keeps (``Withdrawn.kept``: started, or committed to
        #: a library): never asked back again
        self.kept: set[TaskRecord] = set()
        #: ``settled(task)``: it left its worker otherwise (done, moved, forgotten); the
        #: state calls it for every task it takes back
        self.settled: Callable[[TaskRecord], None] = self._settled
        #: ``Withdraw``s of a task sent to a worker and not answered yet: a task taken
        #: back (``Cancel``), sent there again and asked back again has two answers on
        #: the way, and only the last is about the copy there now (simulator, --delay
        #: 0.3, seeds 108 and 306: the first moved the task while the second copy was
        #: still there, which could run it twice)
        self.asks: dict[tuple[WorkerRecord, TaskRecord], int] = {}

    def _settled(self, task: TaskRecord) -> None:
        self.withdrawing.discard(task)
        if self.kept:
            self.kept.discard(task)

    def steal_for_idle_workers(self) -> None:
        """Ask for tasks that wait unstarted behind busy cores back, for idle cores.

        Only asked (``Withdraw``): a task moves once its worker confirms it dropped it
        unstarted (``Withdrawn``), so no task ever runs twice because of this.
        """
        # (A worker whose last tasks failed is no thief: a black hole is always idle.)
        idle = [w for w in self.workers.values() if self.room(w) > 0 and not (w.full or w.errors)]
        if not idle or all(len(w.processing) <= w.cores for w in self.workers.values()):
            return  # nobody idle, or nothing waits behind busy cores anywhere
        wanted = sum(self.room(w) for w in idle) - len(self.withdrawing)
        if wanted <= 0:
            return  # enough already asked for
        # Startable tasks beyond a worker's cores are queued there, not running.
        surplus = {w: _startable(w) - w.cores for w in self.workers.values()}
        for task in itertools.chain(self.withdrawing, self.kept):  # (neither is startable)
            if task.worker in surplus:
                surplus[task.worker] -= 1
        asked: dict[WorkerRecord, list[int]] = {}
        for _ in range(wanted):
            victim = max(surplus, key=surplus.__getitem__)
            if surplus[victim] <= 0:
                break
            # The newest startable task there is the least likely to have started.
            task = next(
                t
                for t in reversed(victim.processing)
                if t.missing == 0
                and t not in self.withdrawing
                and t not in self.kept
                and t.placement is None
            )
            surplus[victim] -= 1
            self.withdrawing.add(task)
            asked.setdefault(victim, []).append(task.id)
            self.asks[victim, task] = self.asks.get((victim, task), 0) + 1
        if len(self.asks) > 2 * len(self.withdrawing) + 64:  # answers that never came
            self._prune()
        for victim, ids in asked.items():
            self.send(victim, p.Withdraw(tuple(ids)))

    def on_withdrawn(self, worker: WorkerRecord, msg: p.Withdrawn) -> None:
        """Tasks a worker gave back unstarted: queue them for whoever is free. Those it
        keeps (started, or committed to a library) are asked back no more. An answer
        to an earlier ``Withdraw`` of the same task, while a later one is on its way,
        is about a copy that is gone: only the last answer counts."""
        for task_id in msg.kept:
            task = self._answered(worker, task_id)
            if task is not None:
                self.withdrawing.discard(task)
                self.kept.add(task)
        for task_id in msg.task_ids:
            task = self._answered(worker, task_id)
            if task is None:
                continue
            if task.missing:
                self.transition(task, "waiting")
                continue
            self.transition(task, "ready")
            thief = next(
                (
                    w
                    for w in self.workers.values()
                    if w is not worker and not (w.full or w.errors) and self.room(w) > 0
                ),
                None,
            )
            if thief is not None:  # straight to an idle worker, not back to the queue's front
                self.queue.remove(task)
                self.transition(task, "processing", thief)

    def _answered(self, worker: WorkerRecord, task_id: int) -> TaskRecord | None:
        """The task processing on ``worker`` that an answer about ``task_id`` is about,
        if it answers the last ``Withdraw`` of it sent there."""
        task = self.held(task_id, worker)
        if task is None:
            return None
        left = self.asks.pop((worker, task), 1) - 1
        if left > 0:
            self.asks[worker, task] = left
            return None
        return task

    def _prune(self) -> None:
        """Forget the asks of workers gone and of tasks no longer processing there."""
        for worker, task in list(self.asks):
            if self.workers.get(worker.id) is not worker or task.worker is not worker:
                del self.asks[worker, task]


def _startable(worker: WorkerRecord) -> int:
    return sum(1 for task in worker.processing if task.missing == 0 and task.placement is None)
