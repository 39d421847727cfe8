"""An exponential moving average of durations that forgets its past on a large outlier.

Shared by the scheduler (task durations per prefix, round trips per worker) and the worker
(its recent task durations); a pure function of its samples, no clock is read.
"""

from __future__ import annotations

#: Weight of the newest sample. Higher follows changes sooner; lower smooths noise.
ALPHA = 0.25
#: A task running this many times longer than its estimate resets the estimate.
RESET_FACTOR = 4.0


class Ema:
    """An exponential moving average that forgets its past on a large outlier."""

    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def observe(self, sample: float) -> None:
        if self.count == 0 or sample > RESET_FACTOR * self.value:
            self.value = sample
        else:
            self.value += ALPHA * (sample - self.value)
        self.count += 1
