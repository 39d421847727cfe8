"""Taking queued tasks back from busy workers for idle ones (``Withdraw``).

A mixin of ``state.SchedulerState``. Workers hold more tasks than cores (saturation), so
when the manager's queue runs dry an idle core may face a neighbour with several tasks
waiting unstarted. The manager only asks for them back: a task moves once its worker
confirms it dropped it unstarted (``Withdrawn``), so none ever runs twice because of this.
"""

from __future__ import annotations

from typing import Any

from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p


class Stealing:
    """The work-stealing half of ``SchedulerState``; see the module docstring."""

    workers: dict[Any, WorkerRecord]
    queue: Any
    #: tasks asked back from their worker for an idle one, unanswered
    _withdrawing: set[TaskRecord]
    _room: Any
    _send: Any
    _held: Any
    _transition: Any

    def _steal_for_idle_workers(self) -> None:
        """Ask for tasks that wait unstarted behind busy cores back, for idle cores.

        Only asked (``Withdraw``): a task moves once its worker confirms it dropped it
        unstarted (``Withdrawn``), so no task ever runs twice because of this.
        """
        idle = [w for w in self.workers.values() if self._room(w) > 0 and not w.full]
        if not idle or all(len(w.processing) <= w.cores for w in self.workers.values()):
            return  # nobody idle, or nothing waits behind busy cores anywhere
        wanted = sum(self._room(w) for w in idle) - len(self._withdrawing)
        if wanted <= 0:
            return  # enough already asked for
        # Startable tasks beyond a worker's cores are queued there, not running.
        surplus = {w: _startable(w) - w.cores for w in self.workers.values()}
        for task in self._withdrawing:
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
                if t.missing == 0 and t not in self._withdrawing and t.placement is None
            )
            surplus[victim] -= 1
            self._withdrawing.add(task)
            asked.setdefault(victim, []).append(task.id)
        for victim, ids in asked.items():
            self._send(victim, p.Withdraw(tuple(ids)))

    def _on_withdrawn(self, worker: WorkerRecord, msg: p.Withdrawn) -> None:
        """Tasks a worker gave back unstarted: queue them for whoever is free."""
        for task_id in msg.task_ids:
            task = self._held(task_id, worker)
            if task is None:
                continue
            if task.missing:
                self._transition(task, "waiting")
                continue
            self._transition(task, "ready")
            thief = next(
                (w for w in self.workers.values()
                 if w is not worker and not w.full and self._room(w) > 0),
                None,
            )  # fmt: skip
            if thief is not None:  # straight to an idle worker, not back to the queue's front
                self.queue.remove(task)
                self._transition(task, "processing", worker=thief)


def _startable(worker: WorkerRecord) -> int:
    return sum(1 for task in worker.processing if task.missing == 0 and task.placement is None)
