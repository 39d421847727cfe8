"""The copies of results: replicas, copies reported gone, and lineage.

A component of ``state.SchedulerState``. A result is in memory while some worker holds a
copy (``who_has``). Runs asking for replicas get more copies (``Replicate``); workers report
copies they took from peers (``Replicas``) and copies they lost (``Lost``, a dead library;
``FetchFailed``, a holder that could not serve one; an error about a task whose result
they were said to hold). When the last copy goes and the result is still needed, it is
computed again from its lineage: released inputs first (``recompute``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from daskvine_py.scheduler.records import TaskRecord, WorkerRecord, needed
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context


class Copies:
    """Where results' copies are, and what happens when they go; see the module docstring.

    It reads the context's ``tasks`` and ``workers``; its messages go through
    ``Claims.send``. For the result cache: ``cache_lost(lost)`` takes the cached results
    out of ``lost`` (their readers switch to their own lineage); ``cache_payload(task)``
    makes the payload of a task submitted without one; ``cache_runs`` is only tested for
    emptiness (no cache run: no payload to make).
    """

    __slots__ = (
        "tasks",
        "workers",
        "transition",
        "send",
        "held",
        "cache_lost",
        "cache_payload",
        "cache_runs",
        "recomputed",
    )

    def __init__(self, ctx: Context) -> None:
        self.tasks = ctx.tasks
        self.workers = ctx.workers
        self.transition = ctx.transition
        self.send = ctx.claims.send
        self.held = ctx.held
        self.cache_lost = ctx.caching.lost
        self.cache_payload = ctx.caching.payload
        self.cache_runs = ctx.cache_runs
        #: results brought back after every copy was lost (lineage), since the start
        self.recomputed = 0

    # -- more copies ------------------------------------------------------------------

    def replicate(
        self, task: TaskRecord, worker: WorkerRecord, copies: int = 0
    ) -> list[WorkerRecord]:
        """Ask other workers, those holding fewest results, to copy ``task``'s result from
        ``worker`` until ``copies`` (0: ``task.run.replicas``) would exist; the workers
        asked."""
        others = [w for w in self.workers.values() if w is not worker and not w.full]
        wanted = (copies or task.run.replicas) - len(task.who_has)
        chosen = heapq.nsmallest(wanted, others, key=lambda w: len(w.has_what))
        for other in chosen:
            self.send(other, p.Replicate(task.id, (worker.peer_address,)))
        return chosen

    def on_replicas(self, worker: WorkerRecord, msg: p.Replicas) -> None:
        """Record inputs ``worker`` fetched from peers; release those nobody needs now."""
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is not None and task.state == "memory":
                task.hold(worker)
                worker.has_what.add(task)
            else:
                self.send(worker, p.Release((task_id,)))

    # -- copies gone ------------------------------------------------------------------

    def on_lost(self, worker: WorkerRecord, msg: p.Lost) -> None:
        """Results ``worker`` no longer holds (a library process died with them)."""
        lost = []
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is None or worker not in task.who_has:
                continue
            task.unhold(worker)
            worker.has_what.discard(task)
            if not task.who_has and task.state == "memory":
                lost.append(task)
        self.lose(lost)

    def not_held(self, task_id: int, worker: WorkerRecord) -> None:
        """``worker`` could not run ``task`` (it erred, crashed or lacked an input), which
        the state believes it holds: the ``TaskDone`` that said so was false, and the
        copy does not exist. Without this, tasks sent ahead to wait for it there would
        wait forever. (An honest worker runs a task again only once its result is gone.)"""
        task = self.tasks.get(task_id)
        if task is None or task.state != "memory" or worker not in task.who_has:
            return
        task.unhold(worker)
        worker.has_what.discard(task)
        if not task.who_has:
            self.lose([task])

    def on_fetch_failed(self, worker: WorkerRecord, msg: p.FetchFailed) -> None:
        """``worker`` could not fetch an input of a task: forget the copies it was told
        of, and queue the task again (its inputs are computed again if none is left)."""
        task = self.held(msg.task_id, worker)
        if task is None:
            self.not_held(msg.task_id, worker)
            return
        dep = self.tasks.get(msg.dep_id)
        if dep is None or (dep.run is not task.run and dep not in task.deps):  # (or cached)
            # Not one of its inputs: all that is known is that the worker dropped the task.
            self.transition(task, "ready" if task.missing == 0 else "waiting")
            return
        # Whoever could not serve it has lost it (or is unreachable): forget that copy.
        failed = [w for w in dep.who_has if w.peer_address in msg.peers]
        for holder in failed:
            dep.unhold(holder)
            holder.has_what.discard(dep)
            self.send(holder, p.Release((dep.id,)))
        if dep.state == "memory" and not dep.who_has:
            self.lose([dep])
        if task.state == "processing":  # its inputs still exist elsewhere: try again
            self.transition(task, "ready" if task.missing == 0 else "waiting")

    # -- lineage ----------------------------------------------------------------------

    def lose(self, lost: list[TaskRecord]) -> None:
        """Results whose every copy is gone: forget them, then recompute what is needed."""
        lost = self.cache_lost(lost)  # cached ones are forgotten; their readers recompute
        for task in lost:
            self.transition(task, "released")
        for task in lost:
            if task.state == "released" and needed(task):
                self.recompute(task)

    def recompute(self, root: TaskRecord) -> None:
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
            if not task.payload and self.cache_runs:
                self.cache_payload(task)  # submitted without it: lineage needs it now
            self.transition(task, "ready" if missing == 0 else "waiting")
