"""The library process: a persistent Python process that runs tasks for its worker.

A worker starts one library per core (or per ``--lib-cores`` cores) and keeps it for its
whole life, so no task pays for an interpreter start or for re-importing its modules. The
worker and its library talk over a pipe: a request carries one task, or a few when tasks
are tiny, and each task is answered as soon as it is done (tiny ones a few together)::

    worker ──Run(functions=[(function_id, bytes), ...], config=RunConfig | None,
                 calls=[Call(task_id, key, payload, [(dep_key, Serialized), ...]), ...])──►
    worker ◄──Done(task_id, Serialized, seconds)─────────────────────────────── library
    worker ◄──Erred(task_id, exception | None, traceback, message)───────────── library
    worker ◄──Crashed(task_id, reason)──────────── library (fork mode: the child died)
    worker ◄──Ready()───────────── library (once, when started and its imports are done)
    worker ◄──Replies([Done | Erred | Crashed, ...])──── library (tiny tasks' replies held)

The records are the NamedTuples below, dispatched by type; a task process
(``task_mode="tasks"``) writes the same replies to its reply file.

How a task runs is its run's ``RunConfig`` (None: the defaults, the fast path):

- direct (default): in this process. ``env_vars`` are set for the task and restored after
  it; with ``sandbox`` the task gets its own directory as cwd and temp dir, removed after.
- fork: in a child forked from this process, which already holds the functions and the
  hoisted modules; the child sends its reply through a pipe and exits. Nothing the task
  changes survives it; a child that dies is reported as ``crashed`` and this library
  lives on. Always sandboxed.
- ``import_modules`` are imported once, before the first task of the run; a failure is
  remembered and fails each of the run's tasks here with ``ImportHoistingError``.

With ``slots`` > 1 a library runs that many tasks at once, each in a thread (which forks,
in fork mode). Process-wide state is then shared: in direct mode, ``env_vars`` and the
sandbox's cwd of concurrent tasks overlap.

A library dies with its worker (``PR_SET_PDEATHSIG`` on Linux, and the pipe closing), so a
worker killed with SIGKILL leaves no orphan running user code; so do forked children.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from queue import SimpleQueue
from typing import Any, NamedTuple

from .errors import ImportHoistingError, SerializationError
from .serialize import TaskDecoder, dumps, dumps_exception, loads

_prctl: Any = None


class Call(NamedTuple):
    """One task to run: its inputs' values come with it, by their Dask keys."""

    task_id: int
    key: Any
    payload: bytes  #: the pickled ``GraphNode``
    inputs: list  #: [(dep_key, Serialized), ...]


class Run(NamedTuple):
    """Worker -> library: functions it has not seen, then tasks of one run configuration."""

    functions: list  #: [(function_id, cloudpickle bytes), ...]
    config: Any  #: the run's ``protocol.RunConfig``; None: the defaults
    calls: list  #: [Call, ...]


class Ready(NamedTuple):
    """Library -> worker, once: started, and the warm imports are done."""


class Done(NamedTuple):
    task_id: int
    value: Any  #: the result, ``Serialized``
    duration: float  #: seconds the call took, serialization excluded


class Erred(NamedTuple):
    """The task's own code raised (or its function, inputs or result could not be
    (de)serialized): the fields of ``protocol.TaskErred``."""

    task_id: int
    exception: Any  #: ``Serialized`` exception; None when it could not be pickled
    traceback: str
    message: str


class Crashed(NamedTuple):
    """The process running the task died (fork mode's child, a task process)."""

    task_id: int
    reason: str


class Replies(NamedTuple):
    """Several of the replies above in one message: tiny tasks' replies held together."""

    replies: list  #: [Done | Erred | Crashed, ...]


#: A tiny task's reply waits, while more of its request's tasks run, until the oldest
#: unsent one is this old: the worker then reads one message for several tasks (a pipe
#: message costs it about as much as a noop task). A task that took longer is answered
#: at once, with the replies held before it.
REPLY_HOLD = 0.0005


#: Imported before the library says it is ready: every task payload needs Dask's task
#: classes, and importing Dask takes most of a second, which the first task would pay.
WARM_IMPORTS = ("daskvine_py.graph",)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the worker) dies."""
    global _prctl
    if not sys.platform.startswith("linux"):
        return
    try:
        if _prctl is None:
            _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        pr_set_pdeathsig = 1
        _prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def main(
    conn: Connection,
    worker_name: str,
    import_modules: Sequence[str] = (),
    workdir: str | None = None,
    slots: int = 1,
) -> None:
    """Entry point of a library process: hoist imports, then serve requests until EOF.

    ``workdir`` is where sandboxed tasks get their directories; ``slots`` how many tasks
    run at once.
    """
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the worker
    for module in (*WARM_IMPORTS, *import_modules):
        importlib.import_module(module)
    runner = Runner(worker_name, workdir or tempfile.gettempdir())
    try:
        send(conn, Ready())  # the worker registers once every library has said this
    except OSError:
        return
    if slots > 1:
        _serve_in_slots(conn, runner, slots)
        return
    while True:
        try:
            request = receive(conn)
        except (EOFError, OSError):
            return
        functions, config, calls = request
        runner.decoder.add_functions(functions)
        held: list = []
        oldest = 0.0
        last = len(calls) - 1
        for index, call in enumerate(calls):
            start = time.perf_counter()
            reply = runner.execute(call, config)
            now = time.perf_counter()
            if not held:
                oldest = now
            held.append(reply)
            if index == last or now - start >= REPLY_HOLD or now - oldest >= REPLY_HOLD:
                try:  # dependents may be waiting: no reply waits longer than that
                    send(conn, held[0] if len(held) == 1 else Replies(held))
                except OSError:  # the worker is gone
                    return
                held = []
        request = calls = call = reply = held = None  # drop references to inputs and results


def _serve_in_slots(conn: Connection, runner: Runner, slots: int) -> None:
    """Run up to ``slots`` tasks at once; the main thread keeps reading requests, so the
    worker never blocks writing to us while we write results to it."""
    work: SimpleQueue = SimpleQueue()
    send_lock = threading.Lock()

    def slot() -> None:
        while (item := work.get()) is not None:
            reply = runner.execute(*item)
            item = None
            with send_lock:
                try:
                    send(conn, reply)
                except OSError:
                    os._exit(0)  # the worker is gone
            reply = None

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(slots)]
    for thread in threads:
        thread.start()
    while True:
        try:
            functions, config, calls = receive(conn)
        except (EOFError, OSError):
            break
        runner.decoder.add_functions(functions)
        for call in calls:
            work.put((call, config))
    for _ in threads:
        work.put(None)


class Runner:
    """Runs the calls of one library: resident functions, hoisted imports, exec modes."""

    def __init__(self, worker_name: str, workdir: str) -> None:
        self.worker_name = worker_name
        self.workdir = workdir
        self.decoder = TaskDecoder()  # functions stay deserialized here for the process's life
        #: run id -> the import failure of its ``import_modules`` (None: all imported)
        self._prepared: dict[int, ImportHoistingError | None] = {}

    def execute(self, call: Call, config: Any) -> Done | Erred | Crashed:
        """The reply to one call; ``config`` is its run's ``RunConfig`` or None."""
        if config is None:
            return run(call, self.decoder, self.worker_name)
        failure = self._prepare(config)
        if failure is not None:
            return _erred(call[0], failure, None)
        if config.exec_mode == "fork":
            return self._forked(call, config)
        return self._direct(call, config)

    def _prepare(self, config: Any) -> ImportHoistingError | None:
        if config.run_id not in self._prepared:
            if len(self._prepared) > 1000:
                self._prepared.clear()  # old runs; their modules stay imported anyway
            self._prepared[config.run_id] = import_all(config.import_modules, self.worker_name)
        return self._prepared[config.run_id]

    def _direct(self, call: Call, config: Any) -> Done | Erred | Crashed:
        saved_env = {name: os.environ.get(name) for name, _ in config.env_vars}
        os.environ.update(config.env_vars)
        task_dir = cwd = saved_tempdir = None
        if config.sandbox:
            task_dir = self._task_dir(call[0])
            cwd = os.getcwd()
            saved_tempdir = tempfile.tempdir
            _enter(task_dir)
        try:
            return run(call, self.decoder, self.worker_name)
        finally:
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if task_dir is not None:
                os.chdir(cwd)
                tempfile.tempdir = saved_tempdir
                shutil.rmtree(task_dir, ignore_errors=True)

    def _forked(self, call: Call, config: Any) -> Done | Erred | Crashed:
        """Run ``call`` in a forked child; its reply comes back through a pipe."""
        try:  # deserialize the function here, once, so every child inherits it
            self.decoder.decode(call[2])
        except Exception:
            pass  # the child meets the same error and reports it
        task_dir = self._task_dir(call[0])
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.close(read_fd)
                _die_with_parent()
                os.environ.update(config.env_vars)
                _enter(task_dir)
                reply = run(call, self.decoder, self.worker_name)
                with os.fdopen(write_fd, "wb") as pipe:
                    pickle.dump(reply, pipe, protocol=5)
            finally:
                os._exit(0)
        os.close(write_fd)
        try:
            with os.fdopen(read_fd, "rb") as pipe:
                data = pipe.read()  # before waiting: a large reply fills the pipe
            _, status = os.waitpid(pid, 0)
        finally:
            shutil.rmtree(task_dir, ignore_errors=True)
        if data:
            try:
                return pickle.loads(data)
            except Exception:
                pass  # cut short: the child died while writing
        how = describe_exit(os.waitstatus_to_exitcode(status))
        return Crashed(call[0], f"forked task process {how} on worker {self.worker_name}")

    def _task_dir(self, task_id: int) -> str:
        path = os.path.join(self.workdir, f"task-{task_id}-{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        return path


def _enter(task_dir: str) -> None:
    """Make ``task_dir`` the current directory and the temp dir of this process."""
    os.chdir(task_dir)
    os.environ["TMPDIR"] = task_dir
    tempfile.tempdir = task_dir


def import_all(modules: Sequence[str], worker_name: str) -> ImportHoistingError | None:
    """Import ``modules``; the error naming the first that fails, or None."""
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # SyntaxError, SystemExit from a module too
            error = ImportHoistingError(module, worker_name, f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
            error.__traceback__ = exc.__traceback__
            return error
    return None


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` or ``killed by signal SIGSEGV``, from an exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


#: The pipe's records by tag. A record travels as ``(tag, fields)``: pickled as itself it
#: would carry its class's module and name, looked up again on every message (1.8 µs more
#: per record here, two records per task).
_RECORDS: tuple[type, ...] = (Run, Call, Ready, Done, Erred, Crashed, Replies)
_TAGS = {record: tag for tag, record in enumerate(_RECORDS)}
_RUN = _TAGS[Run]
_REPLIES = _TAGS[Replies]


def send(conn: Connection, message: Any) -> None:
    """Send a record over the pipe with its large buffers as messages of their own.

    Inputs and results (``Serialized``) keep their buffers out of band, so a 100 MB array
    is written as it is rather than first copied into one big pickle.
    """
    tag = _TAGS[type(message)]
    fields = tuple(message)
    if tag == _RUN:  # its calls travel as plain tuples too
        fields = (message.functions, message.config, [tuple(call) for call in message.calls])
    elif tag == _REPLIES:
        fields = ([(_TAGS[type(reply)], tuple(reply)) for reply in message.replies],)
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps((tag, fields), protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + header)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def receive(conn: Connection) -> Any:
    """The record ``send`` sent; ``EOFError`` if the other side is gone."""
    first = conn.recv_bytes()
    buffers = [conn.recv_bytes() for _ in range(int.from_bytes(first[:4], "little"))]
    tag, fields = pickle.loads(memoryview(first)[4:], buffers=buffers)
    if tag == _RUN:
        functions, config, calls = fields
        fields = (functions, config, [tuple.__new__(Call, call) for call in calls])
    elif tag == _REPLIES:
        fields = ([tuple.__new__(_RECORDS[t], f) for t, f in fields[0]],)
    return tuple.__new__(_RECORDS[tag], fields)


def run(call: Call, decoder: TaskDecoder, worker_name: str) -> Done | Erred:
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
    return Done(task_id, serialized, duration)


def _erred(task_id: int, exc: BaseException, cause: BaseException | None) -> Erred:
    if cause is not None:
        exc.__cause__ = cause
        exc.__traceback__ = cause.__traceback__
    serialized, text = dumps_exception(exc)
    return Erred(task_id, serialized, text, _describe(exc))


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__ must not break error reporting
        return type(exc).__name__
