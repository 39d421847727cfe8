"""What a task takes, measured in the process that runs it: its result's size (``sizeof``),
its CPU seconds and its own peak resident memory.

Linux keeps a process's high-water mark of resident memory and lets the process reset it
to the current resident size by writing "5" to ``/proc/self/clear_refs``; ``getrusage``
reports the mark (``ru_maxrss``) with the CPU seconds in one call. So a task pays one
``write`` and two ``getrusage`` calls, some 2 µs (a read of ``/proc/self/status``, which
names the mark too, costs 6): the mark just after the reset is its base (the resident
size as it begins), and its own peak is the mark at its end less that base. Some kernels
keep a larger figure in ``ru_maxrss`` beyond any reset once a thread exits: every
``CHECK_EVERY`` tasks the base is compared with ``/proc/self/statm``, and a process found
so reads ``statm`` and ``status`` from then on. The worker's memory watch limits a
library by the same base (``start_task``). Where the reset is refused the mark is the
process's peak so far.
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
import threading
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
#: Tasks between checks that ``ru_maxrss`` still follows the resets.
CHECK_EVERY = 64
#: The mark may exceed the base by this much as a task begins (pages touched between the
#: two reads) before ``ru_maxrss`` is taken for a stale figure.
STALE_SLACK = 4 << 20

#: The open files, and the process they were opened in: a forked child opens its own
#: (those it inherits still name its parent).
_pid = 0
_clear_fd = -1
_status_fd = -1
_statm_fd = -1
#: ``ru_maxrss`` holds a figure older than the resets (``begin`` checks every
#: ``CHECK_EVERY`` tasks): bases then come from ``statm`` and marks from ``status``
_stale = False
_countdown = 0
#: a thread's task begun by ``start_task``, for ``task_begun``
_pending = threading.local()

#: What ``begin`` hands ``end``: the base, the CPU seconds then, and whether the mark
#: must come from ``/proc/self/status``.
Begun = tuple[int, float, bool]
_NOT_MEASURED: Begun = (-1, 0.0, False)


def _open() -> None:
    global _pid, _clear_fd, _status_fd, _statm_fd, _stale, _countdown
    _pid = os.getpid()
    _clear_fd = _status_fd = _statm_fd = -1
    _stale, _countdown = False, 0  # (a new process: its first task checks)
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


def begin() -> Begun:
    """A task begins: reset the mark; its base (the resident bytes now, which the mark
    equals once reset) and the CPU seconds so far."""
    global _countdown
    if _pid != os.getpid():
        _open()
    if not MEASURING:
        return _NOT_MEASURED
    if _clear_fd >= 0:
        try:
            os.write(_clear_fd, _RESET_HIGH_WATER)
        except OSError:
            pass
    usage = _usage(_SELF)
    start = usage.ru_maxrss * _MAXRSS_UNIT
    _countdown -= 1
    if _stale or _countdown <= 0:
        _countdown = CHECK_EVERY
        resident = _resident()
        if resident and start > resident + STALE_SLACK:
            _stale_now()
            start = resident
    return start, usage.ru_utime + usage.ru_stime, _stale


def _stale_now() -> None:
    global _stale
    _stale = True  # (for the process's life: ``ru_maxrss`` never comes down again)


def end(begun: Begun) -> tuple[float, int]:
    """A task ended: its CPU seconds and its own peak resident bytes (0: not known)."""
    start, cpu, stale = begun
    if start < 0:
        return 0.0, 0
    usage = _usage(_SELF)
    mark = peak_memory() if stale else usage.ru_maxrss * _MAXRSS_UNIT
    return usage.ru_utime + usage.ru_stime - cpu, max(0, mark - start)


def start_task() -> int:
    """``begin`` for the task this thread runs next (``task_begun`` takes it); its base,
    which the worker's watch limits the library from."""
    begun = begin()
    _pending.begun = (_pid, begun)
    return max(0, begun[0])


def task_begun() -> Begun:
    """What ``start_task`` began for this thread's task, else ``begin`` now (a forked
    child, or a task not started through it)."""
    pending = getattr(_pending, "begun", None)
    if pending is not None:
        _pending.begun = None
        if pending[0] == _pid:  # (0 in a forked child until it opens its own files)
            begun: Begun = pending[1]
            return begun
    return begin()


def reset_peak() -> None:
    """Reset the process's high-water mark of resident memory to its resident size now."""
    begin()


def base() -> int:
    """The process's resident bytes now (0: not known)."""
    if _pid != os.getpid():
        _open()
    return _resident()


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


def resident_bytes(fd: int) -> int:
    """Resident bytes from an open ``/proc/PID/statm`` (its second field, in pages);
    ``OSError``, ``ValueError`` or ``IndexError`` where it cannot be read."""
    return int(os.pread(fd, 128, 0).split()[1]) * PAGE


def _resident() -> int:
    if _statm_fd >= 0:
        try:
            return resident_bytes(_statm_fd)
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
