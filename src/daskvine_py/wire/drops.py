"""What a receiver logs of what it drops: at most one warning per kind per interval."""

from __future__ import annotations

import logging
from collections.abc import Hashable


class DropLog:
    """Warnings about what a loop drops, at most one per kind per ``interval`` seconds.

    The first drop of a kind (say, malformed messages from one worker) is logged at once;
    later ones within ``interval`` are only counted, and the next warning of that kind
    says how many there were. A flood of garbage costs a few lines a minute, never one
    per message. ``now`` is the caller's monotonic clock.
    """

    __slots__ = ("logger", "interval", "max_kinds", "_last")

    def __init__(
        self, logger: logging.Logger, interval: float = 60.0, max_kinds: int = 1024
    ) -> None:
        self.logger = logger
        self.interval = interval
        #: kinds remembered at most (sources come and go): past it, all are forgotten
        self.max_kinds = max_kinds
        #: kind -> [when its last warning was logged, drops since then not logged]
        self._last: dict[Hashable, list[float]] = {}

    def warn(
        self,
        kind: Hashable,
        now: float,
        msg: str,
        *args: object,
        exc_info: BaseException | bool | None = None,
    ) -> bool:
        """Log ``msg % args`` unless a warning of ``kind`` was logged in the last
        ``interval`` seconds (then count it); whether it was logged."""
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.interval:
            last[1] += 1
            self.logger.debug(msg, *args)
            return False
        if last is None and len(self._last) >= self.max_kinds:
            self._last.clear()
        if last is not None and last[1]:
            msg += " (and %d more like it in the last %.0f s)"
            args += (last[1], now - last[0])
        self._last[kind] = [now, 0]
        self.logger.warning(msg, *args, exc_info=exc_info)
        return True
