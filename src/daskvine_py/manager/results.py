"""What a run gives its caller: its outputs, unpickled in the caller's thread, or the
exception ``get`` raises, with the task's own type, message and remote traceback.

This is the only place where the manager's side opens a pickle a worker sent, and only
in the caller's thread: the outputs the caller asked for, and a failed task's exception
when ``Manager(unpickle_remote_exceptions=True)`` (the default). The I/O thread passes
both along unopened (``wire.plain``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from daskvine_py.errors import (
    RemoteTaskError,
    RemoteTraceback,
    SerializationError,
    TaskFailed,
    attach_remote_traceback,
)
from daskvine_py.manager import callbacks
from daskvine_py.manager.watching import Run
from daskvine_py.plan.fusion import link_key
from daskvine_py.scheduler import state as s
from daskvine_py.wire.serialize import loads


def values_of(run: Run, hooks: callbacks.Hooks | None) -> dict[Hashable, Any]:
    """The run's outputs by key, unpickled in the caller's thread (those the callbacks
    saw are not unpickled again)."""
    values = {} if hooks is None else hooks.values
    for key, serialized in run.values.items():
        if key in values:
            continue
        try:
            values[key] = loads(serialized)
        except Exception as exc:
            raise SerializationError(key, "the result", f"{exc!r} (on the client)") from exc
    return values


def run_error(failure: s.RunFailed | BaseException, unpickle: bool = True) -> BaseException:
    """The exception ``get`` raises for a failed run. A task's own exception is unpickled
    when ``unpickle`` allows it; else it is named by a ``RemoteTaskError``."""
    if isinstance(failure, BaseException):
        return failure
    if failure.error is not None:  # made by the scheduler (``ResourceExhausted``)
        return failure.error
    if not unpickle and (failure.type_name or failure.exception is not None):
        return _not_unpickled(failure)  # a task's own exception (``TaskErred``)
    note = f"daskvine_py: raised by task {failure.key!r} on worker {failure.worker}"
    if failure.exception is not None:
        try:
            exc = loads(failure.exception)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            link = link_key(exc)
            if link is not None:
                note = (
                    f"daskvine_py: raised by task {link!r}, run in one chain with "
                    f"{failure.key!r} on worker {failure.worker}"
                )
            return attach_remote_traceback(exc, failure.traceback, note)
    error = TaskFailed(failure.key, failure.message, failure.worker)
    if failure.traceback:
        attach_remote_traceback(error, failure.traceback, None)
    return error


def _not_unpickled(failure: s.RunFailed) -> RemoteTaskError:
    shown = RemoteTraceback.from_wire(failure.traceback).text if failure.traceback else ""
    error = RemoteTaskError(failure.key, failure.worker, failure.type_name, failure.message, shown)
    if failure.traceback:
        attach_remote_traceback(error, failure.traceback, None)
    return error
