"""The progress bar of ``get(..., progress=True)``: tasks done / total and the rate.

The caller's thread, which waits in ``get`` anyway, redraws the bar at most
``1 / UPDATE_PERIOD`` times a second from a counter the manager's I/O thread bumps per
finished task; nothing is called per task. tqdm draws it (on stderr): a small pure-Python
package with no dependencies of its own, which computes the rate and the time left, and
degrades to plain lines where the terminal cannot redraw. (rich draws prettier bars but
brings markdown and syntax highlighting along, for one bar.)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol

#: Seconds between redraws: often enough to look live, rare enough to cost nothing.
UPDATE_PERIOD = 0.1


class Waitable(Protocol):
    """A run's ``done`` event, or what calls Dask's callbacks while waiting for it."""

    def wait(self, timeout: float | None = None) -> bool: ...


def default_enabled() -> bool:
    """On when stderr is a terminal (a person is watching), off in logs and pipes."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def wait_with_progress(done: Waitable, count: Callable[[], int], total: int) -> None:
    """Wait for ``done`` while a bar shows ``count()`` of ``total`` tasks finished.

    The bar is closed however the wait ends (Ctrl-C included), leaving the last state on
    the terminal.
    """
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        unit="task",
        desc="daskvine_py",
        file=sys.stderr,
        mininterval=UPDATE_PERIOD,
        dynamic_ncols=True,
        smoothing=0.1,
    )
    try:
        while not done.wait(UPDATE_PERIOD):
            bar.update(min(count(), total) - bar.n)
        bar.update(min(count(), total) - bar.n)
    finally:
        bar.close()
