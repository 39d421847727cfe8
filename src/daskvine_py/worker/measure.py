"""What a task takes, measured in the process that runs it: its result's size (``sizeof``)
and its peak resident memory.

Linux keeps a process's high-water mark of resident memory (``VmHWM`` in
``/proc/self/status``) and lets the process reset it to the current resident size by
writing "5" to ``/proc/self/clear_refs``: reset before a task, read after, and the mark is
the task's peak (the process's base included). Both files stay open, so a task pays one
``write`` and one ``pread`` (a few microseconds), not two opens. Where the reset is refused
the mark is the process's peak so far; without ``/proc`` it is ``getrusage``'s
``ru_maxrss``. With several tasks at once in one process (``slots`` > 1) they share one
mark: each reads the process's peak while it ran.
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

#: The open files, and the process they were opened in: a forked child opens its own
#: (those it inherits still name its parent).
_pid = 0
_clear_fd = -1
_status_fd = -1


def _open() -> None:
    global _pid, _clear_fd, _status_fd
    _pid = os.getpid()
    _clear_fd = _status_fd = -1
    try:
        _clear_fd = os.open(_CLEAR_REFS, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        pass  # not Linux, or not allowed: the mark is the process's peak so far
    try:
        _status_fd = os.open(_STATUS, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        pass


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


def reset_peak() -> None:
    """Reset the process's high-water mark of resident memory to its resident size now."""
    if _pid != os.getpid():
        _open()
    if _clear_fd >= 0:
        try:
            os.write(_clear_fd, _RESET_HIGH_WATER)
        except OSError:
            pass


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
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except OSError:
        return 0
    return peak if sys.platform == "darwin" else peak * 1024  # (bytes there, kB elsewhere)


def sizeof(value: Any) -> int:
    """Dask's estimate of an object's bytes (what its spill accounting uses)."""
    try:
        from dask.sizeof import sizeof as estimate

        return int(estimate(value))
    except Exception:
        return sys.getsizeof(value)
