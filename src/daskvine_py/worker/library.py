"""The library process: a persistent Python process that runs tasks for its worker.

A worker starts one library per core (or per ``--lib-cores`` cores) and keeps it for its
whole life, so no task pays for an interpreter start or for re-importing its modules. The
worker and its library talk over a pipe: a request carries one task, or a few when tasks
are tiny or form a chain, and each task is answered as soon as it is done (tiny ones a
few together): see ``pipe`` for the records and how they travel.

Results stay live. A call with ``keep`` leaves its result here as a Python object, and a
later call that reads it names it instead of carrying it (input value None): no pickling
between tasks of one library. A result is serialized only when asked: with ``Done``
(``send``: an output; and small ones, which the manager may inline elsewhere), or on
``Export``, when a peer, another library or a spill needs it. Calls of one request run in
order, so a call may read a result that an earlier call of the same request makes: the
worker sends a chain whole, and the library runs it without waiting for anyone.

Two threads share the work: this one reads requests and serves ``Export`` and ``Forget``
at once, even while a long task runs; ``slots`` others run the calls.

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
from collections import deque
from collections.abc import Hashable, Sequence
from multiprocessing.connection import Connection
from queue import SimpleQueue
from typing import Any, Protocol

from daskvine_py.errors import ImportHoistingError, SerializationError, WorkerImportError
from daskvine_py.plan.fusion import link_key
from daskvine_py.wire.protocol import RunConfig
from daskvine_py.wire.serialize import TaskDecoder, dumps, dumps_exception, loads, type_name
from daskvine_py.worker import pipe, threads
from daskvine_py.worker.measure import end, sizeof, start_task, task_begun
from daskvine_py.worker.pipe import (
    Call,
    Crashed,
    Done,
    Erred,
    Export,
    Exported,
    Forget,
    Missing,
    Ready,
    Replies,
    Reply,
    Run,
    ToLibrary,
    receive_request,
    send,
)

_prctl: Any = None  # libc's prctl, through ctypes: untyped


class SlotTable(Protocol):
    """Per slot, 1 + the id of the task it runs (0: none) and the bytes it began from
    (``measure.start_task``): shared memory the worker reads (or a list in tests)."""

    def __setitem__(self, slot: int, value: int, /) -> None: ...


#: What the export thread is handed: (task id, drop); None: stop.
_ExportQueue = SimpleQueue[tuple[int, bool] | None]
#: What a slot thread is handed: (run configuration, calls in order); None: stop.
_WorkQueue = SimpleQueue[tuple[RunConfig | None, list[Call]] | None]


#: A tiny task's reply waits, while more of its request's tasks run, until the oldest
#: unsent one is this old: the worker then reads one message for several tasks (a pipe
#: message costs it about as much as a noop task). A task that took longer is answered
#: at once, with the replies held before it.
REPLY_HOLD = 0.0005
#: Results kept live are sent with ``Done`` as well when their estimated size is at most
#: this: pickling them is cheap, and the manager can then hand them inline to tasks on
#: other workers (``protocol.INLINE_BYTES``).
SEND_SMALL_BYTES = 1024
#: Results whose size ``dask.sizeof`` knows: builtins, and the modules it sizes. For any
#: other type it falls back to ``sys.getsizeof``, which sees a few dozen bytes in an
#: object holding megabytes (an awkward array of events): such results are never sent
#: as "small" (pickling 400 kB per task cost a Coffea analysis 15% of its CPU).
SIZED_MODULES = frozenset({"builtins", "numpy", "pandas"})


#: Imported before the library says it is ready: every task payload needs Dask's task
#: classes, and importing Dask takes most of a second, which the first task would pay.
WARM_IMPORTS = ("daskvine_py.plan.graph",)


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
    running: SlotTable | None = None,
) -> None:
    """Entry point of a library process: hoist imports, then serve requests until EOF.

    ``workdir`` is where sandboxed tasks get their directories; ``slots`` how many tasks
    run at once; ``running`` (shared memory, one integer per slot) where each slot says
    which task it runs, for the worker to blame the right one if this process dies.
    """
    _die_with_parent()
    pipe.own_segments(os.getppid())  # the worker: its segments are removed if it dies
    os.environ["DASKVINE_PY_WORKER_NAME"] = worker_name  # (named in ``inputs``' errors)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the worker
    for module in (*WARM_IMPORTS, *import_modules):
        importlib.import_module(module)
    runner = Runner(worker_name, workdir or tempfile.gettempdir())
    try:
        send(conn, Ready())  # the worker registers once every library has said this
    except OSError:
        return
    serve(conn, runner, slots, running if running is not None else [0] * 2 * slots)


def serve(conn: Connection, runner: Runner, slots: int, running: SlotTable) -> None:
    """Serve requests until EOF: one slot on this thread (``_serve_alone``), several on
    threads of their own (``_serve_in_slots``). Exports always have a thread of their own,
    so a peer or a spill never waits for a long task."""
    exports: _ExportQueue = SimpleQueue()
    out = _Sender(conn)
    threading.Thread(target=_export, args=(exports, runner, out), daemon=True).start()
    if slots == 1:
        _serve_alone(conn, runner, running, out, exports)
    else:
        _serve_in_slots(conn, runner, slots, running, out, exports)
    exports.put(None)


def _route(request: ToLibrary, runner: Runner, exports: _ExportQueue) -> Run | None:
    """Take an ``Export`` or a ``Forget`` at once; a ``Run`` is returned, to run."""
    if type(request) is Run:
        runner.will_read(request.calls)
        return request
    if type(request) is Export:
        for task_id in request.task_ids:
            exports.put((task_id, request.drop))
    elif type(request) is Forget:
        for task_id in request.task_ids:
            runner.forget(task_id)
    return None


#: Seconds between a one-slot library's looks at whether its task has run this long:
#: then a watcher reads the pipe until it is done. How long an export (a peer, a spill)
#: may wait behind a long task; tasks shorter than this cost nothing more.
WATCH_INTERVAL = 0.005


def _serve_alone(
    conn: Connection, runner: Runner, running: SlotTable, out: _Sender, exports: _ExportQueue
) -> None:
    """One slot: this thread reads a request and runs it, with no hand-off between
    threads (a round trip costs what it did with one thread). While it runs a task, a
    watcher reads what comes meanwhile: exports are served at once, requests are kept for
    this thread. So the pipe is always read, and the worker never stays blocked writing
    to us while we write to it. The watcher wakes every ``WATCH_INTERVAL`` and looks at a
    timestamp: a short task costs no signal between threads."""
    read_lock = threading.Lock()
    #: when this thread began running the current request (None: not running)
    busy: list[float | None] = [None]
    #: requests the watcher read while this thread was busy (None: the pipe closed)
    inbox: deque[Run | None] = deque()

    def watch() -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            since = busy[0]
            if since is None or time.perf_counter() - since < WATCH_INTERVAL:
                continue
            try:
                with read_lock:
                    while busy[0] is not None and conn.poll(WATCH_INTERVAL):
                        request = _route(receive_request(conn), runner, exports)
                        if request is not None:
                            inbox.append(request)
            except (EOFError, OSError):
                inbox.append(None)
                return

    threading.Thread(target=watch, daemon=True).start()
    while True:
        with read_lock:  # the watcher may hold it for a moment: it fills the inbox then
            if inbox:
                request = inbox.popleft()
                if request is None:
                    return
            else:
                try:  # (only the read raises these)
                    request = _route(receive_request(conn), runner, exports)
                except (EOFError, OSError):
                    return
                if request is None:
                    continue
        runner.decoder.add_functions(request.functions)
        busy[0] = time.perf_counter()
        _run_calls(request.config, request.calls, runner, out, running, 0)
        busy[0] = None
        request = None


def _serve_in_slots(
    conn: Connection,
    runner: Runner,
    slots: int,
    running: SlotTable,
    out: _Sender,
    exports: _ExportQueue,
) -> None:
    """Several slots: this thread only reads (and never writes: the worker may be blocked
    writing a large request while a slot writes a large result); calls go, in order, to
    ``slots`` threads that run them."""
    work: _WorkQueue = SimpleQueue()
    threads = [
        threading.Thread(
            target=_execute_calls, args=(work, runner, out, running, slot), daemon=True
        )
        for slot in range(slots)
    ]
    for thread in threads:
        thread.start()
    while True:
        try:  # (only the read raises these)
            request = _route(receive_request(conn), runner, exports)
        except (EOFError, OSError):
            break
        if request is not None:
            runner.decoder.add_functions(request.functions)
            for call in request.calls:
                work.put((request.config, [call]))
        request = None
    for _ in range(slots):
        work.put(None)


class _Sender:
    """Writes replies to the worker from any thread; exits the process once it is gone."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, message: Reply | Replies | Exported) -> None:
        with self.lock:
            try:
                send(self.conn, message)
            except OSError:
                os._exit(0)  # the worker is gone


def _export(exports: _ExportQueue, runner: Runner, out: _Sender) -> None:
    while (item := exports.get()) is not None:
        out.send(runner.export(*item))


def _execute_calls(
    work: _WorkQueue, runner: Runner, out: _Sender, running: SlotTable, slot: int
) -> None:
    while (item := work.get()) is not None:
        _run_calls(*item, runner, out, running, slot)
        item = None


def _run_calls(
    config: RunConfig | None,
    calls: list[Call],
    runner: Runner,
    out: _Sender,
    running: SlotTable,
    slot: int,
) -> None:
    """Run calls in order, answering each at once (tiny ones a few together)."""
    held: list[Reply] = []
    oldest = 0.0
    last = len(calls) - 1
    for index, call in enumerate(calls):
        start = time.perf_counter()
        if call[6] != threads.asked:  # (a task's own cores; most ask what the last did)
            threads.fit(call[6])
        running[2 * slot + 1] = start_task()  # before its id: the watch reads id, then base
        running[2 * slot] = call[0] + 1
        reply = runner.execute(call, config)
        running[2 * slot] = 0
        runner.has_read(call)
        now = time.perf_counter()
        if not held:
            oldest = now
        held.append(reply)
        if index == last or now - start >= REPLY_HOLD or now - oldest >= REPLY_HOLD:
            out.send(held[0] if len(held) == 1 else Replies(held))
            held = []


class Runner:
    """Runs the calls of one library: resident functions, hoisted imports, exec modes."""

    def __init__(self, worker_name: str, workdir: str) -> None:
        self.worker_name = worker_name
        self.workdir = workdir
        self.decoder = TaskDecoder()  # functions stay deserialized here for the process's life
        #: run id -> the import failure of its ``import_modules`` (None: all imported)
        self._prepared: dict[int, ImportHoistingError | None] = {}
        #: task id -> result kept live for later tasks here (``Call.keep``), until the
        #: worker says ``Forget`` or exports it with ``drop``
        self.live: dict[int, Any] = {}
        #: live result -> calls queued here that read it; forgetting it waits for them
        #: (``Forget`` and ``Export`` are served at once, ahead of the queued calls)
        self._readers: dict[int, int] = {}
        self._doomed: set[int] = set()
        self._readers_lock = threading.Lock()

    def execute(self, call: Call, config: RunConfig | None) -> Reply:
        """The reply to one call; ``config`` is its run's ``RunConfig`` or None."""
        if config is None:
            return run(call, self.decoder, self.worker_name, self.live)
        failure = self._prepare(config)
        if failure is not None:
            return _erred(call[0], failure, None)
        if config.inputs:  # what it reads is kept for the run's lifetime (``inputs.using``)
            from daskvine_py import inputs

            with inputs.using(config.inputs, config.run_id):
                if config.exec_mode == "fork":
                    return self._forked(call, config)
                return self._direct(call, config)
        if config.exec_mode == "fork":
            return self._forked(call, config)
        return self._direct(call, config)

    def will_read(self, calls: list[Call]) -> None:
        """Calls queued: the live results they read stay until they have run."""
        for call in calls:
            for _, dep_id, value in call[3]:
                if value is None:
                    with self._readers_lock:
                        self._readers[dep_id] = self._readers.get(dep_id, 0) + 1

    def has_read(self, call: Call) -> None:
        for _, dep_id, value in call[3]:
            if value is None:
                with self._readers_lock:
                    left = self._readers.pop(dep_id) - 1
                    if left:
                        self._readers[dep_id] = left
                    elif dep_id in self._doomed:
                        self._doomed.discard(dep_id)
                        self.live.pop(dep_id, None)

    def forget(self, task_id: int) -> None:
        """Drop a live result now, or once the queued calls that read it have run."""
        with self._readers_lock:
            if task_id in self._readers:
                self._doomed.add(task_id)
            else:
                self.live.pop(task_id, None)

    def export(self, task_id: int, drop: bool) -> Exported:
        """A live result, serialized; with ``drop`` it is no longer kept here."""
        value = self.live.get(task_id, _ABSENT)
        if value is _ABSENT:
            return Exported(task_id, None, 0.0, "it is not held in this library")
        start = time.perf_counter()
        try:
            serialized = dumps(value)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            return Exported(task_id, None, time.perf_counter() - start, text)
        if drop:
            self.forget(task_id)
        return Exported(task_id, serialized, time.perf_counter() - start, "")

    def _prepare(self, config: RunConfig) -> ImportHoistingError | None:
        if config.run_id not in self._prepared:
            if len(self._prepared) > 1000:
                self._prepared.clear()  # old runs; their modules stay imported anyway
            failed = import_all(config.import_modules, self.worker_name)
            if failed is None and config.inputs:
                failed = install_inputs(self.worker_name)
            self._prepared[config.run_id] = failed
        return self._prepared[config.run_id]

    def _direct(self, call: Call, config: RunConfig) -> Reply:
        saved_env = {name: os.environ.get(name) for name, _ in config.env_vars}
        os.environ.update(config.env_vars)
        task_dir = saved_tempdir = None
        cwd = ""
        if config.sandbox:
            task_dir = self._task_dir(call[0])
            cwd = os.getcwd()
            saved_tempdir = tempfile.tempdir
            _enter(task_dir)
        try:
            return run(call, self.decoder, self.worker_name, self.live)
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

    def _forked(self, call: Call, config: RunConfig) -> Reply:
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
                # Its inputs may be live here (inherited); its result is always sent.
                sent = call._replace(keep=False, send=True)
                reply = run(sent, self.decoder, self.worker_name, self.live)
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
                answer: Done | Erred | Crashed | Missing = pickle.loads(data)
                return answer
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


def install_inputs(worker_name: str) -> ImportHoistingError | None:
    """Route ``root://`` reads through the node's input cache (``cache_inputs``:
    ``daskvine_py.inputs.install``); the error naming what failed, or None."""
    try:
        from daskvine_py import inputs

        inputs.install()
    except ModuleNotFoundError as exc:
        if exc.name in ("fsspec", "fsspec_xrootd"):
            return None  # no fsspec root:// here to route: the API (local_path) still works
        return _inputs_failed(exc, worker_name)
    except BaseException as exc:  # the bindings broken in the environment...
        return _inputs_failed(exc, worker_name)
    return None


def _inputs_failed(exc: BaseException, worker_name: str) -> ImportHoistingError:
    error = ImportHoistingError(
        "daskvine_py.inputs (cache_inputs=True: its fsspec path needs fsspec-xrootd)",
        worker_name,
        f"{type(exc).__name__}: {exc}",
    )
    error.__cause__ = exc
    return error


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` or ``killed by signal SIGSEGV``, from an exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run(
    call: Call, decoder: TaskDecoder, worker_name: str, live: dict[int, Any] | None = None
) -> Done | Erred | Missing:
    """Run one task; every outcome is a reply, never an exception. ``live``: this
    library's live results, where the call's live inputs are and its result is kept
    (None: a process that keeps nothing, whose results are always sent)."""
    task_id, key, payload, inputs, keep, send_result, _ = call
    try:
        node = decoder.decode(payload)
    except Exception as exc:
        return _erred(
            task_id, _unpickling_error(key, "the function or arguments", exc, worker_name), exc
        )
    start = time.perf_counter()
    values = {}
    unpickled = False
    try:
        for dep_key, dep_id, value in inputs:
            if value is not None:
                values[dep_key] = loads(value)
                unpickled = True
                continue
            found = _ABSENT if live is None else live.get(dep_id, _ABSENT)
            if found is _ABSENT:
                return Missing(task_id, dep_id)
            values[dep_key] = found
    except Exception as exc:
        return _erred(task_id, _unpickling_error(key, "an input", exc, worker_name), exc)
    begun = task_begun()  # its CPU seconds and its own peak resident memory (``measure``)
    began = time.perf_counter()
    try:
        result = node(values)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from user code too
        _files_read()  # (not the next task's)
        return _erred(task_id, exc, None)
    ended = time.perf_counter()
    cpu, peak = end(begun)
    files = _files_read()
    values = None  # type: ignore[assignment]
    unpickling = began - start if unpickled else 0.0  # live inputs cost nothing
    keep_live = keep is True and live is not None  # (None: as False)
    nbytes = 0
    if keep_live:
        live[task_id] = result  # type: ignore[index]
        nbytes = sizeof(result)
        if not send_result and (
            nbytes > SEND_SMALL_BYTES or type(result).__module__ not in SIZED_MODULES
        ):
            return Done(task_id, None, ended - began, nbytes, True, unpickling, cpu, peak, files)
    try:
        serialized = dumps(result)
    except Exception as exc:
        if keep_live and not send_result:  # small but unpicklable: it stays here only
            return Done(task_id, None, ended - began, nbytes, True, unpickling, cpu, peak, files)
        if keep_live:
            live.pop(task_id, None)  # type: ignore[union-attr]
        error = SerializationError(key, "the result", f"{type(exc).__name__}: {exc}")
        return _erred(task_id, error, exc)
    seconds = unpickling + time.perf_counter() - ended
    nbytes = serialized.nbytes
    return Done(task_id, serialized, ended - began, nbytes, keep_live, seconds, cpu, peak, files)


_ABSENT = object()


def _files_read() -> tuple[tuple[str, int, int, str], ...]:
    """The input files the task just run obtained through the node's input cache: none
    unless it (or an earlier task) imported ``daskvine_py.inputs``."""
    module = sys.modules.get("daskvine_py.inputs")
    return () if module is None else module.take_reads()


def _unpickling_error(key: Hashable, what: str, exc: Exception, worker_name: str) -> Exception:
    """What a task whose ``what`` could not be unpickled here fails with: a module the
    manager's side has and this worker cannot import is named as such."""
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):
        return WorkerImportError(key, exc.name, worker_name, detail)
    return SerializationError(key, what, f"{detail} (on worker {worker_name})")


def _erred(task_id: int, exc: BaseException, cause: BaseException | None) -> Erred:
    if cause is not None:
        exc.__cause__ = cause
        exc.__traceback__ = cause.__traceback__
    serialized, text = dumps_exception(exc)
    return Erred(task_id, serialized, text, _describe(exc), type_name(exc))


def _describe(exc: BaseException) -> str:
    link = link_key(exc)
    where = "" if link is None else f" (in task {link!r}, run in one chain)"
    try:
        return f"{type(exc).__name__}: {exc}{where}"
    except Exception:  # a broken __str__ must not break error reporting
        return f"{type(exc).__name__}{where}"
