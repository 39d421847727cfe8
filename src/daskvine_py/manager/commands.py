"""What caller threads ask of the manager's I/O thread: typed commands on its queue.

A caller never touches the loop's state: it queues one of these with ``IOLoop.command``,
which wakes the loop, and waits on its ``Run``.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from daskvine_py.manager.live import Snapshot
from daskvine_py.manager.watching import Run
from daskvine_py.scheduler import state as s


class Submit(NamedTuple):
    """Open a run with its first part; ``watch``: feed it ``TaskFinished``/``Dispatched``."""

    run: Run
    event: s.SubmitRun
    watch: bool


class Extend(NamedTuple):
    """More tasks of a run in progress."""

    run: Run
    event: s.ExtendRun


class Cancel(NamedTuple):
    """The caller gave up on a run (Ctrl-C, or a task that could not be pickled)."""

    run: Run


class Close(NamedTuple):
    """Tell the workers to leave and stop the loop."""


class Retire(NamedTuple):
    """Tell the worker of this name to leave (a pool retiring an idle worker)."""

    name: str
    reason: str


class StateEvent(NamedTuple):
    """Hand an event to the scheduler state as it is (``messages.CacheClear``);
    ``handled`` is set once the state has handled it, or once the loop is dead."""

    event: s.Event
    handled: threading.Event | None = None


#: Every command the loop takes.
Command = Submit | Extend | Cancel | Close | Retire | StateEvent | Snapshot
