"""The worker's bookkeeping as a sans-I/O state machine: events in, instructions out.

``shell.Worker`` is the I/O shell (ZeroMQ, pipes, processes, the filesystem); this is
everything it decides. ``WorkerState.handle(events, now)`` takes what happened (the
events of ``messages``: records from the manager and peers, library replies and deaths,
task processes, timers, the manager's connection) and returns what to do (its
instructions: records for the manager, requests for libraries and peers, processes to
start and kill), as ``scheduler.state.SchedulerState.handle`` does; a simulator drives
it the same way, with no shell. It never reads a clock (``now`` is passed in), never
touches a socket, a pipe or a process. Its one collaborator is the ``Store`` of results
(which may spill to disk, as distributed's ``WorkerState.data`` may): membership, put,
release.

``WorkerState`` holds the tasks, their transitions and the manager's liveness, and owns
three components, each with its own state, which the shell never sees; they append
their instructions to the state's one list (``_out``):

- ``fetcher`` (``fetching.Fetcher``): copies of inputs from peers, and relays;
- ``live_tasks`` (``live_tasks.LiveTasks``): the results libraries keep live, exports;
- ``dispatch`` (``dispatch.Dispatch``): the libraries, the queues of tasks ready to run,
  the requests to send them, chains and stealing.

Each ``handle`` applies its events in order, then ends the pass: requests to libraries
with free slots, task processes to start, one ``Started`` for the tasks sent to run
(before any report of them), fetches that found a slot, the store's fullness, the bytes
received from peers, live results past the memory limit, and one ``AskPeer`` per peer.

A task moves through these states; every legal edge is in ``_TRANSITIONS`` and any other
raises ``InvalidTransition``::

    new ──► waiting ──► queued ──► running ──► forgotten
     │        │           ▲ │         │
     │        │           │ └─────────┼──► forgotten  (cancelled, input lost, cannot start)
     │        │           └───────────┘    (its library died before it started)
     │        └──► forgotten                (cancelled, withdrawn, no peer could serve)
     └──► queued / forgotten                (inputs all here / one input held nowhere)

``waiting``: some inputs are not in the store yet (fetched from peers, or computed here);
``queued``: every input is here, it waits for a library slot (or a task process slot);
``running``: sent to a library or a task process; ``forgotten``: out of ``tasks``, with
nothing left of it in any other container.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from daskvine_py.errors import InvalidTransition, SerializationError
from daskvine_py.wire import protocol as p
from daskvine_py.wire.exits import EXIT_NO_LIBRARIES, EXIT_NO_MANAGER, EXIT_REJECTED, EXIT_UNFIT
from daskvine_py.wire.serialize import dumps_exception, type_name
from daskvine_py.worker import pipe
from daskvine_py.worker.activity import PROCESS_LANE, Activity
from daskvine_py.worker.dispatch import Dispatch
from daskvine_py.worker.fetching import MAX_PEER_LINKS, Fetch, Fetcher
from daskvine_py.worker.live_tasks import MANAGER_IDENT, LiveTasks
from daskvine_py.worker.messages import (
    AnswerPeer,
    Boot,
    EndRunInputs,
    Event,
    EventFailed,
    FilesShipped,
    FromLibrary,
    Instruction,
    KillLibrary,
    KillProcess,
    Leave,
    LibraryDied,
    ManagerConnection,
    MemoryExceeded,
    PeerAsked,
    PeerUnreachable,
    PrepareSoftware,
    ProcessExited,
    ProcessFailed,
    ProcessStarted,
    RegistrationSent,
    SendStatus,
    SoftwarePrepared,
    StartLibrary,
    StartProcess,
    Stop,
    StopLibraries,
    Tick,
    ToLibrary,
    Unreadable,
)
from daskvine_py.worker.records import LibraryRecord, TaskStateName, WorkerTask
from daskvine_py.worker.store import Store

logger = logging.getLogger("daskvine_py.worker")

#: Run configurations kept for runs that may still send tasks; older ones are forgotten.
MAX_RUN_CONFIGS = 256
#: Reports that end a task which ran to its end: its ``Started`` earlier in the same
#: pass tells the manager nothing these do not (``_drop_started_ended_after``).
_RAN_TO_ITS_END = (p.TaskDone, p.TaskErred)
#: Seconds a ``Started`` that would travel alone waits for company (``_hold_started``):
#: a tiny task's report comes within it, and the ``Started`` is then dropped. One batch
#: to the manager instead of two per task that finishes alone: the manager's thread
#: wakes once, not twice, in a one-task ``compute``. A longer task is said to have
#: started this much later, which nothing of the manager times to the millisecond
#: (fast abort, the stall check and the dashboard count in seconds).
STARTED_HOLD = 0.002
#: A worker connected to its manager (the connection up, the handshake done) waits this
#: many ``manager_timeout``s for the answer to its registration (10 minutes by default):
#: a manager busy welcoming a storm of workers is not a dead one. Unconnected, it gives
#: up after one ``manager_timeout``, counted from the registration or the disconnection.
REGISTRATION_PATIENCE = 20
#: Library processes that may die before the worker has registered before it gives up:
#: the manager's deadline only starts with the registration, so without this bound a
#: library that cannot start (a broken environment, no memory) would be restarted forever.
MAX_START_FAILURES = 3

Edge = tuple[TaskStateName, TaskStateName]
Step = Callable[[WorkerTask], None]

#: Every legal edge of a task's states and the name of its step, the method that does
#: what the edge does besides setting the state (None: nothing more; its fetches, local
#: waits or exports are in place). The caller records where a task runs; "start" has it
#: reported in the pass's ``Started``.
_TRANSITIONS: dict[Edge, str | None] = {
    ("new", "waiting"): None,
    ("new", "queued"): "enqueue",
    ("new", "forgotten"): "forget",
    ("waiting", "queued"): "enqueue",
    ("waiting", "running"): "start",  # sent with the task it waits for (a chain)
    ("waiting", "forgotten"): "forget",
    ("queued", "waiting"): None,  # an input must first leave another library (export)
    ("queued", "running"): "start",
    ("queued", "forgotten"): "forget",
    ("running", "queued"): "requeue",  # its library died before it started, or was killed
    ("running", "forgotten"): "forget_running",
}


def _illegal(task: WorkerTask) -> None:
    """Stands for an edge that is not in ``_TRANSITIONS`` (never called)."""
    raise AssertionError("an illegal transition is raised before its step")


class WorkerState:
    """The worker's tasks and manager liveness, and its components; see the module
    docstring. ``peer_address`` names this worker in ``FetchFailed``; ``name`` in
    crash reasons and logs, ``address`` (the manager's) in logs. ``process_slots``:
    task processes run at once (``task_mode="tasks"``); ``gpus``: the devices it has
    (``--gpus``); ``peer_links``: peers it holds a socket to at once."""

    def __init__(
        self,
        store: Store,
        name: str = "worker",
        peer_address: str = "",
        manager_timeout: float = 30.0,
        fetch_timeout: float = 10.0,
        now: float = 0.0,
        *,
        address: str = "the manager",
        process_slots: int = 1,
        gpus: Sequence[str] = (),
        peer_links: int = MAX_PEER_LINKS,
        started_hold: float = STARTED_HOLD,
    ) -> None:
        self.store = store
        self.name = name
        self.peer_address = peer_address
        self.address = address
        self.manager_timeout = manager_timeout
        self.heartbeat_interval = 1.0
        #: task id -> its record, from ``Execute`` until it is forgotten
        self.tasks: dict[int, WorkerTask] = {}
        #: input being computed here -> tasks sent ahead that wait for it
        self.local_waiters: dict[int, set[int]] = {}
        #: ``Execute``s of results held here, answered at the end of the pass
        #: (``_answer_held``)
        self.held_answers: dict[int, p.Execute] = {}
        #: run id -> how its tasks run, for runs that do not use the defaults
        self.run_configs: dict[int, p.RunConfig] = {}
        self.disk_full = False
        #: the instructions of the ``handle`` under way; the components append to it too
        self._out: list[Instruction] = []
        out = self._out
        #: tasks that went running since the last ``Started`` (one record per pass)
        self.started: list[WorkerTask] = []
        #: a ``Started`` is among this pass's instructions (``_drop_started_ended_after``)
        self._started_sent = False
        #: ids of tasks that started, whose ``Started`` waits for company until
        #: ``started_due``, at most ``started_hold`` seconds (``_hold_started``; 0: never)
        self.held_started: list[int] = []
        self.started_due = 0.0
        self.started_hold = started_hold
        #: tasks sent to a library behind the ones its slots run: reported ``Started`` when
        #: a reply frees a slot for them (the manager times a task from its ``Started``)
        self.behind: set[int] = set()
        #: libraries killed to abort a task they ran: their deaths crash no task
        self.aborting: set[int] = set()
        #: task processes started and not yet exited (killed ones too), and how many may run
        self.processes: set[WorkerTask] = set()
        self.process_slots = process_slots
        #: what ran, was fetched and spilled here since the last heartbeat (its bars)
        self.activity = Activity()
        store.on_spill = self.activity.add_spills
        self.fetcher = Fetcher(fetch_timeout, out, self._fetch_failed, peer_links)
        self.live_tasks = LiveTasks(store, out)
        #: the results the libraries keep live (``live_tasks``'s), read here and by the shell
        self.live = self.live_tasks.live
        self.dispatch = Dispatch(
            self.tasks,
            self.local_waiters,
            self.live_tasks,
            store,
            self._transition,
            self._input_lost,
        )
        self.dispatch.gpus.declare(gpus)
        #: legal edges -> what each does besides setting the state; the dispatch's
        #: queues called directly, with no call of ours in between
        steps: dict[str, Step] = {
            "enqueue": self.dispatch.enqueue,
            "start": self.started.append,  # (``Started``)
            "requeue": self._requeue,
            "forget": self._forget,
            "forget_running": self._running_to_forgotten,
        }
        self._steps: dict[Edge, Step | None] = {
            edge: None if name is None else steps[name] for edge, name in _TRANSITIONS.items()
        }
        #: event type -> its handler; the manager's records and a peer's ``Data`` as they
        #: arrive, the others from ``messages``
        self._handlers: dict[type, Callable[[Any, float], None]] = {
            p.Execute: self._on_execute,
            p.RunConfig: self._on_run_config,
            p.RunEnded: self._on_run_ended,
            p.Function: self._on_function,
            p.Release: self._on_release,
            p.Cancel: self._on_cancel,
            p.Abort: self._on_abort,
            p.Withdraw: self._on_withdraw,
            p.Replicate: self._on_replicate,
            p.Upload: self._on_upload,
            p.Relayed: self._on_relayed,
            p.Welcome: self._on_welcome,
            p.Heartbeat: _nothing,
            p.Rejected: self._on_rejected,
            p.Shutdown: self._on_shutdown,
            p.Data: self._on_data,
            Boot: self._on_boot,
            Tick: self._on_tick,
            Stop: self._on_stop,
            ManagerConnection: self._on_manager_connection,
            RegistrationSent: self._on_registration_sent,
            Unreadable: self._on_unreadable,
            FromLibrary: self._on_from_library,
            LibraryDied: self._on_library_death,
            MemoryExceeded: self._on_memory_exceeded,
            ProcessStarted: self._on_process_started,
            ProcessFailed: self._on_process_failed,
            ProcessExited: self._on_process_exited,
            PeerUnreachable: self._on_peer_unreachable,
            PeerAsked: self._on_peer_asked,
            SoftwarePrepared: self._on_software_prepared,
            FilesShipped: self._on_files_shipped,
        }
        #: the records that show the manager is there (``last_contact``)
        self._from_manager = p.TO_WORKER
        #: the manager welcomed us; when we last heard from it and sent it a heartbeat
        self.registered = False
        self.last_contact = now
        self.last_sent = 0.0
        #: the ``Register`` to send once every library is ready (``Boot``); whether it was
        self.registration: p.Register | None = None
        self.register_out = False
        #: library processes that died before the registration went out
        self.start_failures = 0
        self.next_library_id = 0
        self.lib_slots = 1
        #: when the registration went out (None: not yet, its libraries still starting):
        #: the manager's silence counts from then, not from the worker's start
        self.registration_sent: float | None = None
        #: the connection to the manager is up (the shell's ``HandshakeWatch`` says)
        self.manager_connected = False
        #: what answers there sent something unreadable: not a busy manager, no patience
        self.manager_garbled = False
        #: the one warning that it still waits for its welcome, connected, has been given
        self.warned_waiting = False
        #: a ``Leave`` went out: nothing new starts
        self.leaving = False
        #: libraries to keep running (``Boot``), whatever software they start with
        self.library_count = 0
        #: libraries may start with the worker's own Python (False: the small install)
        self.own_python = True
        #: the key of the software the libraries run (None: the worker's own Python) and
        #: of the one the latest run needs; while they differ no task starts, and the
        #: libraries are replaced once the new one is prepared and the old ones are idle
        self.software: str | None = None
        self.software_wanted: str | None = None
        #: software keys prepared on the node (``SoftwarePrepared``) and being prepared
        self.prepared: set[str] = set()
        self.preparing: set[str] = set()
        #: libraries of the shipped software that died before they were ready
        self.software_failures = 0
        #: the files the libraries started with (``FilesShipped.digest``; "": none) and
        #: those the latest run shipped: while they differ, the libraries are replaced
        #: as software is (``_switch_software``)
        self.files = ""
        self.files_wanted = ""

    @property
    def functions(self) -> dict[bytes, bytes]:
        """Function id -> cloudpickle bytes, for task processes."""
        return self.dispatch.functions

    # -- entry point ------------------------------------------------------------------

    def handle(self, events: Iterable[Event], now: float) -> list[Instruction]:
        """Apply ``events`` (``messages``) in order, then end the pass (see the module
        docstring); return the instructions, in the order to carry them out.

        Never raises: an event whose handling raises is reported (``EventFailed``); an
        ``Execute`` so lost is reported crashed to the manager, a peer's ``Data`` so lost
        fails the tasks that waited for it.
        """
        out = self._out
        handlers = self._handlers
        from_manager = self._from_manager
        for event in events:
            kind = type(event)
            handler = handlers.get(kind)
            if handler is None:
                out.append(EventFailed(event, TypeError(f"not a worker event: {event!r:.80}")))
                continue
            if kind in from_manager:
                self.last_contact = now
            try:
                handler(event, now)
            except Exception as exc:
                out.append(EventFailed(event, exc))
                self._on_handler_error(event, exc)
        try:
            self._end_pass(now)
        except Exception as exc:  # (a bug: said, and the worker goes on)
            out.append(EventFailed(None, exc))
        if self._started_sent or self.held_started:
            self._started_sent = False
            self._hold_started(out, now)
        instructions = out.copy()
        out.clear()  # (the list is shared with the components: emptied, never replaced)
        return instructions

    def _hold_started(self, out: list[Instruction], now: float) -> None:
        """Send the pass's ``Started`` with the pass's other records for the manager, or
        hold it (``STARTED_HOLD``) when it would go alone; a held one goes first (its
        tasks started before anything of this pass) with the next pass that sends
        anything, or alone once due. Either way a task whose report follows in the
        same batch is left out of it (``_drop_started_ended_after``)."""
        held = self.held_started
        if held:
            out.insert(0, p.Started(tuple(held)))
            held.clear()
        _drop_started_ended_after(out)
        if not self.started_hold:
            return
        alone = True
        for instruction in out:
            kind = type(instruction)
            if kind is not p.Started and kind in p.TO_MANAGER:
                alone = False
                break
        if not alone or (self.started_due and now >= self.started_due):
            self.started_due = 0.0
            return
        for index in range(len(out) - 1, -1, -1):
            instruction = out[index]
            if isinstance(instruction, p.Started):
                held[:0] = instruction.task_ids
                del out[index]
        if len(held) > 1:
            held[:] = dict.fromkeys(held)  # (one started anew while held: said once)
        if held and not self.started_due:
            self.started_due = now + self.started_hold

    def _on_handler_error(self, event: object, exc: Exception) -> None:
        kind = type(event)
        if kind is p.Data:  # storing it failed: the tasks that wait give up on it
            self.fetcher.on_data_error(event.task_id)  # type: ignore[attr-defined]
        elif kind in self._from_manager:
            self._cannot_take(event, f"it could not take the task: {exc!r}")

    def _end_pass(self, now: float) -> None:
        """Once per ``handle``: start what can start, report the tasks that started,
        start fetches that found a slot, report a change of the store's fullness and the
        bytes received from peers, spill live results past the memory limit, ask peers."""
        out = self._out
        dispatch = self.dispatch
        if self.held_answers:
            self._answer_held(now)
        if self._replacing() and not self.leaving:
            self._switch_software()
        if not self.leaving and not self._replacing():
            for record, request in dispatch.start_runnable():
                out.append(ToLibrary(record.id, request))
            gpus = dispatch.gpus
            if gpus.restarts:  # its replacement gets other GPUs
                out.extend(KillLibrary(library_id) for library_id in gpus.take_restarts())
            if dispatch.process_runnable:
                self._start_processes()
        if self.started:
            self._report_started()
        fetcher = self.fetcher
        if fetcher.slots.freed:  # (most passes: no call)
            fetcher.start_queued(now)
        if self.store.full is not self.disk_full:
            self.disk_full = self.store.full
            logger.warning("worker %s disk full: %s", self.name, self.disk_full)
            out.append(p.DiskFull(self.disk_full))
        if fetcher.received_from:
            fetcher.report_received()
        store = self.store
        live = self.live
        if store.memory_limit is not None and live.nbytes:  # (running tasks' room counts too)
            excess = live.nbytes - live.leaving_bytes + store.memory_bytes + store.allocated
            excess -= store.memory_limit
            if excess > 0:
                self.live_tasks.evict(excess)
        if fetcher.asks or fetcher.slots.evicted:
            fetcher.flush()

    # -- queries ----------------------------------------------------------------------

    def poll_timeout(self, now: float) -> float:
        """Seconds until the next deadline: the manager's silence, the next heartbeat, a
        held ``Started``, a fetch's timeout (the next ``Tick`` is due then)."""
        if self.registration_sent is None and not self.registered:
            deadline = now + self.manager_timeout  # no clock runs until it goes out
        elif self._waits_connected():
            sent = self.registration_sent or now
            patience = REGISTRATION_PATIENCE if self.warned_waiting else 1
            deadline = sent + patience * self.manager_timeout
        else:
            deadline = self.last_contact + self.manager_timeout
        if self.registered:  # heartbeats start with registration; until then, nothing is due
            deadline = min(deadline, self.last_sent + self.heartbeat_interval)
        if self.held_started:
            deadline = min(deadline, self.started_due)
        return max(0.0, self.fetcher.deadline(deadline) - now)

    def manager_silent(self, now: float) -> bool:
        if self.registration_sent is None and not self.registered:
            return False  # nothing asked of the manager yet: its silence means nothing
        if self._waits_connected():
            waited = now - (self.registration_sent or now)
            return waited > REGISTRATION_PATIENCE * self.manager_timeout
        return now - self.last_contact > self.manager_timeout

    def _waits_connected(self) -> bool:
        return not self.registered and self.manager_connected and not self.manager_garbled

    def heartbeat_due(self, now: float) -> bool:
        return self.registered and now - self.last_sent > self.heartbeat_interval

    # -- the worker's life ------------------------------------------------------------

    def _on_boot(self, ev: Boot, now: float) -> None:
        self.registration = ev.register
        self.lib_slots = ev.slots
        self.library_count = ev.libraries
        self.own_python = ev.own_python
        if ev.own_python:
            for _ in range(ev.libraries):
                self._start_library()
        if not ev.libraries or not ev.own_python:  # (the small install's come with software)
            self._register()

    def _register(self) -> None:
        """Join the manager: once every library is ready to run tasks at once."""
        if self.registration is not None:
            self.register_out = True
            self._out.append(self.registration)

    def _start_library(self) -> None:
        self.next_library_id += 1
        record = self.dispatch.add_library(self.next_library_id, self.lib_slots)
        gpus = self.dispatch.gpus.env(record.id)
        self._out.append(StartLibrary(record.id, record.slots, gpus, self.software))

    def _leave(
        self, reason: str, exit_code: int = 0, level: int = logging.INFO, unreachable: bool = False
    ) -> None:
        if not self.leaving:
            self.leaving = True
            self._out.append(Leave(reason, exit_code, level, unreachable))

    def _on_stop(self, ev: Stop, now: float) -> None:
        if not self.leaving and self.registered:
            self._out.append(p.Goodbye(ev.reason))
        self._leave(ev.reason)

    def _on_shutdown(self, msg: p.Shutdown, now: float) -> None:
        self._on_stop(Stop(f"the manager asked it to ({msg.reason})"), now)

    def _on_rejected(self, msg: p.Rejected, now: float) -> None:
        self._leave(f"the manager rejected it: {msg.reason}", EXIT_REJECTED, logging.ERROR)

    def _on_welcome(self, msg: p.Welcome, now: float) -> None:
        self.registered = True
        self.heartbeat_interval = msg.heartbeat_interval

    def _on_manager_connection(self, ev: ManagerConnection, now: float) -> None:
        """The connection to the manager went up or down. Down, an unanswered registration
        has one ``manager_timeout`` from now for the connection to come back; up again,
        a registration that went out on the lost one goes again."""
        if ev.connected is not self.manager_connected:
            self.manager_connected = ev.connected
            if not ev.connected and not self.registered:
                self.last_contact = now
        if ev.again and self.register_out and not self.registered:
            if self.registration_sent is not None:
                self._register()

    def _on_registration_sent(self, ev: RegistrationSent, now: float) -> None:
        """The registration went out: the manager has ``manager_timeout`` to answer."""
        if self.registration_sent is None:
            self.registration_sent = now
            self.last_contact = now

    def _on_unreadable(self, ev: Unreadable, now: float) -> None:
        if ev.message is None:
            self.manager_garbled = True  # (a busy manager would still speak the protocol)
        else:
            self._cannot_take(ev.message, f"it could not read the task: {ev.why}")

    def _on_tick(self, ev: Tick, now: float) -> None:
        """Timers: the manager's silence (leave), the heartbeat, fetches past their
        deadline (to their next holder, the silent peer's socket closed)."""
        if self.leaving:
            return
        if self._waiting_warning_due(now):
            logger.warning(
                "worker %s has waited %.0f s for %s to answer its registration "
                "(--manager-timeout %g); the connection is up, so the manager is busy: it "
                "waits on, up to %.0f s",
                self.name,
                now - (self.registration_sent or now),
                self.address,
                self.manager_timeout,
                REGISTRATION_PATIENCE * self.manager_timeout,
            )
        if self.manager_silent(now):
            self._on_manager_silent(now)
            return
        if self.heartbeat_due(now):  # busy or not: the manager draws memory over time
            self.last_sent = now
            store = self.store
            bars = self.activity.take(ev.wall - now)  # (fetches: the loop's clock)
            self._out.append(SendStatus(store.nbytes + self.live.nbytes, store.disk_bytes, bars))
        self.fetcher.on_timers(now)

    def _waiting_warning_due(self, now: float) -> bool:
        """Once: the registration has waited ``manager_timeout`` for an answer over a
        connection that is up, and the worker waits on."""
        if self.warned_waiting or not self._waits_connected() or self.registration_sent is None:
            return False
        if now - self.registration_sent <= self.manager_timeout:
            return False
        self.warned_waiting = True
        return True

    def _on_manager_silent(self, now: float) -> None:
        silent = now - self.last_contact
        timeout = self.manager_timeout
        if self.registered:
            logger.warning(
                "worker %s lost the manager at %s: nothing heard from it for %.0f s "
                "(--manager-timeout %g)",
                self.name,
                self.address,
                silent,
                timeout,
            )
            self._leave("the manager was lost", 0, logging.INFO, unreachable=True)
        elif self.manager_connected:
            waited = now - (self.registration_sent or now)
            self._leave(
                f"the manager has not answered its registration, sent {waited:.0f} s "
                f"ago, though connected ({REGISTRATION_PATIENCE} x --manager-timeout "
                f"{timeout:g}); is it stopped or overloaded?",
                EXIT_NO_MANAGER,
                logging.ERROR,
                unreachable=True,
            )
        else:
            self._leave(
                f"the manager has not answered its registration, sent {silent:.0f} s ago "
                f"(--manager-timeout {timeout:g}), and no connection to it is up; is a "
                "manager listening there?",
                EXIT_NO_MANAGER,
                logging.ERROR,
                unreachable=True,
            )

    # -- the manager ------------------------------------------------------------------

    def _on_run_config(self, msg: p.RunConfig, now: float) -> None:
        if len(self.run_configs) >= MAX_RUN_CONFIGS:
            del self.run_configs[next(iter(self.run_configs))]
        self.run_configs[msg.run_id] = msg
        self._want_software(msg.software, msg.run_id)

    # -- software (``RunConfig.software``) ----------------------------------------------

    def _on_run_ended(self, msg: p.RunEnded, now: float) -> None:
        self._out.append(EndRunInputs(msg.run_id))

    def _want_software(self, software: p.Software | None, run_id: int) -> None:
        """The latest run needs ``software`` (None: the worker's own Python): prepared on
        the node if it is not, and no task starts until the libraries run it. The newest
        run's software wins: the manager ships one at a time (a changed module is a new
        software, and no library runs the old code after that)."""
        key = None if software is None else software.key
        if key == self.software_wanted:
            return
        self.software_wanted = key
        if software is None:
            if not self.own_python:
                self._no_software(run_id)
            return
        if software.key not in self.prepared and software.key not in self.preparing:
            self.preparing.add(software.key)
            self._out.append(PrepareSoftware(software))

    def _no_software(self, run_id: int) -> None:
        self._unfit(
            "none",
            f"worker {self.name} has no Python environment of its own (dask is not "
            f"installed beside it) and run {run_id} ships none: give the manager or get() "
            "an environment= (docs/environments.md)",
        )

    def _on_files_shipped(self, ev: FilesShipped, now: float) -> None:
        self.files_wanted = ev.digest

    def _on_software_prepared(self, ev: SoftwarePrepared, now: float) -> None:
        self.preparing.discard(ev.key)
        if ev.error is None:
            self.prepared.add(ev.key)
        elif ev.key == self.software_wanted:
            self._unfit(ev.key, ev.error)

    def _unfit(self, key: str, reason: str) -> None:
        """The software a run needs cannot run here: the manager hears why (once, as this
        worker's goodbye) and gives its tasks to others; the worker leaves."""
        if self.leaving:
            return
        if self.register_out:
            self._out.append(p.Goodbye(reason, key))
        self._leave(reason, EXIT_UNFIT, logging.ERROR)

    def _replacing(self) -> bool:
        """Whether the libraries are to be replaced (another software, other files): no
        task starts meanwhile."""
        return self.software_wanted != self.software or self.files_wanted != self.files

    def _switch_software(self) -> None:
        """Replace the libraries with ones of the wanted software (and files), once it is
        prepared and no library runs a task (their live results are lost: reported
        ``Lost``)."""
        key = self.software_wanted
        if key is not None and key not in self.prepared:
            return
        dispatch = self.dispatch
        if self.processes or any(lib.sent for lib in dispatch.libraries.values()):
            return
        stopped = tuple(dispatch.libraries)
        lost: list[int] = []
        for library_id in stopped:
            dispatch.drop_library(library_id)
            dispatch.unhome(library_id)
            lost.extend(self._lose_live(library_id))
        if stopped:
            self._out.append(StopLibraries(stopped))
        if lost:
            self._out.append(p.Lost(tuple(lost)))
        self.software = key
        self.files = self.files_wanted
        self.software_failures = 0
        for _ in range(self.library_count):
            self._start_library()

    def _on_function(self, msg: p.Function, now: float) -> None:
        self.dispatch.add_function(msg.function_id, bytes(msg.code))

    def _on_release(self, msg: p.Release, now: float) -> None:
        for task_id in msg.task_ids:
            self.store.release(task_id)
        self.live_tasks.forget(msg.task_ids)
        if self.held_answers:  # released and made anew in one batch: made here, after all
            for task_id in msg.task_ids:
                again = self.held_answers.pop(task_id, None)
                if again is not None:
                    self._on_execute(again, now)

    def _on_cancel(self, msg: p.Cancel, now: float) -> None:
        for task_id in msg.task_ids:
            self._cancel(task_id)

    def _on_withdraw(self, msg: p.Withdraw, now: float) -> None:
        """Every id answered: dropped, or not given back (running, committed to a
        library's pipe, or not here any more: its report is on its way). The manager
        matches answers to its asks one for one."""
        dropped: list[int] = []
        kept: list[int] = []
        for task_id in msg.task_ids:
            (dropped if self._cancel(task_id) else kept).append(task_id)
        if msg.task_ids:
            self._out.append(p.Withdrawn(tuple(dropped), tuple(kept)))

    def _on_replicate(self, msg: p.Replicate, now: float) -> None:
        if msg.task_id in self.store or msg.task_id in self.live:
            self._out.append(p.Replicas((msg.task_id,)))
        else:
            self.fetcher.replicate(msg.task_id, msg.peers, now)

    def _on_upload(self, msg: p.Upload, now: float) -> None:
        for task_id in msg.task_ids:
            value = self.store.get(task_id, use=False)
            if value is None and self.live_tasks.serve_peer(task_id, MANAGER_IDENT):
                continue  # uploaded once its library has exported it
            self._out.append(p.Uploaded(task_id, value))

    def _on_relayed(self, msg: p.Relayed, now: float) -> None:
        if self.fetcher.relayed(msg.task_id):
            self._on_data(p.Data(msg.task_id, msg.value), now)

    def _cannot_take(self, message: object, why: str) -> None:
        """An ``Execute`` that was dropped (``message``: whatever arrived, perhaps
        malformed): forget what was kept of its task, and tell the manager, which would
        otherwise wait for it forever."""
        if type(message) is not p.Execute or len(message) < 1 or type(message[0]) is not int:
            return
        task_id = message[0]
        task = self.tasks.get(task_id)
        if task is not None and task.state == "running":
            return  # an earlier Execute of it runs: its own report will come
        if task is not None:
            self._transition(task, "forgotten")
        # What a handler that failed half-way kept of it, found by id.
        for dep_id in [d for d, waiters in self.local_waiters.items() if task_id in waiters]:
            self.local_waiters[dep_id].discard(task_id)
            if not self.local_waiters[dep_id]:
                del self.local_waiters[dep_id]
        self.fetcher.unwait_all(task_id)
        self._out.append(p.TaskCrashed(task_id, f"worker {self.name}: {why}"))

    def _on_execute(self, msg: p.Execute, now: float) -> None:
        """A task to run: queued when its inputs are all here, else waiting for them
        (fetched from peers, or computed here)."""
        if msg.task_id in self.tasks:
            return  # re-sent after a cancel while it was running: its result is coming
        if self.software_wanted is None and not self.own_python:
            self._no_software(msg.run_id)  # (a run of the defaults sends no ``RunConfig``)
            return
        if self._holds(msg):
            self.held_answers[msg.task_id] = msg  # answered at the end of the pass
            return
        task = WorkerTask(msg, self.run_configs.get(msg.run_id))
        for dep in msg.deps:
            if dep.value is not None or dep.task_id in self.store or dep.task_id in self.live:
                continue
            if dep.peers is None:  # being computed here: start when it is done
                task.missing.add(dep.task_id)
                self.local_waiters.setdefault(dep.task_id, set()).add(task.id)
                continue
            if not dep.peers:  # the manager thinks we hold it, but we do not
                self._input_lost(task, dep.task_id)
                return
            task.missing.add(dep.task_id)
            self.fetcher.want(dep.task_id, dep.peers, task.id, now)
        self.tasks[task.id] = task
        if task.missing:
            self._transition(task, "waiting")
            self.dispatch.follow(task)
        else:
            self.dispatch.queue(task)

    def _holds(self, msg: p.Execute) -> bool:
        """Whether the result of the task ``msg`` asks for is held here already, as it
        can be answered: stored, or live when its value is not asked for."""
        task_id = msg.task_id
        return task_id in self.store or (task_id in self.live and not msg.want_result)

    def _answer_held(self, now: float) -> None:
        """The end of a pass: the ``Execute``s of results held here (``held_answers``)
        answered from them (``TaskDone``, with the value when asked for or small). Such
        an ``Execute`` was sent again after a ``Cancel`` that crossed the result's
        ``TaskDone``, which the manager counts for it (this answer then finds it done:
        harmless). Run again, the task made a second live copy, or waited for an input
        that the manager, its result in, then cancelled: for ever. One released in the
        same pass was sent again to be made anew (lineage): it runs (``_on_release``),
        as does one whose copy went meanwhile (its library died)."""
        store = self.store
        answers, self.held_answers = self.held_answers, {}
        for task_id, msg in answers.items():
            if not self._holds(msg):
                self._on_execute(msg, now)
                continue
            entry = self.live.entries.get(task_id)
            nbytes = entry.nbytes if entry is not None else store.size(task_id)
            value = None
            if task_id in store and (msg.want_result or store.size(task_id) <= p.INLINE_BYTES):
                value = store.get(task_id, use=False)
                if value is not None and not msg.want_result and not p.inlinable(value):
                    value = None
            self._out.append(p.TaskDone(task_id, nbytes, 0.0, value))

    def _cancel(self, task_id: int) -> bool:
        """Drop a task that has not started (nor been written to a library's pipe);
        whether it was dropped."""
        task = self.tasks.get(task_id)
        if task is None:
            return False
        if task.state == "running":
            if not self.dispatch.unchain(task):
                return False
            if task in self.started:  # (never written: it did not start)
                self.started.remove(task)
        self._transition(task, "forgotten")
        return True

    def _on_abort(self, msg: p.Abort, now: float) -> None:
        """Stop these tasks with no report (the manager gave them to another worker):
        dropped if unstarted, else what runs them is killed (``KillLibrary``,
        ``KillProcess``)."""
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            if task.state == "running":
                if task.lib is not None:
                    if task.lib not in self.aborting:
                        self.aborting.add(task.lib)
                        self._out.append(KillLibrary(task.lib))
                elif task in self.processes:
                    self._out.append(KillProcess(task))
            self._transition(task, "forgotten")  # a late reply finds no task to report

    def _input_lost(self, task: WorkerTask, dep_id: int) -> None:
        """An input of ``task`` is held nowhere here: the manager decides (``FetchFailed``)."""
        self._out.append(p.FetchFailed(task.id, dep_id, (self.peer_address,)))
        self._transition(task, "forgotten")

    # -- peers ------------------------------------------------------------------------

    def _fetch_failed(self, fetch: Fetch) -> None:
        """No holder could serve ``fetch``: the tasks that waited for it are reported."""
        for task_id in fetch.waiters:
            task = self.tasks.get(task_id)
            if task is not None:
                self._out.append(p.FetchFailed(task_id, fetch.dep_id, fetch.peers))
                task.missing.discard(fetch.dep_id)
                self._transition(task, "forgotten")

    def _on_peer_unreachable(self, ev: PeerUnreachable, now: float) -> None:
        """Requests that could not be sent to ``address``: their fetches try the next holder."""
        self.fetcher.on_unreachable(ev.address, ev.task_ids, now)

    def _on_peer_asked(self, ev: PeerAsked, now: float) -> None:
        """A peer asks for results held live only: exported, then answered (``AnswerPeer``);
        one not live here (any more) is answered "not here" at once."""
        serve = self.live_tasks.serve_peer
        for task_id in ev.task_ids:
            if not serve(task_id, ev.ident):
                value = self.store.get(task_id, use=False)
                self._out.append(AnswerPeer(ev.ident, p.Data(task_id, value)))

    def _on_data(self, reply: p.Data, now: float) -> None:
        """A peer's answer: the input (stored, its tasks queued) or None (ask the next)."""
        fetch = self.fetcher.on_data(reply, now)
        value = reply.value
        if fetch is None or value is None:  # (a fetch is done only with a value)
            return
        self.store.put(reply.task_id, value)
        self.activity.add_interval(p.FETCH_LANE, fetch.started, now)
        self._out.append(p.Replicas((reply.task_id,)))
        self._input_arrived(reply.task_id, fetch.waiters)

    def _input_arrived(self, dep_id: int, waiters: set[int]) -> None:
        for task_id in waiters:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            task.missing.discard(dep_id)
            if not task.missing and task.state == "waiting":  # (else queued already)
                self.dispatch.queue(task)

    # -- libraries --------------------------------------------------------------------

    def _on_from_library(self, ev: FromLibrary, now: float) -> None:
        """What a library wrote: replies (tasks' outcomes, exported results), or that it
        is ready (the registration goes once all are)."""
        lib = self.dispatch.libraries.get(ev.library_id)
        if lib is None:
            return  # died since (its death was read first)
        message = ev.message
        kind = type(message)
        if kind is pipe.Replies:
            for reply in message.replies:  # type: ignore[union-attr]
                self._on_library_reply(lib, reply, ev.wall)
        elif kind is pipe.Ready:
            if self.dispatch.on_ready(lib) and not self.register_out:
                self._register()
        else:
            self._on_library_reply(lib, message, ev.wall)  # type: ignore[arg-type]

    def _on_library_reply(
        self, lib: LibraryRecord, reply: pipe.Reply | pipe.Exported, wall: float
    ) -> None:
        """A task's outcome from a library (``wall``: the clock for ``TaskDone.finished``),
        or a result it exported."""
        if type(reply) is pipe.Exported:
            self._on_exported(reply)
            return
        sent = lib.sent
        if sent and sent[0] == reply.task_id:
            sent.popleft()
        else:
            sent.remove(reply.task_id)
        if self.behind:
            self._slot_freed(lib)
        self._on_reply(reply, wall, lib.id)  # type: ignore[arg-type]

    def _slot_freed(self, lib: LibraryRecord) -> None:
        """The tasks that a reply moved from behind into ``lib``'s running slots: they
        start now, and are reported so (before their own replies: ``Started`` is sent
        ahead of a task's report)."""
        behind = self.behind
        for task_id in itertools.islice(lib.sent, lib.slots):
            if task_id in behind:
                behind.discard(task_id)
                task = self.tasks.get(task_id)
                if task is not None and task.state == "running":
                    self.started.append(task)

    def _on_exported(self, reply: pipe.Exported) -> None:
        """A live result, serialized: into the store (the copy every later reader gets),
        then to the tasks and peers that waited for it."""
        wait = self.live_tasks.on_exported(reply)
        if wait is None:
            return
        task_id = reply.task_id
        if reply.value is not None and task_id in self.store:
            self._input_arrived(task_id, wait.tasks)
            return
        for waiter in wait.tasks:  # it could not be serialized: they cannot run elsewhere
            task = self.tasks.get(waiter)
            if task is None:
                continue
            dep_key = next((d.key for d in task.deps if d.task_id == task_id), task_id)
            error = SerializationError(
                dep_key,
                "an input",
                f"{reply.error} (moving it out of its library process on worker {self.name})",
            )
            exception, text = dumps_exception(error)
            self._out.append(p.TaskErred(waiter, exception, text, str(error), type_name(error)))
            task.missing.discard(task_id)
            self._transition(task, "forgotten")

    def _on_library_death(self, ev: LibraryDied, now: float) -> None:
        """A library process died (``how``: its exit): the tasks it was ``running`` (by
        default the first ones sent) crashed; the others sent to it, finished or not
        (their replies may have been held), go back to the front of the queue; the
        results it kept live are lost (the manager recomputes those still needed). One
        killed to abort a task crashed none: the others it ran go back to the queue too.
        A new library takes its place, unless too many died before the registration."""
        lib = self.dispatch.libraries.get(ev.library_id)
        if lib is None:
            return
        self.dispatch.drop_library(lib.id)  # its chained calls are in ``lib.sent``: requeued
        running = ev.running
        if lib.id in self.aborting:
            self.aborting.discard(lib.id)
            running = ()
        elif running is None:
            running = list(lib.sent)[: lib.slots]
        for task_id in running:
            task = self.tasks.get(task_id)
            if task is not None and _sent_to(task, lib) and task_id in lib.sent:
                lib.sent.remove(task_id)
                reason = f"library process {ev.how} on worker {self.name}"
                logger.warning("task %r: %s", task.key, reason)
                self._transition(task, "forgotten")
                self._out.append(p.TaskCrashed(task.id, reason))
        for task_id in reversed(lib.sent):
            queued = self.tasks.get(task_id)
            if queued is not None and _sent_to(queued, lib):  # (not a new record of an
                self._transition(queued, "queued")  # aborted task, sent again elsewhere)
        lib.sent.clear()
        self.dispatch.unhome(lib.id)
        lost = self._lose_live(lib.id)
        if lost:
            logger.warning(
                "worker %s lost %d results kept live by its library process", self.name, len(lost)
            )
            self._out.append(p.Lost(tuple(lost)))
        if self.software is not None and not lib.ready:
            self.software_failures += 1
            if self.software_failures >= MAX_START_FAILURES:
                self._unfit(
                    self.software,
                    f"worker {self.name}: libraries of the shipped environment could not "
                    f"start: {self.software_failures} died before they were ready, the last "
                    f"one {ev.how}",
                )
        if not self.register_out:
            self.start_failures += 1
            if self.start_failures >= MAX_START_FAILURES:
                self._leave(
                    f"its library processes could not start: {self.start_failures} died "
                    f"before it could register, the last one {ev.how}",
                    EXIT_NO_LIBRARIES,
                    logging.ERROR,
                    unreachable=True,
                )
        if not self.leaving:
            self._start_library()

    def _lose_live(self, library_id: int) -> list[int]:
        """A library is gone (died, or replaced): the results it kept live are lost (their
        ids, to report), and exports of them that peers and tasks here waited for fail."""
        lost = self.live_tasks.lose(library_id, self.store)
        for task_id, wait in self.live_tasks.abandon(library_id):
            self.live_tasks.answer_peers(task_id, wait.peers, None)
            for waiter in wait.tasks:
                task = self.tasks.get(waiter)
                if task is not None:
                    task.missing.discard(task_id)
                    self._input_lost(task, task_id)
        return list(lost)

    def _on_memory_exceeded(self, ev: MemoryExceeded, now: float) -> None:
        """A task's library was stopped for memory (``kind``: its own use, "memory", or the
        worker's budget, "budget"): reported so (its library's death follows)."""
        lib = self.dispatch.libraries.get(ev.library_id)
        task = self.tasks.get(ev.task_id)
        if lib is None or task is None:
            return
        if task.state == "running" and ev.task_id in lib.sent:
            lib.sent.remove(ev.task_id)
            self._transition(task, "forgotten")
            self._out.append(p.TaskExhausted(ev.task_id, ev.kind, ev.peak, ev.limit))

    def _on_reply(self, reply: pipe.Reply, wall: float, lib: int | None = None) -> None:
        """A task's outcome, from a library (``lib``) or a task process."""
        task = self.tasks.get(reply.task_id)
        if task is None or (lib is not None and task.lib != lib):
            return  # forgotten (aborted), or sent again since to another library
        self._transition(task, "forgotten")
        out = self._out
        if type(reply) is pipe.Done:
            task_id, value, duration, nbytes, live, serialization, cpu, peak, files = reply
            self.dispatch.recent_duration.observe(duration)
            start = wall - duration - serialization  # (``wall``: ``TaskDone.finished``)
            self.activity.add_task(lib or PROCESS_LANE, task.key, start, wall, serialization)
            keep = task.keep
            if keep is None:  # (the cache's outputs) kept when too large to travel inline
                keep = value is not None and not p.inlinable(value)
                live = False  # (the library kept nothing: ``Call.keep`` was None)
            if keep:
                if live and lib is not None:
                    self.live_tasks.keep(task_id, lib, nbytes)
                if value is not None:
                    self.store.put(task_id, value)
            waiters = self.local_waiters.pop(task_id, None)
            if waiters:
                self._input_arrived(task_id, waiters)
            if value is not None and not task.want_result and not p.inlinable(value):
                value = None
            out.append(
                p.TaskDone(task_id, nbytes, duration, value, wall, serialization, cpu, peak, files)
            )
        elif type(reply) is pipe.Erred:
            out.append(p.TaskErred(*reply))
        elif type(reply) is pipe.Missing:  # its producer failed: the manager decides
            out.append(p.FetchFailed(task.id, reply.dep_id, (self.peer_address,)))
        else:  # Crashed: the process running it died (fork and tasks modes)
            logger.warning("task %r: %s", task.key, reply.reason)  # type: ignore[union-attr]
            out.append(p.TaskCrashed(reply.task_id, reply.reason))  # type: ignore[union-attr]

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def _start_processes(self) -> None:
        """Tasks queued for task processes, while a process slot is free (``StartProcess``)."""
        dispatch = self.dispatch
        gpus = dispatch.gpus.env(None)
        while dispatch.process_runnable and len(self.processes) < self.process_slots:
            task = dispatch.next_process_task()
            if task is None:
                return
            self.processes.add(task)
            self._out.append(StartProcess(task, dispatch.call(task), gpus))

    def _on_process_started(self, ev: ProcessStarted, now: float) -> None:
        self._transition(ev.task, "running")

    def _on_process_failed(self, ev: ProcessFailed, now: float) -> None:
        """Its process could not be started."""
        task = ev.task
        self.processes.discard(task)
        self._transition(task, "forgotten")
        reason = f"cannot start a task process on worker {self.name}: {ev.why}"
        self._out.append(p.TaskCrashed(task.id, reason))

    def _on_process_exited(self, ev: ProcessExited, now: float) -> None:
        """A task process exited: its slot is free; its reply reported, unless its task
        was aborted (or forgotten) meanwhile."""
        self.processes.discard(ev.task)
        if self.tasks.get(ev.task.id) is ev.task:
            self._on_reply(ev.reply, ev.wall)

    # -- transitions ------------------------------------------------------------------

    def _transition(self, task: WorkerTask, finish: TaskStateName) -> None:
        step = self._steps.get((task.state, finish), _illegal)
        if step is _illegal:
            raise InvalidTransition(task.key, task.state, finish, [])
        task.state = finish
        if step is not None:  # three transitions per task: skip the empty calls
            step(task)

    def _forget(self, task: WorkerTask) -> None:
        """Out of ``tasks``, and out of the fetches, local waits and exports it was in."""
        self.tasks.pop(task.id, None)
        for dep_id in task.missing:
            waiters = self.local_waiters.get(dep_id)
            if waiters is not None:
                waiters.discard(task.id)
                if not waiters:
                    del self.local_waiters[dep_id]
            self.fetcher.unwait(dep_id, task.id)
            self.live_tasks.unwait(dep_id, task.id)  # the export still arrives, into the store

    def _running_to_forgotten(self, task: WorkerTask) -> None:
        if self.started:  # its report follows the news that it started
            self._report_started()
        self.behind.discard(task.id)
        self.tasks.pop(task.id, None)  # running: nothing missing, nothing fetched for it

    def _requeue(self, task: WorkerTask) -> None:
        if self.started:
            self._report_started()
        self.behind.discard(task.id)
        self.dispatch.requeue(task)

    def _report_started(self) -> None:
        """``Started`` for the tasks that went running, but only those a slot of their
        library runs now: one queued behind a running task (a batch of tiny tasks, the
        next task of a short one, a chain) starts when a reply frees a slot for it."""
        started = self.started
        libraries = self.dispatch.libraries
        ids = []
        for task in started:
            lib = libraries.get(task.lib) if task.lib is not None else None
            if lib is None or len(lib.sent) <= lib.slots or _running_in(task.id, lib):
                ids.append(task.id)
            else:
                self.behind.add(task.id)
        started.clear()
        if ids:
            self._out.append(p.Started(tuple(ids)))
            self._started_sent = True

    def leaks(self) -> Iterator[str]:
        """Containers that still hold something: names, for tests of a quiet worker."""
        for name in ("tasks", "local_waiters", "aborting", "processes", "behind"):
            if getattr(self, name):
                yield name
        if self.fetcher.asks:
            yield "asks"
        yield from self.fetcher.leaks()
        yield from self.live_tasks.leaks()
        yield from self.dispatch.leaks()


def _running_in(task_id: int, lib: LibraryRecord) -> bool:
    """Whether ``task_id`` is among the tasks ``lib``'s slots run (the first of ``sent``)."""
    return task_id in itertools.islice(lib.sent, lib.slots)


def _sent_to(task: WorkerTask, lib: LibraryRecord) -> bool:
    """Whether ``task`` runs in ``lib``: its id in ``lib.sent`` may be that of an
    aborted record, forgotten, while a new ``Execute`` of it waits or runs elsewhere."""
    return task.state == "running" and task.lib == lib.id


def _nothing(event: object, now: float) -> None:
    """A record that says only that the manager is there (``Heartbeat``)."""


def _drop_started_ended_after(out: list[Instruction]) -> None:
    """Take out of each ``Started`` in ``out`` the tasks whose ``TaskDone`` or
    ``TaskErred`` comes after it in ``out``: they reach the manager in one batch, and the
    report says the task ran. Tiny tasks queued in a library start as the one before
    them ends, so each had a ``Started`` of its own before the report of the one before
    (measured on a 50,000-leaf tree: about as many ``Started`` records as tasks), each
    one more record for the manager to check and handle. A task started again after
    its report (made anew) keeps its ``Started``: only ends after it count."""
    ended: set[int] = set()
    for index in range(len(out) - 1, -1, -1):
        instruction = out[index]
        if isinstance(instruction, _RAN_TO_ITS_END):
            ended.add(instruction.task_id)
        elif ended and isinstance(instruction, p.Started):
            ids = instruction.task_ids
            kept = tuple(task_id for task_id in ids if task_id not in ended)
            if not kept:
                del out[index]
            elif len(kept) < len(ids):
                out[index] = p.Started(kept)
