"""The manager's I/O thread: one loop between the ROUTER and the scheduler state.

Data flow::

    caller threads ── commands (Submit, Extend, Cancel, Close) + waker pipe ─┐
                                                                            ▼
    workers ── batches ──► poll(ROUTER, waker) ─► decode, check ─► state events
                                                                            │
                              SchedulerState.handle(events, now) ─► instructions
                                                                            │
       Send ─► outbox per worker, flushed once per loop ─► workers          │
       RunOutput/RunDone/RunFailed/RunAborted ─► the caller's ``Run`` ◄─────┤
       TaskFinished/Dispatched/BytesInlined ─► ``watching.Watching`` ◄──────┘

- The loop drains every readable message, feeds the whole batch to the state, and sends
  one multipart message per worker per iteration: batching by loop iteration, no sleeps.
- Timers run on the loop's own clock, ``time.monotonic``; who is silent, who is due a
  heartbeat and whose local process exited is ``liveness.Liveness``'s to say.
- Caller threads never read the loop's dicts: they queue typed commands, wait on their
  ``Run``, and read the workers from a snapshot the loop publishes under ``changed``.
- Every run ends. Each step of the loop is guarded: an exception fails the runs it
  concerns (``SchedulerError``, the exception as its cause) and the loop goes on; one
  that concerns no run is logged and dropped. A malformed record from a worker fails the
  runs of the tasks it names (``state.BadReport``); the good records beside it count.
  Should the thread die all the same, ``error`` is set and every run fails at once.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, NamedTuple

import zmq

from daskvine_py.batch.planner import Demand
from daskvine_py.errors import (
    ManagerDied,
    ProtocolError,
    RunCancelled,
    SchedulerError,
    VersionMismatch,
)
from daskvine_py.manager.runinfo import MANAGER
from daskvine_py.manager.watching import Run, Watching
from daskvine_py.options import ManagerOptions
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.liveness import Liveness
from daskvine_py.scheduler.messages import BytesRelayed
from daskvine_py.wire import protocol as p
from daskvine_py.wire.transport import has_more, send_batch

logger = logging.getLogger("daskvine_py.manager")

#: Messages drained from the ROUTER per loop iteration, so timers and commands still run
#: under a flood.
DRAIN_LIMIT = 10_000
#: Seconds between timer checks (silent workers, dead local processes, heartbeats).
TIMER_PERIOD = 0.1
#: Worker reports the scheduler state takes (``state.FromWorker``).
_STATE_REPORTS = frozenset(
    {
        p.TaskDone,
        p.TaskErred,
        p.TaskCrashed,
        p.FetchFailed,
        p.Replicas,
        p.Lost,
        p.Withdrawn,
        p.DiskFull,
        p.Relay,
        p.Uploaded,
    }
)
#: This host's name: a worker registering from it with the pid of a local process that
#: exited is lost at once.
HOSTNAME = socket.gethostname()
#: What an identity that has not registered may send: a registration, or a status
#: client's records (``StatusRequest``, ``RetireWorker``).
_FROM_STRANGERS = p.TO_MANAGER | p.FROM_CLIENT

# -- commands: what caller threads ask of the loop ----------------------------------------


class Submit(NamedTuple):
    """Open a run with its first part; ``watch``: feed it ``TaskFinished``/``Dispatched``."""

    run: Run
    event: s.SubmitRun
    watch: bool


class Extend(NamedTuple):
    """More tasks of a run in progress."""

    run: Run
    event: s.ExtendRun


class Cancel(NamedTuple):
    """The caller gave up on a run (Ctrl-C, or a task that could not be pickled)."""

    run: Run


class Close(NamedTuple):
    """Tell the workers to leave and stop the loop."""


class Retire(NamedTuple):
    """Tell the worker of this name to leave (a pool retiring an idle worker)."""

    name: str
    reason: str


class StateEvent(NamedTuple):
    """Hand an event to the scheduler state as it is (``cache_placement.CacheClear``);
    ``handled`` is set once the state has handled it, or once the loop is dead."""

    event: Any
    handled: threading.Event | None = None


class WorkerInfo:
    """What a worker said of itself when it registered, and in its last ``Status``."""

    __slots__ = ("name", "hostname", "cores", "memory", "pid", "peer_address", "status")

    def __init__(self, reg: p.Register) -> None:
        self.name = reg.name
        self.hostname = reg.hostname
        self.cores = reg.cores
        self.memory = reg.memory
        self.pid = reg.pid
        self.peer_address = reg.peer_address
        self.status = p.Status(0, 0, 0)

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hostname": self.hostname,
            "cores": self.cores,
            "memory": self.memory,
            "pid": self.pid,
            "peer_address": self.peer_address,
            **self.status._asdict(),
        }


class IOLoop:
    """The loop's state and steps; ``run`` is the I/O thread's body.

    Only ``command``, ``snapshot``, ``changed``, ``error`` and ``cache_index`` are for
    other threads.
    """

    def __init__(
        self,
        router: zmq.Socket,
        state: s.SchedulerState,
        options: ManagerOptions,
        local_processes: list[subprocess.Popen],
    ) -> None:
        self.router = router
        self.state = state
        self.options = options
        #: local worker processes (shared with the ``Manager``, which starts them)
        self.local_processes = local_processes
        self.commands: SimpleQueue = SimpleQueue()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        self.watching = Watching(state.load)
        self.liveness = Liveness(options.worker_timeout, options.heartbeat_interval)
        self.workers: dict[bytes, WorkerInfo] = {}
        self.outboxes: dict[bytes, list[Any]] = {}
        self.events: list[Any] = []
        #: bytes of every message workers sent: outputs, not intermediates
        self.received_bytes = 0
        #: bytes of every message sent to workers: tasks, functions, control
        self.sent_bytes = 0
        #: what killed the loop, once it has died (see ``ManagerDied``)
        self.error: BaseException | None = None
        #: guards ``snapshot``; notified when a worker joins or leaves, or the loop dies
        self.changed = threading.Condition()
        #: the registered workers' ``WorkerInfo.public()`` by identity (under ``changed``)
        self.snapshot: dict[bytes, dict[str, Any]] = {}
        #: the latest ``Demand`` (replaced whole, so other threads read it without a lock),
        #: computed only once someone asked for it (a pool): it walks every worker
        self.demand = Demand(0, {})
        self.wants_demand = False
        #: when each worker last held a task (the loop's clock)
        self._busy_at: dict[bytes, float] = {}
        #: workers told to leave by a pool: their leaving is no news
        self._retiring: set[bytes] = set()
        #: what to do with instructions of other kinds (``state_cache.CacheWrite``)
        self.handlers: dict[type, Callable[[Any], None]] = {}
        #: ``StateEvent.handled`` of the events waiting in ``events``
        self._handled: list[threading.Event] = []
        #: what the state publishes of the result cache, for the caller's ``Cache``
        self.cache_index = state.cache
        state.cache_worker_bytes = options.cache_worker_bytes

    @functools.cached_property
    def _drops(self) -> p.DropLog:
        """Warnings about dropped messages and loop errors, rate-limited."""
        return p.DropLog(logger)

    # -- other threads ----------------------------------------------------------------

    def command(self, command: Submit | Extend | Cancel | Close | Retire | StateEvent) -> None:
        """Queue a command and wake the loop (any thread)."""
        self.commands.put(command)
        os.write(self.wake_write, b"x")
        if self.error is not None:
            # Queued after the dying thread failed what it found: nobody will read it.
            self._abandon(command)

    def dead_error(self) -> ManagerDied:
        cause = self.error
        error = ManagerDied(f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause
        return error

    def fail_dead(self, run: Run) -> None:
        if not run.done.is_set():
            run.failure = self.dead_error()
            run.done.set()

    def _abandon(self, command: Any) -> None:
        """A command the dead loop will never carry out: its run fails, its waiter wakes."""
        run = getattr(command, "run", None)
        if run is not None:
            self.fail_dead(run)
        elif type(command) is StateEvent and command.handled is not None:
            command.handled.set()

    def close_pipe(self) -> None:
        os.close(self.wake_read)
        os.close(self.wake_write)

    def _publish(self, ident: bytes, info: WorkerInfo | None) -> None:
        """Update the callers' snapshot of one worker (None: it left)."""
        with self.changed:
            if info is None:
                self.snapshot.pop(ident, None)
                self.changed.notify_all()
            else:
                joined = ident not in self.snapshot
                self.snapshot[ident] = info.public()
                if joined:
                    self.changed.notify_all()

    # -- the I/O thread ---------------------------------------------------------------

    def run(self) -> None:
        try:
            self._serve()
            self._shutdown_workers()
        except BaseException as exc:
            self._died(exc)

    def _serve(self) -> None:
        """The loop: each step guarded, so that an error fails only the runs it concerns."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.wake_read, zmq.POLLIN)
        next_timer = 0.0
        running = True
        while running:
            busy = self.outboxes or self.events
            timeout = 0 if busy else max(0.0, next_timer - time.monotonic())
            # Whole milliseconds, rounded up: a fraction would be cut to 0 and spin.
            for sock, _ in poller.poll(math.ceil(timeout * 1000)):
                if sock is self.router:
                    self._drain_router()
                else:
                    running = self._drain_commands()
            now = time.monotonic()
            if now >= next_timer:
                try:
                    self._check_timers(now)
                except Exception as exc:
                    self._loop_error(exc, "checking the workers' timers")
                next_timer = now + TIMER_PERIOD
            self._apply_events()
            if self.watching.watched:
                try:
                    self.watching.sample_due(time.monotonic())
                except Exception as exc:
                    watched = list(self.watching.watched)
                    self._loop_error(exc, "sampling watched runs", run_ids=watched)
            self._flush()

    def _loop_error(
        self,
        exc: Exception,
        what: str,
        task_ids: Any = (),
        run_ids: Any = (),
    ) -> None:
        """An exception in a step of the loop: fail the runs it concerns (those of
        ``run_ids`` and of the tasks ``task_ids``), or, concerning none, log and go on."""
        runs = {run_id: None for run_id in run_ids if run_id in self.watching.runs}
        for run_id in self.state.runs_of(task_ids):
            if run_id in self.watching.runs:
                runs[run_id] = None
        if not runs:
            self._drops.warn(
                ("loop", what), time.monotonic(), "the manager dropped %s: it raised %r", what,
                exc, exc_info=exc,
            )  # fmt: skip
        for run_id in runs:
            self.events.append(s.AbortRun(run_id, exc, what))

    def _died(self, exc: BaseException) -> None:
        """The I/O thread is dying: fail every run, waiting or queued, and tell the
        workers to leave, so that nothing waits on a loop that is gone."""
        self.error = exc
        logger.error("the manager's I/O thread died; every run fails", exc_info=exc)
        for run in self.watching.clear():
            self.fail_dead(run)
        with self.changed:
            self.changed.notify_all()  # callers waiting for workers: it will not come
        for handled in self._handled:  # queued for the state, which will not see them
            handled.set()
        while not self.commands.empty():
            self._abandon(self.commands.get())
        for ident in list(self.workers):
            try:
                self._send_now(ident, [p.Shutdown("the manager's I/O thread died")])
            except BaseException:
                logger.warning("could not tell a worker to leave", exc_info=True)

    def _drain_commands(self) -> bool:
        try:
            os.read(self.wake_read, 65536)
        except BlockingIOError:
            pass
        handlers = self._COMMAND_HANDLERS
        while not self.commands.empty():
            command = self.commands.get()
            if type(command) is Close:
                return False
            try:
                handlers[type(command)](self, command)
            except Exception as exc:
                run = getattr(command, "run", None)
                run_ids = () if run is None else (run.id,)
                what = f"the {type(command).__name__} command of run {getattr(run, 'id', None)}"
                self._loop_error(exc, what, run_ids=run_ids)
                if type(command) is Submit and run.id not in self.watching.runs:
                    # Never recorded: no AbortRun will reach it, so it ends here.
                    self.watching.runs[run.id] = run
                    self._end_failed(run.id, exc, what)
        return True

    def _on_submit(self, command: Submit) -> None:
        workers = [(info.name, info.cores, info.hostname) for info in self.workers.values()]
        self.watching.start(command.run, command.watch, workers, time.monotonic())
        self.events.append(command.event)

    def _on_extend(self, command: Extend) -> None:
        if command.run.id in self.watching.runs:
            self.events.append(command.event)

    def _on_cancel(self, command: Cancel) -> None:
        if self.watching.pop(command.run.id, time.monotonic()) is not None:
            self.events.append(s.CancelRun(command.run.id))

    def _on_retire(self, command: Retire) -> None:
        for ident, info in self.workers.items():
            if info.name == command.name:
                logger.info("retiring worker %s: %s", info.name, command.reason)
                self._retiring.add(ident)
                self.outboxes.setdefault(ident, []).append(p.Shutdown(command.reason))
                return

    def _on_state_event(self, command: StateEvent) -> None:
        self.events.append(command.event)
        if command.handled is not None:
            self._handled.append(command.handled)

    _COMMAND_HANDLERS: dict[type, Callable[[IOLoop, Any], None]] = {
        Submit: _on_submit,
        Extend: _on_extend,
        Cancel: _on_cancel,
        Retire: _on_retire,
        StateEvent: _on_state_event,
    }

    def _drain_router(self) -> None:
        router = self.router
        now = time.monotonic()
        for _ in range(DRAIN_LIMIT):
            try:
                ident, *frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = ident.bytes
            buffers = [f.buffer for f in frames]
            self.received_bytes += sum(b.nbytes for b in buffers)
            info = self.workers.get(ident)
            try:
                messages = p.unpack(buffers, _FROM_STRANGERS if info is None else p.TO_MANAGER)
            except ProtocolError as exc:
                if info is not None:
                    self._unreadable(ident, info, exc)
                    continue
                self._drops.warn(
                    ("malformed", "unregistered peers"), now, "dropped a malformed message "
                    "from unregistered peers (%r): %s", ident[:32], exc,
                )  # fmt: skip
                continue
            if info is None:
                self._on_stranger(ident, messages, now)
            else:
                self._on_worker_batch(ident, info, messages, now)
            if not has_more(router):
                return

    def _unreadable(self, ident: bytes, info: WorkerInfo, exc: ProtocolError) -> None:
        """A registered worker sent a batch that is not one: the reports in it are lost,
        and the tasks they were about would wait forever. The worker is lost (its tasks
        run elsewhere) and told to leave."""
        reason = f"it sent a message that could not be read ({exc})"
        self._lose_worker(ident, reason)
        self._send_now(ident, [p.Shutdown(reason)])

    def _on_worker_batch(self, ident: bytes, info: WorkerInfo, messages: list, now: float) -> None:
        """The records of one batch from a registered worker, each checked on its own: a
        malformed one fails the runs of the tasks it names, the others count."""
        valid = False
        for message in messages:
            kind = type(message)
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    ("malformed", info.name), now, "dropped a malformed record from worker %s: %s",
                    info.name, exc,
                )  # fmt: skip
                named = p.task_ids_named(message)
                self.events.append(s.BadReport(ident, kind.__name__, named, exc))
                continue
            if not valid:
                valid = True
                self.liveness.heard(ident, now)  # only what we can read shows life
            try:
                if kind is p.TaskDone:
                    if message.value is not None:
                        self.watching.count(info.name, MANAGER, message.value.nbytes)
                elif kind is p.Transfers:
                    self.watching.received(info.name, message)
                    continue
                elif kind is p.Status:
                    info.status = message
                    self._publish(ident, info)
                    continue
                if kind is p.Goodbye:
                    self._lose_worker(ident, f"it left: {message.reason}")
                    return
                if kind is p.Register:
                    continue
            except Exception as exc:
                what = f"a {kind.__name__} from worker {info.name}"
                self._loop_error(exc, what, task_ids=p.task_ids_named(message))
                if kind not in _STATE_REPORTS:
                    continue
            self.events.append(s.FromWorker(ident, message))

    def _on_stranger(self, ident: bytes, messages: list, now: float) -> None:
        """Messages from an identity that has not registered: only ``Register`` counts,
        unless they are a status client's (``_on_client``).

        Its version is read first, before its other fields are checked: another version
        may mean other fields, and deserves a clear mismatch rather than a malformed one.
        """
        if any(type(m) in p.FROM_CLIENT for m in messages):
            self._on_client(ident, messages, now)
            return
        reg = next((m for m in messages if type(m) is p.Register), None)
        if reg is None:
            self._drops.warn(
                ("unregistered",), now, "dropped %d record(s) from unregistered peer %r",
                len(messages), ident[:32],
            )  # fmt: skip
            return
        version = reg[0] if len(reg) else None
        if type(version) is int and version != p.PROTOCOL_VERSION:
            name = reg.name if len(reg) > 1 and type(reg.name) is str else repr(ident[:32])
            error = VersionMismatch(p.PROTOCOL_VERSION, version, name)
            logger.warning("rejected worker %s: %s", name, error)
            self.outboxes.setdefault(ident, []).append(p.Rejected(str(error)))
            return
        try:
            p.check_fields(reg)
        except ProtocolError as exc:
            self._drops.warn(
                ("unregistered",), now, "rejected a malformed registration from %r: %s",
                ident[:32], exc,
            )  # fmt: skip
            rejected = p.Rejected(f"malformed registration: {exc}")
            self.outboxes.setdefault(ident, []).append(rejected)
            return
        info = WorkerInfo(reg)
        self.workers[ident] = info
        self.liveness.joined(ident, now, reg.pid if reg.hostname == HOSTNAME else None)
        self._publish(ident, info)
        self.watching.names_by_peer[reg.peer_address] = reg.name
        logger.info("worker %s joined from %s with %d cores", reg.name, reg.hostname, reg.cores)
        self.outboxes.setdefault(ident, []).append(
            p.Welcome(reg.name, self.options.heartbeat_interval)
        )
        self.events.append(
            s.WorkerJoined(ident, reg.name, reg.cores, reg.peer_address, reg.memory, reg.hostname)
        )
        self.watching.worker_joined(now, reg.name, reg.cores, reg.hostname)

    def _on_client(self, ident: bytes, messages: list, now: float) -> None:
        """A status client's batch (a factory's pool): each ``StatusRequest`` is answered
        with the work's demand, each ``RetireWorker`` retires a worker. The client never
        registers; a record of another kind in its batch is dropped."""
        for message in messages:
            kind = type(message)
            if kind is p.StatusRequest and len(message) and type(message[0]) is int:
                if message[0] != p.PROTOCOL_VERSION:
                    error = (
                        f"a status client speaks protocol version {message[0]}, but the "
                        f"manager speaks version {p.PROTOCOL_VERSION}: install the same "
                        "daskvine-py on both"
                    )
                    self._drops.warn(("client version",), now, "rejected %s", error)
                    self.outboxes.setdefault(ident, []).append(p.Rejected(error))
                    continue
            try:
                if kind not in p.FROM_CLIENT:
                    raise ProtocolError(f"a {kind.__name__} in a status client's batch")
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    ("malformed", "status clients"), now, "dropped a malformed record from "
                    "status client %r: %s", ident[:32], exc,
                )  # fmt: skip
                continue
            if kind is p.RetireWorker:
                self._on_retire(Retire(message.name, message.reason))
                continue
            logger.debug("status request from %s", message.name)
            self.wants_demand = True  # from now on, idle times are sampled every check
            self._publish_demand(now)
            demand = self.demand
            loads = tuple((name, cores, idle) for name, (cores, idle) in demand.workers.items())
            self.outboxes.setdefault(ident, []).append(p.StatusReply(demand.cores_needed, loads))

    def _lose_worker(self, ident: bytes, reason: str) -> None:
        info = self.workers.pop(ident, None)
        if info is None:
            return
        if ident in self._retiring:
            self._retiring.discard(ident)
            logger.info("worker %s left: %s", info.name, reason)
        else:
            logger.warning("worker %s lost: %s", info.name, reason)
        self.liveness.left(ident)
        self._publish(ident, None)
        self.watching.worker_lost(time.monotonic(), info.name, reason)
        self.outboxes.pop(ident, None)
        self.events.append(s.WorkerLost(ident, reason))

    def _check_timers(self, now: float) -> None:
        exited = {
            proc.pid: proc.returncode for proc in self.local_processes if proc.poll() is not None
        }
        verdict = self.liveness.check(now, exited)
        for gone in verdict.lost:
            self._lose_worker(gone.worker, gone.reason)
            if gone.silent:
                self._send_now(gone.worker, [p.Shutdown("declared lost after silence")])
        for ident in verdict.heartbeat:
            if ident not in self.outboxes:
                self.outboxes[ident] = [p.Heartbeat()]
        if self.wants_demand:
            self._publish_demand(now)

    def _publish_demand(self, now: float) -> None:
        """The work's demand and each worker's idle time, for worker pools."""
        ready, processing, _ = self.state.load()
        loads = self.state.worker_loads()
        busy_at = self._busy_at
        workers = {}
        for ident, (cores, held) in loads.items():
            info = self.workers.get(ident)
            if info is None:
                continue
            if held or ident not in busy_at:
                busy_at[ident] = now  # holding work now, or just joined
            workers[info.name] = (cores, now - busy_at[ident])
        for ident in [ident for ident in busy_at if ident not in loads]:
            del busy_at[ident]
        self.demand = Demand(ready + processing, workers)

    def _apply_events(self) -> None:
        if not self.events:
            return
        events, self.events = self.events, []
        try:
            instructions = self.state.handle(events, time.monotonic())
            handled, self._handled = self._handled, []  # (kept for ``_died`` until now)
            for done in handled:
                done.set()
        except Exception as exc:  # handle never raises; if it does, no run can trust it
            self._handled = []  # not handled: their waiters time out
            logger.error("the scheduler failed on %d events; every run fails", len(events),
                         exc_info=exc)  # fmt: skip
            for run_id in list(self.watching.runs):
                self._end_failed(run_id, exc, f"a batch of {len(events)} events")
            return
        for instruction in instructions:
            kind = type(instruction)
            try:
                if kind is s.Send:
                    self.outboxes.setdefault(instruction.worker, []).append(instruction.message)
                elif kind is s.TaskFinished:
                    self.watching.task_finished(instruction, time.monotonic())
                elif kind is s.Dispatched:
                    self.watching.dispatched(instruction, time.monotonic())
                elif kind is s.BytesInlined:
                    self.watching.count(MANAGER, instruction.name, instruction.nbytes)
                elif kind is BytesRelayed:
                    self.watching.relayed(instruction)
                elif kind is s.RunOutput:
                    run = self.watching.runs.get(instruction.run_id)
                    if run is not None:
                        run.values[instruction.key] = instruction.value
                elif kind is s.RunDone:
                    run = self.watching.pop(instruction.run_id, time.monotonic())
                    if run is not None:
                        self.watching.settle(run, instruction)
                        run.done.set()
                elif kind is s.RunFailed:
                    run = self.watching.pop(instruction.run_id, time.monotonic())
                    if run is not None:
                        run.failure = instruction
                        self.watching.settle(run, instruction)
                        run.done.set()
                elif kind is s.RunAborted:
                    self._end_failed(instruction.run_id, instruction.error, instruction.what)
                elif kind is s.EventDropped:
                    error = instruction.error
                    self._drops.warn(
                        ("scheduler", instruction.what), time.monotonic(),
                        "the scheduler dropped %s: handling it raised %r", instruction.what,
                        error, exc_info=error,
                    )  # fmt: skip
                elif kind in self.handlers:
                    self.handlers[kind](instruction)
            except Exception as exc:
                run_id = getattr(instruction, "run_id", None)
                task_ids = p.task_ids_named(instruction.message) if kind is s.Send else ()
                what = f"a {kind.__name__} instruction"
                if kind is s.TaskFinished:
                    what = f"a {type(instruction.report).__name__} from worker {instruction.worker}"
                self._loop_error(exc, what, task_ids, () if run_id is None else (run_id,))
                if run_id is not None:  # now: its RunDone may follow in this very list
                    self._end_failed(run_id, exc, what)

    def _end_failed(self, run_id: int, cause: BaseException, what: str) -> None:
        """A run failed by an exception of the manager's own: ``get`` raises
        ``SchedulerError``, naming ``what``, with the exception as its cause."""
        run = self.watching.pop(run_id, time.monotonic())
        if run is None:
            return
        logger.error("run %d failed: the manager could not handle %s", run_id, what,
                     exc_info=cause)  # fmt: skip
        error = SchedulerError(run_id, what, f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause
        run.failure = error
        try:
            self.watching.settle(run)
        finally:
            run.done.set()

    def _flush(self) -> None:
        outboxes, self.outboxes = self.outboxes, {}
        now = time.monotonic()
        for ident, messages in outboxes.items():
            if self._send_now(ident, messages):
                self.liveness.sent(ident, now)

    def _send_now(self, ident: bytes, messages: list) -> bool:
        try:
            frames = p.encode(messages)
        except Exception:
            frames = self._encode_what_can_be(ident, messages)
            if frames is None:
                return False
        try:
            self.sent_bytes += sum(memoryview(frame).nbytes for frame in frames)
            send_batch(self.router, frames, ident)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: its connection is gone
            self._lose_worker(ident, f"unreachable ({exc})")
            return False

    def _encode_what_can_be(self, ident: bytes, messages: list) -> list | None:
        """A batch that would not encode: the frames of the messages that do (None if
        none does); the runs of the tasks the others name fail, since their worker will
        never hear of them."""
        info = self.workers.get(ident)
        name = info.name if info is not None else repr(ident[:32])
        good = []
        for message in messages:
            try:
                p.encode([message])
            except Exception as exc:
                what = f"a {type(message).__name__} for worker {name}"
                self._loop_error(exc, what, p.task_ids_named(message))
            else:
                good.append(message)
        return p.encode(good) if good else None

    def _shutdown_workers(self) -> None:
        for ident in list(self.workers):
            self._send_now(ident, [p.Shutdown("the manager is closing")])
        for run in self.watching.clear():
            run.failure = RunCancelled("the manager was closed before the run finished")
            run.done.set()
