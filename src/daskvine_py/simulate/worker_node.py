"""One simulated worker: the real ``WorkerState`` and simulated library processes.

The one module of the simulator that touches ``WorkerState`` (worker/state.py): when the
worker's state machine changes its interface, this is what changes with it. The rest of
the simulator sees a ``WorkerNode``: records in (from the manager, from peers, from its
libraries), records out (through its ``Host``), and a few views for the invariants.

It drives the state as the worker's shell (worker/shell.py) does, through
``WorkerState.handle(events, now)`` alone: on each loop pass, what arrived becomes
events (the manager's records, a peer's ``Data``, ``PeerAsked`` for results a library
keeps live, ``FromLibrary``, ``MemoryExceeded`` and ``LibraryDied``), a ``Tick`` after
them; the instructions are carried out in order, and what they answer at once (a killed
library's ``LibraryDied``, a library that starts ready) goes back to the state in the same
pass, until none; then records go to the manager in one batch (``RegistrationSent``
follows the one that holds the ``Register``), answers and requests to peers.
``EventFailed`` is a violation (the state could not handle an event; the worker goes
on, as the real one does); an instruction the simulator does not model (task
processes) is one too.

Libraries are simulated, their calls computed for real: each call runs through the
library's own ``library.run`` (the real decoding, inputs, live results kept between
calls, ``Missing`` for a live input that is not there) at the moment it starts on the
library's one slot; its reply arrives when the task's simulated duration has passed
(its duration at this worker's speed; the measured timings are replaced by simulated
ones, so a run never depends on this machine's speed). A library can run out of memory
(``MemoryExceeded``, then it dies) or be killed (``KillLibrary``); the state starts one
in its place, which imports for a moment before it is ready.

Each worker has its own clock: ``local = offset + rate * t`` of the simulation's time
``t``, so deadlines and heartbeats drift as on real machines. The same clock stands for
its wall clock (``Tick.wall``, ``FromLibrary.wall``).
"""

from __future__ import annotations

import functools
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from daskvine_py.wire import protocol as p
from daskvine_py.wire.exits import EXIT_REJECTED
from daskvine_py.wire.serialize import Serialized, TaskDecoder, dumps
from daskvine_py.worker import library, pipe, serving
from daskvine_py.worker.messages import (
    AnswerPeer,
    AskPeer,
    Boot,
    ClosePeer,
    Event,
    EventFailed,
    FromLibrary,
    KillLibrary,
    Leave,
    LibraryDied,
    ManagerConnection,
    MemoryExceeded,
    PeerAsked,
    RegistrationSent,
    SendStatus,
    StartLibrary,
    Stop,
    Tick,
    ToLibrary,
)
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

#: A worker's peer address: what the manager hands its peers to fetch from it.
ADDRESS_PREFIX = "sim://"


class Host(Protocol):
    """What a node needs of the simulation: its time, a timer, and the network."""

    def now(self) -> float: ...

    def after(self, delay: float, action: Callable[[], None]) -> None: ...

    def to_manager(self, sender: WorkerNode, messages: list[p.ToManager]) -> None: ...

    def to_peer(self, sender: WorkerNode, address: str, link: int, request: p.GetData) -> None: ...

    def reply_to_peer(
        self, sender: WorkerNode, peer: str, link: int, data: list[p.Data]
    ) -> None: ...

    def broken(self, node: str, step: str, what: str) -> None: ...

    def died(self, node: WorkerNode) -> None: ...

    def file_read(self, node: WorkerNode, url: str, nbytes: int, source: int) -> None: ...


@dataclass
class Faults:
    """What goes wrong on one worker: its speed, the share of its calls whose library
    runs out of memory, and whether it lies (answers every task with None, a value that
    makes the honest tasks reading it raise: the liar of issue 38)."""

    speed: float = 1.0
    oom: float = 0.0
    liar: bool = False


@dataclass
class SimLibrary:
    """A library process with one slot: its queue of calls, the results it keeps live."""

    id: int
    decoder: TaskDecoder = field(default_factory=TaskDecoder)
    live: dict[int, Any] = field(default_factory=dict)
    queue: deque[pipe.Call] = field(default_factory=deque)
    #: the call on its slot now, if any
    running: int | None = None
    #: it has imported (said ``Ready``): calls written to it before wait in its pipe
    ready: bool = False
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
        durations: Callable[[Hashable], float],
        sizes: Callable[[Hashable], int],
        faults: Faults,
        clock: tuple[float, float] = (0.0, 1.0),
        manager_timeout: float = 30.0,
        fetch_timeout: float = 10.0,
        reads: Callable[[Hashable], tuple[str, int] | None] | None = None,
        disk: int = 0,
    ) -> None:
        self.host = host
        #: the remote file a task reads, by key (``Workload.reads``), and this node's
        #: input cache: URL -> bytes, least recently used first, bounded by ``disk``
        #: (0: no bound), as ``daskvine_py.inputs`` keeps whole files on a node
        self.reads = reads
        self.disk = disk
        self.files: OrderedDict[str, int] = OrderedDict()
        self.files_bytes = 0
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
        #: messages waiting for the next pass: (kind, payload)
        self.inbox: list[tuple[str, Any]] = []
        #: records for the manager, sent in one batch at the end of the pass
        self.outbox: list[p.ToManager] = []
        #: the ``Register`` waits in ``outbox``: its going out is news for the state
        self.register_pending = False
        #: the connection to the manager is up (said to the state once, at the first send)
        self.connected = False
        #: answers for peers that waited for an export (``AnswerPeer``), by identity
        self.answers: dict[bytes, list[p.Data]] = {}
        #: per peer address: the generation of the link to it (a reset link drops replies)
        self.links: dict[str, int] = {}
        #: calls whose library ran out of memory here (the injected faults: for the checks)
        self.exhausted: list[Hashable] = []  # (their keys)
        #: the state's ``Leave``, once it came: the worker goes at the end of the pass
        self.leaving: Leave | None = None
        #: libraries start ready while it boots (as before its first pass), later import
        self.booting = True
        self._carriers: dict[type, Callable[[Any, list[Event]], None]] = dict.fromkeys(
            p.TO_MANAGER, self._to_manager
        )
        self._carriers.update(
            {
                SendStatus: self._send_status,
                StartLibrary: self._start_library,
                ToLibrary: self._to_library,
                KillLibrary: self._kill_library,
                AskPeer: self._ask_peer,
                ClosePeer: self._close_peer,
                AnswerPeer: self._answer_peer,
                Leave: self._leave,
                EventFailed: self._event_failed,
            }
        )
        register = p.Register(p.PROTOCOL_VERSION, name, cores, 1 << 34, "sim", self.address, 0)
        self._handle([Boot(register, cores)])
        self.booting = False

    def clock(self) -> float:
        """This worker's own clock."""
        return self.offset + self.rate * self.host.now()

    # -- what arrives -----------------------------------------------------------------

    def deliver(self, kind: str, payload: Any) -> None:
        """Something for the next pass: "manager" (a batch), "request" (peer, link,
        ``GetData``), "data" (peer, link, ``Data`` records), "library" (an event of a
        library: ``FromLibrary``, ``MemoryExceeded``, ``LibraryDied``)."""
        self.inbox.append((kind, payload))

    def step(self) -> None:
        """One loop pass of the worker's shell. ``handle`` never raises; should it all
        the same, the worker process would die: so does this one (the manager sees its
        connection close)."""
        if not self.alive:
            return
        try:
            self._step()
        except Exception as exc:
            self.host.broken(self.name, "the worker's state never raises", repr(exc))
            self.vanish()
            self.host.died(self)

    def _step(self) -> None:
        inbox, self.inbox = self.inbox, []
        events: list[Event] = []
        for kind, payload in inbox:
            if kind == "manager":
                events += payload
            elif kind == "request":
                peer, link, request = payload
                self._serve(peer, link, request, events)
            elif kind == "data":
                address, link, records = payload
                if self.links.get(address, 0) == link:  # else reset since: its socket is gone
                    events += records
            elif kind == "library":
                events.append(payload)
        events.append(Tick(self.clock()))
        self._handle(events)
        self._flush()

    def _serve(self, peer: str, link: int, request: p.GetData, events: list[Event]) -> None:
        """A peer's request, answered from the store at once; the ids of results a library
        keeps live go to the state (``PeerAsked``), answered once exported."""
        answers = []
        deferred = []
        ident = f"{peer}#{link}".encode()
        for task_id in request.task_ids:
            data = serving.answer(self.store, self.state.live, task_id, _unreadable)
            if data is None:
                deferred.append(task_id)
            else:
                answers.append(data)
        if answers:
            self.host.reply_to_peer(self, peer, link, answers)
        if deferred:
            events.append(PeerAsked(ident, tuple(deferred)))

    def _handle(self, events: list[Event]) -> None:
        """Hand the state ``events``, carry out its instructions, and again with what
        they answered at once, until none."""
        carriers = self._carriers
        while events and self.alive:
            answered: list[Event] = []
            for instruction in self.state.handle(events, self.clock()):
                carrier = carriers.get(type(instruction))
                if carrier is None:
                    self.host.broken(
                        self.name, "the simulator models every instruction", repr(instruction)
                    )
                else:
                    carrier(instruction, answered)
            events = answered

    def wake_in(self) -> float:
        """Seconds of simulated time until this worker's next deadline."""
        return self.state.poll_timeout(self.clock()) / self.rate

    def _flush(self) -> None:
        """The end of a pass: one batch to the manager, answers to peers; the worker goes
        if its state said to leave."""
        leave = self.leaving
        if self.outbox and (leave is None or not leave.unreachable):
            messages = self.outbox[:]
            self.outbox.clear()
            self.host.to_manager(self, messages)
            news: list[Event] = []
            if not self.connected:
                self.connected = True
                news.append(ManagerConnection(True))
            if self.register_pending:  # the manager's deadline starts now
                self.register_pending = False
                news.append(RegistrationSent())
            if news and leave is None:
                self._handle(news)
        if self.answers:
            answers, self.answers = self.answers, {}
            for ident, records in answers.items():
                peer, _, generation = ident.decode().partition("#")
                self.host.reply_to_peer(self, peer, int(generation or 0), records)
        if self.leaving is not None:
            self.vanish()

    # -- instructions -----------------------------------------------------------------

    def _to_manager(self, record: p.ToManager, answered: list[Event]) -> None:
        if type(record) is p.Register:
            self.register_pending = True
        self.outbox.append(record)

    def _send_status(self, status: SendStatus, answered: list[Event]) -> None:
        held, spilled, bars = status  # (no processes to measure: their memory is 0)
        self.outbox.append(p.Status(held, 0, 0, spilled, 0, bars))

    def _ask_peer(self, ask: AskPeer, answered: list[Event]) -> None:
        link = self.links.setdefault(ask.address, 0)
        self.host.to_peer(self, ask.address, link, p.GetData(ask.task_ids))

    def _close_peer(self, close: ClosePeer, answered: list[Event]) -> None:
        """A new link: what comes back on the old one is dropped."""
        self.links[close.address] = self.links.get(close.address, 0) + 1

    def _answer_peer(self, answer: AnswerPeer, answered: list[Event]) -> None:
        self.answers.setdefault(answer.ident, []).append(answer.data)

    def _leave(self, leave: Leave, answered: list[Event]) -> None:
        if leave.exit_code == EXIT_REJECTED:  # an honest worker is never rejected
            self.host.broken(self.name, "rejected", leave.reason)
        if self.leaving is None:
            self.leaving = leave

    def _event_failed(self, failed: EventFailed, answered: list[Event]) -> None:
        self.host.broken(
            self.name,
            "the worker's state never raises",
            f"it could not handle {failed.event!r:.200}: {failed.error!r}",
        )

    # -- leaving ----------------------------------------------------------------------

    def leave(self, reason: str) -> None:
        """A clean leave (asked to stop): a goodbye to the manager if it joined, then gone."""
        if not self.alive:
            return
        self._handle([Stop(reason)])
        self._flush()
        self.vanish()

    def vanish(self) -> None:
        """Gone without a word (preempted, or exited): nothing more is sent or taken."""
        self.alive = False
        self.inbox.clear()
        for lib in self.libraries.values():
            lib.dead = True

    # -- libraries --------------------------------------------------------------------

    def _start_library(self, start: StartLibrary, answered: list[Event]) -> None:
        lib = self.libraries[start.library_id] = SimLibrary(start.library_id)
        if self.booting:
            lib.ready = True
            answered.append(FromLibrary(lib.id, pipe.Ready(), self.clock()))
        else:  # it imports, then says it is ready
            self.host.after(self.rng.uniform(0.01, 0.3), lambda: self._ready(lib))

    def _ready(self, lib: SimLibrary) -> None:
        if self.alive and not lib.dead:
            lib.ready = True
            self.deliver("library", FromLibrary(lib.id, pipe.Ready(), self.clock()))
            self.host.after(0.0, self.step)
            if lib.running is None:
                self._next_call(lib)

    def _to_library(self, write: ToLibrary, answered: list[Event]) -> None:
        lib = self.libraries.get(write.library_id)
        if lib is None or lib.dead:
            return  # died since (its death is the state's news, or on its way)
        request = write.request
        if type(request) is pipe.Run:
            self._accept(lib, request)
        else:
            self._library_request(lib, request)  # type: ignore[arg-type]

    def _kill_library(self, kill: KillLibrary, answered: list[Event]) -> None:
        lib = self.libraries.get(kill.library_id)
        if lib is not None and not lib.dead:
            answered.append(self._library_died(lib, "killed by signal SIGKILL"))

    def _accept(self, lib: SimLibrary, run: pipe.Run) -> None:
        """A request written to the library's pipe. Every input it names (live, no value)
        must be live there or made by a call before it there: else the call would run
        without an input the worker said it had. A call there that failed counts as one
        that made it: its reply may still be on the pipe as the worker chains a reader on
        it, and the library answers that reader ``Missing``, as ``_next_call`` allows."""
        if run.functions:
            lib.decoder.add_functions(run.functions)
        made = set(lib.live) | lib.failed | {call.task_id for call in lib.queue}
        if lib.running is not None:
            made.add(lib.running)
        for call in run.calls:
            for dep_key, dep_id, value in call.inputs:
                if value is None and dep_id not in made:
                    self.host.broken(
                        self.name,
                        "no task runs without its inputs",
                        f"task {call.key!r} (id {call.task_id}) sent to library "
                        f"{lib.id} naming input {dep_key!r} (id {dep_id}) live there, "
                        "which it does not hold and no call before it makes",
                    )
            made.add(call.task_id)
            lib.queue.append(call)
        if lib.running is None and lib.ready:
            self._next_call(lib)

    def _obtain(self, url: str, nbytes: int) -> tuple[tuple[str, int, int, str], ...]:
        """A task of this node reads ``url``: from the node's cache, or fetched whole
        from storage into it (the least recently used go past ``disk``, and are said to
        be gone: ``INPUT_DROPPED``)."""
        files = self.files
        reads = []
        if url in files:
            files.move_to_end(url)
            source = p.INPUT_FROM_CACHE
        else:
            source = p.INPUT_FROM_STORAGE
            files[url] = nbytes
            self.files_bytes += nbytes
            while self.disk and self.files_bytes > self.disk and len(files) > 1:
                gone, size = files.popitem(last=False)
                self.files_bytes -= size
                reads.append((gone, 0, p.INPUT_DROPPED, "simulated"))
        self.host.file_read(self, url, nbytes, source)
        reads.append((url, nbytes, source, "simulated"))
        return tuple(reads)

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
        reply: pipe.Done | pipe.Erred | pipe.Missing
        if self.faults.liar:
            reply = _lie(call, lib.live)
        else:
            reply = library.run(call, lib.decoder, self.name, lib.live)
        if type(reply) is pipe.Done:  # the simulated time, never this machine's
            reply = reply._replace(duration=seconds, serialization=0.0, cpu=0.0, peak_memory=0)
            read = self.reads(call.key) if self.reads is not None else None
            if read is not None:
                reply = reply._replace(inputs=self._obtain(*read))
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
                self.name,
                "no task runs without its inputs",
                f"task {call.key!r} (id {call.task_id}) ran in library {lib.id} "
                f"without its live input id {reply.dep_id}",
            )
        self.host.after(seconds, lambda: self._reply(lib, reply))

    def _reply(self, lib: SimLibrary, reply: pipe.Reply) -> None:
        if lib.dead:
            return
        self.deliver("library", FromLibrary(lib.id, reply, self.clock()))
        self.host.after(0.0, self.step)
        self._next_call(lib)

    def _out_of_memory(self, lib: SimLibrary, call: pipe.Call) -> None:
        """The call went past its allocation: killed by the memory watch, which reports
        it, and its library dies (the next pass reads both, as the shell's does)."""
        if lib.dead or not self.alive:
            return
        limit = call.cores * (1 << 30)
        self.deliver("library", MemoryExceeded(lib.id, call.task_id, 2 * limit, limit))
        self.deliver("library", self._library_died(lib, "killed by signal SIGKILL (out of memory)"))
        self.host.after(0.0, self.step)

    def _library_died(self, lib: SimLibrary, how: str) -> LibraryDied:
        """The library is gone; its death, for the state (which starts another)."""
        lib.dead = True
        running = () if lib.running is None else (lib.running,)
        del self.libraries[lib.id]
        return LibraryDied(lib.id, how, running)

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
            self.deliver("library", FromLibrary(lib.id, exported, self.clock()))
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


def _lie(call: pipe.Call, live: dict[int, Any]) -> pipe.Done:
    """A liar's answer to a call: None, kept live as asked (peers read None too), sent as
    asked; it computes nothing."""
    keep = call.keep is True
    if keep:
        live[call.task_id] = None
    value = dumps(None) if call.send or not keep else None
    return pipe.Done(call.task_id, value, 0.0, 8, keep)


def _padding(nbytes: int) -> bytes:
    return PADDING if nbytes >= len(PADDING) else PADDING[:nbytes]


def _unreadable(task_id: int, exc: Exception) -> None:
    raise AssertionError(f"a simulated store cannot fail to read result {task_id}: {exc!r}")
