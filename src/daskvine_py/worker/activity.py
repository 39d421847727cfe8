"""What a worker did since its last heartbeat, as bars for the manager's live task stream.

The manager must see each worker's tasks without doing anything per task, so the worker
aggregates: ``Activity`` merges what ran on each lane into bars (``p.Bar``: lane, key
prefix, start, end, serialization seconds, tasks) and the heartbeat carries the bars
finished since the previous one (``Status.activity``). Lanes: a library's id (tasks run
there), ``PROCESS_LANE`` (task processes), ``p.FETCH_LANE`` (inputs fetched from peers)
and ``p.SPILL_LANE`` (results written to spill files).

Merging, per lane: a task of the lane's last bar's prefix that starts within
``RESOLUTION`` of that bar's end extends it; so does any task that starts within
``RESOLUTION`` of that bar's start, whatever its prefix (the bar keeps its own prefix and
counts the task). A lane so gets a new bar at most every ``RESOLUTION`` seconds of its
tasks' starts, however short and varied they are: a heartbeat carries at most about
interval / ``RESOLUTION`` bars per lane (``MAX_BARS`` overall, whatever happens).

Pure: no I/O and no clock. Tasks come with the wall clock (``time.time()``, the library
replies' clock); fetches and spills with the worker's loop clock (``time.monotonic()``),
moved onto the wall clock when taken (``take``'s ``clock_offset``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from daskvine_py.wire import protocol as p
from daskvine_py.wire.keys import key_prefix

#: Seconds below which a lane's bars are not told apart (see the module docstring).
RESOLUTION = 0.05
#: The lane of tasks run in task processes (``task_mode="tasks"``): library ids start at 1.
PROCESS_LANE = 0
#: Bars held between two heartbeats at most: past it, tasks join their lane's last bar (a
#: worker that cannot send heartbeats must not grow without bound).
MAX_BARS = 10_000
#: Key names whose prefix is remembered (then forgotten all at once): tuple keys repeat
#: their name, so most tasks find it here.
MAX_PREFIXES = 4096


class Activity:
    """A worker's bars since the last ``take``; see the module docstring."""

    __slots__ = ("_bars", "_last", "_prefixes")

    def __init__(self) -> None:
        #: every bar since the last take, as lists (lane, prefix, start, end, seconds,
        #: tasks) that later tasks extend in place
        self._bars: list[list[Any]] = []
        #: lane -> its last bar (in ``_bars``)
        self._last: dict[int, list[Any]] = {}
        #: key name (a key, or a tuple key's first element) -> its prefix
        self._prefixes: dict[Hashable, str] = {}

    def add_task(
        self, lane: int, key: Hashable, start: float, end: float, serialization: float
    ) -> None:
        """A task of ``key`` ran on ``lane`` from ``start`` to ``end`` (wall clock),
        ``serialization`` seconds of it spent (un)pickling. Runs for every task: cheap."""
        name = key[0] if type(key) is tuple and key else key
        prefixes = self._prefixes
        prefix = prefixes.get(name)
        if prefix is None:
            prefix = key_prefix(name)
            if len(prefixes) >= MAX_PREFIXES:
                prefixes.clear()
            prefixes[name] = prefix
        bar = self._last.get(lane)
        if bar is not None and (
            start < bar[2] + RESOLUTION or (bar[1] == prefix and start <= bar[3] + RESOLUTION)
        ):
            if end > bar[3]:
                bar[3] = end
            if start < bar[2]:
                bar[2] = start
            bar[4] += serialization
            bar[5] += 1
        else:
            self._add(bar, [lane, prefix, start, end, serialization, 1])

    def add_interval(self, lane: int, start: float, end: float, count: int = 1) -> None:
        """``count`` transfers (``p.FETCH_LANE``) or spills (``p.SPILL_LANE``) done from
        ``start`` to ``end`` (the loop's clock), merged as tasks are."""
        prefix = "fetch" if lane == p.FETCH_LANE else "spill"
        bar = self._last.get(lane)
        if bar is not None and start <= bar[3] + RESOLUTION:  # (it ends after it starts)
            if end > bar[3]:
                bar[3] = end
            if start < bar[2]:
                bar[2] = start
            bar[5] += count
        else:
            self._add(bar, [lane, prefix, start, end, 0.0, count])

    def add_spills(self, start: float, end: float, count: int) -> None:
        """``count`` results written to spill files from ``start`` to ``end`` (the
        store's ``on_spill``)."""
        self.add_interval(p.SPILL_LANE, start, end, count)

    def _add(self, last: list[Any] | None, bar: list[Any]) -> None:
        if last is not None and len(self._bars) >= MAX_BARS:  # full: the last bar grows
            last[3] = max(last[3], bar[3])
            last[4] += bar[4]
            last[5] += bar[5]
            return
        self._bars.append(bar)
        self._last[bar[0]] = bar

    def take(self, clock_offset: float = 0.0) -> tuple[p.Bar, ...]:
        """The bars since the last take, then forgotten. ``clock_offset``: the wall clock
        less the loop's, added to the fetch and spill lanes' times."""
        bars = self._bars
        if not bars:
            return ()
        self._bars = []
        self._last = {}
        taken: list[p.Bar] = []
        for lane, prefix, start, end, seconds, tasks in bars:
            if lane < 0:
                start += clock_offset
                end += clock_offset
            start = max(0.0, start)  # (what the manager accepts: times >= 0)
            taken.append((lane, prefix, start, max(start, end), max(0.0, seconds), tasks))
        return tuple(taken)

    def __len__(self) -> int:
        """Bars held now."""
        return len(self._bars)
