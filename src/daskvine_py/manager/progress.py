"""The progress bar of ``get(..., progress=True)``: tasks done / total and the rate.

The caller's thread, which waits in ``get`` anyway, redraws the bar at most
``1 / UPDATE_PERIOD`` times a second from a counter the manager's I/O thread bumps per
finished task; nothing is called per task. tqdm draws it (on stderr): a small pure-Python
package with no dependencies of its own, which computes the rate and the time left.
(rich draws prettier bars but brings markdown and syntax highlighting along, for one bar.)

A terminal that reports no size (a pty nobody sized: some containers' ``-t``, a
program driving a shell) gives tqdm a width and a height of 0, and it would draw nothing
but an empty line: there the bar is drawn for a terminal of ``FALLBACK_SIZE``.

Where stderr is no terminal (``progress=True`` into a pipe, a log, CI), a redraw would be
one more ``\\r`` on a single endless line: there the same counts are written as plain
lines instead, at the start, every ``LINE_PERIOD`` seconds and at the end.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

#: Seconds between redraws: often enough to look live, rare enough to cost nothing.
UPDATE_PERIOD = 0.1
#: Seconds between plain lines where stderr is no terminal: each is kept for good there,
#: so a few a minute tell a log's reader the run moves without flooding the log.
LINE_PERIOD = 10.0
#: Columns and rows assumed of a terminal that reports no size (the VT100's, which
#: terminal emulators still open with).
FALLBACK_SIZE = (80, 24)
#: A plain line: no bar, which only a redrawn terminal line makes sense of.
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} tasks ({percentage:.0f}%) in {elapsed}, {rate_fmt}"


class Waitable(Protocol):
    """A run's ``done`` event, or what calls Dask's callbacks while waiting for it."""

    def wait(self, timeout: float | None = None) -> bool: ...


def _is_terminal(stream: Any) -> bool:
    try:
        return stream is not None and bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def _columns(stream: Any) -> int | None:
    """The width of the terminal ``stream`` writes to; None where it reports none (0)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):  # no file descriptor, or not a tty's
        return None


def default_enabled() -> bool:
    """On when stderr is a terminal (a person is watching), off in logs and pipes."""
    return _is_terminal(sys.stderr)


def wait_with_progress(done: Waitable, count: Callable[[], int], total: int) -> None:
    """Wait for ``done`` while a bar shows ``count()`` of ``total`` tasks finished.

    The bar is closed however the wait ends (Ctrl-C included), leaving the last state on
    the terminal; where stderr is no terminal, the last line is written all the same.
    """
    from tqdm import tqdm

    stream = sys.stderr
    terminal = _is_terminal(stream)
    # Where the terminal reports its width, tqdm follows it (a resized window too); else
    # it is fixed, one column short as tqdm draws a measured width (no wrap at the edge).
    sized = terminal and _columns(stream) is not None
    bar = tqdm(
        total=total,
        unit="task",
        desc="daskvine_py",
        # No terminal: tqdm only counts (into nothing); the lines are ours.
        file=stream if terminal else io.StringIO(),
        mininterval=UPDATE_PERIOD,
        ncols=None if sized or not terminal else FALLBACK_SIZE[0] - 1,
        nrows=None if sized or not terminal else FALLBACK_SIZE[1],
        dynamic_ncols=sized,
        smoothing=0.1,
        bar_format=None if terminal else LINE_FORMAT,
    )
    next_line = time.monotonic() + LINE_PERIOD
    if not terminal:
        _line(stream, bar)
    try:
        while not done.wait(UPDATE_PERIOD):
            bar.update(min(count(), total) - bar.n)
            if not terminal and time.monotonic() >= next_line:
                _line(stream, bar)
                next_line = time.monotonic() + LINE_PERIOD
        bar.update(min(count(), total) - bar.n)
    finally:
        if not terminal:
            _line(stream, bar)
        bar.close()


def _line(stream: Any, bar: Any) -> None:
    try:
        stream.write(f"{bar}\n")
        stream.flush()
    except (AttributeError, OSError, ValueError):  # no stderr, or a closed one
        pass
