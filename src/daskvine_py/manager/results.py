"""What a run gives its caller: its outputs, unpickled in the caller's thread, or the
exception ``get`` raises, with the task's own type, message and remote traceback.
"""

from __future__ import annotations

from typing import Any

from daskvine_py.errors import SerializationError, TaskFailed, attach_remote_traceback
from daskvine_py.manager import callbacks
from daskvine_py.manager.watching import Run
from daskvine_py.plan.fusion import link_key
from daskvine_py.scheduler import state as s
from daskvine_py.wire.serialize import loads


def values_of(run: Run, hooks: callbacks.Hooks | None) -> dict[Any, Any]:
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


def run_error(failure: s.RunFailed | BaseException) -> BaseException:
    """The exception ``get`` raises for a failed run."""
    if isinstance(failure, BaseException):
        return failure
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
