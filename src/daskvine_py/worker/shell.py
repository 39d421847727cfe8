"""``python -m daskvine_py.worker ADDRESS --cores N``: one worker process per node.

Data flow::

    manager ──Execute/Release/Cancel──► [DEALER] ─┐
                                                  │   one loop, one thread
    peers ◄──Data── [ROUTER peer server] ◄────────┤   (poll: manager, peers, libraries)
    peers ──Data──► [DEALER per peer] ────────────┤
                                                  ▼
               store (results, serialized) ◄── library processes (one per core, pipes)
                                              ◄── task processes (task_mode="tasks")

- This module is the I/O shell: the manager's socket, the loop, registration and exit.
  Every decision (which task runs where, what to fetch from whom, when a fetch or the
  manager has been silent too long) is ``state.WorkerState``'s, which takes events
  and ``now`` and leaves instructions; ``peers.PeerLinks`` owns the sockets to peers and
  ``host`` the library and task processes.
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
  it, or, in ``task_mode="tasks"``, each to a fresh ``python -m daskvine_py.worker.task_process``.
- Task directories and function files live in ``<workdir>/tasks`` and ``<workdir>/functions``.
- The worker exits when the manager says ``Shutdown`` or stays silent past the timeout,
  counted from when its registration went out (its libraries start first, which takes a
  while on many cores). Only records that pass validation count as hearing from it.
  While the connection is up (handshake done), an unanswered registration waits longer,
  ``state.REGISTRATION_PATIENCE`` timeouts, with one WARNING once past the first: a
  manager welcoming hundreds of workers at once is busy, not gone. A registration that
  went out on a connection since lost is sent again once it is made again.
- It logs one INFO line when it joins, one WARNING when it loses the manager, one line
  when it leaves, saying why (ERROR when it never could join); nothing per task.
  A task the manager aborts (``Abort``) while it runs has its process killed: its
  library is replaced as after a crash, with no report of the task.
- Every record from the manager and from peers is validated (``protocol.check_fields``);
  a bad one is dropped with a rate-limited warning and the worker goes on. A task whose
  ``Execute`` it cannot read or take is reported crashed (``TaskCrashed``), so that the
  manager retries it elsewhere or fails its run; an error while serving a peer costs that
  peer its reply (it tries another holder), never the worker.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Sequence

import zmq

from daskvine_py.command_line import configure_logging, libraries
from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security, sharedbuf
from daskvine_py.wire.exits import (
    EXIT_AUTH_FAILED,
    EXIT_NO_LIBRARIES,
    EXIT_NO_MANAGER,
    EXIT_REJECTED,
)
from daskvine_py.wire.limits import raise_open_files
from daskvine_py.wire.protocol import split_address
from daskvine_py.wire.transport import has_more, send_batch
from daskvine_py.worker import host as h
from daskvine_py.worker import pipe
from daskvine_py.worker.args import counted, parse_args
from daskvine_py.worker.memory_watch import MemoryWatch
from daskvine_py.worker.peers import DRAIN_LIMIT, PeerLinks
from daskvine_py.worker.records import WorkerTask
from daskvine_py.worker.state import REGISTRATION_PATIENCE, WorkerState
from daskvine_py.worker.store import Store
from daskvine_py.worker.threads import task_cores

# Named explicitly: run as ``python -m daskvine_py.worker`` this module is ``__main__``.
logger = logging.getLogger("daskvine_py.worker")

#: Seconds a send to the manager may wait for a connection to take it before the loop
#: goes on and tries again: with no connection (the manager refused ours) a send would
#: otherwise block for good, before the refusal is read.
MANAGER_SEND_TIMEOUT = 1.0

#: Library processes that may die before the worker has registered before it gives up:
#: the manager's deadline only starts with the registration, so without this bound a
#: library that cannot start (a broken environment, no memory) would be restarted forever.
MAX_START_FAILURES = 3

#: Records from the manager about this worker's life rather than its tasks: the shell's.
_LIFECYCLE = (p.Welcome, p.Rejected, p.Shutdown)


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
        gpus: Sequence[str] = (),
    ) -> None:
        split_address(address)  # ValueError for a malformed address, before anything starts
        if cores < 1:
            raise ValueError(f"cores must be >= 1, not {cores}")
        if lib_cores < 1 or lib_slots < 1:
            raise ValueError(f"lib_cores and lib_slots must be >= 1, not {lib_cores}, {lib_slots}")
        if not fetch_timeout > 0:
            raise ValueError(f"fetch_timeout must be > 0, not {fetch_timeout}")
        self.address = address
        self.cores = cores
        #: bytes of results kept in memory before spilling (``disk``: of spill files)
        self.memory = memory if memory is not None else h.total_memory()
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.identity = uuid.uuid4().hex.encode()
        #: libraries of ``lib_slots`` concurrent tasks each: the tasks this worker runs at once
        self.library_count = libraries(cores, lib_cores)
        self.lib_slots = lib_slots
        self.task_cores = task_cores(lib_cores, lib_slots)  # what each task's threads fit
        self.task_slots = self.library_count * lib_slots
        #: this worker's own directory (inside ``workdir``, default the system temp dir),
        #: removed at exit: task directories, function files, spill files
        if workdir is not None:
            os.makedirs(workdir, exist_ok=True)
        prefix = f"daskvine-{socket.gethostname()}-"
        h.remove_dead_workdirs(workdir or tempfile.gettempdir(), prefix)
        sharedbuf.remove_dead()  # segments in flight when a worker of this host was killed
        self.workdir = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=workdir)
        self.tasks_dir = os.path.join(self.workdir, "tasks")
        os.mkdir(self.tasks_dir)

        #: the run's keys (CurveZMQ on every socket); None: no security
        self.keys = keys
        self.context = zmq.Context()
        self.manager = self.context.socket(zmq.DEALER)
        self.manager.setsockopt(zmq.IDENTITY, self.identity)
        self.manager.setsockopt(zmq.LINGER, 2000)
        self.manager.setsockopt(zmq.SNDTIMEO, int(MANAGER_SEND_TIMEOUT * 1000))
        if keys is not None:
            security.connect_as_worker(self.manager, keys.manager_public, keys)
        #: handshake outcomes with the manager: a refused worker exits, saying why
        self.handshakes = security.HandshakeWatch(self.manager, keys is not None)
        self.manager.connect(address)
        self.poller = zmq.Poller()
        self.poller.register(self.manager, zmq.POLLIN)
        self.poller.register(self.handshakes.events, zmq.POLLIN)

        self.store = Store(self.memory or None, os.path.join(self.workdir, "spill"), disk)
        self.peers = PeerLinks(
            self.context, self.poller, self.store, self._drops, self.name,
            host or h.interface_towards(address), peer_port, contact_address, keys,
        )  # fmt: skip
        self.peer_address = self.peers.address
        #: every decision: tasks, fetches, library slots, manager liveness
        self.state = WorkerState(
            self.store, self.name, self.peer_address, manager_timeout, fetch_timeout,
            time.monotonic(),
        )  # fmt: skip
        exports = self.state.live_tasks.exports  # (their copies raise limits)
        self.watch = MemoryWatch(self.memory, self.state.tasks, self.store, self.name, exports)
        self.gpus = self.state.dispatch.gpus.declare(gpus)  #: device ids (``--gpus``)
        self.library_by_fd: dict[int, h.Library] = {}
        #: the same libraries by id (``LibraryRecord.id``), for the state's requests
        self.library_by_id: dict[int, h.Library] = {}
        self.next_library_id = 0
        #: task processes (task_mode="tasks") by the fd that says they exited
        self.process_by_fd: dict[int, h.TaskProcess] = {}
        #: functions written to ``functions_dir`` for task processes
        self.functions_dir = os.path.join(self.workdir, "functions")
        self.functions_written: set[bytes] = set()
        self.register_sent = False
        #: library processes that died before the registration went out
        self.start_failures = 0
        #: the manager went silent or refused our keys: nothing more can reach it
        self.manager_gone = False
        self.running = True
        self.exit_code = 0
        #: why it leaves, said in its last log line, and at which level
        self.leave_reason = "it stopped"
        self.leave_level = logging.INFO

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
        logger.log(self.leave_level, "worker %s left %s: %s (exit status %d)", self.name,
                   self.address, self.leave_reason, self.exit_code)  # fmt: skip
        return self.exit_code

    def _register(self) -> None:
        """Join the manager: once, when every library is ready to run tasks at once."""
        self.register_sent = True
        self.state.outbox.append(
            p.Register(
                p.PROTOCOL_VERSION, self.name, self.task_slots, self.memory,
                socket.gethostname(), self.peer_address, os.getpid(), len(self.gpus.devices),
            )  # fmt: skip
        )

    def stop(self, reason: str) -> None:
        if self.running:
            self.leave_reason = reason
            self.running = False
            if self.state.registered:
                self.state.outbox.append(p.Goodbye(reason))

    def _leave(self, reason: str, exit_code: int, level: int = logging.INFO) -> None:
        """Leave a manager that cannot be reached (gone, silent, refusing us)."""
        self.leave_reason = reason
        self.leave_level = level
        self.exit_code = exit_code
        self.manager_gone = True
        self.running = False

    def _close(self) -> None:
        self._flush()
        for proc in self.process_by_fd.values():
            h.kill_task_process(proc)
        # One still importing (a worker that never reached its manager) is not waited for.
        h.stop_libraries(self.library_by_fd.values(), 0.0 if self.manager_gone else 2.0)
        sharedbuf.remove_owned(os.getpid())  # messages its libraries wrote that none read
        self.peers.close()
        self.handshakes.close()
        # A manager that is gone or refused us will not take what is queued for it.
        self.manager.close(linger=0 if self.manager_gone else None)
        self.context.term()
        self.store.close()
        self.watch.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the loop ---------------------------------------------------------------------

    def _loop_once(self) -> None:
        timeout_ms = self._poll_timeout_ms()
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.manager:
                self._drain_manager()
            elif sock is self.peers.server:
                self.peers.serve(self.state)
            elif sock is self.handshakes.events:
                self._on_handshake_events()
            elif isinstance(sock, int):
                lib = self.library_by_fd.get(sock)
                if lib is not None:
                    self._on_library_readable(lib)
                else:
                    self._on_process_exit(self.process_by_fd[sock])
            else:
                self.peers.drain(sock, self.state)
        if self.state.aborted:
            self._kill_aborted()
        now = time.monotonic()
        for lib, task, peak, limit, kind in self.watch.look(self.library_by_id, now):  # killed
            self.state.on_exhausted(lib.record, task.id, peak, limit, kind)
            self._on_library_death(lib)
        self._check_timers(now)
        state = self.state
        for record, request in state.start_runnable():
            lib = self.library_by_id.get(record.id)
            if lib is not None:  # not died since, on an earlier request
                self._send_to_library(lib, request)
        for idle in filter(None, map(self.library_by_id.get, self.gpus.take_restarts())):
            idle.process.kill()  # its replacement gets other GPUs (the death is read as EOF)
        if state.process_runnable:
            self._start_processes()
        state.end_pass(now)  # (after every start: one ``Started`` for the pass)
        while state.library_outbox:  # exports and forgets; a death may add more
            outbox = state.library_outbox[:]
            state.library_outbox.clear()
            for library_id, message in outbox:
                lib = self.library_by_id.get(library_id)
                if lib is not None:
                    if type(message) is pipe.Export:  # its copies are not its tasks'
                        self.watch.exporting(library_id, state.live.bytes_of(message.task_ids))
                    self._send_to_library(lib, message)
        self._flush()

    def _poll_timeout_ms(self) -> int:
        if not self.running:
            return 0
        now = time.monotonic()
        timeout = min(self.state.poll_timeout(now), self.watch.timeout(now))
        busy = self.state.outbox or self.peers.requests  # (peers: answers left for next turn)
        return 0 if busy else int(timeout * 1000) + 1

    def _check_timers(self, now: float) -> None:
        state = self.state
        if state.waiting_warning_due(now):
            logger.warning(
                "worker %s has waited %.0f s for %s to answer its registration "
                "(--manager-timeout %g); the connection is up, so the manager is busy: it "
                "waits on, up to %.0f s",
                self.name, now - (state.registration_sent or now), self.address,
                state.manager_timeout, REGISTRATION_PATIENCE * state.manager_timeout,
            )  # fmt: skip
        if state.manager_silent(now):
            silent = now - state.last_contact
            timeout = state.manager_timeout
            if state.registered:
                logger.warning(
                    "worker %s lost the manager at %s: nothing heard from it for %.0f s "
                    "(--manager-timeout %g)", self.name, self.address, silent, timeout,
                )  # fmt: skip
                self._leave("the manager was lost", 0)
            elif state.manager_connected:
                waited = now - (state.registration_sent or now)
                self._leave(
                    f"the manager has not answered its registration, sent {waited:.0f} s "
                    f"ago, though connected ({REGISTRATION_PATIENCE} x --manager-timeout "
                    f"{timeout:g}); is it stopped or overloaded?",
                    EXIT_NO_MANAGER,
                    logging.ERROR,
                )
            else:
                self._leave(
                    f"the manager has not answered its registration, sent {silent:.0f} s ago "
                    f"(--manager-timeout {timeout:g}), and no connection to it is up; is a "
                    "manager listening there?",
                    EXIT_NO_MANAGER,
                    logging.ERROR,
                )
            return
        if state.heartbeat_due(now):
            state.last_sent = now  # busy or not: the manager draws memory over time
            state.outbox.append(h.status(state, self.library_by_fd.values()))
        for address in state.on_timers(now):
            self.peers.reset(address)

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
                if self.register_sent:  # the first batch holds it: the deadline starts
                    state.on_registration_sent(time.monotonic())
        self.peers.flush(state)

    # -- the manager ------------------------------------------------------------------

    def _on_handshake_events(self) -> None:
        """CurveZMQ handshakes with the manager: give up, saying why, once refused."""
        before = self.handshakes.succeeded
        why = self.handshakes.refusal()
        state = self.state
        state.on_manager_connection(self.handshakes.connected, time.monotonic())
        if before and self.handshakes.succeeded > before and self.register_sent:
            if not state.registered and state.registration_sent is not None:
                self._register()  # it went out on a connection since lost, and with it
        if why is not None:
            self._leave(
                f"it could not authenticate with the manager: {why}. Join with the "
                "manager's current connection file (--connection-file): a manager "
                "restarted without key_file has new keys",
                EXIT_AUTH_FAILED,
                logging.ERROR,
            )

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
            self.state.manager_garbled = True  # (a busy manager would still speak the protocol)
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
        if isinstance(msg, p.Welcome):
            logger.info(
                "worker joined %s as %s with %s (%s, %s at once)", self.address, msg.name,
                counted(self.cores, "core"), counted(self.library_count, "library", "libraries"),
                counted(self.task_slots, "task"),
            )  # fmt: skip
        elif isinstance(msg, p.Rejected):
            self.leave_reason = f"the manager rejected it: {msg.reason}"
            self.leave_level = logging.ERROR
            self.exit_code = EXIT_REJECTED
            self.running = False
        else:
            self.stop(f"the manager asked it to ({msg.reason})")

    # -- libraries --------------------------------------------------------------------

    def _start_library(self) -> None:
        self.next_library_id += 1
        record = self.state.add_library(self.next_library_id, self.lib_slots)
        lib = h.start_library(
            record, self.name, self.tasks_dir, self.task_cores, self.gpus.env(record.id)
        )
        self.library_by_fd[lib.conn.fileno()] = lib
        self.library_by_id[record.id] = lib
        self.poller.register(lib.conn.fileno(), zmq.POLLIN)

    def _send_to_library(self, lib: h.Library, request: pipe.ToLibrary) -> None:
        try:
            pipe.send(lib.conn, request)
        except OSError:
            self._on_library_death(lib)

    def _on_library_readable(self, lib: h.Library) -> None:
        """Take every reply the library has written so far."""
        state = self.state
        record = lib.record
        wall = time.time()
        while True:
            try:
                reply = pipe.receive_reply(lib.conn)
            except (EOFError, OSError):
                self._on_library_death(lib)
                return
            if isinstance(reply, pipe.Replies):
                for each in reply.replies:
                    state.on_library_reply(record, each, wall)
            elif isinstance(reply, pipe.Ready):
                if state.on_library_ready(record) and not self.register_sent:
                    self._register()
            else:
                state.on_library_reply(record, reply, wall)
            if not record.sent or not lib.pending.poll(0):
                return

    def _on_library_death(self, lib: h.Library) -> None:
        fd = next(fd for fd, other in self.library_by_fd.items() if other is lib)
        self.poller.unregister(fd)
        del self.library_by_fd[fd]
        del self.library_by_id[lib.record.id]
        how = h.reap_library(lib, self.tasks_dir)
        self.state.on_library_death(lib.record, how, h.running_tasks(lib))
        if not self.register_sent:
            self.start_failures += 1
            if self.start_failures >= MAX_START_FAILURES:
                self._leave(
                    f"its library processes could not start: {self.start_failures} died "
                    f"before it could register, the last one {how}",
                    EXIT_NO_LIBRARIES,
                    logging.ERROR,
                )
        if self.running:
            self._start_library()

    def _kill_aborted(self) -> None:
        """Kill what runs the tasks the manager aborted: their library (replaced as after
        a crash) or their task process (reaped as it exits, its reply ignored)."""
        for task in self.state.take_aborted():
            lib = self.library_by_id.get(task.lib if task.lib is not None else -1)
            if lib is not None:
                lib.process.kill()
                self._on_library_death(lib)
            for proc in self.process_by_fd.values():
                if proc.task is task:
                    proc.process.kill()

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def _start_processes(self) -> None:
        while self.state.process_runnable and len(self.process_by_fd) < self.task_slots:
            task = self.state.next_process_task()
            if task is None:
                return
            self._start_process(task)

    def _start_process(self, task: WorkerTask) -> None:
        h.write_functions(self.state.functions, self.functions_written, self.functions_dir)
        call = self.state.call(task)
        try:
            proc = h.start_task_process(
                task, call, self.tasks_dir, self.functions_dir, self.name, self.task_cores,
                self.gpus.env(None),
            )
        except OSError as exc:
            self.state.on_process_failed(task, str(exc))
            return
        self.state.on_process_started(task)
        self.process_by_fd[proc.fd] = proc
        self.poller.register(proc.fd, zmq.POLLIN)

    def _on_process_exit(self, proc: h.TaskProcess) -> None:
        self.poller.unregister(proc.fd)
        del self.process_by_fd[proc.fd]
        reply = h.reap_task_process(proc, self.name, logger)
        if self.state.tasks.get(proc.task.id) is proc.task:
            self.state.on_reply(reply, time.time())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    raise_open_files()  # a socket per peer and per connection served, on a login node too
    if args.keys is None:
        logger.info("joining %s without security (no connection or key file)", args.address)
    try:
        worker = _make_worker(args)
    except (OSError, zmq.ZMQError) as exc:  # a --workdir or --host the checks let through
        logger.error("worker cannot start: %s", exc)
        return EXIT_REJECTED
    signal.signal(signal.SIGTERM, lambda *_: worker.stop("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: worker.stop("SIGINT"))
    return worker.run()


def _make_worker(args: argparse.Namespace) -> Worker:
    return Worker(
        args.address,
        cores=args.cores,
        memory=args.memory * 2**20 if args.memory is not None else None,
        name=args.name,
        host=args.host,
        manager_timeout=args.manager_timeout,
        fetch_timeout=args.fetch_timeout,
        disk=args.disk * 2**20 if args.disk is not None else None,
        workdir=args.workdir,
        lib_cores=args.lib_cores,
        lib_slots=args.lib_slots,
        keys=args.keys,
        peer_port=args.peer_port,
        contact_address=args.contact_address,
        gpus=args.gpus,
    )
