"""One simulated worker: the real ``WorkerState`` and simulated library processes.

The one module of the simulator that touches ``WorkerState`` (worker/state.py): when the
worker's state machine changes its interface, this is what changes with it. The rest of
the simulator sees a ``WorkerNode``: records in (from the manager, from peers, from its
libraries), records out (through its ``Host``), and a few views for the invariants.

It does what the worker's shell (worker/shell.py) does on each loop pass, in the same
order: take what arrived, kill the libraries of aborted tasks, check timers (the
manager's silence, heartbeats, fetch deadlines), hand runnable tasks to libraries, end
the pass, send exports and forgets to libraries, flush to the manager and to peers.

Libraries are simulated, their calls computed for real: each call runs through the
library's own ``library.run`` (the real decoding, inputs, live results kept between
calls, ``Missing`` for a live input that is not there) at the moment it starts on the
library's one slot; its reply arrives when the task's simulated duration has passed
(its duration at this worker's speed; the measured timings are replaced by simulated
ones, so a run never depends on this machine's speed). A library can run out of memory
(``TaskExhausted``, then it dies) or be killed (``Abort``); a new one starts in its place.

Each worker has its own clock: ``local = offset + rate * t`` of the simulation's time
``t``, so deadlines and heartbeats drift as on real machines.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, TaskDecoder, dumps
from daskvine_py.worker import library, pipe, serving
from daskvine_py.worker.records import LibraryRecord
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

#: A worker's peer address: what the manager hands its peers to fetch from it.
ADDRESS_PREFIX = "sim://"


class Host(Protocol):
    """What a node needs of the simulation: its time, a timer, and the network."""

    def now(self) -> float: ...

    def after(self, delay: float, action: Callable[[], None]) -> None: ...

    def to_manager(self, sender: WorkerNode, messages: list[Any]) -> None: ...

    def to_peer(self, sender: WorkerNode, address: str, link: int, request: p.GetData) -> None: ...

    def reply_to_peer(
        self, sender: WorkerNode, peer: str, link: int, data: list[p.Data]
    ) -> None: ...

    def broken(self, node: str, step: str, what: str) -> None: ...

    def died(self, node: WorkerNode) -> None: ...


@dataclass
class Faults:
    """What goes wrong on one worker: its speed, and the share of its calls whose library
    runs out of memory."""

    speed: float = 1.0
    oom: float = 0.0


@dataclass
class SimLibrary:
    """A library process with one slot: its queue of calls, the results it keeps live."""

    record: LibraryRecord
    decoder: TaskDecoder = field(default_factory=TaskDecoder)
    live: dict[int, Any] = field(default_factory=dict)
    queue: deque[pipe.Call] = field(default_factory=deque)
    #: the call on its slot now, if any
    running: int | None = None
    dead: bool = False
    #: live results to forget once the queued calls that read them have run
    forget_later: set[int] = field(default_factory=set)
    #: calls that made no result here (raised, or missed an input themselves)
    failed: set[int] = field(default_factory=set)


class WorkerNode:
    """A worker as the manager and its peers see it; see the module docstring."""

    def __init__(
        self,
        host: Host,
        name: str,
        cores: int,
        rng: random.Random,
        durations: Callable[[Any], float],
        sizes: Callable[[Any], int],
        faults: Faults,
        clock: tuple[float, float] = (0.0, 1.0),
        manager_timeout: float = 30.0,
        fetch_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.name = name
        self.address = ADDRESS_PREFIX + name
        self.identity = name.encode()
        self.rng = rng
        self.durations = durations
        self.sizes = sizes
        self.faults = faults
        self.offset, self.rate = clock
        self.alive = True
        self.store = Store()
        self.state = WorkerState(
            self.store, name, self.address, manager_timeout, fetch_timeout, self.clock()
        )
        self.libraries: dict[int, SimLibrary] = {}
        self.next_library = 0
        #: messages waiting for the next pass: (kind, payload)
        self.inbox: list[tuple[str, Any]] = []
        #: per peer address: the generation of the link to it (a reset link drops replies)
        self.links: dict[str, int] = {}
        #: calls whose library ran out of memory here (the injected faults: for the checks)
        self.exhausted: list[Any] = []
        self.registered_once = False
        self.leaving: str | None = None
        for _ in range(cores):
            self._start_library(ready=True)
        self.state.outbox.append(
            p.Register(p.PROTOCOL_VERSION, name, cores, 1 << 34, "sim", self.address, 0)
        )

    def clock(self) -> float:
        """This worker's own clock."""
        return self.offset + self.rate * self.host.now()

    # -- what arrives -----------------------------------------------------------------

    def deliver(self, kind: str, payload: Any) -> None:
        """Something for the next pass: "manager" (a batch), "request" (peer, link,
        ``GetData``), "data" (peer, link, ``Data`` records), "library" (id, reply)."""
        self.inbox.append((kind, payload))

    def step(self) -> None:
        """One loop pass of the worker's shell. Should its state raise, the worker
        process would die: so does this one (the manager sees its connection close)."""
        if not self.alive:
            return
        try:
            self._step()
        except Exception as exc:
            self.host.broken(self.name, "the worker's state never raises", repr(exc))
            self.vanish()
            self.host.died(self)

    def _step(self) -> None:
        state = self.state
        inbox, self.inbox = self.inbox, []
        for kind, payload in inbox:
            now = self.clock()
            if kind == "manager":
                self._from_manager(payload, now)
            elif kind == "request":
                self._serve(*payload)
            elif kind == "data":
                address, link, records = payload
                if self.links.get(address, 0) != link:
                    continue  # the link was reset since: its socket is gone
                for data in records:
                    state.on_data(data, now)
            elif kind == "library":
                library_id, reply = payload
                lib = self.libraries.get(library_id)
                if lib is not None and not lib.dead:
                    state.on_library_reply(lib.record, reply, now)
            if not self.alive:
                return
        if state.aborted:
            for task in state.take_aborted():
                lib = self.libraries.get(task.lib if task.lib is not None else -1)
                if lib is not None and not lib.dead:
                    self._library_died(lib, "killed by signal SIGKILL")
        now = self.clock()
        if not self._timers(now):
            return
        for record, run in state.start_runnable():
            lib = self.libraries.get(record.id)
            if lib is not None and not lib.dead:
                self._accept(lib, run)
        state.end_pass(now)
        while state.library_outbox:
            outbox = state.library_outbox[:]
            state.library_outbox.clear()
            for library_id, message in outbox:
                lib = self.libraries.get(library_id)
                if lib is not None and not lib.dead:
                    self._library_request(lib, message)
        self._flush()

    def _from_manager(self, messages: list[Any], now: float) -> None:
        for message in messages:
            kind = type(message)
            if kind is p.Shutdown:
                self.leave(f"the manager asked it to ({message.reason})")
                return
            if kind is p.Rejected:
                self.host.broken(self.name, "rejected", message.reason)
                self.vanish()
                return
            if kind is p.Welcome:
                self.registered_once = True
            try:
                self.state.on_manager_message(message, now)
            except Exception as exc:  # as the shell does: the task is reported crashed
                self.host.broken(self.name, "worker state raised", f"{message!r:.200}: {exc!r}")
                self.state.cannot_take(message, f"it could not take the task: {exc!r}")

    def _serve(self, peer: str, link: int, request: p.GetData) -> None:
        answers = []
        ident = f"{peer}#{link}".encode()  # (an export's answer comes back to it later)
        for task_id in request.task_ids:
            data = serving.answer(self.store, self.state, ident, task_id, _unreadable)
            if data is not None:
                answers.append(data)
        if answers:
            self.host.reply_to_peer(self, peer, link, answers)

    def _timers(self, now: float) -> bool:
        """The shell's timer checks; False if the worker left (the manager went silent)."""
        state = self.state
        if state.manager_silent(now):
            self.vanish()  # it exits; its connections close
            return False
        if state.heartbeat_due(now):
            state.last_sent = now
            state.outbox.append(p.Status(self.store.nbytes, 0, 0))
        for address in state.on_timers(now):
            self.links[address] = self.links.get(address, 0) + 1
        return True

    def wake_in(self) -> float:
        """Seconds of simulated time until this worker's next deadline."""
        return self.state.poll_timeout(self.clock()) / self.rate

    def _flush(self) -> None:
        state = self.state
        if state.outbox:
            messages = state.outbox[:]
            state.outbox.clear()
            self.host.to_manager(self, messages)
            state.on_registration_sent(self.clock())
            state.on_manager_connection(True, self.clock())
        evicted = state.fetcher.slots.evicted
        for address in evicted:
            self.links[address] = self.links.get(address, 0) + 1
        evicted.clear()
        if state.peer_replies:
            replies = state.peer_replies[:]
            state.peer_replies.clear()
            by_peer: dict[bytes, list[p.Data]] = {}
            for ident, data in replies:
                by_peer.setdefault(ident, []).append(data)
            for ident, records in by_peer.items():
                peer, _, generation = ident.decode().partition("#")
                self.host.reply_to_peer(self, peer, int(generation or 0), records)
        while state.peer_outbox:
            outbox = dict(state.peer_outbox)
            state.peer_outbox.clear()
            for address, ids in outbox.items():
                link = self.links.setdefault(address, 0)
                self.host.to_peer(self, address, link, p.GetData(tuple(ids)))

    # -- leaving ----------------------------------------------------------------------

    def leave(self, reason: str) -> None:
        """A clean leave: a goodbye to the manager, then gone."""
        if not self.alive:
            return
        if self.state.registered:
            self.state.outbox.append(p.Goodbye(reason))
        self._flush()
        self.vanish()

    def vanish(self) -> None:
        """Gone without a word (preempted, or exited): nothing more is sent or taken."""
        self.alive = False
        self.inbox.clear()
        for lib in self.libraries.values():
            lib.dead = True

    # -- libraries --------------------------------------------------------------------

    def _start_library(self, ready: bool = False) -> None:
        self.next_library += 1
        record = self.state.add_library(self.next_library, 1)
        lib = self.libraries[record.id] = SimLibrary(record)
        if ready:
            self.state.on_library_ready(record)
        else:  # it imports, then says it is ready
            self.host.after(self.rng.uniform(0.01, 0.3), lambda: self._ready(lib))

    def _ready(self, lib: SimLibrary) -> None:
        if self.alive and not lib.dead:
            self.state.on_library_ready(lib.record)
            self.host.after(0.0, self.step)

    def _accept(self, lib: SimLibrary, run: pipe.Run) -> None:
        """A request written to the library's pipe. Every input it names (live, no value)
        must be live there or made by a call before it there: else the call would run
        without an input the worker said it had."""
        if run.functions:
            lib.decoder.add_functions(run.functions)
        made = set(lib.live) | {call.task_id for call in lib.queue}
        if lib.running is not None:
            made.add(lib.running)
        for call in run.calls:
            for dep_key, dep_id, value in call.inputs:
                if value is None and dep_id not in made:
                    self.host.broken(
                        self.name, "no task runs without its inputs",
                        f"task {call.key!r} (id {call.task_id}) sent to library "
                        f"{lib.record.id} naming input {dep_key!r} (id {dep_id}) live there, "
                        "which it does not hold and no call before it makes",
                    )  # fmt: skip
            made.add(call.task_id)
            lib.queue.append(call)
        if lib.running is None:
            self._next_call(lib)

    def _next_call(self, lib: SimLibrary) -> None:
        if lib.dead or not lib.queue:
            lib.running = None
            self._forget_now(lib)
            return
        call = lib.queue.popleft()
        lib.running = call.task_id
        seconds = self.durations(call.key) / self.faults.speed
        seconds *= self.rng.uniform(0.8, 1.25)
        if self.faults.oom and self.rng.random() < self.faults.oom:
            self.exhausted.append(call.key)
            self.host.after(seconds / 2, lambda: self._out_of_memory(lib, call))
            return
        reply = library.run(call, lib.decoder, self.name, lib.live)
        if type(reply) is pipe.Done:  # the simulated time, never this machine's
            reply = reply._replace(duration=seconds, serialization=0.0, cpu=0.0, peak_memory=0)
            nbytes = self.sizes(call.key)
            if reply.value is not None and nbytes > p.INLINE_BYTES:
                # As large as declared to the manager; a few kB travel, so that it goes
                # from peer to peer as large results do (the value is the same).
                value = Serialized(reply.value.header, [_padding(nbytes)])
                reply = reply._replace(value=value, nbytes=nbytes)
        else:
            lib.failed.add(call.task_id)
        if type(reply) is pipe.Missing and reply.dep_id not in lib.failed:
            self.host.broken(
                self.name, "no task runs without its inputs",
                f"task {call.key!r} (id {call.task_id}) ran in library {lib.record.id} "
                f"without its live input id {reply.dep_id}",
            )  # fmt: skip
        self.host.after(seconds, lambda: self._reply(lib, reply))

    def _reply(self, lib: SimLibrary, reply: Any) -> None:
        if lib.dead:
            return
        self.deliver("library", (lib.record.id, reply))
        self.host.after(0.0, self.step)
        self._next_call(lib)

    def _out_of_memory(self, lib: SimLibrary, call: pipe.Call) -> None:
        """The call went past its allocation: reported, and its library dies."""
        if lib.dead or not self.alive:
            return
        limit = call.cores * (1 << 30)
        self.state.on_exhausted(lib.record, call.task_id, 2 * limit, limit)
        self._library_died(lib, "killed by signal SIGKILL (out of memory)")
        self.host.after(0.0, self.step)

    def _library_died(self, lib: SimLibrary, how: str) -> None:
        lib.dead = True
        running = () if lib.running is None else (lib.running,)
        del self.libraries[lib.record.id]
        self.state.on_library_death(lib.record, how, running)
        self._start_library()

    def _library_request(self, lib: SimLibrary, message: pipe.Export | pipe.Forget) -> None:
        if isinstance(message, pipe.Forget):
            lib.forget_later.update(message.task_ids)
            self._forget_now(lib)
            return
        for task_id in message.task_ids:  # served at once, ahead of the queued calls
            value = lib.live.get(task_id, _ABSENT)
            if value is _ABSENT:
                exported = pipe.Exported(task_id, None, 0.0, "it is not held in this library")
            else:
                exported = pipe.Exported(task_id, dumps(value), 0.0, "")
                if message.drop:
                    lib.forget_later.add(task_id)
            reply = functools.partial(self._reply_export, lib, exported)
            self.host.after(self.rng.uniform(0.0, 0.002), reply)
        self._forget_now(lib)

    def _reply_export(self, lib: SimLibrary, exported: pipe.Exported) -> None:
        if not lib.dead:
            self.deliver("library", (lib.record.id, exported))
            self.host.after(0.0, self.step)

    def _forget_now(self, lib: SimLibrary) -> None:
        if not lib.forget_later:
            return
        needed = {d for call in lib.queue for _, d, value in call.inputs if value is None}
        for task_id in list(lib.forget_later):
            if task_id not in needed:
                lib.live.pop(task_id, None)
                lib.forget_later.discard(task_id)

    # -- views for the invariants -------------------------------------------------------

    def holds(self) -> set[int]:
        """Ids of the results this worker holds: stored, or live in a library."""
        held = set(self.store)
        for lib in self.libraries.values():
            held.update(lib.live)
        return held

    def leaks(self) -> list[str]:
        """What its state still holds once quiet (``WorkerState.leaks``)."""
        return list(self.state.leaks())

    def state_registered(self) -> bool:
        """Whether it believes it joined its manager (it was welcomed)."""
        return self.state.registered

    def busy(self) -> bool:
        """Whether a library runs or has queued a call."""
        return any(lib.running is not None or lib.queue for lib in self.libraries.values())


_ABSENT = object()
#: Bytes a large result carries beside its value: enough not to travel inline.
PADDING = bytes(4 * p.INLINE_BYTES)


def _padding(nbytes: int) -> bytes:
    return PADDING if nbytes >= len(PADDING) else PADDING[:nbytes]


def _unreadable(task_id: int, exc: Exception) -> None:
    raise AssertionError(f"a simulated store cannot fail to read result {task_id}: {exc!r}")
