"""What a task takes, measured in the process that runs it: its result's size (``sizeof``)
and its own peak resident memory.

Linux keeps a process's high-water mark of resident memory (``VmHWM`` in
``/proc/self/status``) and lets the process reset it to the current resident size by
writing "5" to ``/proc/self/clear_refs``: reset before a task, read after, and the mark
less the process's resident size when the task began is the task's own peak. That size
(``VmRSS``) comes from the same read at the end of the previous task (or from the files'
opening), so a task pays one ``write`` and one ``pread`` (a few microseconds), no more;
only after a large result left the process (``freed``) is it read again as the task
begins, lest the base count memory that is gone.
The worker's memory watch limits a library by the same base (``base``). Where the reset
is refused the mark is the process's peak so far; without ``/proc`` it is
``getrusage``'s ``ru_maxrss``. With several tasks at once in one process (``slots`` > 1)
they share one mark: each reads the process's growth while it ran.

``DASKVINE_PY_MEASURE=0`` in a worker's environment turns the reads off (peaks are then 0,
and categories are not sized from them): only to measure what measuring costs
(``benchmarks/bench_measure.py``).
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
_RESET_HIGH_WATER = b"5"
_MARK = b"VmHWM:"
_RESIDENT = b"VmRSS:"

#: The open files, and the process they were opened in: a forked child opens its own
#: (those it inherits still name its parent).
_pid = 0
_clear_fd = -1
_status_fd = -1
#: resident bytes at the last read: the base of the next task; ``_stale``: memory was
#: freed since (``freed``), so the next task's base is read afresh
_rss = 0
_stale = False
#: Bytes of a page of memory (``/proc/PID/statm`` counts pages).
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Off only to measure what measuring costs (the module docstring).
MEASURING = os.environ.get("DASKVINE_PY_MEASURE", "1") != "0"
#: Freeing less than this leaves the base as it was read: it errs by that much at most.
STALE_BYTES = 1 << 20


def _open() -> None:
    global _pid, _clear_fd, _status_fd, _rss
    _pid = os.getpid()
    _clear_fd = _status_fd = -1
    if not MEASURING:
        _rss = 0
        return
    try:
        _clear_fd = os.open(_CLEAR_REFS, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        pass  # not Linux, or not allowed: the mark is the process's peak so far
    try:
        _status_fd = os.open(_STATUS, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        pass
    _rss = _read()[1]


def _forked() -> None:
    global _pid
    _pid = 0  # the child opens its own files on first use; the inherited ones are closed
    for fd in (_clear_fd, _status_fd):
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def reset_peak() -> int:
    """Reset the process's high-water mark of resident memory to its resident size now;
    the task's base: the resident bytes of the last read (no read here)."""
    if _pid != os.getpid():
        _open()
    elif _stale:
        _refresh()
    if _clear_fd >= 0:
        try:
            os.write(_clear_fd, _RESET_HIGH_WATER)
        except OSError:
            pass
    return _rss


def base() -> int:
    """The resident bytes a task starting now is measured from (``reset_peak``'s)."""
    if _pid != os.getpid():
        _open()
    elif _stale:
        _refresh()
    return _rss


def freed(nbytes: int) -> None:
    """``nbytes`` leave the process (a result sent and not kept, a live one forgotten):
    a large amount has the next task's base read afresh, not taken from the last read."""
    global _stale
    if nbytes >= STALE_BYTES:
        _stale = True


def dropped(value: Any) -> None:
    """``freed`` for a value dropped here, sized cheaply: its ``nbytes`` (arrays), else
    ``sys.getsizeof`` (``sizeof`` would cost more than the read it may save)."""
    nbytes = getattr(value, "nbytes", None)
    freed(nbytes if type(nbytes) is int else sys.getsizeof(value))


def _refresh() -> None:
    global _rss, _stale
    _stale = False
    resident = _read()[1]
    if resident:
        _rss = resident


def peak_memory() -> int:
    """The process's high-water mark of resident memory, in bytes (0: not known)."""
    if _pid != os.getpid():
        _open()
    return _read()[0]


def task_peak(start: int) -> int:
    """A task's own peak: the high-water mark less ``start`` (its ``reset_peak``); the
    resident size read with it is the next task's base."""
    global _rss
    peak, resident = _read()
    if resident:
        _rss = resident
    return max(0, peak - start)


def _read() -> tuple[int, int]:
    """The high-water mark and the resident size, in bytes, from one read (0: unknown)."""
    if not MEASURING:
        return 0, 0
    if _status_fd >= 0:
        try:
            status = os.pread(_status_fd, 8192, 0)
            at = status.index(_MARK) + len(_MARK)
            end = status.index(b"kB", at)
            peak = int(status[at:end]) * 1024
            at = status.index(_RESIDENT, end) + len(_RESIDENT)
            return peak, int(status[at : status.index(b"kB", at)]) * 1024
        except (OSError, ValueError):
            pass
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except OSError:
        return 0, 0
    return (peak if sys.platform == "darwin" else peak * 1024), 0  # (bytes there, kB else)


def sizeof(value: Any) -> int:
    """Dask's estimate of an object's bytes (what its spill accounting uses)."""
    try:
        from dask.sizeof import sizeof as estimate

        return int(estimate(value))
    except Exception:
        return sys.getsizeof(value)
