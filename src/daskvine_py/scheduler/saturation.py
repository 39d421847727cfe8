"""How many tasks a worker should hold: EMA of task durations against the round trip.

A worker that finishes a task must not wait for the manager to send the next one, so it
holds ``cores + extra`` tasks where ``extra`` covers the round trip::

    extra ≈ cores × round_trip / duration

Durations are estimated per task prefix (the kind of function) with an exponential moving
average; an estimate is forgotten when a task runs far longer than predicted, so the queue
shrinks at once when the workload turns slow. The round trip is estimated per worker from
tasks that found a free core: their turnaround minus their run time is pure overhead
(the estimates are a record the parts share: ``records.DurationEstimates``).
``extra`` is bounded: too much prefetch leaves work queued on one worker while another
idles (the manager also takes unstarted work back for idle workers).

Everything here is a pure function of its samples; no clocks are read. ``Saturation`` is
the state's component that applies it to each worker.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from daskvine_py.scheduler.records import TaskRecord, WorkerRecord

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: Assumed round trip before a worker has been measured, in seconds.
DEFAULT_ROUND_TRIP = 0.001
#: Shortest duration used to size queues, so a flood of empty tasks has a finite target.
MIN_DURATION = 20e-6


def extra_tasks(
    cores: int, duration: float | None, round_trip: float | None, max_extra_per_core: int
) -> int:
    """Tasks a worker of ``cores`` cores should hold beyond one per core.

    Unknown durations get one extra per core: enough to overlap the first round trips,
    little enough not to hoard work of unknown length.
    """
    if duration is None:
        return min(cores, cores * max_extra_per_core)
    trip = DEFAULT_ROUND_TRIP if round_trip is None else round_trip
    wanted = math.ceil(cores * trip / max(duration, MIN_DURATION))
    return max(0, min(wanted, cores * max_extra_per_core))


class Saturation:
    """How many tasks each worker holds beyond its cores: ``extra(worker, task)``.

    It reads the context's ``durations``; annotated tasks take slots on a worker beyond
    one each (``Constraints.held_back``), which leave no room for extras at all.
    """

    __slots__ = ("durations", "held_back", "max_extra_tasks_per_core", "fixed_extra_tasks_per_core")

    def __init__(
        self,
        ctx: Context,
        max_extra_tasks_per_core: int = 16,
        fixed_extra_tasks_per_core: int | None = None,
    ) -> None:
        self.durations = ctx.durations
        self.held_back = ctx.constraints.held_back
        #: bound on the tasks a worker holds beyond one per core
        self.max_extra_tasks_per_core = max_extra_tasks_per_core
        #: when set, every worker holds exactly this many extra per core (no EMA sizing)
        self.fixed_extra_tasks_per_core = fixed_extra_tasks_per_core

    def extra(self, worker: WorkerRecord, task: TaskRecord) -> int:
        """Tasks ``worker`` may hold beyond its cores when the next is one like ``task``
        (negative: annotated tasks there take more than their one slot each, or it is
        quarantined: ``faults``)."""
        if worker.quarantined is not None:
            return -worker.cores
        if worker.holding and (held := self.held_back(worker)):
            return -held
        if self.fixed_extra_tasks_per_core is not None:
            return worker.cores * self.fixed_extra_tasks_per_core
        trip = worker.round_trip.value if worker.round_trip.count else None
        return extra_tasks(
            worker.cores, self.durations.get(task.prefix), trip, self.max_extra_tasks_per_core
        )
