"""One category's measured peaks and the memory each of its tasks gets now (``Size``):
the sizing modes of ``sizing.Sizing`` (docs/resources.md, "Sizing categories").

"max" allots the largest peak seen and a margin. "min-waste" and "max-throughput" keep the
peaks in buckets and allot the bucket bound that, over what was seen, holds least memory x
seconds, or finishes most tasks per second, a task above it paying its try and a retry at
the "max" allocation (the idea of TaskVine's categories, computed anew here). "fixed"
allots nothing.
"""

from __future__ import annotations

import math

MB = 2**20
#: "max": the largest peak seen times this: room for the next task's being a little larger.
MARGIN = 1.25
#: The least a measured category is allotted: a task's own peak is measured as a
#: difference of resident sizes, a few MB of which are the allocator's, not the task's;
#: and a task importing a module on first use in a fresh library grows by tens of MB
#: (stopping it costs a library's start and its live results).
FLOOR = 64 * MB
#: "min-waste"/"max-throughput": peaks are kept in buckets growing by this ratio from
#: ``FLOOR`` (some 9% apart: a hundred-odd buckets up to a terabyte), each bucket's upper
#: bound a candidate allocation.
STEP = 2**0.125
#: Seconds a task counts for at least, so that instant tasks weigh something.
MIN_SECONDS = 1e-3
#: "min-waste"/"max-throughput": past this many finished tasks, the allocation is
#: computed again every this many (and at each new largest peak).
RESIZE_EVERY = 16


class Size:
    """One category's measurements, and the memory each of its tasks gets now."""

    __slots__ = (
        "name",
        "mode",
        "allocation",
        "measured",
        "slow",
        "peak",
        "tasks",
        "exhausted",
        "buckets",
    )

    def __init__(self, name: str, mode: str) -> None:
        self.name = name
        self.mode = mode
        #: bytes each of its tasks gets now (0: none: what the worker's budget has left)
        self.allocation = 0
        #: one of its tasks finished (the mode sizes it from then on)
        self.measured = False
        #: dispatch looks at its tasks one by one (``Sizing.fits``): unmeasured, or its
        #: allocation not yet counted in ``Sizing.largest``
        self.slow = mode != "fixed"
        #: the largest peak seen (bytes), tasks finished, tasks that ran out
        self.peak = 0
        self.tasks = 0
        self.exhausted = 0
        #: "min-waste"/"max-throughput": bucket's upper bound -> [tasks, seconds]
        self.buckets: dict[int, list[float]] = {}

    def __repr__(self) -> str:
        return (
            f"Size({self.name!r}, {self.mode}, allocation={self.allocation / MB:.1f} MB, "
            f"tasks={self.tasks}, exhausted={self.exhausted})"
        )

    def measure(self, peak: int, seconds: float) -> None:
        """One of its tasks finished having used ``peak`` bytes for ``seconds``."""
        self.tasks += 1
        mode = self.mode
        if mode == "fixed":
            return
        first = not self.measured
        self.measured = True
        larger = peak > self.peak
        if larger:
            self.peak = peak
        if mode == "max":
            if first or larger:
                self.allocation = self.top()
            return
        bound = _bucket(peak)
        seconds = max(seconds, MIN_SECONDS)
        entry = self.buckets.get(bound)
        if entry is None:
            self.buckets[bound] = [1.0, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds
        if first or larger or entry is None or self.tasks % RESIZE_EVERY == 0:
            self.allocation = self._first_allocation()

    def top(self) -> int:
        """The "max" allocation: the largest peak seen and a margin (0: none seen)."""
        return max(FLOOR, int(self.peak * MARGIN)) if self.measured else 0

    def _first_allocation(self) -> int:
        """The candidate (a bucket's bound, or the "max" allocation) that wastes least or
        finishes most, a task above it paying its try and a retry at the "max" one."""
        top = self.top()
        buckets = sorted(self.buckets.items())
        tasks = sum(entry[0] for _, entry in buckets)
        seconds = sum(entry[1] for _, entry in buckets)
        waste = self.mode == "min-waste"

        def score(allotted: int, fit: float, again: float) -> float:
            """Higher is better; ``fit`` tasks fit in ``allotted``, the others ran for
            ``again`` seconds that a retry at ``top`` repeats."""
            if waste:  # memory x seconds held (less is better)
                return -(allotted * seconds + top * again)
            # tasks per second in ``top`` bytes: top / allotted at once of those that
            # fit, one at a time of those that run again
            return (top / allotted * fit + (tasks - fit)) / (seconds + again)

        best, best_score = top, score(top, tasks, 0.0)
        fit = spent = 0.0
        for bound, (count, seconds_in) in buckets:
            fit += count
            spent += seconds_in
            allotted = max(bound, FLOOR)
            if allotted >= top:
                break
            candidate = score(allotted, fit, seconds - spent)
            if candidate > best_score:
                best, best_score = allotted, candidate
        return best


def _bucket(peak: int) -> int:
    """The upper bound of the bucket that holds a peak of ``peak`` bytes."""
    if peak <= FLOOR:
        return FLOOR
    return int(FLOOR * STEP ** math.ceil(math.log(peak / FLOOR, STEP) - 1e-9))
