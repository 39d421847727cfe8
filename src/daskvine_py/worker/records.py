"""The worker's records of its tasks and libraries, shared by ``state.WorkerState`` and
its components: what the state knows of each; the processes and pipes are the shell's.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from daskvine_py.wire import protocol as p

TaskStateName = Literal["new", "waiting", "queued", "running", "forgotten"]


class WorkerTask:
    """One task this worker was sent, from its ``Execute`` until its reply."""

    __slots__ = (
        "id",
        "key",
        "payload",
        "deps",
        "want_result",
        "keep",
        "missing",
        "state",
        "config",
        "home",
        "lib",
        "cores",
        "memory",
        "gpus",
    )

    def __init__(self, msg: p.Execute, config: p.RunConfig | None) -> None:
        self.id = msg.task_id
        self.key = msg.key
        self.payload = msg.payload
        self.deps = msg.deps
        self.want_result = msg.want_result
        self.keep = msg.keep
        #: its allocation: cores its thread pools fit, bytes of memory its library may
        #: grow by while it runs (0: the worker's budget less the others'; ``memory_watch``)
        self.cores = msg.cores
        self.memory = msg.memory
        #: inputs not yet in the local store
        self.missing: set[int] = set()
        self.state: TaskStateName = "new"
        #: how it runs (its run's ``RunConfig``); None: the defaults
        self.config = config
        #: the library that holds inputs only it has (live), where it must run
        self.home: int | None = None
        #: the library it was sent to, while running there
        self.lib: int | None = None
        #: GPUs it runs with, its own while it runs (``gpus``)
        self.gpus = msg.gpus


class LibraryRecord:
    """What the state knows of one library process: its slots, the tasks sent to it and
    the functions it has not seen. The process and its pipe are the shell's."""

    __slots__ = ("id", "sent", "unsent", "slots", "ready")

    def __init__(self, library_id: int, unsent: list[bytes], slots: int) -> None:
        self.id = library_id
        #: it has started and imported what every task needs
        self.ready = False
        #: tasks it runs at once
        self.slots = slots
        #: tasks sent to it, in the order it runs them: the first is running
        self.sent: deque[int] = deque()
        #: ids of functions to send with the next request
        self.unsent = unsent
