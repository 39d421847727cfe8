"""The legal edges of a worker's task states (``state.WorkerState._transition``) and what
each does besides setting the state, by name; ``state`` binds the names to its steps."""

from __future__ import annotations

from collections.abc import Callable

from daskvine_py.worker.records import TaskStateName, WorkerTask

Edge = tuple[TaskStateName, TaskStateName]
Step = Callable[[WorkerTask], None]


def illegal(task: WorkerTask) -> None:
    """Stands for an edge that is not in ``TRANSITIONS`` (never called)."""
    raise AssertionError("an illegal transition is raised before its step")


#: Every legal edge and its step's name; None: nothing more (its fetches, local waits or
#: exports are in place). The caller records where a task runs; "start" has it reported
#: in the pass's ``Started``.
TRANSITIONS: dict[Edge, str | None] = {
    ("new", "waiting"): None,
    ("new", "queued"): "enqueue",
    ("new", "forgotten"): "forget",
    ("waiting", "queued"): "enqueue",
    ("waiting", "running"): "start",  # sent with the task it waits for (a chain)
    ("waiting", "forgotten"): "forget",
    ("queued", "waiting"): None,  # an input must first leave another library (export)
    ("queued", "running"): "start",
    ("queued", "forgotten"): "forget",
    ("running", "queued"): "requeue",  # its library died before it started, or was killed
    ("running", "forgotten"): "forget_running",
}


def bind(edges: dict[Edge, str | None], steps: dict[str, Step]) -> dict[Edge, Step | None]:
    """``edges`` (``TRANSITIONS``) with each step's name bound to ``steps[name]``."""
    return {edge: None if name is None else steps[name] for edge, name in edges.items()}
