"""What a task takes, measured in the process that runs it: its result's size (``sizeof``),
its CPU seconds and its own peak resident memory.

Linux keeps a process's high-water mark of resident memory and lets the process reset it
to the current resident size by writing "5" to ``/proc/self/clear_refs``; ``getrusage``
reports the mark (``ru_maxrss``) with the CPU seconds in one call. So a task pays one
``write``, one ``pread`` of ``/proc/self/statm`` (its base: the resident size as it
begins) and two ``getrusage`` calls, some 3 µs (``/proc/self/status``, which names the
mark too, costs 6 µs a read). Its own peak is the mark less its base. A process whose
threads exited after a larger peak keeps that figure in ``ru_maxrss`` beyond any reset:
then (the mark above the base as the task begins) the mark is read from
``/proc/self/status`` instead. The worker's memory watch limits a library by the same
base (``base``). Where the reset is refused the mark is the process's peak so far.
With several tasks at once in one process (``slots`` > 1) they share one mark: each
reads the process's growth while it ran.

``DASKVINE_PY_MEASURE=0`` in a worker's environment turns the reads off (peaks and CPU
seconds are then 0, and categories are not sized from them): only to measure what
measuring costs (``benchmarks/bench_measure.py``).
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
_STATM = "/proc/self/statm"
_RESET_HIGH_WATER = b"5"
_MARK = b"VmHWM:"
#: ``ru_maxrss`` is in kB on Linux, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024
_SELF = resource.RUSAGE_SELF
_usage = resource.getrusage

#: Bytes of a page of memory (``/proc/PID/statm`` counts pages).
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Off only to measure what measuring costs (the module docstring).
MEASURING = os.environ.get("DASKVINE_PY_MEASURE", "1") != "0"
#: The mark may exceed the base by this much as a task begins (pages touched between the
#: two reads) before ``ru_maxrss`` is taken for a stale figure.
STALE_SLACK = 4 << 20

#: The open files, and the process they were opened in: a forked child opens its own
#: (those it inherits still name its parent).
_pid = 0
_clear_fd = -1
_status_fd = -1
_statm_fd = -1
#: the base ``base`` read last, for the next ``begin`` to take rather than read again
_fresh = 0

#: What ``begin`` hands ``end``: the base, the CPU seconds then, and whether the mark
#: must come from ``/proc/self/status``.
Begun = tuple[int, float, bool]
_NOT_MEASURED: Begun = (-1, 0.0, False)


def _open() -> None:
    global _pid, _clear_fd, _status_fd, _statm_fd, _fresh
    _pid = os.getpid()
    _clear_fd = _status_fd = _statm_fd = -1
    _fresh = 0
    if not MEASURING:
        return
    for path, flags in ((_CLEAR_REFS, os.O_WRONLY), (_STATUS, os.O_RDONLY), (_STATM, os.O_RDONLY)):
        try:
            fd = os.open(path, flags | os.O_CLOEXEC)
        except OSError:
            fd = -1  # not Linux, or not allowed: the mark is the process's peak so far
        if path == _CLEAR_REFS:
            _clear_fd = fd
        elif path == _STATUS:
            _status_fd = fd
        else:
            _statm_fd = fd


def _forked() -> None:
    global _pid
    _pid = 0  # the child opens its own files on first use; the inherited ones are closed
    for fd in (_clear_fd, _status_fd, _statm_fd):
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def base() -> int:
    """The process's resident bytes now: what a task starting now is measured (and
    limited, by the worker's watch) from; the next ``begin`` takes it."""
    global _fresh
    if _pid != os.getpid():
        _open()
    _fresh = _resident()
    return _fresh


def begin() -> Begun:
    """A task begins: reset the mark; its base and the CPU seconds so far."""
    global _fresh
    if _pid != os.getpid():
        _open()
    if not MEASURING:
        return _NOT_MEASURED
    start = _fresh or _resident()
    _fresh = 0
    if _clear_fd >= 0:
        try:
            os.write(_clear_fd, _RESET_HIGH_WATER)
        except OSError:
            pass
    usage = _usage(_SELF)
    stale = usage.ru_maxrss * _MAXRSS_UNIT > start + STALE_SLACK
    return start, usage.ru_utime + usage.ru_stime, stale


def end(begun: Begun) -> tuple[float, int]:
    """A task ended: its CPU seconds and its own peak resident bytes (0: not known)."""
    start, cpu, stale = begun
    if start < 0:
        return 0.0, 0
    usage = _usage(_SELF)
    mark = peak_memory() if stale else usage.ru_maxrss * _MAXRSS_UNIT
    return usage.ru_utime + usage.ru_stime - cpu, max(0, mark - start)


def reset_peak() -> None:
    """Reset the process's high-water mark of resident memory to its resident size now."""
    begin()


def peak_memory() -> int:
    """The process's high-water mark of resident memory, in bytes (0: not known)."""
    if _pid != os.getpid():
        _open()
    if _status_fd >= 0:
        try:
            status = os.pread(_status_fd, 8192, 0)
            at = status.index(_MARK) + len(_MARK)
            return int(status[at : status.index(b"kB", at)]) * 1024
        except (OSError, ValueError):
            pass
    if not MEASURING:
        return 0
    return _usage(_SELF).ru_maxrss * _MAXRSS_UNIT


def _resident() -> int:
    if _statm_fd >= 0:
        try:
            return int(os.pread(_statm_fd, 128, 0).split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            pass
    return 0


def sizeof(value: Any) -> int:
    """Dask's estimate of an object's bytes (what its spill accounting uses)."""
    try:
        from dask.sizeof import sizeof as estimate

        return int(estimate(value))
    except Exception:
        return sys.getsizeof(value)
