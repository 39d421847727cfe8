"""The manager's side of ``scheduler.faults``: its settings, its tick, and what is shown
of a quarantine.

The state reads no clock: the I/O loop hands it a ``Tick`` at most every ``TICK_PERIOD``
seconds while runs are under way, and it looks for stragglers and stuck workers then.
A ``Quarantined`` instruction becomes one WARNING naming the worker and why, the
``quarantined`` field of ``manager.workers`` and a row in the report of every run watched.
"""

from __future__ import annotations

import logging
import time

from daskvine_py.manager.registry import Registry, printable
from daskvine_py.manager.watching import Watching
from daskvine_py.options import ManagerOptions
from daskvine_py.scheduler.messages import Event, Quarantined, Tick
from daskvine_py.scheduler.state import SchedulerState

logger = logging.getLogger("daskvine_py.manager")

#: Seconds between two ticks at most: stragglers are caught within about this much.
TICK_PERIOD = 1.0
#: Heartbeat intervals a ``Withdraw`` may go unanswered before its worker is ejected (and
#: never less than ``worker_timeout``: the patience given to silence).
WITHDRAW_BEATS = 10


class FaultWatch:
    """Settings and tick of the state's ``Faults``; the loop's handler of ``Quarantined``."""

    def __init__(
        self,
        state: SchedulerState,
        options: ManagerOptions,
        registry: Registry,
        watching: Watching,
    ) -> None:
        self.state = state
        self.registry = registry
        self.watching = watching
        faults = state.faults
        faults.factor = options.fast_abort or 0.0
        faults.stall = options.worker_timeout
        faults.patience = max(WITHDRAW_BEATS * options.heartbeat_interval, options.worker_timeout)
        self._next_tick = 0.0

    def tick(self, now: float, events: list[Event]) -> None:
        """Queue a ``Tick`` for the state if one is due, a run is under way and a worker
        is there to judge."""
        if now >= self._next_tick and self.state.runs and self.state.workers:
            self._next_tick = now + TICK_PERIOD
            events.append(Tick())

    def quarantined(self, news: Quarantined) -> None:
        info = self.registry.workers.get(news.worker)
        if info is None:
            return  # gone meanwhile
        info.quarantined = news.reason
        self.registry.publish(news.worker, info)
        name = printable(news.name)
        if news.reason is None:
            logger.warning("worker %s is no longer quarantined: %s", name, news.note)
            shown = f"released: {news.note}"
        else:
            logger.warning("quarantined worker %s (it gets no new tasks): %s", name, news.reason)
            shown = news.reason
        now = time.monotonic()
        for run in self.watching.watched.values():
            if run.log is not None:
                run.log.quarantined(now, news.name, shown)
