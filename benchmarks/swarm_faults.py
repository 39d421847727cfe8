"""Faulty simulated workers of the swarm (issue 29): black holes, stragglers, ``Abort``.

``--black-holes F``: that share of a swarm process's workers (at least one) fail every
task ``BLACK_HOLE_SECONDS`` after it is handed to a library, as a broken install would.
``--stragglers F``: that share of the others (at least one) run every task ``SLOWDOWN``
times slower than it declares. ``Abort`` (the manager's fast abort, or a quarantine) is
honoured as a worker does: a queued task is dropped, a running one "killed" (its library
slot is free at once) and nothing is reported for either.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from typing import Any

from daskvine_py.wire import protocol as p
from daskvine_py.worker.messages import FromLibrary

#: How much slower a straggler runs every task.
SLOWDOWN = 10.0
#: Seconds a black hole takes to fail a task.
BLACK_HOLE_SECONDS = 0.01


def choose(swarm: Any) -> None:
    """Mark the swarm's black holes and stragglers (disjoint, drawn with its seed)."""
    healthy = list(swarm.workers)
    for share, kind in ((swarm.args.black_holes, "black_hole"), (swarm.args.stragglers, "slow")):
        if share <= 0 or not healthy:
            continue
        count = min(max(1, round(share * len(swarm.workers))), len(healthy))
        for worker in swarm.random.sample(healthy, count):
            healthy.remove(worker)
            if kind == "black_hole":
                worker.black_hole = True
                swarm.black_holes.append(worker.name)
            else:
                worker.slowdown = SLOWDOWN
                swarm.stragglers.append(worker.name)


def abort(worker: Any, task_ids: Sequence[int], now: float) -> None:
    """``Abort`` at a simulated worker: a queued task is dropped (as ``Cancel`` drops it),
    a running one killed."""
    queued = tuple(t for t in task_ids if t not in worker.running)
    if queued:
        worker.events.append(p.Cancel(queued))
    for task_id in task_ids:
        if task_id in worker.running and task_id not in worker.killed:
            _kill(worker, task_id, now)


def _kill(worker: Any, task_id: int, now: float) -> None:
    """A running simulated call is killed: its reply falls due now, to free its library
    slot, and is swallowed when it comes (``swallow``)."""
    swarm = worker.swarm
    completions = swarm.completions
    for index, (due, sequence, owner, lib, reply) in enumerate(completions):
        if owner is worker and reply.task_id == task_id:
            completions[index] = (now, sequence, owner, lib, reply)
            if worker.free_at[lib] == due:
                worker.free_at[lib] = now
            heapq.heapify(completions)
            worker.killed.add(task_id)
            swarm.tasks_killed += 1
            return


def swallow(worker: Any, lib: Any, reply: Any, wall: float) -> None:
    """The reply of a killed call: its library slot is free, its report never sent, its
    result not kept."""
    task_id = reply.task_id
    worker.killed.discard(task_id)
    now = time.monotonic()
    worker.handle(worker.events, now)  # what came before it, first
    out = worker.state.handle([FromLibrary(lib, reply, wall), p.Release((task_id,))], now)
    kept = [i for i in out if type(i) not in p.TO_MANAGER or p.task_ids_named(i) != (task_id,)]
    events: list[object] = []
    worker.carry(kept, events, now)
    worker.handle(events, now)
