"""Processes as /proc shows them, for tests that check what a worker started or left.

Children are found by the parent pid in each ``/proc/PID/stat``, not from
``/proc/PID/task/TID/children``: the kernel documents that list as reliable only while
the children are stopped, and under load it missed a task process that had been running
for a while (``test_abort``'s one failure on a fresh clone)."""

from __future__ import annotations

import os
import signal


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first); raises
    ``FileNotFoundError`` or ``ProcessLookupError`` for a process gone."""
    with open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Running, or stopped: a zombie (exited, not yet reaped) counts as gone."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid``, with their command lines (arguments joined
    by spaces)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(entry)
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                found[int(entry)] = cmdline.read().replace(b"\0", b" ").decode().strip()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # gone meanwhile
    return found


def sigint_default() -> None:
    """``preexec_fn`` of a child that a test stops with Ctrl-C: its SIGINT as a person at
    a terminal has it (the default), whatever this run inherited. A shell without job
    control starts a command in the background with SIGINT ignored, every process it
    starts inherits that, and Python then installs no handler: Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
