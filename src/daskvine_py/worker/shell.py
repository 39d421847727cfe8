"""``python -m daskvine_py.worker ADDRESS --cores N``: one worker process per node.

Data flow::

    manager ──Execute/Release/Cancel──► [DEALER] ─┐
                                                  │   one loop, one thread
    peers ◄──Data── [ROUTER peer server] ◄────────┤   (poll: manager, peers, libraries)
    peers ──Data──► [DEALER per peer] ────────────┤
                                                  ▼
               store (results, serialized) ◄── library processes (one per core, pipes)
                                              ◄── task processes (task_mode="tasks")

- This module is the I/O shell: the manager's socket, the loop, the processes. Every
  decision (which task runs where, what to fetch from whom, when to register, when a
  fetch or the manager has been silent too long, when to leave) is
  ``state.WorkerState``'s: the shell turns what it reads into events
  (``messages``), hands them to ``WorkerState.handle`` with ``now`` and carries out the
  instructions it returns; ``peers.PeerLinks`` owns the sockets to peers and ``host``
  the library and task processes.
- The loop drains every readable socket and pipe into events, hands them to the state
  once per pass (the state then starts queued tasks on idle libraries), carries out its
  instructions (what they answer, a death or a peer that cannot be reached, goes back to
  the state at once), then flushes one batched message to the manager and one per peer.
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
- Runs with ``cache_inputs`` read remote inputs through the node's input cache
  (``--input-cache``, bounded by ``--disk``), whose variables the worker sets for its
  libraries; it removes what runs fetched as they end or as it exits, by their lifetimes
  (``inputs_keeper``).
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
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from daskvine_py.command_line import configure_logging, libraries
from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security, sharedbuf
from daskvine_py.wire.exits import (
    EXIT_AUTH_FAILED,
    EXIT_REJECTED,
)
from daskvine_py.wire.limits import raise_open_files
from daskvine_py.wire.protocol import split_address
from daskvine_py.wire.transport import has_more, send_batch
from daskvine_py.worker import host as h
from daskvine_py.worker import pipe
from daskvine_py.worker.args import counted, parse_args
from daskvine_py.worker.input_peers import InputPeers
from daskvine_py.worker.inputs_keeper import InputsKeeper
from daskvine_py.worker.memory_watch import MemoryWatch
from daskvine_py.worker.messages import (
    AnswerPeer,
    AskPeer,
    Boot,
    ClosePeer,
    EndRunInputs,
    Event,
    EventFailed,
    FilesShipped,
    FromLibrary,
    KillLibrary,
    KillProcess,
    Leave,
    LibraryDied,
    ManagerConnection,
    MemoryExceeded,
    PrepareSoftware,
    ProcessExited,
    ProcessFailed,
    ProcessStarted,
    RegistrationSent,
    SendStatus,
    StartLibrary,
    StartProcess,
    Stop,
    StopLibraries,
    Tick,
    ToLibrary,
    Unreadable,
)
from daskvine_py.worker.peers import DRAIN_LIMIT, PeerLinks
from daskvine_py.worker.software_host import SoftwareHost, files_digest, own_python
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store
from daskvine_py.worker.threads import task_cores

# Named explicitly: run as ``python -m daskvine_py.worker`` this module is ``__main__``.
logger = logging.getLogger("daskvine_py.worker")

#: Seconds a send to the manager may wait for a connection to take it before the loop
#: goes on and tries again: with no connection (the manager refused ours) a send would
#: otherwise block for good, before the refusal is read.
MANAGER_SEND_TIMEOUT = 1.0

#: The event that says the registration went out (it has no fields: made once).
_REGISTRATION_SENT = RegistrationSent()


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
        software_cache: str | None = None,
        input_cache: str | None = None,
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
            self.context,
            self.poller,
            self.store,
            self._drops,
            self.name,
            host or h.interface_towards(address),
            peer_port,
            contact_address,
            keys,
        )
        self.peer_address = self.peers.address
        #: software runs ship: prepared on a thread, libraries started with it, archives
        #: served to peers, files written (``software_host``)
        self.software = SoftwareHost(
            self.workdir, self.name, split_address(self.peer_address)[0], keys, software_cache
        )
        self.poller.register(self.software.wake_fd, zmq.POLLIN)
        #: the node's input cache as this worker keeps it: its claims' lifetimes
        self.inputs = InputsKeeper(input_cache, disk)
        #: that cache served to peers, and files pulled from theirs (``input_peers``)
        self.input_peers = InputPeers(self.name, split_address(self.peer_address)[0], keys)
        #: every decision: tasks, fetches, library slots, manager liveness
        self.state = WorkerState(
            self.store,
            self.name,
            self.peer_address,
            manager_timeout,
            fetch_timeout,
            time.monotonic(),
            address=address,
            process_slots=self.task_slots,
            gpus=gpus,
        )
        exports = self.state.live_tasks.exports  # (their copies raise limits)
        self.watch = MemoryWatch(self.memory, self.state.tasks, self.store, self.name, exports)
        self.gpus = self.state.dispatch.gpus  #: device ids (``--gpus``), read
        self.library_by_fd: dict[int, h.Library] = {}
        #: the same libraries by id (``LibraryRecord.id``), for the state's requests
        self.library_by_id: dict[int, h.Library] = {}
        #: task processes (task_mode="tasks") by the fd that says they exited
        self.process_by_fd: dict[int, h.TaskProcess] = {}
        #: functions written to ``functions_dir`` for task processes
        self.functions_dir = os.path.join(self.workdir, "functions")
        self.functions_written: set[bytes] = set()
        #: events for the state's next ``handle``: what the loop read, and the answers
        #: to instructions (a library's death, a peer that cannot be reached...)
        self.events: list[Event] = []
        #: records for the manager, sent as one batch at the end of the pass
        self.outbox: list[p.ToManager] = []
        #: a ``Register`` waits in ``outbox``: its going out is news for the state
        self.register_pending = False
        #: why it was asked to stop (a signal), for the state's next pass
        self.stop_reason: str | None = None
        #: instruction type -> what carries it out (records for the manager: queued)
        self._carriers: dict[type, Callable[[Any], None]] = dict.fromkeys(
            p.TO_MANAGER, self.outbox.append
        )
        self._carriers.update(
            {
                p.Register: self._send_register,
                p.TaskDone: self._send_task_done,
                SendStatus: self._send_status,
                StartLibrary: self._start_library,
                PrepareSoftware: self._prepare_software,
                StopLibraries: self._stop_libraries,
                ToLibrary: self._to_library,
                KillLibrary: self._kill_library,
                StartProcess: self._start_process,
                KillProcess: self._kill_process,
                AskPeer: self._ask_peer,
                ClosePeer: self._close_peer,
                AnswerPeer: self.peers.answer_later,
                Leave: self._on_leave,
                EndRunInputs: self.inputs.end_run,
                EventFailed: self._on_event_failed,
            }
        )
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
        self.events.append(
            Boot(self._registration(), self.library_count, self.lib_slots, own_python())
        )
        try:
            self._handle(time.monotonic())
            while self.running:
                self._loop_once()
        finally:
            self._close()
        logger.log(
            self.leave_level,
            "worker %s left %s: %s (exit status %d)",
            self.name,
            self.address,
            self.leave_reason,
            self.exit_code,
        )
        return self.exit_code

    def _registration(self) -> p.Register:
        """What it registers with: the state sends it once every library is ready."""
        return p.Register(
            p.PROTOCOL_VERSION,
            self.name,
            self.task_slots,
            self.memory,
            socket.gethostname(),
            self.peer_address,
            os.getpid(),
            len(self.gpus.devices),
        )

    def stop(self, reason: str = "it was stopped") -> None:
        """Stop at the end of this pass (a signal handler may call it): the state says
        goodbye to the manager and leaves."""
        if self.running and self.stop_reason is None:
            self.stop_reason = reason

    def _on_leave(self, leave: Leave) -> None:
        """The state's ``Leave``, or the shell's own (refused by the manager's keys)."""
        if not self.running:
            return
        self.leave_reason = leave.reason
        self.leave_level = leave.level
        self.exit_code = leave.exit_code
        if leave.unreachable:
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
        self.software.close()
        self.input_peers.close()
        self.handshakes.close()
        # A manager that is gone or refused us will not take what is queued for it.
        self.manager.close(linger=0 if self.manager_gone else None)
        self.context.term()
        self.store.close()
        self.watch.close()
        self.inputs.close()  # (its libraries are gone: what they used is free)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the loop ---------------------------------------------------------------------

    def _loop_once(self) -> None:
        events = self.events
        for sock, _ in self.poller.poll(self._poll_timeout_ms()):
            if sock is self.manager:
                self._drain_manager()
            elif sock is self.peers.server:
                self.peers.serve(self.state.live, events)
            elif sock is self.handshakes.events:
                self._on_handshake_events()
            elif sock == self.software.wake_fd:
                events.extend(self.software.drain())
            elif isinstance(sock, int):
                lib = self.library_by_fd.get(sock)
                if lib is not None:
                    self._on_library_readable(lib)
                else:
                    self._on_process_exit(self.process_by_fd[sock])
            else:
                self.peers.drain(sock, events)
        now = time.monotonic()
        for lib, task, peak, limit, kind in self.watch.look(self.library_by_id, now):  # killed
            events.append(MemoryExceeded(lib.record.id, task.id, peak, limit, kind))
            self._library_died(lib)
        events.append(Tick(time.time()))
        self.inputs.retry(now)
        if self.stop_reason is not None:
            events.append(Stop(self.stop_reason))
        self._handle(now)
        dropped = self.inputs.take_dropped()  # (its runs' cleanups: the manager hears)
        if dropped is not None:
            self.outbox.append(dropped)
        self._flush()

    def _handle(self, now: float) -> None:
        """Hand the state the events gathered, carry out its instructions, and again
        with what they answered (a death, a peer that cannot be reached), until none."""
        events = self.events
        carriers = self._carriers
        state = self.state
        while events:
            batch = events[:]
            events.clear()
            for instruction in state.handle(batch, now):
                carriers[type(instruction)](instruction)

    def _poll_timeout_ms(self) -> int:
        if not self.running or self.events or self.stop_reason is not None:
            return 0
        now = time.monotonic()
        timeout = min(self.state.poll_timeout(now), self.watch.timeout(now))
        busy = self.outbox or self.peers.requests  # (peers: answers left for next turn)
        return 0 if busy else int(timeout * 1000) + 1

    def _flush(self) -> None:
        outbox = self.outbox
        if outbox and not self.manager_gone:
            messages = outbox[:]
            outbox.clear()
            try:
                send_batch(self.manager, p.encode(messages))
            except zmq.Again:  # no connection took it in time: kept for the next pass
                outbox[:0] = messages
            else:
                if self.register_pending:  # the manager's deadline starts now
                    self.register_pending = False
                    self.events.append(_REGISTRATION_SENT)
                    self._handle(time.monotonic())
        self.peers.flush(self.state.live, self.events)  # (exports asked: the next pass's)

    def _send_register(self, register: p.Register) -> None:
        self.register_pending = True
        self.outbox.append(register)

    def _send_status(self, status: SendStatus) -> None:
        self.outbox.append(h.status(status, self.library_by_fd.values()))

    # -- the manager ------------------------------------------------------------------

    def _on_handshake_events(self) -> None:
        """CurveZMQ handshakes with the manager: give up, saying why, once refused."""
        before = self.handshakes.succeeded
        why = self.handshakes.refusal()
        again = bool(before) and self.handshakes.succeeded > before  # (a lost registration)
        self.events.append(ManagerConnection(self.handshakes.connected, again))
        if why is not None:
            self._on_leave(
                Leave(
                    f"it could not authenticate with the manager: {why}. Join with the "
                    "manager's current connection file (--connection-file): a manager "
                    "restarted without key_file has new keys",
                    EXIT_AUTH_FAILED,
                    logging.ERROR,
                    unreachable=True,
                )
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

    def _on_manager_frames(self, frames: Sequence[p.Frame]) -> None:
        """One batch from the manager, each record checked on its own: a bad one is
        dropped (an ``Unreadable`` event: its task is reported crashed), the others are
        events for the state. Only a valid record shows that the manager is there."""
        now = time.monotonic()
        events = self.events
        try:
            messages = p.unpack(frames, p.TO_WORKER)
        except ProtocolError as exc:
            self._drops.warn(
                "manager",
                now,
                "worker %s dropped a malformed message from the manager: %s",
                self.name,
                exc,
            )
            events.append(Unreadable(None, str(exc)))
            return
        for message in messages:
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    "manager",
                    now,
                    "worker %s dropped a malformed record from the manager: %s",
                    self.name,
                    exc,
                )
                events.append(Unreadable(message, str(exc)))
                continue
            if type(message) is p.FetchInputs:
                self.input_peers.fetch(message)  # (beside the work: the state never knows)
                continue
            if type(message) is p.RunConfig and message.inputs:
                self.inputs.own()  # before its tasks claim anything
                announced = self.input_peers.announce(message.input_peers)
                if announced is not None:
                    self.outbox.append(announced)
            if type(message) is p.RunConfig and message.files:
                digest = files_digest(message.files)
                try:
                    message = self.software.with_files(message)
                except OSError as exc:  # its tasks would fail reading them: say so now
                    logger.error("worker %s cannot write a run's files: %s", self.name, exc)
                else:  # (libraries that started without them are replaced)
                    events.append(FilesShipped(digest))
            events.append(message)
            if type(message) is p.Welcome:
                held = self.input_peers.announce(None)  # (its node's cache, for placement)
                if held is not None:
                    self.outbox.append(held)
                logger.info(
                    "worker joined %s as %s with %s (%s, %s at once)",
                    self.address,
                    message.name,
                    counted(self.cores, "core"),
                    counted(self.library_count, "library", "libraries"),
                    counted(self.task_slots, "task"),
                )

    def _on_event_failed(self, failed: EventFailed) -> None:
        """An event the state could not handle: said (rate-limited), the worker goes on."""
        event, exc = failed
        now = time.monotonic()
        if type(event) is p.Data:
            self._drops.warn(
                ("data",),
                now,
                "worker %s could not take result %d from a peer: %r",
                self.name,
                event.task_id,
                exc,
                exc_info=exc,
            )
            return
        kind = type(event).__name__
        source = " from the manager" if type(event) in p.TO_WORKER else ""
        self._drops.warn(
            ("handling", kind),
            now,
            "worker %s could not handle a %s%s: %r",
            self.name,
            kind,
            source,
            exc,
            exc_info=exc,
        )

    # -- libraries --------------------------------------------------------------------

    def _start_library(self, start: StartLibrary) -> None:
        if not self.running:
            return  # leaving: no new process (the state forgets it with the worker)
        record = self.state.dispatch.libraries[start.library_id]
        if start.software is None:
            lib = h.start_library(record, self.name, self.tasks_dir, self.task_cores, start.gpus)
        else:
            python, env = self.software.launch(start.software)
            try:
                lib = h.start_library_with(
                    python, env, record, self.name, self.tasks_dir, self.task_cores, start.gpus
                )
            except OSError as exc:
                self.events.append(LibraryDied(record.id, f"could not start: {exc}", None))
                return
        self.library_by_fd[lib.conn.fileno()] = lib
        self.library_by_id[record.id] = lib
        self.poller.register(lib.conn.fileno(), zmq.POLLIN)

    def _prepare_software(self, prepare: PrepareSoftware) -> None:
        self.software.prepare(prepare.software)

    def _stop_libraries(self, stop: StopLibraries) -> None:
        """Stop idle libraries whose software is replaced (the state forgot them)."""
        stopping = [self.library_by_id.pop(i) for i in stop.library_ids if i in self.library_by_id]
        for lib in stopping:
            fd = lib.conn.fileno()
            self.poller.unregister(fd)
            del self.library_by_fd[fd]
        h.stop_libraries(stopping, 2.0)

    def _to_library(self, write: ToLibrary) -> None:
        lib = self.library_by_id.get(write.library_id)
        if lib is None:
            return  # died since, on an earlier request (its death is the state's news)
        request = write.request
        if type(request) is pipe.Export:  # its copies are not its tasks'
            self.watch.exporting(lib.record.id, self.state.live.bytes_of(request.task_ids))
        try:
            pipe.send(lib.conn, request)
        except OSError:
            self._library_died(lib)

    def _on_library_readable(self, lib: h.Library) -> None:
        """Take every reply the library has written so far, as events."""
        events = self.events
        library_id = lib.record.id
        wall = time.time()
        while True:
            try:
                reply = pipe.receive_reply(lib.conn)
            except (EOFError, OSError):
                self._library_died(lib)
                return
            events.append(FromLibrary(library_id, reply, wall))
            if not lib.pending.poll(0):
                return

    def _library_died(self, lib: h.Library) -> None:
        """Reap a library that is gone; its death is news for the state (which starts
        another in its place)."""
        fd = next(fd for fd, other in self.library_by_fd.items() if other is lib)
        self.poller.unregister(fd)
        del self.library_by_fd[fd]
        del self.library_by_id[lib.record.id]
        how = h.reap_library(lib, self.tasks_dir)
        self.events.append(LibraryDied(lib.record.id, how, h.running_tasks(lib)))

    def _kill_library(self, kill: KillLibrary) -> None:
        """Kill a library (an aborted task runs there; its GPUs are wanted elsewhere)."""
        lib = self.library_by_id.get(kill.library_id)
        if lib is not None:
            lib.process.kill()
            self._library_died(lib)

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def _start_process(self, start: StartProcess) -> None:
        task = start.task
        software = self.state.software
        h.write_functions(self.state.functions, self.functions_written, self.functions_dir)
        try:
            proc = h.start_task_process(
                task,
                start.call,
                self.tasks_dir,
                self.functions_dir,
                self.name,
                self.task_cores,
                start.gpus,
                None if software is None else self.software.launch(software),
            )
        except OSError as exc:
            self.events.append(ProcessFailed(task, str(exc)))
            return
        self.events.append(ProcessStarted(task))
        self.process_by_fd[proc.fd] = proc
        self.poller.register(proc.fd, zmq.POLLIN)

    def _kill_process(self, kill: KillProcess) -> None:
        """Kill an aborted task's process (reaped as it exits, its reply ignored)."""
        for proc in self.process_by_fd.values():
            if proc.task is kill.task:
                proc.process.kill()

    def _on_process_exit(self, proc: h.TaskProcess) -> None:
        self.poller.unregister(proc.fd)
        del self.process_by_fd[proc.fd]
        reply = h.reap_task_process(proc, self.name, logger)
        self.events.append(ProcessExited(proc.task, reply, time.time()))

    # -- peers ------------------------------------------------------------------------

    def _ask_peer(self, ask: AskPeer) -> None:
        self.peers.ask(ask, self.events)

    def _send_task_done(self, done: p.TaskDone) -> None:
        peers = self.input_peers
        self.outbox.append(peers.relabel(done) if done.inputs or peers.drops else done)

    def _close_peer(self, close: ClosePeer) -> None:
        self.peers.reset(close.address)


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
        software_cache=args.software_cache,
        input_cache=args.input_cache,
    )
