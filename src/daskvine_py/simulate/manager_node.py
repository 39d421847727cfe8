"""The simulated manager: the real ``SchedulerState`` behind what the manager's I/O loop
does around it (manager/loop.py, manager/registry.py), without sockets or threads.

The one module of the simulator that touches ``SchedulerState``: the rest sees a
``ManagerNode`` taking batches from workers, runs to submit or cancel, and timer passes,
and reporting what it decided through its ``Listener``.

What it keeps of the loop: a registration is welcomed at once (``Welcome``) and becomes
``WorkerJoined``; any readable batch shows life (``Liveness.heard``); ``Status`` and
credible ``Transfers`` stop here; ``Goodbye`` loses the worker; a send to a worker whose
connection is known closed loses it ("unreachable"); ``Eject`` loses it and says
``Shutdown``; on the timer (every ``TIMER_PERIOD`` s) the liveness watch loses silent
workers and heartbeats idle ones, and a ``Tick`` goes in about once a second. Events are
handled once per pass, as the loop does per iteration; one batch per worker goes out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, cast

from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.claims import Claims
from daskvine_py.scheduler.liveness import Liveness
from daskvine_py.scheduler.messages import (
    CacheClear,
    CancelRun,
    Eject,
    EventDropped,
    Quarantined,
    RunAborted,
    RunDone,
    RunFailed,
    RunOutput,
    Send,
    SubmitRun,
    Tick,
)
from daskvine_py.scheduler.outbox import ReleaseHold
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

#: Seconds between the loop's timer checks (``manager.loop.TIMER_PERIOD``).
TIMER_PERIOD = 0.1
#: Seconds between ticks (``faults_watch``: about once a second).
TICK_PERIOD = 1.0
#: Bytes from one peer in one ``Transfers`` past which it is not believed (``transfers``).
MAX_REPORTED_BYTES = 1 << 44


@contextlib.contextmanager
def hashed_by_id() -> Iterator[None]:
    """While a simulation runs, the scheduler's records hash by their ids, not by where
    they sit in memory.

    The state iterates sets of records (a result's holders become the peers an input is
    fetched from, in that order), and a set iterates in the order of its members'
    hashes: by default their addresses, which differ from one process to the next and
    after every earlier seed. Hashing by id makes a seed one run wherever it runs. (The
    records could hash so themselves; until then this is the one place that does it.)
    """
    saved = WorkerRecord.__hash__, TaskRecord.__hash__
    WorkerRecord.__hash__ = _worker_hash  # type: ignore[method-assign,assignment]
    TaskRecord.__hash__ = _task_hash  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        WorkerRecord.__hash__, TaskRecord.__hash__ = saved  # type: ignore[method-assign]


def _worker_hash(worker: WorkerRecord) -> int:
    return hash(worker.id)


def _task_hash(task: TaskRecord) -> int:
    return task.id


class Listener(Protocol):
    """What the simulation hears of the manager's decisions."""

    def send(self, worker: bytes, messages: list[p.ToWorker]) -> None: ...

    def run_output(self, ev: RunOutput) -> None: ...

    def run_ended(self, ev: RunDone | RunFailed) -> None: ...

    def lost(self, worker: bytes, reason: str) -> None: ...

    def broken(self, node: str, step: str, what: str) -> None: ...


class ManagerNode:
    """The manager as its workers see it; see the module docstring."""

    def __init__(
        self,
        listener: Listener,
        now: Callable[[], float],
        worker_timeout: float = 30.0,
        heartbeat_interval: float = 1.0,
    ) -> None:
        self.listener = listener
        self.now = now
        self.state = s.SchedulerState()
        self.liveness = Liveness(worker_timeout, heartbeat_interval)
        self.heartbeat_interval = heartbeat_interval
        #: registered workers: identity -> (name, peer address)
        self.workers: dict[bytes, tuple[str, str]] = {}
        self.names_by_peer: dict[str, str] = {}
        #: identities whose connection is known closed: a send to them fails
        self.closed: set[bytes] = set()
        self.events: list[s.Event] = []
        self.outboxes: dict[bytes, list[p.ToWorker]] = {}
        #: batches of only ``Release`` records waiting for company, as the loop's
        self.release_hold: ReleaseHold[bytes, p.ToWorker] = ReleaseHold()
        self.next_tick = 0.0
        self.ejected: list[tuple[bytes, str]] = []
        self.quarantined: list[Quarantined] = []

    # -- what arrives -----------------------------------------------------------------

    def from_worker(self, ident: bytes, messages: list[p.ToManager]) -> None:
        now = self.now()
        if ident not in self.workers:
            register = next((m for m in messages if type(m) is p.Register), None)
            if register is None or ident in self.closed:
                return  # a stranger's records, or a lost worker's last words: dropped
            if any(name == register.name for name, _ in self.workers.values()):
                self.outboxes.setdefault(ident, []).append(p.Rejected("name taken"))
                return
            self.workers[ident] = (register.name, register.peer_address)
            self.names_by_peer[register.peer_address] = register.name
            self.liveness.joined(ident, now)
            self.outboxes.setdefault(ident, []).append(
                p.Welcome(register.name, self.heartbeat_interval)
            )
            self.events.append(
                s.WorkerJoined(
                    ident,
                    register.name,
                    register.cores,
                    register.peer_address,
                    register.memory,
                    register.hostname,
                    register.gpus,
                )
            )
            messages = [m for m in messages if type(m) is not p.Register]
        if messages:
            self.liveness.heard(ident, now)
        for message in messages:  # (``type(message) is``: the test mypy narrows by)
            if type(message) is p.Status or type(message) is p.Register:
                continue
            if type(message) is p.Transfers and self._credible(ident, message):
                continue
            if type(message) is p.Goodbye:
                self._lose(ident, f"it left: {message.reason}")
                return
            self.events.append(s.FromWorker(ident, message))

    def _credible(self, ident: bytes, message: p.Transfers) -> bool:
        own = self.workers[ident][1]
        seen = set()
        for address, nbytes in message.received:
            if address not in self.names_by_peer or address == own or address in seen:
                return False
            if not 0 <= nbytes <= MAX_REPORTED_BYTES:
                return False
            seen.add(address)
        return True

    def submit(self, event: SubmitRun) -> None:
        self.events.append(event)

    def cancel(self, run_id: int) -> None:
        self.events.append(CancelRun(run_id))

    def clear_cache(self) -> None:
        self.events.append(CacheClear())

    def disconnected(self, ident: bytes) -> None:
        """The worker's connection closed (its process died): the next send fails."""
        self.closed.add(ident)

    # -- a pass -----------------------------------------------------------------------

    def timers(self) -> None:
        """The loop's timer check: silent workers lost, idle ones sent a heartbeat."""
        now = self.now()
        verdict = self.liveness.check(now)
        for gone in verdict.lost:  # (the watch keeps the identities it was given)
            lost = cast(bytes, gone.worker)
            self._lose(lost, gone.reason)
            if gone.silent:  # (it may still be there: told to leave, as the loop does)
                self.listener.send(lost, [p.Shutdown("declared lost after silence")])
        for due in verdict.heartbeat:
            self.outboxes.setdefault(cast(bytes, due), [p.Heartbeat()])
        if now >= self.next_tick:
            self.next_tick = now + TICK_PERIOD
            self.events.append(Tick())

    def step(self) -> None:
        """Feed the events to the state, act on its instructions, flush."""
        if self.events:
            events, self.events = self.events, []
            for instruction in self.state.handle(events, self.now()):
                self._act(instruction)
        self._flush()

    def _act(self, instruction: s.Instruction) -> None:
        # (``type(instruction) is``: the test mypy narrows the union of instructions by)
        if type(instruction) is Send:
            if instruction.worker in self.workers:
                self.outboxes.setdefault(instruction.worker, []).append(instruction.message)
        elif type(instruction) is RunOutput:
            self.listener.run_output(instruction)
        elif type(instruction) is RunDone or type(instruction) is RunFailed:
            self.listener.run_ended(instruction)
        elif type(instruction) is Eject:
            self.ejected.append((instruction.worker, instruction.reason))
            if instruction.worker in self.workers:
                self._lose(instruction.worker, f"ejected: {instruction.reason}")
                self.listener.send(instruction.worker, [p.Shutdown("ejected by the manager")])
        elif type(instruction) is Quarantined:
            self.quarantined.append(instruction)
        elif type(instruction) is RunAborted:
            self.listener.broken(
                "manager", "a handler raised", f"{instruction.what}: {instruction.error!r}"
            )
        elif type(instruction) is EventDropped:
            self.listener.broken(
                "manager", "an event was dropped", f"{instruction.what}: {instruction.error!r}"
            )

    def _flush(self) -> None:
        outboxes, self.outboxes = self.outboxes, {}
        now = self.now()
        for ident, messages in self.release_hold.batches(outboxes, now):
            if ident in self.closed:
                self._lose(ident, "unreachable (its connection closed)")
                continue
            self.listener.send(ident, messages)
            self.liveness.sent(ident, now)
        if self.events:  # workers lost while flushing: the state hears of it now
            events, self.events = self.events, []
            for instruction in self.state.handle(events, now):
                self._act(instruction)
            if self.outboxes:
                self._flush()

    def _lose(self, ident: bytes, reason: str) -> None:
        if self.workers.pop(ident, None) is None:
            return
        self.closed.add(ident)  # (a lost identity is never welcomed again)
        self.liveness.left(ident)
        self.outboxes.pop(ident, None)
        self.release_hold.drop(ident)
        self.events.append(s.WorkerLost(ident, reason))
        self.listener.lost(ident, reason)

    # -- views for the invariants -------------------------------------------------------

    def false_claims(self) -> dict[str, int]:
        """False claims counted per worker name (``Claims``), those above zero."""
        claims = self.state.ctx.claims
        assert isinstance(claims, Claims)  # (the context types its parts by what they offer)
        told = claims.told
        return {worker.name: mine.false for worker, mine in told.items() if mine.false}

    def strikes(self) -> dict[str, float]:
        """Strikes per worker name (``Faults``), those above zero."""
        faults = self.state.faults
        strikes = {w.name: n for w, n in faults.strikes.items() if n}
        for worker, count in faults.suspected.items():  # (each a disagreement settled)
            strikes[worker.name] = strikes.get(worker.name, 0.0) + count
        return strikes

    def busy(self) -> bool:
        """Runs, tasks or events still in the state."""
        return bool(
            self.state.runs or self.state.tasks or self.events or self.outboxes or self.release_hold
        )

    def held_by(self) -> dict[str, set[int]]:
        """Per worker name: the results the state believes it holds."""
        return {w.name: {t.id for t in w.has_what} for w in self.state.workers.values()}

    def processing(self) -> dict[str, set[int]]:
        return {w.name: {t.id for t in w.processing} for w in self.state.workers.values()}

    def known_workers(self) -> set[str]:
        return {w.name for w in self.state.workers.values()}
