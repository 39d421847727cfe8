"""The scheduler's components built alone, as ``SchedulerState`` builds them: around one
``Context``, with the other parts they reach given by name as stand-ins."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from daskvine_py.scheduler.context import Context
from daskvine_py.scheduler.records import WorkerRecord


def context(
    transition: Any = None, workers: tuple[WorkerRecord, ...] = (), **parts: Any
) -> Context:
    """A context around ``transition`` (a test's stand-in) holding ``workers``; ``parts``:
    the components a component under test reaches, by name, each a real one or a dict of
    the methods it is called through (``stealing={"room": ...}``)."""
    ctx = Context(transition)
    for worker in workers:
        ctx.workers[worker.id] = worker
    for name, part in parts.items():
        setattr(ctx, name, SimpleNamespace(**part) if isinstance(part, dict) else part)
    return ctx
