"""``python -m daskvine_py.worker ADDRESS --cores N``: one worker process per node.

Data flow::

    manager ──Execute/Release/Cancel──► [DEALER] ─┐
                                                  │   one loop, one thread
    peers ◄──Data── [ROUTER peer server] ◄────────┤   (poll: manager, peers, libraries)
    peers ──Data──► [DEALER per peer] ────────────┤
                                                  ▼
               store (results, serialized) ◄── library processes (one per core, pipes)
                                              ◄── task processes (task_mode="tasks")

- The loop drains every readable socket and pipe, then starts queued tasks on idle
  libraries, then flushes one batched message to the manager and one per peer.
- A task's inputs are in the local store or fetched directly from the peers the manager
  named; a peer that does not answer in ``fetch_timeout`` is skipped, and when none can
  serve an input the manager is told (``FetchFailed``) and decides.
- At most ``fetching.MAX_FETCHES`` inputs are fetched at once, ``MAX_FETCHES_PER_PEER``
  from any one peer; the rest queue. Bytes received per peer go to the manager in ``Transfers``.
- Results stay in the store until the manager releases them; only outputs travel to the
  manager, inside ``TaskDone``. Past ``--memory`` the store spills to ``<workdir>/spill``;
  past ``--disk`` as well, the manager is told (``DiskFull``) and sends no new work.
- A run that does not use the defaults (``RunConfig``: exec mode, hoisted imports,
  environment) is announced once, before its first task; its tasks go to libraries with
  it, or, in ``task_mode="tasks"``, each to a fresh ``python -m daskvine_py.task``.
- Task directories and function files live in ``<workdir>/tasks`` and
  ``<workdir>/functions``, removed with the worker's directory when it exits.
- The worker exits when the manager says ``Shutdown`` or stays silent past the timeout.
  Only records that pass validation count as hearing from it.
- Every record from the manager and from peers is validated (``protocol.check_fields``);
  a bad one is dropped with a rate-limited warning and the worker goes on. A task whose
  ``Execute`` it cannot read or take is reported crashed (``TaskCrashed``), so that the
  manager retries it elsewhere or fails its run; an error while serving a peer costs that
  peer its reply (it tries another holder), never the worker.
"""

from __future__ import annotations

import argparse
import functools
import glob
import logging
import multiprocessing
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import library, security
from . import protocol as p
from . import task as task_process
from .errors import ProtocolError
from .protocol import split_address
from .store import Store
from .transport import has_more, send_batch
from .worker_state import LibraryRecord, WorkerState, WorkerTask

# Named explicitly: run as ``python -m daskvine_py.worker`` this module is ``__main__``.
logger = logging.getLogger("daskvine_py.worker")

#: Messages drained from one socket per loop iteration, so one busy peer cannot starve the rest.
DRAIN_LIMIT = 1000
#: Failed CurveZMQ handshakes with the manager, with none succeeding between them, after
#: which the worker gives up. One ZAP refusal or mechanism mismatch is enough: the manager
#: said no, and libzmq does not reconnect after either. Two, not one, for failures
#: without detail: a connection cut mid-handshake looks the same, and it reconnects.
HANDSHAKE_FAILURES = 2
#: Seconds a send to the manager may wait for a connection to take it before the loop
#: goes on and tries again: with no connection (the manager refused ours) a send would
#: otherwise block for good, before the refusal is read.
MANAGER_SEND_TIMEOUT = 1.0

#: Exit statuses of ``python -m daskvine_py.worker`` besides 0 (told to stop, or the
#: manager went silent after we had joined) and argparse's 2 for bad arguments.
EXIT_REJECTED = 2
EXIT_NO_MANAGER = 3
EXIT_AUTH_FAILED = 4
EXIT_MEANINGS = {
    EXIT_REJECTED: "the manager rejected it (version mismatch) or its arguments were bad",
    EXIT_NO_MANAGER: "the manager never answered its registration",
    EXIT_AUTH_FAILED: "it could not authenticate with the manager: wrong or missing keys",
}
#: Handshake failures after which libzmq drops the connection for good.
_FINAL_HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_HANDSHAKE_FAILURE = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the manager refused this worker's key",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the manager speaks another security mechanism",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the manager's key is not the one this worker has",
}
#: Records from the manager about this worker's life rather than its tasks: the shell's.
_LIFECYCLE = (p.Welcome, p.Rejected, p.Shutdown)
_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class Library:
    """A library process and its pipe; its bookkeeping is the state's ``record``."""

    __slots__ = ("process", "conn", "pending", "record")

    def __init__(self, process: Any, conn: Connection, record: LibraryRecord) -> None:
        self.process = process
        self.conn = conn
        #: asks whether another reply is waiting: ``Connection.poll`` would build a
        #: selector on every call, about once per task
        self.pending = select.poll()
        self.pending.register(conn.fileno(), select.POLLIN)
        self.record = record


class TaskProcess:
    """A fresh interpreter running one task (``task_mode="tasks"``)."""

    __slots__ = ("task", "process", "directory", "fd")

    def __init__(self, task: WorkerTask, process: subprocess.Popen, directory: str, fd: int):
        self.task = task
        self.process = process
        self.directory = directory
        #: read end of a pipe only the child holds open: readable (EOF) when it exits
        self.fd = fd


class Worker:
    """The worker's I/O and its single event loop around a ``WorkerState``; see the
    module docstring."""

    @functools.cached_property
    def _drops(self) -> p.DropLog:
        """Warnings about dropped messages, rate-limited."""
        return p.DropLog(logger)

    def __init__(
        self,
        address: str,
        cores: int = 1,
        memory: int | None = None,
        name: str | None = None,
        host: str | None = None,
        manager_timeout: float = 30.0,
        fetch_timeout: float = 10.0,
        disk: int | None = None,
        workdir: str | None = None,
        lib_cores: int = 1,
        lib_slots: int = 1,
        keys: security.Keys | None = None,
        peer_port: int = 0,
        contact_address: str | None = None,
    ) -> None:
        split_address(address)  # ValueError for a malformed address, before anything starts
        if cores < 1:
            raise ValueError(f"cores must be >= 1, not {cores}")
        if lib_cores < 1 or lib_slots < 1:
            raise ValueError(f"lib_cores and lib_slots must be >= 1, not {lib_cores}, {lib_slots}")
        if not fetch_timeout > 0:
            raise ValueError(f"fetch_timeout must be > 0, not {fetch_timeout}")
        self.address = address
        #: bytes of results kept in memory before spilling (``disk``: of spill files)
        self.memory = memory if memory is not None else _total_memory()
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.identity = uuid.uuid4().hex.encode()
        #: libraries of ``lib_slots`` concurrent tasks each: the tasks this worker runs at once
        self.library_count = max(1, cores // lib_cores)
        self.lib_slots = lib_slots
        self.task_slots = self.library_count * lib_slots
        #: this worker's own directory (inside ``workdir``, default the system temp dir),
        #: removed at exit: task directories, function files, spill files
        if workdir is not None:
            os.makedirs(workdir, exist_ok=True)
        prefix = f"daskvine-{socket.gethostname()}-"
        _remove_dead_workdirs(workdir or tempfile.gettempdir(), prefix)
        self.workdir = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=workdir)
        self.tasks_dir = os.path.join(self.workdir, "tasks")
        os.mkdir(self.tasks_dir)

        #: the run's keys (CurveZMQ on every socket); None: no security
        self.keys = keys
        self.context = zmq.Context()
        #: the ZAP handler admitting peers to ``peer_server`` (None without keys)
        self.gate: security.Gate | None = None
        self.manager = self.context.socket(zmq.DEALER)
        self.manager.setsockopt(zmq.IDENTITY, self.identity)
        self.manager.setsockopt(zmq.LINGER, 2000)
        self.manager.setsockopt(zmq.SNDTIMEO, int(MANAGER_SEND_TIMEOUT * 1000))
        if keys is not None:
            security.connect_as_worker(self.manager, keys.manager_public, keys)
        #: handshake outcomes with the manager: a refused worker exits, saying why
        self.manager_events = self.manager.get_monitor_socket(_HANDSHAKE_EVENTS)
        self.handshake_failures = 0
        self.manager.connect(address)
        host = host or _interface_towards(address)
        self.peer_server = self.context.socket(zmq.ROUTER)
        self.peer_server.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            self.gate = security.Gate(self.context, keys.worker_public, f"worker {self.name}")
            self.gate.start()  # before the bind: a server with no ZAP handler admits anyone
            security.serve(self.peer_server, keys.worker_public, keys.worker_secret)
        if peer_port:
            self.peer_server.bind(f"tcp://{host}:{peer_port}")
            port = peer_port
        else:
            port = self.peer_server.bind_to_random_port(f"tcp://{host}")
        #: where peers fetch our results: the bound address, or one that forwards to it
        self.peer_address = contact_address or f"tcp://{host}:{port}"
        self.peer_clients: dict[str, zmq.Socket] = {}
        self.poller = zmq.Poller()
        self.poller.register(self.manager, zmq.POLLIN)
        self.poller.register(self.peer_server, zmq.POLLIN)
        self.poller.register(self.manager_events, zmq.POLLIN)

        self.store = Store(self.memory or None, os.path.join(self.workdir, "spill"), disk)
        #: every decision: tasks, fetches, library slots, manager liveness
        self.state = WorkerState(
            self.store, self.name, self.peer_address, manager_timeout, fetch_timeout,
            time.monotonic(),
        )  # fmt: skip
        self.library_by_fd: dict[int, Library] = {}
        self.next_library_id = 0
        #: task processes (task_mode="tasks") by the fd that says they exited
        self.process_by_fd: dict[int, TaskProcess] = {}
        #: functions written to ``functions_dir`` for task processes
        self.functions_dir = os.path.join(self.workdir, "functions")
        self.functions_written: set[bytes] = set()
        self.register_sent = False
        #: the manager went silent or refused our keys: nothing more can reach it
        self.manager_gone = False
        self.running = True
        self.exit_code = 0

    # -- lifecycle --------------------------------------------------------------------

    def run(self) -> int:
        """Register, serve until told to stop or the manager goes silent; the exit code."""
        for _ in range(self.library_count):
            self._start_library()
        if not self.library_by_fd:
            self._register()
        try:
            while self.running:
                self._loop_once()
        finally:
            self._close()
        return self.exit_code

    def _register(self) -> None:
        """Join the manager: once, when every library is ready to run tasks at once."""
        self.register_sent = True
        self.state.outbox.append(
            p.Register(
                p.PROTOCOL_VERSION,
                self.name,
                self.task_slots,
                self.memory,
                socket.gethostname(),
                self.peer_address,
                os.getpid(),
            )
        )

    def stop(self, reason: str) -> None:
        if self.running:
            logger.info("worker %s stopping: %s", self.name, reason)
            self.running = False
            if self.state.registered:
                self.state.outbox.append(p.Goodbye(reason))

    def _close(self) -> None:
        self._flush()
        for proc in self.process_by_fd.values():
            proc.process.kill()
            proc.process.wait()
            os.close(proc.fd)
        libraries = list(self.library_by_fd.values())
        for lib in libraries:
            lib.conn.close()
        # Libraries see the closed pipe and exit; one still importing (a worker that
        # never reached its manager) is not waited for.
        deadline = time.monotonic() + (0.0 if self.manager_gone else 2.0)
        for lib in libraries:
            lib.process.join(max(0.0, deadline - time.monotonic()))
            if lib.process.is_alive():
                lib.process.kill()
                lib.process.join(1.0)
        for sock in self.peer_clients.values():
            sock.close(linger=0)
        self.peer_server.close(linger=0)
        self.manager.disable_monitor()
        self.manager_events.close(linger=0)
        # A manager that is gone or refused us will not take what is queued for it.
        self.manager.close(linger=0 if self.manager_gone else None)
        if self.gate is not None:
            self.gate.stop()
        self.context.term()
        self.store.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the loop ---------------------------------------------------------------------

    def _loop_once(self) -> None:
        timeout_ms = self._poll_timeout_ms()
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.manager:
                self._drain_manager()
            elif sock is self.peer_server:
                self._serve_peers()
            elif sock is self.manager_events:
                self._on_handshake_events()
            elif isinstance(sock, int):
                lib = self.library_by_fd.get(sock)
                if lib is not None:
                    self._on_library_readable(lib)
                else:
                    self._on_process_exit(self.process_by_fd[sock])
            else:
                self._drain_peer_client(sock)
        now = time.monotonic()
        self._check_timers(now)
        state = self.state
        for lib, request in state.start_runnable():
            if lib.id in state.libraries:  # not died since, on an earlier request
                self._send_to_library(lib, request)
        if state.process_runnable:
            self._start_processes()
        state.end_pass(now)
        self._flush()

    def _poll_timeout_ms(self) -> int:
        if not self.running:
            return 0
        timeout = self.state.poll_timeout(time.monotonic())
        return 0 if self.state.outbox else int(timeout * 1000) + 1

    def _check_timers(self, now: float) -> None:
        state = self.state
        if state.manager_silent(now):
            what = "answered" if state.registered else "answered our registration"
            logger.warning(
                "manager %s has not %s for %.0f s; exiting",
                self.address,
                what,
                now - state.last_contact,
            )
            self.exit_code = 0 if state.registered else EXIT_NO_MANAGER
            self.manager_gone = True
            self.running = False
            return
        if state.heartbeat_due(now):
            state.outbox.append(self._status())
        for address in state.on_timers(now):
            self._reset_peer_client(address)

    def _status(self) -> p.Status:
        libraries = [_peak_rss(lib.process.pid) for lib in self.library_by_fd.values()]
        return p.Status(
            self.store.nbytes,
            _peak_rss(os.getpid()),
            max(libraries, default=0),
            self.store.disk_bytes,
        )

    def _flush(self) -> None:
        state = self.state
        if state.outbox and not self.manager_gone:
            messages = state.outbox[:]
            state.outbox.clear()
            try:
                send_batch(self.manager, p.encode(messages))
            except zmq.Again:  # no connection took it in time: kept for the next pass
                state.outbox[:0] = messages
            else:
                state.last_sent = time.monotonic()
        # A peer that cannot be asked passes its fetches on to their next holders, which
        # may add requests: until none is left (each fetch has finitely many holders).
        while state.peer_outbox:
            outbox = dict(state.peer_outbox)
            state.peer_outbox.clear()
            for address, ids in outbox.items():
                if address not in self.peer_clients and not p.connectable(address):
                    self._unreachable(address, ids, "not an address to connect to")
                    continue
                try:
                    send_batch(self._peer_client(address), p.encode([p.GetData(tuple(ids))]))
                except zmq.ZMQError as exc:
                    self._unreachable(address, ids, str(exc))

    def _unreachable(self, address: str, ids: list[int], why: str) -> None:
        now = time.monotonic()
        self._drops.warn(
            ("unreachable", address), now, "worker %s cannot ask peer %r for results: %s",
            self.name, address, why,
        )  # fmt: skip
        self.state.on_peer_unreachable(address, ids, now)

    # -- the manager ------------------------------------------------------------------

    def _on_handshake_events(self) -> None:
        """CurveZMQ handshakes with the manager: give up, saying why, once refused."""
        while self.manager_events.poll(0):
            event = recv_monitor_message(self.manager_events)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshake_failures = 0
                continue
            self.handshake_failures += 1
            if event not in _FINAL_HANDSHAKE_FAILURES:
                if self.handshake_failures < HANDSHAKE_FAILURES:
                    continue
            if self.keys is None:
                why = "this worker has no keys, and the manager requires them"
            else:
                why = _HANDSHAKE_FAILURE.get(event, f"handshake failed (event {event})")
            logger.error(
                "worker %s could not authenticate with the manager at %s: %s; exiting. "
                "Join with the manager's current connection file (--connection-file): "
                "a manager restarted without key_file has new keys",
                self.name,
                self.address,
                why,
            )
            self.exit_code = EXIT_AUTH_FAILED
            self.manager_gone = True
            self.running = False
            return

    def _drain_manager(self) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                frames = self.manager.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_manager_frames([f.buffer for f in frames])
            if not has_more(self.manager):
                return

    def _on_manager_frames(self, frames: list) -> None:
        """One batch from the manager, each record checked on its own: a bad one is
        dropped (its task reported crashed), the others taken. Only a valid record shows
        that the manager is there (``last_contact``)."""
        now = time.monotonic()
        try:
            messages = p.unpack(frames, p.TO_WORKER)
        except ProtocolError as exc:
            self._drops.warn(
                "manager", now, "worker %s dropped a malformed message from the manager: %s",
                self.name, exc,
            )  # fmt: skip
            return
        state = self.state
        for message in messages:
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    "manager", now, "worker %s dropped a malformed record from the manager: %s",
                    self.name, exc,
                )  # fmt: skip
                state.cannot_take(message, f"it could not read the task: {exc}")
                continue
            try:
                state.on_manager_message(message, now)
                if type(message) in _LIFECYCLE:
                    self._on_lifecycle(message)
            except Exception as exc:
                kind = type(message).__name__
                self._drops.warn(
                    ("handling", kind), now, "worker %s could not handle a %s from the manager: %r",
                    self.name, kind, exc, exc_info=exc,
                )  # fmt: skip
                state.cannot_take(message, f"it could not take the task: {exc!r}")

    def _on_lifecycle(self, msg: p.Welcome | p.Rejected | p.Shutdown) -> None:
        if type(msg) is p.Welcome:
            logger.info("worker %s registered as %s", self.name, msg.name)
        elif type(msg) is p.Rejected:
            logger.error("manager %s rejected this worker: %s", self.address, msg.reason)
            self.exit_code = EXIT_REJECTED
            self.running = False
        else:
            self.stop(f"manager asked: {msg.reason}")

    # -- peers ------------------------------------------------------------------------

    def _peer_client(self, address: str) -> zmq.Socket:
        sock = self.peer_clients.get(address)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                if self.keys is not None:  # every peer serves with the workers' key pair
                    security.connect_as_worker(sock, self.keys.worker_public, self.keys)
                sock.connect(address)
            except zmq.ZMQError:
                sock.close(linger=0)  # an open socket would hang the context's term
                raise
            self.peer_clients[address] = sock
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def _reset_peer_client(self, address: str | None) -> None:
        """Drop the socket to a silent peer, and the requests queued on it."""
        sock = self.peer_clients.pop(address, None) if address else None
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(linger=0)

    def _serve_peers(self) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                ident, *frames = self.peer_server.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            replies = self._peer_replies(ident.bytes, [f.buffer for f in frames])
            if replies:
                try:
                    send_batch(self.peer_server, p.encode(replies), ident)
                except Exception as exc:  # the peer asks another holder after its timeout
                    self._drops.warn(
                        ("reply",), time.monotonic(), "worker %s could not answer a peer: %r",
                        self.name, exc, exc_info=exc,
                    )  # fmt: skip

    def _peer_replies(self, ident: bytes, frames: list) -> list[p.Data] | None:
        """The answer to one request from a peer; None for a request that is not valid."""
        try:
            requests = p.decode(frames, p.TO_PEER)
        except ProtocolError as exc:
            self._drops.warn(
                ("request",), time.monotonic(), "worker %s dropped a malformed request from "
                "peer %r: %s", self.name, ident[:32], exc,
            )  # fmt: skip
            return None
        replies = []
        for request in requests:
            for task_id in request.task_ids:
                try:
                    value = self.store.get(task_id, use=False)
                except Exception as exc:  # a spill file that cannot be read back
                    self._drops.warn(
                        ("store",), time.monotonic(), "worker %s cannot serve result %d: %r",
                        self.name, task_id, exc,
                    )  # fmt: skip
                    value = None  # "not held here": the peer asks the next holder
                replies.append(p.Data(task_id, value))
        return replies

    def _drain_peer_client(self, sock: zmq.Socket) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_peer_frames([f.buffer for f in frames])

    def _on_peer_frames(self, frames: list) -> None:
        """A peer's replies; a malformed one is dropped, and its fetch times out."""
        now = time.monotonic()
        try:
            replies = p.decode(frames, p.FROM_PEER)
        except ProtocolError as exc:
            self._drops.warn(
                ("reply from a peer",), now, "worker %s dropped a malformed reply from a "
                "peer: %s", self.name, exc,
            )  # fmt: skip
            return
        for reply in replies:
            try:
                self.state.on_data(reply, now)
            except Exception as exc:  # storing it failed: the tasks that wait give up on it
                self._drops.warn(
                    ("data",), now, "worker %s could not take result %d from a peer: %r",
                    self.name, reply.task_id, exc, exc_info=exc,
                )  # fmt: skip
                self.state.on_data_error(reply.task_id)

    # -- libraries --------------------------------------------------------------------

    def _start_library(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=library.main,
            args=(child_conn, self.name, (), self.tasks_dir, self.lib_slots),
            name=f"daskvine-library-{self.name}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self.next_library_id += 1
        record = self.state.add_library(self.next_library_id, self.lib_slots)
        self.library_by_fd[parent_conn.fileno()] = Library(process, parent_conn, record)
        self.poller.register(parent_conn.fileno(), zmq.POLLIN)

    def _send_to_library(self, record: LibraryRecord, request: library.Run) -> None:
        lib = next(lib for lib in self.library_by_fd.values() if lib.record is record)
        try:
            library.send(lib.conn, request)
        except OSError:
            self._on_library_death(lib)

    def _on_library_readable(self, lib: Library) -> None:
        """Take every reply the library has written so far."""
        state = self.state
        record = lib.record
        wall = time.time()
        while True:
            try:
                reply = library.receive(lib.conn)
            except (EOFError, OSError):
                self._on_library_death(lib)
                return
            if type(reply) is library.Ready:
                if state.on_library_ready(record) and not self.register_sent:
                    self._register()
            else:
                state.on_library_reply(record, reply, wall)
            if not record.sent or not lib.pending.poll(0):
                return

    def _on_library_death(self, lib: Library) -> None:
        lib.process.join(1.0)
        how = library.describe_exit(lib.process.exitcode)
        # The directory of the sandboxed task it was running (see ``library.Runner``).
        for path in glob.glob(os.path.join(self.tasks_dir, f"task-*-{lib.process.pid}")):
            shutil.rmtree(path, ignore_errors=True)
        fd = next(fd for fd, other in self.library_by_fd.items() if other is lib)
        self.poller.unregister(fd)
        del self.library_by_fd[fd]
        lib.conn.close()
        self.state.on_library_death(lib.record, how)
        if self.running:
            self._start_library()

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def _start_processes(self) -> None:
        while self.state.process_runnable and len(self.process_by_fd) < self.task_slots:
            task = self.state.next_process_task()
            if task is None:
                return
            self._start_process(task)

    def _start_process(self, task: WorkerTask) -> None:
        """Start ``python -m daskvine_py.task`` for ``task``, its call in a file."""
        config = task.config
        assert config is not None
        self._write_functions()
        directory = os.path.join(self.tasks_dir, f"task-{task.id}")
        os.makedirs(directory, exist_ok=True)
        call = self.state.call(task)
        with open(os.path.join(directory, task_process.CALL_FILE), "wb") as file:
            pickle.dump(
                (call, self.functions_dir, self.name, config.import_modules), file, protocol=5
            )
        env = dict(os.environ)
        env.update(config.env_vars)
        env["TMPDIR"] = directory
        read_fd, write_fd = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "daskvine_py.task", directory],
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
            )
        except OSError as exc:
            os.close(read_fd)
            shutil.rmtree(directory, ignore_errors=True)
            self.state.on_process_failed(task, str(exc))
            return
        finally:
            os.close(write_fd)
        self.state.on_process_started(task)
        self.process_by_fd[read_fd] = TaskProcess(task, process, directory, read_fd)
        self.poller.register(read_fd, zmq.POLLIN)

    def _write_functions(self) -> None:
        """Put every function not yet written into ``functions_dir``, one file each."""
        functions = self.state.functions
        if len(self.functions_written) == len(functions):
            return
        os.makedirs(self.functions_dir, exist_ok=True)
        for fid, code in functions.items():
            if fid not in self.functions_written:
                path = task_process.function_file(self.functions_dir, fid)
                with open(path + ".part", "wb") as file:
                    file.write(code)
                os.replace(path + ".part", path)
                self.functions_written.add(fid)

    def _on_process_exit(self, proc: TaskProcess) -> None:
        self.poller.unregister(proc.fd)
        del self.process_by_fd[proc.fd]
        os.close(proc.fd)
        code = proc.process.wait()
        reply = None
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
            reply = library.Crashed(proc.task.id, f"task process {how} on worker {self.name}")
        if self.state.tasks.get(proc.task.id) is proc.task:
            self.state.on_reply(reply, time.time())


def _remove_dead_workdirs(parent: str, prefix: str) -> None:
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


def _peak_rss(pid: int | None) -> int:
    """Peak resident memory of a process in bytes (Linux ``VmHWM``; 0 where unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _interface_towards(address: str) -> str:
    """The local IP address that routes to the manager: where peers can reach us."""
    host, _ = split_address(address)
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m daskvine_py.worker",
        description="Join a daskvine_py manager and run its tasks on this node.",
    )
    parser.add_argument(
        "address",
        nargs="?",
        type=_manager_address,
        help="the manager's address, e.g. tcp://HOST:PORT (default: the connection file's)",
    )
    parser.add_argument(
        "--connection-file",
        metavar="PATH",
        default=None,
        help="the manager's connection file (manager.connection_file): its address and "
        f"keys (default: ${security.CONNECTION_FILE_ENV})",
    )
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        default=None,
        help="keys only, from a connection file or a manager's key file; the address is "
        "given as the first argument",
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count() or 1,
        help="library processes to run tasks in (default: all cores)",
    )
    parser.add_argument(
        "--memory",
        type=int,
        default=None,
        metavar="MB",
        help="memory for results, in MB; past it results spill to disk "
        "(default: the node's memory)",
    )
    parser.add_argument(
        "--disk",
        type=int,
        default=None,
        metavar="MB",
        help="disk for results spilled past --memory, in MB (default: no limit)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="where the worker makes its own directory for task directories and spill "
        "files, removed at exit (default: the system temp dir)",
    )
    parser.add_argument(
        "--lib-cores",
        type=int,
        default=1,
        metavar="C",
        help="cores per library process: the worker runs cores // C libraries (default 1)",
    )
    parser.add_argument(
        "--lib-slots",
        type=int,
        default=1,
        metavar="S",
        help="tasks each library process runs at once, in threads (default 1)",
    )
    parser.add_argument("--name", default=None, help="a name for logs and errors")
    parser.add_argument(
        "--host",
        default=None,
        help="address peers use to reach this worker (default: the "
        "interface that routes to the manager)",
    )
    parser.add_argument(
        "--peer-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port peers fetch results from (default: a free port)",
    )
    parser.add_argument(
        "--contact-address",
        type=_manager_address,
        default=None,
        metavar="tcp://HOST:PORT",
        help="address peers use when it is not the one bound (NAT, port forwarding)",
    )
    parser.add_argument(
        "--manager-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="exit after this long without hearing from the manager",
    )
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    if not 0 <= args.peer_port < 65536:
        parser.error(f"--peer-port must be a port number, not {args.peer_port}")
    try:
        args.address, args.keys = _connection(args)
    except (security.SecurityError, ValueError) as exc:
        parser.error(str(exc))
    return args


def _manager_address(text: str) -> str:
    """An argparse type: ``tcp://HOST:PORT`` with a real port, as a one-line error."""
    try:
        _, port = split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not text.startswith("tcp://") or port == 0:
        raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT, not {text!r}")
    return text


def _connection(args: argparse.Namespace) -> tuple[str, security.Keys | None]:
    """The manager's address and the run's keys, from the arguments or the environment."""
    if args.connection_file and args.key_file:
        raise ValueError("give --connection-file or --key-file, not both")
    path = args.connection_file
    if path is None and args.key_file is None:
        path = os.environ.get(security.CONNECTION_FILE_ENV) or None
    if path is not None:
        connection = security.read_connection_file(path)
        address = args.address or _manager_address(connection.address)
        return address, connection.keys
    if args.address is None:
        raise ValueError(
            "the manager's address is needed: give tcp://HOST:PORT or --connection-file"
        )
    if args.key_file is not None:
        return args.address, security.read_key_file(args.key_file)
    return args.address, None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.keys is None:
        logger.info("joining %s without security (no connection or key file)", args.address)
    worker = Worker(
        args.address,
        cores=args.cores,
        memory=args.memory * 2**20 if args.memory is not None else None,
        name=args.name,
        host=args.host,
        manager_timeout=args.manager_timeout,
        disk=args.disk * 2**20 if args.disk is not None else None,
        workdir=args.workdir,
        lib_cores=args.lib_cores,
        lib_slots=args.lib_slots,
        keys=args.keys,
        peer_port=args.peer_port,
        contact_address=args.contact_address,
    )
    signal.signal(signal.SIGTERM, lambda *_: worker.stop("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: worker.stop("SIGINT"))
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
