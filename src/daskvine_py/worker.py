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
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import library, security
from . import protocol as p
from . import task as task_process
from .errors import ProtocolError
from .fetching import Fetch, TransferSlots
from .protocol import split_address
from .saturation import Ema
from .store import Store
from .transport import has_more, send_batch

# Named explicitly: run as ``python -m daskvine_py.worker`` this module is ``__main__``.
logger = logging.getLogger("daskvine_py.worker")

#: Messages drained from one socket per loop iteration, so one busy peer cannot starve the rest.
DRAIN_LIMIT = 1000
#: Tasks a library may be sent at once when tasks are tiny (recent runs under
#: ``TINY_TASK`` seconds). More saves pipe round trips; each queued task is committed to
#: that library, so longer tasks go one at a time and idle libraries are never starved.
LIBRARY_BATCH = 8
TINY_TASK = 0.001
#: Tasks shorter than this (recent runs) get the next task queued in their library's
#: pipe while they run, saving the library a wait for the worker between tasks. Longer
#: tasks do not: a queued task is committed to its library, and another might free up.
SHORT_TASK = 0.05
#: Largest request queued behind a running task: well within a pipe's buffer, so the
#: worker never blocks writing it while the library is blocked writing a result.
QUEUED_REQUEST_BYTES = 32 * 1024
#: Run configurations kept for runs that may still send tasks; older ones are forgotten.
MAX_RUN_CONFIGS = 256
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
_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class WorkerTask:
    __slots__ = (
        "id", "key", "payload", "deps", "want_result", "keep", "missing", "state", "config"
    )  # fmt: skip

    def __init__(self, msg: p.Execute, config: p.RunConfig | None) -> None:
        self.id = msg.task_id
        self.key = msg.key
        self.payload = msg.payload
        self.deps = msg.deps
        self.want_result = msg.want_result
        self.keep = msg.keep
        #: inputs not yet in the local store
        self.missing: set[int] = set()
        self.state = "fetching"  # -> "queued" -> "running"
        #: how it runs (its run's ``RunConfig``); None: the defaults
        self.config = config


class Library:
    """A library process, the tasks sent to it, and the functions it has not seen."""

    __slots__ = ("process", "conn", "sent", "unsent", "slots", "ready", "pending")

    def __init__(self, process: Any, conn: Connection, unsent: list[bytes], slots: int) -> None:
        self.process = process
        self.conn = conn
        #: asks whether another reply is waiting: ``Connection.poll`` would build a
        #: selector on every call, about once per task
        self.pending = select.poll()
        self.pending.register(conn.fileno(), select.POLLIN)
        #: it has started and imported what every task needs
        self.ready = False
        #: tasks it runs at once
        self.slots = slots
        #: tasks sent to it, in the order it runs them: the first is running
        self.sent: deque[int] = deque()
        #: ids of functions to send with the next request
        self.unsent = unsent


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
    """The worker's state and its single event loop; see the module docstring."""

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
        self.address = address
        self.cores = cores
        #: bytes of results kept in memory before spilling; ``disk``: bytes of spill files
        self.memory = memory if memory is not None else _total_memory()
        self.disk = disk
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.manager_timeout = manager_timeout
        self.heartbeat_interval = 1.0
        self.fetch_timeout = fetch_timeout
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

        self.store = Store(
            self.memory or None, os.path.join(self.workdir, "spill"), self.disk
        )  # fmt: skip
        self.disk_full = False
        #: recent task run times, to decide whether to batch tasks to libraries
        self.recent_duration = Ema()
        #: function id -> cloudpickle bytes: resident for the worker's life
        self.functions: dict[bytes, bytes] = {}
        self.tasks: dict[int, WorkerTask] = {}
        self.runnable: deque[int] = deque()
        self.fetches: dict[int, Fetch] = {}
        #: requests in flight overall and per peer, and fetches waiting for a free slot
        self.slots = TransferSlots()
        #: bytes received per peer address since the last ``Transfers`` report
        self.received_from: dict[str, int] = {}
        #: input being computed here -> tasks sent ahead that wait for it
        self.local_waiters: dict[int, set[int]] = {}
        self.libraries: list[Library] = []
        self.library_by_fd: dict[int, Library] = {}
        #: run id -> how its tasks run, for runs that do not use the defaults
        self.run_configs: dict[int, p.RunConfig] = {}
        #: tasks of task_mode="tasks" runs waiting for a slot, and those running
        self.process_runnable: deque[int] = deque()
        self.process_by_fd: dict[int, TaskProcess] = {}
        #: functions written to ``functions_dir`` for task processes
        self.functions_dir = os.path.join(self.workdir, "functions")
        self.functions_written: set[bytes] = set()
        self.outbox: list[Any] = []
        self.peer_outbox: dict[str, list[int]] = {}
        self.registered = False
        self.register_sent = False
        #: the manager went silent or refused our keys: nothing more can reach it
        self.manager_gone = False
        self.running = True
        self.exit_code = 0
        self.last_contact = time.monotonic()
        self.last_sent = 0.0

    # -- lifecycle --------------------------------------------------------------------

    def run(self) -> int:
        """Register, serve until told to stop or the manager goes silent; the exit code."""
        for _ in range(self.library_count):
            self._start_library()
        if not self.libraries:
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
        self.outbox.append(
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
            if self.registered:
                self.outbox.append(p.Goodbye(reason))

    def _close(self) -> None:
        self._flush()
        for proc in self.process_by_fd.values():
            proc.process.kill()
            proc.process.wait()
            os.close(proc.fd)
        for lib in self.libraries:
            lib.conn.close()
        # Libraries see the closed pipe and exit; one still importing (a worker that
        # never reached its manager) is not waited for.
        deadline = time.monotonic() + (0.0 if self.manager_gone else 2.0)
        for lib in self.libraries:
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
        if self.slots.freed and self.slots.queue:
            for fetch, address in self.slots.startable(self._fetch_is_live):
                self._request(fetch, address, now)
        self._start_runnable()
        if self.process_runnable:
            self._start_processes()
        if self.store.full is not self.disk_full:
            self.disk_full = self.store.full
            logger.warning("worker %s disk full: %s", self.name, self.disk_full)
            self.outbox.append(p.DiskFull(self.disk_full))
        if self.received_from:
            self.outbox.append(p.Transfers(tuple(self.received_from.items())))
            self.received_from = {}
        self._flush()

    def _poll_timeout_ms(self) -> int:
        if self.outbox or not self.running:
            return 0
        now = time.monotonic()
        deadline = self.last_contact + self.manager_timeout
        if self.registered:  # heartbeats start with registration; until then, nothing is due
            deadline = min(deadline, self.last_sent + self.heartbeat_interval)
        for fetch in self.fetches.values():
            deadline = min(deadline, fetch.deadline)
        return max(0, int((deadline - now) * 1000) + 1)

    def _check_timers(self, now: float) -> None:
        if now - self.last_contact > self.manager_timeout:
            what = "answered" if self.registered else "answered our registration"
            logger.warning(
                "manager %s has not %s for %.0f s; exiting",
                self.address,
                what,
                now - self.last_contact,
            )
            self.exit_code = 0 if self.registered else EXIT_NO_MANAGER
            self.manager_gone = True
            self.running = False
            return
        if self.registered and now - self.last_sent > self.heartbeat_interval:
            self.outbox.append(self._status())
        for fetch in [f for f in self.fetches.values() if f.deadline <= now]:
            if self.fetches.get(fetch.dep_id) is not fetch:
                continue  # dropped with a task that an earlier failure here cancelled
            logger.warning(
                "peer did not serve result %d within %.1f s", fetch.dep_id, self.fetch_timeout
            )
            self._reset_peer_client(fetch.current)
            self.slots.give_back(fetch)
            self._request_next(fetch, now)

    def _status(self) -> p.Status:
        libraries = [_peak_rss(lib.process.pid) for lib in self.libraries]
        return p.Status(
            self.store.nbytes,
            _peak_rss(os.getpid()),
            max(libraries, default=0),
            self.store.disk_bytes,
        )

    def _flush(self) -> None:
        if self.outbox and not self.manager_gone:
            messages, self.outbox = self.outbox, []
            try:
                send_batch(self.manager, p.encode(messages))
            except zmq.Again:  # no connection took it in time: kept for the next pass
                self.outbox[:0] = messages
            else:
                self.last_sent = time.monotonic()
        # A peer that cannot be asked passes its fetches on to their next holders, which
        # may add requests: until none is left (each fetch has finitely many holders).
        while self.peer_outbox:
            outbox, self.peer_outbox = self.peer_outbox, {}
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
        for dep_id in ids:
            fetch = self.fetches.get(dep_id)
            if fetch is not None and fetch.current == address:
                self.slots.give_back(fetch)
                self._request_next(fetch, now)

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
        for message in messages:
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    "manager", now, "worker %s dropped a malformed record from the manager: %s",
                    self.name, exc,
                )  # fmt: skip
                self._cannot_take(message, f"it could not read the task: {exc}")
                continue
            self.last_contact = now
            try:
                self._on_manager_message(message)
            except Exception as exc:
                kind = type(message).__name__
                self._drops.warn(
                    ("handling", kind), now, "worker %s could not handle a %s from the manager: %r",
                    self.name, kind, exc, exc_info=exc,
                )  # fmt: skip
                self._cannot_take(message, f"it could not take the task: {exc!r}")

    def _cannot_take(self, message: Any, why: str) -> None:
        """An ``Execute`` that was dropped: forget what was kept of its task, and tell the
        manager, which would otherwise wait for it forever."""
        if type(message) is not p.Execute or len(message) < 1 or type(message[0]) is not int:
            return
        task_id = message[0]
        task = self.tasks.get(task_id)
        if task is not None and task.state == "running":
            return  # an earlier Execute of it runs: its own report will come
        if task is not None:
            self._drop_task(task)
        # What a handler that failed half-way kept of it, found by id.
        for dep_id in [d for d, waiters in self.local_waiters.items() if task_id in waiters]:
            self.local_waiters[dep_id].discard(task_id)
            if not self.local_waiters[dep_id]:
                del self.local_waiters[dep_id]
        for fetch in list(self.fetches.values()):
            fetch.waiters.discard(task_id)
            if not fetch.waiters and not fetch.replicate:  # for nobody: a later task would
                del self.fetches[fetch.dep_id]  # wait on it forever, never requested
                self.slots.give_back(fetch)
        self.outbox.append(p.TaskCrashed(task_id, f"worker {self.name}: {why}"))

    def _on_manager_message(self, msg: Any) -> None:
        kind = type(msg)
        if kind is p.Execute:
            self._on_execute(msg)
        elif kind is p.RunConfig:
            if len(self.run_configs) >= MAX_RUN_CONFIGS:
                del self.run_configs[next(iter(self.run_configs))]
            self.run_configs[msg.run_id] = msg
        elif kind is p.Function:
            self.functions[msg.function_id] = bytes(msg.code)
            for lib in self.libraries:
                lib.unsent.append(msg.function_id)
        elif kind is p.Release:
            for task_id in msg.task_ids:
                self.store.release(task_id)
        elif kind is p.Cancel:
            for task_id in msg.task_ids:
                self._cancel(task_id)
        elif kind is p.Withdraw:
            dropped = tuple(task_id for task_id in msg.task_ids if self._cancel(task_id))
            if dropped:
                self.outbox.append(p.Withdrawn(dropped))
        elif kind is p.Replicate:
            self._on_replicate(msg)
        elif kind is p.Welcome:
            self.registered = True
            self.heartbeat_interval = msg.heartbeat_interval
            logger.info("worker %s registered as %s", self.name, msg.name)
        elif kind is p.Rejected:
            logger.error("manager %s rejected this worker: %s", self.address, msg.reason)
            self.exit_code = EXIT_REJECTED
            self.running = False
        elif kind is p.Shutdown:
            self.stop(f"manager asked: {msg.reason}")

    def _on_execute(self, msg: p.Execute) -> None:
        if msg.task_id in self.tasks:
            return  # re-sent after a cancel while it was running: its result is coming
        task = WorkerTask(msg, self.run_configs.get(msg.run_id))
        now = time.monotonic()
        for dep in msg.deps:
            if dep.value is not None or dep.task_id in self.store:
                continue
            if dep.peers is None:  # being computed here: start when it is done
                task.missing.add(dep.task_id)
                self.local_waiters.setdefault(dep.task_id, set()).add(task.id)
                continue
            if not dep.peers:  # the manager thinks we hold it, but we do not
                self.outbox.append(p.FetchFailed(task.id, dep.task_id, (self.peer_address,)))
                self._drop_task(task)
                return
            task.missing.add(dep.task_id)
            fetch = self.fetches.get(dep.task_id)
            if fetch is None:
                fetch = self.fetches[dep.task_id] = Fetch(dep.task_id, dep.peers)
                self._request_next(fetch, now)
            fetch.waiters.add(task.id)
        self.tasks[task.id] = task
        if not task.missing:
            self._enqueue(task)

    def _enqueue(self, task: WorkerTask) -> None:
        task.state = "queued"
        if task.config is not None and task.config.task_mode == "tasks":
            self.process_runnable.append(task.id)
        else:
            self.runnable.append(task.id)

    def _on_replicate(self, msg: p.Replicate) -> None:
        if msg.task_id in self.store:
            self.outbox.append(p.Replicas((msg.task_id,)))
            return
        fetch = self.fetches.get(msg.task_id)
        if fetch is not None:
            fetch.replicate = True
        elif msg.peers:
            fetch = self.fetches[msg.task_id] = Fetch(msg.task_id, msg.peers, replicate=True)
            self._request_next(fetch, time.monotonic())

    def _cancel(self, task_id: int) -> bool:
        """Drop a task that has not started; whether it was dropped."""
        task = self.tasks.get(task_id)
        if task is not None and task.state != "running":
            self._drop_task(task)
            return True
        return False

    def _drop_task(self, task: WorkerTask) -> None:
        self.tasks.pop(task.id, None)
        for dep_id in task.missing:
            waiters = self.local_waiters.get(dep_id)
            if waiters is not None:
                waiters.discard(task.id)
                if not waiters:
                    del self.local_waiters[dep_id]
            fetch = self.fetches.get(dep_id)
            if fetch is not None:
                fetch.waiters.discard(task.id)
                if not fetch.waiters and not fetch.replicate:
                    del self.fetches[dep_id]
                    self.slots.give_back(fetch)  # a late reply finds no fetch and is dropped

    # -- peers ------------------------------------------------------------------------

    def _request_next(self, fetch: Fetch, now: float) -> None:
        """Ask the next untried holder, or queue the fetch until a transfer slot is free."""
        if not fetch.untried:
            self._fetch_failed(fetch)
            return
        address = self.slots.take(fetch)
        if address is None:
            fetch.deadline = float("inf")
            self.slots.queue.append(fetch)
        else:
            self._request(fetch, address, now)

    def _request(self, fetch: Fetch, address: str, now: float) -> None:
        fetch.deadline = now + self.fetch_timeout
        self.peer_outbox.setdefault(address, []).append(fetch.dep_id)

    def _fetch_is_live(self, fetch: Fetch) -> bool:
        return self.fetches.get(fetch.dep_id) is fetch

    def _fetch_failed(self, fetch: Fetch) -> None:
        self.fetches.pop(fetch.dep_id, None)
        if fetch.replicate and not fetch.waiters:
            logger.info("could not copy result %d from %s", fetch.dep_id, fetch.peers)
        for task_id in fetch.waiters:
            task = self.tasks.get(task_id)
            if task is not None:
                self.outbox.append(p.FetchFailed(task_id, fetch.dep_id, fetch.peers))
                task.missing.discard(fetch.dep_id)
                self._drop_task(task)

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
            fetch = self.fetches.get(reply.task_id)
            try:
                self._on_data(reply, now)
            except Exception as exc:  # storing it failed: the tasks that wait give up on it
                self._drops.warn(
                    ("data",), now, "worker %s could not take result %d from a peer: %r",
                    self.name, reply.task_id, exc, exc_info=exc,
                )  # fmt: skip
                if fetch is not None:
                    self.slots.give_back(fetch)
                    self._fetch_failed(fetch)

    def _on_data(self, reply: p.Data, now: float) -> None:
        fetch = self.fetches.get(reply.task_id)
        if fetch is None or fetch.current is None:
            return  # nobody here waits for it any more, or it was asked elsewhere since
        source = fetch.current
        self.slots.give_back(fetch)
        if reply.value is None:
            self._request_next(fetch, now)
            return
        del self.fetches[reply.task_id]
        received = self.received_from
        received[source] = received.get(source, 0) + reply.value.nbytes
        self.store.put(reply.task_id, reply.value)
        self.outbox.append(p.Replicas((reply.task_id,)))
        self._input_arrived(reply.task_id, fetch.waiters)

    def _input_arrived(self, dep_id: int, waiters: set[int]) -> None:
        for task_id in waiters:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            task.missing.discard(dep_id)
            if not task.missing:
                self._enqueue(task)

    # -- libraries --------------------------------------------------------------------

    def _start_library(self) -> Library:
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
        lib = Library(process, parent_conn, list(self.functions), self.lib_slots)
        self.libraries.append(lib)
        self.library_by_fd[parent_conn.fileno()] = lib
        self.poller.register(parent_conn.fileno(), zmq.POLLIN)
        return lib

    def _start_runnable(self) -> None:
        """Hand runnable tasks to libraries with a free slot: one task per free slot, or a
        few when tasks are tiny, all of one run configuration per request.

        A library runs the tasks it is sent one after the other (or ``slots`` at once)
        and answers each at once; sending tiny tasks in batches saves pipe round trips,
        and their replies then come back, and go to the manager, in batches too.
        """
        if not self.runnable:
            return
        recent = self.recent_duration.value if self.recent_duration.count else None
        tiny = recent is not None and recent < TINY_TASK
        depth = LIBRARY_BATCH if tiny else 1
        # Libraries with a free slot first. A one-slot library blocked writing results
        # while we write inputs would deadlock on the pipe (a library of several slots
        # keeps reading while its slots write)...
        for lib in [lib for lib in self.libraries if len(lib.sent) < lib.slots]:
            self._fill_library(lib, lib.slots * depth - len(lib.sent), None)
            if not self.runnable:
                return
        # ...then, for short tasks, one small task queued behind the running one: it fits
        # in the pipe's buffer, so writing it cannot block, and the library starts it
        # without waiting for us to hear of the previous one.
        if tiny or recent is None or recent > SHORT_TASK:
            return
        for lib in self.libraries:
            if lib.slots == 1 and len(lib.sent) == 1 and lib.ready:
                self._fill_library(lib, 1, QUEUED_REQUEST_BYTES)
                if not self.runnable:
                    return

    def _fill_library(self, lib: Library, room: int, max_bytes: int | None) -> None:
        """Send ``lib`` up to ``room`` runnable tasks of one run configuration, of at most
        ``max_bytes`` (payloads and inputs) when given."""
        batch: list[WorkerTask] = []
        while self.runnable and len(batch) < room:
            task = self._next_runnable()
            if task is None:
                break
            if (batch and task.config is not batch[0].config) or (
                max_bytes is not None and self._request_bytes(task) > max_bytes
            ):
                self.runnable.appendleft(task.id)  # for the next request
                break
            batch.append(task)
        if batch:
            self._send_to_library(lib, batch)

    def _request_bytes(self, task: WorkerTask) -> int:
        return len(task.payload) + sum(
            dep.value.nbytes if dep.value is not None else self.store.size(dep.task_id)
            for dep in task.deps
        )

    def _next_runnable(self, queue: deque[int] | None = None) -> WorkerTask | None:
        queue = self.runnable if queue is None else queue
        while queue:
            task = self.tasks.get(queue.popleft())
            if task is None or task.state != "queued":
                continue
            for dep in task.deps:
                if dep.value is None and dep.task_id not in self.store:
                    self.outbox.append(p.FetchFailed(task.id, dep.task_id, (self.peer_address,)))
                    self._drop_task(task)
                    break
            else:
                return task
        return None

    def _send_to_library(self, lib: Library, batch: list[WorkerTask]) -> None:
        calls = []
        for task in batch:
            task.state = "running"
            lib.sent.append(task.id)
            inputs = [(dep.key, self._input(dep)) for dep in task.deps]
            calls.append((task.id, task.key, task.payload, inputs))
        functions = [(fid, self.functions[fid]) for fid in lib.unsent]
        lib.unsent = []
        try:
            library.send(lib.conn, ("run", functions, batch[0].config, calls))
        except OSError:
            self._on_library_death(lib)

    def _input(self, dep: p.DepLocation) -> Any:
        """An input's value: inline in the ``Execute`` (small ones), else in the store."""
        return dep.value if dep.value is not None else self.store.get(dep.task_id)

    def _on_library_readable(self, lib: Library) -> None:
        """Take every reply the library has written so far."""
        while True:
            try:
                reply = library.receive(lib.conn)
            except (EOFError, OSError):
                self._on_library_death(lib)
                return
            self._on_library_reply(lib, reply)
            if not lib.sent or not lib.pending.poll(0):
                return

    def _on_library_reply(self, lib: Library, reply: tuple) -> None:
        if reply[0] == "ready":
            lib.ready = True
            if not self.register_sent and all(other.ready for other in self.libraries):
                self._register()
            return
        if lib.sent and lib.sent[0] == reply[1]:
            lib.sent.popleft()
        else:
            lib.sent.remove(reply[1])
        self._on_reply(reply)

    def _on_reply(self, reply: tuple) -> None:
        """A task's outcome, from a library or a task process."""
        task = self.tasks.pop(reply[1], None)
        if task is None:
            return
        if reply[0] == "done":
            _, task_id, value, duration = reply
            self.recent_duration.observe(duration)
            if task.keep:
                self.store.put(task_id, value)
            waiters = self.local_waiters.pop(task_id, None)
            if waiters:
                self._input_arrived(task_id, waiters)
            self.outbox.append(
                p.TaskDone(
                    task_id,
                    value.nbytes,
                    duration,
                    value if task.want_result or p.inlinable(value) else None,
                    time.time(),
                )
            )
        elif reply[0] == "erred":
            _, task_id, exception, text, message = reply
            self.outbox.append(p.TaskErred(task_id, exception, text, message))
        else:  # "crashed": the process running it died (fork and tasks modes)
            logger.warning("task %r: %s", task.key, reply[2])
            self.outbox.append(p.TaskCrashed(reply[1], reply[2]))

    def _on_library_death(self, lib: Library) -> None:
        lib.process.join(1.0)
        how = library.describe_exit(lib.process.exitcode)
        # The directory of the sandboxed task it was running (see ``library.Runner``).
        for path in glob.glob(os.path.join(self.tasks_dir, f"task-*-{lib.process.pid}")):
            shutil.rmtree(path, ignore_errors=True)
        fd = next(fd for fd, other in self.library_by_fd.items() if other is lib)
        self.poller.unregister(fd)
        del self.library_by_fd[fd]
        self.libraries.remove(lib)
        lib.conn.close()
        # The first tasks (one per slot) were running, and one took the process down; the
        # rest never started and go back to the front of the queue.
        for _ in range(min(lib.slots, len(lib.sent))):
            task = self.tasks.pop(lib.sent.popleft(), None)
            if task is not None:
                reason = f"library process {how} on worker {self.name}"
                logger.warning("task %r: %s", task.key, reason)
                self.outbox.append(p.TaskCrashed(task.id, reason))
        if lib.sent:
            for task_id in reversed(lib.sent):
                queued = self.tasks.get(task_id)
                if queued is not None:
                    queued.state = "queued"
                    self.runnable.appendleft(task_id)
        if self.running:
            self._start_library()

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def _start_processes(self) -> None:
        while self.process_runnable and len(self.process_by_fd) < self.task_slots:
            task = self._next_runnable(self.process_runnable)
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
        inputs = [(dep.key, self._input(dep)) for dep in task.deps]
        call = (task.id, task.key, task.payload, inputs)
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
            self.tasks.pop(task.id, None)
            reason = f"cannot start a task process on worker {self.name}: {exc}"
            self.outbox.append(p.TaskCrashed(task.id, reason))
            return
        finally:
            os.close(write_fd)
        task.state = "running"
        self.process_by_fd[read_fd] = TaskProcess(task, process, directory, read_fd)
        self.poller.register(read_fd, zmq.POLLIN)

    def _write_functions(self) -> None:
        """Put every function not yet written into ``functions_dir``, one file each."""
        if len(self.functions_written) == len(self.functions):
            return
        os.makedirs(self.functions_dir, exist_ok=True)
        for fid, code in self.functions.items():
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
            reply = ("crashed", proc.task.id, f"task process {how} on worker {self.name}")
        if self.tasks.get(proc.task.id) is proc.task:
            self._on_reply(reply)


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
