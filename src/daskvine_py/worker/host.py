"""A worker's dealings with its host: child processes, their files, memory, the network.

``shell.Worker`` decides nothing here: it asks ``WorkerState`` what to run and uses these
to start and reap the processes that run it:

- library processes (``library.main``, spawned, one pipe each), reaped with the
  directories of the sandboxed task they were running;
- task processes (``python -m daskvine_py.worker.task_process DIR``,
  ``task_mode="tasks"``): the call written to ``DIR``, the reply read back from it, ``DIR`` removed;
- facts about the host: its memory, a process's peak memory, the interface that routes
  to the manager, and the directories that killed workers left behind.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import mmap
import multiprocessing
import os
import pickle
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from daskvine_py.wire import protocol as p
from daskvine_py.wire.protocol import split_address
from daskvine_py.worker import gpus, library, library_process, pipe, task_process, threads
from daskvine_py.worker.measure import resident_bytes

if TYPE_CHECKING:
    from daskvine_py.worker.messages import SendStatus
    from daskvine_py.worker.records import LibraryRecord, WorkerTask


class Library:
    """A library process and its pipe; its bookkeeping is the state's ``record``."""

    __slots__ = ("process", "conn", "pending", "record", "running", "table")

    def __init__(
        self,
        process: BaseProcess | ChildProcess,
        conn: Connection,
        record: LibraryRecord,
        running: ctypes.Array[ctypes.c_longlong],
    ) -> None:
        self.process = process
        self.conn = conn
        #: shared memory: per slot, 1 + the id of the task it runs (0: none) and the
        #: resident bytes it began from, written by the library before each call; after a
        #: death it names the task that killed it (replies of tiny tasks are held, so the
        #: order of ``record.sent`` cannot); ``memory_watch`` reads both
        self.running = running
        #: asks whether another reply is waiting: ``Connection.poll`` would build a
        #: selector on every call, about once per task
        self.pending = select.poll()
        self.pending.register(conn.fileno(), select.POLLIN)
        self.record = record
        #: the mapping behind ``running`` when the library is another interpreter's
        self.table: object | None = None


def start_library(
    record: LibraryRecord,
    worker_name: str,
    tasks_dir: str,
    cores: int,
    visible: str | None = None,
) -> Library:
    """Spawn a library process of ``record.slots`` slots, whose thread pools fit ``cores``
    (``threads``) and which sees the GPUs ``visible`` names (``CUDA_VISIBLE_DEVICES``;
    None: the worker's); it says ``Ready`` when it can run."""
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    running = ctx.RawArray("q", 2 * record.slots)
    args = (cores, child_conn, worker_name, (), tasks_dir, record.slots, running)
    process = ctx.Process(
        target=library_process.main if visible is None else library_process.main_seeing,
        args=args if visible is None else (visible, *args),
        name=f"daskvine-library-{worker_name}",
        daemon=True,
    )
    process.start()
    child_conn.close()
    return Library(process, parent_conn, record, running)


class ChildProcess:
    """A library started as a command (another interpreter: shipped software), with the
    few methods of ``multiprocessing``'s processes that the worker uses."""

    __slots__ = ("popen",)

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()


def start_library_with(
    python: str,
    env: dict[str, str],
    record: LibraryRecord,
    worker_name: str,
    tasks_dir: str,
    cores: int,
    visible: str | None = None,
) -> Library:
    """``start_library`` with another interpreter (``python``, its variables ``env``):
    ``python -m daskvine_py.worker.library_process``, handed its end of the pipe and its
    slot table (a file mapped by both) as inherited descriptors. Not ``multiprocessing``:
    its children re-import the parent's ``sys.path``, which is the worker's install."""
    parent_sock, child_sock = socket.socketpair()
    table_fd = os.memfd_create(f"daskvine-slots-{record.id}")
    size = 2 * record.slots * ctypes.sizeof(ctypes.c_longlong)
    os.ftruncate(table_fd, size)
    table = mmap.mmap(table_fd, size)
    running = (ctypes.c_longlong * (2 * record.slots)).from_buffer(table)
    env = dict(env)
    if visible is not None:
        env[gpus.VISIBLE] = visible
    command = [
        python,
        "-m",
        "daskvine_py.worker.library_process",
        str(child_sock.fileno()),
        str(table_fd),
        str(cores),
        worker_name,
        tasks_dir,
        str(record.slots),
    ]
    try:
        popen = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(child_sock.fileno(), table_fd),
        )
    except OSError:
        parent_sock.close()
        raise
    finally:
        child_sock.close()
        os.close(table_fd)
    conn = Connection(parent_sock.detach())
    lib = Library(ChildProcess(popen), conn, record, running)
    lib.table = table
    return lib


def running_tasks(lib: Library) -> set[int]:
    """The tasks a (dead) library was running, by its shared slots."""
    return {value - 1 for value in lib.running[::2] if value}


def reap_library(lib: Library, tasks_dir: str) -> str:
    """A library that died: how it ended (``killed by signal SIGKILL``); the directory of
    the sandboxed task it was running is removed (see ``library.Runner``)."""
    lib.process.join(1.0)
    how = library.describe_exit(lib.process.exitcode)
    for path in glob.glob(os.path.join(tasks_dir, f"task-*-{lib.process.pid}")):
        shutil.rmtree(path, ignore_errors=True)
    lib.conn.close()
    return how


def stop_libraries(libraries: Iterable[Library], wait: float) -> None:
    """Close their pipes, which they take as the order to exit; kill those that have not
    within ``wait`` seconds (one still importing is not waited for when ``wait`` is 0)."""
    libraries = list(libraries)
    for lib in libraries:
        lib.conn.close()
    deadline = time.monotonic() + wait
    for lib in libraries:
        lib.process.join(max(0.0, deadline - time.monotonic()))
        if lib.process.is_alive():
            lib.process.kill()
            lib.process.join(1.0)


class TaskProcess:
    """A fresh interpreter running one task (``task_mode="tasks"``)."""

    __slots__ = ("task", "process", "directory", "fd")

    def __init__(self, task: WorkerTask, process: subprocess.Popen[bytes], directory: str, fd: int):
        self.task = task
        self.process = process
        self.directory = directory
        #: read end of a pipe only the child holds open: readable (EOF) when it exits
        self.fd = fd


def start_task_process(
    task: WorkerTask,
    call: pipe.Call,
    tasks_dir: str,
    functions_dir: str,
    worker_name: str,
    cores: int,
    visible: str | None = None,
    software: tuple[str, dict[str, str]] | None = None,
) -> TaskProcess:
    """Start ``python -m daskvine_py.worker.task_process`` for ``task``, its call in a file,
    its thread pools fitting its cores (``cores`` at least: its slot's), seeing the GPUs
    ``visible`` names (None: the worker's), with ``software``'s interpreter and variables
    (None: the worker's own); ``OSError`` (with nothing left behind) when it cannot be
    started."""
    config = task.config
    assert config is not None
    directory = os.path.join(tasks_dir, f"task-{task.id}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, task_process.CALL_FILE), "wb") as file:
        pickle.dump((call, functions_dir, worker_name, config.import_modules), file, protocol=5)
    python, env = (sys.executable, dict(os.environ)) if software is None else software
    env = dict(env)
    threads.set_thread_env(max(cores, task.cores), env)  # its pools fit it, as a library's
    if visible is not None:
        env[gpus.VISIBLE] = visible
    env.update(config.env_vars)
    env["TMPDIR"] = directory
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [python, "-m", "daskvine_py.worker.task_process", directory],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(write_fd,),
        )
    except OSError:
        os.close(read_fd)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        os.close(write_fd)
    return TaskProcess(task, process, directory, read_fd)


def write_functions(functions: dict[bytes, bytes], written: set[bytes], directory: str) -> None:
    """Put every function not yet ``written`` into ``directory``, one file each."""
    if len(written) == len(functions):
        return
    os.makedirs(directory, exist_ok=True)
    for fid, code in functions.items():
        if fid not in written:
            path = task_process.function_file(directory, fid)
            with open(path + ".part", "wb") as file:
                file.write(code)
            os.replace(path + ".part", path)
            written.add(fid)


def reap_task_process(proc: TaskProcess, worker_name: str, logger: logging.Logger) -> pipe.Reply:
    """The reply of a task process that exited (``Crashed`` if it left none); its
    directory is removed."""
    os.close(proc.fd)
    code = proc.process.wait()
    reply: pipe.Reply | None = None
    try:
        with open(os.path.join(proc.directory, task_process.REPLY_FILE), "rb") as file:
            reply = pickle.load(file)
    except FileNotFoundError:
        pass
    except Exception as exc:  # a torn reply: treat as a crash
        logger.warning("unreadable reply of task %r: %r", proc.task.key, exc)
    shutil.rmtree(proc.directory, ignore_errors=True)
    if reply is None:
        how = library.describe_exit(code)
        reply = pipe.Crashed(proc.task.id, f"task process {how} on worker {worker_name}")
    return reply


def kill_task_process(proc: TaskProcess) -> None:
    proc.process.kill()
    proc.process.wait()
    os.close(proc.fd)


def remove_dead_workdirs(parent: str, prefix: str) -> None:
    """Remove the directories that workers of this host killed with SIGKILL left behind.

    Named ``{prefix}{pid}-XXXX``: a directory whose process is gone is removed; one whose
    pid runs (that worker, or a process reusing its pid) is left alone.
    """
    for path in glob.glob(os.path.join(parent, glob.escape(prefix) + "*-*")):
        pid_text = os.path.basename(path)[len(prefix) :].partition("-")[0]
        if not pid_text.isdigit() or not os.path.isdir(os.path.join(path, "tasks")):
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def peak_rss(pid: int | None) -> int:
    """Peak resident memory of a process in bytes (Linux ``VmHWM``; 0 where unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def status(heartbeat: SendStatus, libraries: Iterable[Library]) -> p.Status:
    """The heartbeat: the state's bytes held (stored and live), peak memory of the worker
    and of its largest library, the state's bytes spilled, the resident bytes of all of
    them now, and the state's bars of what it did since the last one (``activity``)."""
    pids = [lib.process.pid for lib in libraries]
    return p.Status(
        heartbeat.held,
        peak_rss(os.getpid()),
        max(map(peak_rss, pids), default=0),
        heartbeat.spilled,
        sum(map(resident, pids), resident(os.getpid())),
        heartbeat.bars,
    )


def resident(pid: int | None) -> int:
    """Resident bytes of a process now (0 where unknown)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return resident_bytes(statm.fileno())
    except (OSError, ValueError, IndexError):
        return 0


def total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def interface_towards(address: str) -> str:
    """The local IP address that routes to the manager: where peers can reach us."""
    host, _ = split_address(address)
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            own: str = probe.getsockname()[0]
            return own
        except OSError:
            return socket.gethostbyname(socket.gethostname())
