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
- Caller threads never read the loop's dicts: they queue typed commands (``commands``),
  wait on their ``Run``, and read the workers from a snapshot published under ``changed``.
- Who is registered, joining, rejected or retiring, and what status clients are told, is
  ``registry.Registry``'s; this module keeps the per-message path (drain, check, feed the
  state, flush) and tells the state, the liveness watch and the watched runs.
- Stragglers, stuck workers and black holes are the state's to judge (``faults``): on
  the timer ``faults_watch.FaultWatch`` hands it a ``Tick`` about once a second.
- A run never waits silently for workers: on the timer, ``vacancy.Vacancy`` says when
  to warn how to add some, and when runs fail (``NoWorkersLeft``: every local worker it
  started has ended, none other is connected).
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
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import Any, TypeVar, cast

import zmq

from daskvine_py.errors import (
    EnvironmentUnfit,
    ManagerDied,
    NoWorkersLeft,
    ProtocolError,
    RunCancelled,
    SchedulerError,
)
from daskvine_py.manager.commands import Cancel, Close, Command, Extend, Retire, StateEvent, Submit
from daskvine_py.manager.faults_watch import FaultWatch
from daskvine_py.manager.handshakes import HandshakeMonitor
from daskvine_py.manager.live import LiveView, Snapshot
from daskvine_py.manager.registry import Registry, Stranger, WorkerInfo, printable
from daskvine_py.manager.transfers import credible
from daskvine_py.manager.vacancy import Vacancy
from daskvine_py.manager.watching import Run, Watching
from daskvine_py.options import ManagerOptions
from daskvine_py.report.runinfo import MANAGER
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.liveness import Liveness
from daskvine_py.scheduler.messages import BytesRelayed, Eject, Quarantined
from daskvine_py.scheduler.outbox import ReleaseHold
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
        p.Started,
        p.DiskFull,
        p.Relay,
        p.Uploaded,
    }
)
#: This host's name: a worker registering from it with the pid of a local process that
#: exited is lost at once.
HOSTNAME = socket.gethostname()
#: What an identity that has not registered may send: a registration, or a client's records.
_FROM_STRANGERS = p.TO_MANAGER | p.FROM_CLIENT
#: An instruction of a kind the loop hands to a handler (``IOLoop.on``).
Handled = TypeVar("Handled", bound=s.Instruction)


class IOLoop:
    """The loop's state and steps; ``run`` is the I/O thread's body.

    Only ``command``, ``snapshot``, ``changed``, ``error`` and ``cache_index`` are for
    other threads. ``connection_file`` (the ``Manager``'s) is what the no-worker warning
    tells workers to join with.
    """

    def __init__(
        self,
        router: zmq.Socket[bytes],
        state: s.SchedulerState,
        options: ManagerOptions,
        local_processes: list[subprocess.Popen[bytes]],
        connection_file: str | None = None,
    ) -> None:
        self.router = router
        self.state = state
        self.options = options
        #: local worker processes (shared with the ``Manager``, which starts them)
        self.local_processes = local_processes
        self.connection_file = connection_file or (
            None if options.connection_file is None else os.fspath(options.connection_file)
        )
        #: the ROUTER's monitor (made and closed by the I/O thread)
        self._monitor: HandshakeMonitor | None = None
        #: runs waiting with no worker: when to warn, when to give up, what to say
        self.vacancy = Vacancy()
        #: software key -> node -> why that node cannot run it (``Goodbye.unfit``); a
        #: waiting run of that software with no worker left fails at once, saying so
        self.unfit: dict[str, dict[str, str]] = {}
        #: run id -> the key of the software it ships ("none": the workers' own Python)
        self.run_software: dict[int, str] = {}
        self.commands: SimpleQueue[Command] = SimpleQueue()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        self.watching = Watching(state.load)
        self.liveness = Liveness(options.worker_timeout, options.heartbeat_interval)
        self.outboxes: dict[bytes, list[p.FromManager]] = {}
        #: batches of only ``Release`` records waiting for company (``outbox``)
        self.release_hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold()
        self.registry = Registry(
            self._post,
            self._drops,
            options.heartbeat_interval,
            state.load,
            state.worker_loads,
            local_processes,
        )
        self.live = LiveView(state, self.registry, self.watching, self.liveness)
        #: the registry's workers by identity (the same dict: read for every batch)
        self.workers: dict[bytes, WorkerInfo] = self.registry.workers
        #: guards ``snapshot``; notified when a worker joins or leaves, or the loop dies
        self.changed = self.registry.changed
        #: the registered workers' ``WorkerInfo.public()`` by identity (under ``changed``)
        self.snapshot = self.registry.snapshot
        self.events: list[s.Event] = []
        #: bytes of every message workers sent: outputs, not intermediates
        self.received_bytes = 0
        #: bytes of every message sent to workers: tasks, functions, control
        self.sent_bytes = 0
        #: batches sent to workers (one send each: what holding releases saves)
        self.sent_batches = 0
        #: what killed the loop, once it has died (see ``ManagerDied``)
        self.error: BaseException | None = None
        #: what to do with instructions of other kinds (``messages.CacheWrite``), by kind:
        #: each handler takes the kind it is filed under (``on``)
        self.handlers: dict[type, Callable[[Any], None]] = {}
        #: ``StateEvent.handled`` of the events waiting in ``events``
        self._handled: list[threading.Event] = []
        #: what the state publishes of the result cache, for the caller's ``Cache``
        self.cache_index = state.cache
        state.cache_worker_bytes = options.cache_worker_bytes
        #: stragglers, stuck workers and quarantines (``faults_watch``): ticks, warnings
        self.faults = FaultWatch(state, options, self.registry, self.watching)
        self.on(Quarantined, self.faults.quarantined)

    @functools.cached_property
    def _drops(self) -> p.DropLog:
        """Warnings about dropped messages and loop errors, rate-limited."""
        return p.DropLog(logger)

    def on(self, kind: type[Handled], handler: Callable[[Handled], None]) -> None:
        """Hand each instruction of ``kind`` (one the loop does not carry out itself) to
        ``handler``, on the I/O thread."""
        self.handlers[kind] = handler

    def _post(self, ident: bytes, message: p.FromManager) -> None:
        """Queue a message for ``ident``, sent with the next flush."""
        self.outboxes.setdefault(ident, []).append(message)

    # -- other threads ----------------------------------------------------------------

    def command(self, command: Command) -> None:
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

    def _abandon(self, command: Command) -> None:
        """A command the dead loop will never carry out: its run fails, its waiter wakes."""
        run = getattr(command, "run", None)
        if run is not None:
            self.fail_dead(run)
        elif type(command) is StateEvent and command.handled is not None:
            command.handled.set()

    def close_pipe(self) -> None:
        os.close(self.wake_read)
        os.close(self.wake_write)

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
        self._monitor = HandshakeMonitor(self.router, self.vacancy, DRAIN_LIMIT)
        poller.register(self._monitor.socket, zmq.POLLIN)
        try:
            self._iterate(poller)
        finally:
            if self._monitor is not None:
                self._monitor.close()
                self._monitor = None

    def _iterate(self, poller: zmq.Poller) -> None:
        next_timer = 0.0
        last_pass = 0.0
        running = True
        state = self.state
        while running:
            busy = self.outboxes or self.events
            if not busy and state.pace:
                # Tasks finishing one by one: let reports gather for a moment (a fraction
                # of a task's time, ``SchedulerState.pace``), handled in one pass.
                wait = last_pass + state.pace - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            timeout = 0 if busy else max(0.0, next_timer - time.monotonic())
            # Whole milliseconds, rounded up: a fraction would be cut to 0 and spin.
            for sock, _ in poller.poll(math.ceil(timeout * 1000)):
                if sock is self.router:
                    self._drain_router()
                elif self._monitor is not None and sock is self._monitor.socket:
                    self._monitor.drain()
                else:
                    running = self._drain_commands()
            now = time.monotonic()
            if now >= next_timer:
                try:
                    self._check_timers(now)
                except Exception as exc:
                    self._loop_error(exc, "checking the workers' timers")
                next_timer = now + TIMER_PERIOD
            if self.events:
                last_pass = now
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
        task_ids: Iterable[int] = (),
        run_ids: Iterable[int] = (),
    ) -> None:
        """An exception in a step of the loop: fail the runs it concerns (those of
        ``run_ids`` and of the tasks ``task_ids``), or, concerning none, log and go on."""
        runs = {run_id: None for run_id in run_ids if run_id in self.watching.runs}
        for run_id in self.state.runs_of(task_ids):
            if run_id in self.watching.runs:
                runs[run_id] = None
        if not runs:
            self._drops.warn(
                ("loop", what),
                time.monotonic(),
                "the manager dropped %s: it raised %r",
                what,
                exc,
                exc_info=exc,
            )
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
            kind = type(command)
            if isinstance(command, (Submit, Extend)):
                command.run.parts_ahead.release()  # (the caller may send its next part)
            try:
                handlers[kind](self, command)
            except Exception as exc:
                run = getattr(command, "run", None)
                run_ids = () if run is None else (run.id,)
                what = f"the {type(command).__name__} command of run {getattr(run, 'id', None)}"
                self._loop_error(exc, what, run_ids=run_ids)
                if type(command) is Submit and command.run.id not in self.watching.runs:
                    # Never recorded: no AbortRun will reach it, so it ends here.
                    self.watching.runs[command.run.id] = command.run
                    self._end_failed(command.run.id, exc, what)
        return True

    def _on_submit(self, command: Submit) -> None:
        self.watching.start(command.run, command.watch, self.workers.values(), time.monotonic())
        config = command.event.config
        software = None if config is None else config.software
        self.run_software[command.run.id] = "none" if software is None else software.key
        self.events.append(command.event)

    def _on_extend(self, command: Extend) -> None:
        if command.run.id in self.watching.runs:
            self.events.append(command.event)

    def _on_cancel(self, command: Cancel) -> None:
        if self.watching.pop(command.run.id, time.monotonic()) is not None:
            self.events.append(s.CancelRun(command.run.id))

    def _on_retire(self, command: Retire) -> None:
        self.registry.retire(command.name, command.reason)

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
        Snapshot: lambda loop, command: loop.live.answer(command),
    }

    def _drain_router(self) -> None:
        router = self.router
        now = time.monotonic()
        for _ in range(DRAIN_LIMIT):
            try:
                first, *frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident: bytes = first.bytes
            buffers = [f.buffer for f in frames]
            self.received_bytes += sum(b.nbytes for b in buffers)
            info = self.workers.get(ident)
            try:
                messages = p.unpack(buffers, _FROM_STRANGERS if info is None else p.TO_MANAGER)
            except ProtocolError as exc:
                if info is not None:
                    self._unreadable(ident, info, exc)
                    continue
                reply = self.registry.unreadable(ident, buffers[0] if buffers else b"", exc, now)
                if reply is not None:
                    send_batch(self.router, reply, ident)
                continue
            if info is None:
                self._on_stranger(ident, messages, now)
            else:  # (unpacked as ``TO_MANAGER``: a worker's records only)
                self._on_worker_batch(ident, info, cast("list[p.ToManager]", messages), now)
            if not has_more(router):
                return

    def _unreadable(self, ident: bytes, info: WorkerInfo, exc: ProtocolError) -> None:
        """A registered worker sent a batch that is not one: the reports in it are lost,
        and the tasks they were about would wait forever. The worker is lost (its tasks
        run elsewhere) and told to leave."""
        reason = f"it sent a message that could not be read ({exc})"
        self._lose_worker(ident, reason)
        self._send_now(ident, [p.Shutdown(reason)])

    def _on_worker_batch(
        self, ident: bytes, info: WorkerInfo, messages: list[p.ToManager], now: float
    ) -> None:
        """The records of one batch from a registered worker, each checked on its own: a
        malformed one fails the runs of the tasks it names, the others count."""
        valid = False
        for message in messages:
            kind = type(message)
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    ("malformed", info.name),
                    now,
                    "dropped a malformed record from worker %s: %s",
                    info.name,
                    exc,
                )
                named = p.task_ids_named(message)
                self.events.append(s.BadReport(ident, kind.__name__, named, exc))
                continue
            if not valid:
                valid = True
                self.liveness.heard(ident, now)  # only what we can read shows life
            try:  # (``type(message) is``: the test mypy narrows the union of records by)
                if type(message) is p.TaskDone:
                    if message.value is not None:
                        self.watching.count(info.name, MANAGER, message.value.nbytes)
                elif type(message) is p.Transfers:
                    if credible(message, self.watching.names_by_peer, info.peer_address):
                        self.watching.received(info.name, message)
                        continue  # (else the state counts it a false claim)
                elif type(message) is p.Status:
                    info.status = message
                    self.registry.publish(ident, info)
                    self.watching.status(now, info.name, message)
                    continue
                if type(message) is p.Goodbye:
                    if message.unfit:
                        self._on_unfit(info.hostname, message)
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

    def _on_stranger(self, ident: bytes, messages: list[Stranger], now: float) -> None:
        """Messages from an identity that has not registered (``Registry.stranger``): a
        worker admitted is news to the liveness watch, the state and the watched runs."""
        info = self.registry.stranger(ident, messages, now)
        if info is None:
            return
        self.liveness.joined(ident, now, info.pid if info.hostname == HOSTNAME else None)
        self.watching.names_by_peer[info.peer_address] = info.name
        self.events.append(
            s.WorkerJoined(
                ident,
                info.name,
                info.cores,
                info.peer_address,
                info.memory,
                info.hostname,
                info.gpus,
            )
        )
        self.watching.worker_joined(now, info.name, info.cores, info.hostname, info.memory)

    def _lose_worker(self, ident: bytes, reason: str) -> None:
        info = self.registry.remove(ident, reason)
        if info is None:
            return
        self.liveness.left(ident)
        self.watching.worker_lost(time.monotonic(), info.name, reason)
        self.outboxes.pop(ident, None)
        self.release_hold.drop(ident)
        self.events.append(s.WorkerLost(ident, reason))

    def _on_unfit(self, host: str, goodbye: p.Goodbye) -> None:
        """A worker cannot run a run's software on its node: said once per node and
        reason (every worker of a node would say the same)."""
        said = self.unfit.setdefault(goodbye.unfit, {})
        if said.get(host) != goodbye.reason:
            said[host] = goodbye.reason
            logger.warning("%s", printable(goodbye.reason))

    def _fail_unfit_runs(self) -> None:
        """Runs waiting with no worker, whose software every worker that came could not
        run: they fail now, with each node's reason."""
        for run_id in sorted(self.watching.runs):
            reasons = self.unfit.get(self.run_software.get(run_id, "none"))
            if reasons:
                self._end_workerless(run_id, EnvironmentUnfit(run_id, dict(reasons)))
        for run_id in [r for r in self.run_software if r not in self.watching.runs]:
            del self.run_software[run_id]

    def _eject(self, ident: bytes, reason: str) -> None:
        """Told to leave and lost: its tasks run elsewhere, its results are recomputed."""
        info = self.workers.get(ident)
        if info is None:
            return
        logger.warning("ejected worker %s: %s", printable(info.name), reason)
        self._lose_worker(ident, f"ejected: {reason}")
        self._send_now(ident, [p.Shutdown(f"ejected by the manager: {reason}")])

    def _check_timers(self, now: float) -> None:
        exited = {
            proc.pid: proc.returncode for proc in self.local_processes if proc.poll() is not None
        }
        verdict = self.liveness.check(now, exited)
        for gone in verdict.lost:
            lost = cast(bytes, gone.worker)  # the liveness watch keeps what it was given
            self._lose_worker(lost, gone.reason)
            if gone.silent:
                self._send_now(lost, [p.Shutdown("declared lost after silence")])
        for ident in verdict.heartbeat:
            if ident not in self.outboxes:
                self.outboxes[cast(bytes, ident)] = [p.Heartbeat()]
        self.faults.tick(now, self.events)
        if self.registry.wants_demand:
            self.registry.publish_demand(now)
        if self.watching.runs and not self.workers and self.unfit:
            self._fail_unfit_runs()
        if self.watching.runs and not self.workers:
            warning, failed = self.vacancy.check(
                now,
                sorted(self.watching.runs),
                self.local_processes,
                len(exited),
                self.registry.wants_demand,
                self.registry.last_lost,
                self.connection_file,
            )
            for run_id, error in failed:
                self._end_workerless(run_id, error)
            if warning is not None:
                logger.warning("%s", warning)
        else:
            self.vacancy.clear()

    def _end_workerless(self, run_id: int, error: NoWorkersLeft | EnvironmentUnfit) -> None:
        """Fail a run that no worker will ever run: its tasks leave the state."""
        if self.watching.fail(run_id, error, time.monotonic()):
            self.events.append(s.CancelRun(run_id))

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
            logger.error(
                "the scheduler failed on %d events; every run fails", len(events), exc_info=exc
            )
            for run_id in list(self.watching.runs):
                self._end_failed(run_id, exc, f"a batch of {len(events)} events")
            return
        for instruction in instructions:
            # (``type(instruction) is``: the test mypy narrows the union of instructions by)
            try:
                if type(instruction) is s.Send:
                    self.outboxes.setdefault(instruction.worker, []).append(instruction.message)
                elif type(instruction) is s.TaskFinished:
                    self.watching.task_finished(instruction, time.monotonic())
                elif type(instruction) is s.Dispatched:
                    self.watching.dispatched(instruction, time.monotonic())
                elif type(instruction) is s.BytesInlined:
                    self.watching.count(MANAGER, instruction.name, instruction.nbytes)
                elif type(instruction) is BytesRelayed:
                    self.watching.relayed(instruction)
                elif type(instruction) is s.RunOutput:
                    self.watching.output(instruction)
                elif type(instruction) is s.RunDone or type(instruction) is s.RunFailed:
                    self.watching.end(instruction, time.monotonic())
                elif type(instruction) is Eject:
                    self._eject(instruction.worker, instruction.reason)
                elif type(instruction) is s.RunAborted:
                    self._end_failed(instruction.run_id, instruction.error, instruction.what)
                elif type(instruction) is s.EventDropped:
                    error = instruction.error
                    self._drops.warn(
                        ("scheduler", instruction.what),
                        time.monotonic(),
                        "the scheduler dropped %s: handling it raised %r",
                        instruction.what,
                        error,
                        exc_info=error,
                    )
                elif type(instruction) in self.handlers:
                    self.handlers[type(instruction)](instruction)
            except Exception as exc:
                kind = type(instruction)
                concerned: int | None = getattr(instruction, "run_id", None)
                task_ids = (
                    p.task_ids_named(instruction.message) if type(instruction) is s.Send else ()
                )
                what = f"a {kind.__name__} instruction"
                if type(instruction) is s.TaskFinished:
                    what = f"a {type(instruction.report).__name__} from worker {instruction.worker}"
                self._loop_error(exc, what, task_ids, () if concerned is None else (concerned,))
                if concerned is not None:  # now: its RunDone may follow in this very list
                    self._end_failed(concerned, exc, what)

    def _end_failed(self, run_id: int, cause: BaseException, what: str) -> None:
        """A run failed by an exception of the manager's own: ``get`` raises
        ``SchedulerError``, naming ``what``, with the exception as its cause."""
        error = SchedulerError(run_id, what, f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause
        if self.watching.fail(run_id, error, time.monotonic()):
            logger.error(
                "run %d failed: the manager could not handle %s", run_id, what, exc_info=cause
            )

    def _flush(self) -> None:
        outboxes, self.outboxes = self.outboxes, {}
        now = time.monotonic()
        for ident, messages in self.release_hold.batches(outboxes, now):
            if self._send_now(ident, messages):
                self.liveness.sent(ident, now)

    def _send_now(self, ident: bytes, messages: list[p.FromManager]) -> bool:
        if len(messages) > 1:
            messages = p.coalesce_releases(messages)
        try:
            frames = p.encode(messages)
        except Exception:
            some = self._encode_what_can_be(ident, messages)
            if some is None:
                return False
            frames = some
        try:
            self.sent_bytes += sum(memoryview(frame).nbytes for frame in frames)
            self.sent_batches += 1
            send_batch(self.router, frames, ident)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: its connection is gone
            self._lose_worker(ident, f"unreachable ({exc})")
            return False

    def _encode_what_can_be(
        self, ident: bytes, messages: list[p.FromManager]
    ) -> list[p.Frame] | None:
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
