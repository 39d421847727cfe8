"""The library process: a persistent Python process that runs tasks for its worker.

A worker starts one library per core and keeps it for its whole life, so no task pays for
an interpreter start or for re-importing its modules. The worker and its library talk over
a pipe: a request carries one task, or a few when tasks are tiny, and each task is
answered as soon as it is done::

    worker ──("run", [(function_id, bytes), ...],
              [(task_id, key, payload, [(dep_key, Serialized), ...]), ...])──► library
    worker ◄──("done", task_id, Serialized, seconds)───────────────────────── library
    worker ◄──("erred", task_id, exception | None, traceback, message)─────── library

A library dies with its worker (``PR_SET_PDEATHSIG`` on Linux, and the pipe closing), so a
worker killed with SIGKILL leaves no orphan running user code.
"""

from __future__ import annotations

import ctypes
import importlib
import pickle
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from .errors import SerializationError
from .serialize import TaskDecoder, dumps, dumps_exception, loads


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the worker) dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def main(conn: Connection, worker_name: str, import_modules: Sequence[str] = ()) -> None:
    """Entry point of a library process: hoist imports, then serve requests until EOF."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the worker
    for module in import_modules:
        importlib.import_module(module)
    decoder = TaskDecoder()  # functions stay deserialized here for the process's life
    while True:
        try:
            request = receive(conn)
        except (EOFError, OSError):
            return
        _, functions, calls = request
        decoder.add_functions(functions)
        for call in calls:
            reply = run(call, decoder, worker_name)
            try:
                send(conn, reply)  # each result at once: dependents may be waiting
            except OSError:  # the worker is gone
                return
        request = calls = call = reply = None  # drop references to inputs and results now


def send(conn: Connection, message: Any) -> None:
    """Send ``message`` over the pipe with its large buffers as messages of their own.

    Inputs and results (``Serialized``) keep their buffers out of band, so a 100 MB array
    is written as it is rather than first copied into one big pickle.
    """
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + header)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def receive(conn: Connection) -> Any:
    """The message ``send`` sent; ``EOFError`` if the other side is gone."""
    first = conn.recv_bytes()
    buffers = [conn.recv_bytes() for _ in range(int.from_bytes(first[:4], "little"))]
    return pickle.loads(memoryview(first)[4:], buffers=buffers)


def run(call: tuple, decoder: TaskDecoder, worker_name: str) -> tuple:
    """Run one task; every outcome is a reply, never an exception."""
    task_id, key, payload, deps = call
    try:
        node = decoder.decode(payload)
    except Exception as exc:
        error = SerializationError(
            key,
            "the function or arguments",
            f"{type(exc).__name__}: {exc} (on worker {worker_name})",
        )
        return _erred(task_id, error, exc)
    try:
        values = {dep_key: loads(value) for dep_key, value in deps}
    except Exception as exc:
        error = SerializationError(key, "an input", f"{type(exc).__name__}: {exc}")
        return _erred(task_id, error, exc)
    start = time.perf_counter()
    try:
        result = node(values)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from user code too
        return _erred(task_id, exc, None)
    duration = time.perf_counter() - start
    try:
        serialized = dumps(result)
    except Exception as exc:
        error = SerializationError(key, "the result", f"{type(exc).__name__}: {exc}")
        return _erred(task_id, error, exc)
    return ("done", task_id, serialized, duration)


def _erred(task_id: int, exc: BaseException, cause: BaseException | None) -> tuple:
    if cause is not None:
        exc.__cause__ = cause
        exc.__traceback__ = cause.__traceback__
    serialized, text = dumps_exception(exc)
    return ("erred", task_id, serialized, text, _describe(exc))


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__ must not break error reporting
        return type(exc).__name__
