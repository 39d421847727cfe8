"""One process of the swarm: many simulated workers, each a worker as the manager sees it.

Every simulated worker has its own identity and its own DEALER to the manager (CurveZMQ
with the connection file's keys), registers with the real protocol, heartbeats, takes
batched ``Execute`` records, and keeps its bookkeeping in the worker's own sans-I/O
``WorkerState`` (the same saturation queues, fetches and releases a real worker has). Only
the library processes are simulated: a call is computed at once in this process (the
workload's ``sim_task`` is cheap) and its ``Done`` is held back until the duration the
task declared has passed on its library slot, with the result's declared size reported
and a result scaled down by ``--byte-scale`` carried (so that results move between
workers through their peer sockets, as large results do, without moving megabytes).

Each keeps at most ``--peer-links`` sockets to peers (default 8; a real worker keeps up to
``fetching.MAX_PEER_LINKS``): one process polls every socket of its workers on each pass,
and thousands of idle links would make the swarm, not the manager, the bottleneck.

Peers talk through each simulated worker's ``PeerLinks`` (a ROUTER serving its store, a
DEALER per peer it fetches from) without CurveZMQ: only simulated workers are its peers,
and the manager never sees those sockets.

Preemption: ``--preempt F`` makes F of this process's workers (at least one, chosen at
random) vanish, each at a random time within ``--preempt-window`` seconds of its
registration, without a goodbye (their
sockets closed at once, as a killed process's are); a replacement joins
``--replace-after`` seconds later under a new name.

Timing: ``--jitter S`` adds a random delay of up to S seconds to each simulated task
(drawn from the process's seeded generator), so that completions, ``Started`` records
(the worker's state sends them as a reply frees a library slot for the next call, as a
real worker's does) and fetches interleave in orders a fixed duration never gives. An
input a call lacks (the worker's state sent it ahead of its input) fails that task with
the missing ids named and is counted (``missing_inputs``), as is every ``Shutdown`` that
ejects one of these honest workers (``ejected``): both are the scheduler's bugs,
reported, never a crash of the process and its hundreds of workers.

Faulty workers (issue 29): ``--black-holes F`` and ``--stragglers F`` (``swarm_faults``).
Every simulated worker runs the real worker's state, which tells the manager when a
task begins on its library slot (``Started``), and honours ``Abort``. Its heartbeats
carry the bars of what it ran and fetched (``Status.activity``, merged by the worker's
own ``Activity`` as a real worker's are: about one bar per library slot per heartbeat
while tasks of one prefix run back to back), so that the manager's cost of the live
task stream is measured with the rest.

The process measures itself: how late each simulated completion is delivered
(``lag``: the delivery time less the time it was due), so that a swarm too slow for
its load is never mistaken for a slow manager. It writes its figures as JSON to
``--stats`` when the manager says ``Shutdown`` (or on SIGTERM).

``swarm.py`` starts these processes (``swarm.py --swarm-process ARGS``, which calls
``main``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import pickle
import random
import resource
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import zmq

from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.serialize import Serialized, TaskDecoder, loads
from daskvine_py.wire.transport import has_more, send_batch
from daskvine_py.worker import pipe
from daskvine_py.worker.messages import (
    AnswerPeer,
    AskPeer,
    Boot,
    ClosePeer,
    EventFailed,
    FromLibrary,
    Leave,
    RegistrationSent,
    SendStatus,
    StartLibrary,
    Tick,
    ToLibrary,
)
from daskvine_py.worker.peers import PeerLinks
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import swarm_faults  # noqa: E402  (beside this file)
import swarm_workloads  # noqa: E402

logger = logging.getLogger("daskvine_py.swarm")

#: Padding shared by every result of one size: a result carries bytes, not copies.
_PADDING: dict[int, bytes] = {}


#: Padding sizes are rounded up to a multiple of this: few distinct sizes to keep.
_PADDING_STEP = 4096


def _padding(nbytes: int) -> bytes:
    nbytes = -(-nbytes // _PADDING_STEP) * _PADDING_STEP
    pad = _PADDING.get(nbytes)
    if pad is None:
        pad = _PADDING[nbytes] = bytes(nbytes)
    return pad


class _Poller:
    """A ``zmq.Poller`` whose ``unregister`` does not renumber every later socket: the
    swarm's poller holds thousands of sockets, and peer links come and go (measured:
    1.3 ms per ``unregister`` of ``zmq.Poller`` at 10,000 sockets)."""

    def __init__(self) -> None:
        self._flags: dict[Any, int] = {}
        self._items: list[tuple[Any, int]] | None = None

    def register(self, sock: Any, flags: int = zmq.POLLIN) -> None:
        self._flags[sock] = flags
        self._items = None

    def unregister(self, sock: Any) -> None:
        del self._flags[sock]
        self._items = None

    def poll(self, timeout: int | None = None) -> list[tuple[Any, int]]:
        if self._items is None:
            self._items = list(self._flags.items())
        return zmq.zmq_poll(self._items, -1 if timeout is None else timeout)


class Swarm:
    """The process's shared parts: the context, the poller, the clock of completions."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        connection = security.read_connection_file(args.connection_file)
        self.address = connection.address
        self.keys = connection.keys
        self.context = zmq.Context(io_threads=args.io_threads)
        self.context.set(zmq.MAX_SOCKETS, 65536)
        self.poller = _Poller()
        #: socket -> (its worker, what it is: "manager", "server" or "client")
        self.owners: dict[Any, tuple[SimWorker, str]] = {}
        self.decoder = TaskDecoder()
        #: (due, sequence, worker, library id, reply) of the simulated calls in flight
        self.completions: list[tuple[float, int, SimWorker, int, Any]] = []
        #: workers holding a ``Started`` for company, and when it falls due (as a real
        #: worker's poll wakes for it: the liveness sweep every 0.25 s would send it late)
        self.holding: dict[SimWorker, float] = {}
        self.sequence = 0
        self.workers: list[SimWorker] = []
        self.drops = p.DropLog(logger)
        self.random = random.Random(args.seed)
        self.next_index = args.first_index
        #: the workers that will vanish, and when: (time, sequence, worker)
        self.doomed: set[SimWorker] = set()
        self.preemptions: list[tuple[float, int, SimWorker]] = []
        self.replacements: list[float] = []
        self.running = True
        # figures
        self.lags: list[float] = []
        self.max_lag = 0.0
        self.task_seconds = 0.0
        self.tasks_done = 0
        self.tasks_failed = 0
        self.tasks_killed = 0
        self.black_holes: list[str] = []
        self.stragglers: list[str] = []
        self.declared_bytes = 0
        self.connect_started: float | None = None
        self.welcomes: list[float] = []
        self.preempted: list[tuple[float, str]] = []
        #: replacements: (when, name)
        self.joined: list[tuple[float, str]] = []
        self.gave_up = 0
        self.failed_to_join = 0
        #: what honest workers must never see: ejections, and calls without their inputs
        self.ejected: list[str] = []
        self.missing_inputs: list[tuple[str, int, list[int]]] = []

    def start(self) -> None:
        self.connect_started = time.time()
        for _ in range(self.args.workers):
            self.add_worker()
        preempt = self.args.preempt
        if preempt > 0:  # exactly this share of the first workers (at least one) vanish
            count = max(1, round(preempt * len(self.workers)))
            self.doomed = set(self.random.sample(self.workers, min(count, len(self.workers))))
        swarm_faults.choose(self)

    def add_worker(self) -> SimWorker:
        name = f"{self.args.name_prefix}{self.next_index}"
        self.next_index += 1
        worker = SimWorker(self, name, self.args.cores)
        self.workers.append(worker)
        return worker

    def own(self, sock: Any, worker: SimWorker, kind: str) -> None:
        self.owners[sock] = (worker, kind)

    def schedule(self, worker: SimWorker, lib: int, due: float, reply: Any) -> None:
        """A simulated call's reply, due when its slot's earlier calls and its own
        duration have passed. Its ``Started`` is the worker state's, sent as the reply
        before it frees the slot (a second one here would count each start twice)."""
        self.sequence += 1
        heapq.heappush(self.completions, (due, self.sequence, worker, lib, reply))

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        heartbeat_check = 0.0
        while self.running:
            now = time.monotonic()
            timeout = 0.2
            if self.completions:
                timeout = min(timeout, max(0.0, self.completions[0][0] - now))
            if self.preemptions:
                timeout = min(timeout, max(0.0, self.preemptions[0][0] - now))
            if self.holding:
                timeout = min(timeout, max(0.0, min(self.holding.values()) - now))
            dirty: set[SimWorker] = set()
            for sock, _ in self.poller.poll(int(timeout * 1000)):
                owner = self.owners.get(sock)
                if owner is None:  # (a peer client's socket, reset since)
                    continue
                worker, kind = owner
                if not worker.alive:
                    continue
                dirty.add(worker)
                if kind == "manager":
                    worker.drain_manager()
                elif kind == "server":
                    worker.peers.serve(worker.state.live, worker.events)
                else:
                    worker.peers.drain(sock, worker.events)
            now = time.monotonic()
            wall = time.time()
            completions = self.completions
            while completions and completions[0][0] <= now:
                due, _, worker, lib, done = heapq.heappop(completions)
                if not worker.alive:
                    continue
                worker.running.discard(done.task_id)
                if done.task_id in worker.killed:
                    swarm_faults.swallow(worker, lib, done, wall)
                    dirty.add(worker)
                    continue
                lag = now - due
                self.lags.append(lag)
                if lag > self.max_lag:
                    self.max_lag = lag
                if type(done) is pipe.Done:
                    self.task_seconds += done.duration
                    self.tasks_done += 1
                else:
                    self.tasks_failed += 1
                worker.events.append(FromLibrary(lib, done, wall))
                dirty.add(worker)
            while self.preemptions and self.preemptions[0][0] <= now:
                _, _, doomed = heapq.heappop(self.preemptions)
                self.vanish(doomed, now)
            while self.replacements and self.replacements[0] <= now:
                heapq.heappop(self.replacements)
                try:
                    replacement = self.add_worker()
                    replacement.replacement = True
                    self.joined.append((time.time(), replacement.name))
                except zmq.ZMQError as exc:  # (out of files): said, counted, not fatal
                    logger.error("a replacement worker could not start: %s", exc)
                    self.failed_to_join += 1
            if now - heartbeat_check > 0.25:  # liveness: every worker, a few times a second
                heartbeat_check = now
                for worker in self.workers:
                    if worker.alive and worker.check_timers(now):
                        dirty.add(worker)
            holding = self.holding
            if holding:
                for worker, due in list(holding.items()):
                    if due <= now:
                        del holding[worker]
                        if worker.alive and worker.check_timers(now):
                            dirty.add(worker)
            for worker in dirty:
                if worker.alive:
                    worker.pass_end(now)
                    if getattr(worker.state, "held_started", None):  # (None: an older checkout)
                        holding[worker] = worker.state.started_due
                    else:
                        holding.pop(worker, None)

    def vanish(self, worker: SimWorker, now: float) -> None:
        """A registered worker is preempted: gone without a word; one joins later."""
        if not worker.alive:
            return
        worker.close()
        self.preempted.append((time.time(), worker.name))
        heapq.heappush(self.replacements, now + self.args.replace_after)

    def on_welcome(self, worker: SimWorker) -> None:
        if not worker.replacement:  # (the join storm: the workers that started at once)
            self.welcomes.append(time.time())
        if worker in self.doomed:  # it vanishes within the window after it joined
            self.sequence += 1
            when = time.monotonic() + self.random.uniform(0.0, self.args.preempt_window)
            heapq.heappush(self.preemptions, (when, self.sequence, worker))

    def stats(self) -> dict[str, Any]:
        lags = sorted(self.lags)
        pct = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else 0.0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "workers": len(self.workers),
            "connect_started": self.connect_started,
            "welcomes": self.welcomes,
            "tasks_done": self.tasks_done,
            "tasks_failed": self.tasks_failed,
            "tasks_killed": self.tasks_killed,
            "black_holes": self.black_holes,
            "stragglers": self.stragglers,
            "task_seconds": self.task_seconds,
            "declared_bytes": self.declared_bytes,
            "lag_p50_s": pct(0.5),
            "lag_p99_s": pct(0.99),
            "lag_max_s": self.max_lag,
            "preempted": self.preempted,
            "joined": self.joined,
            "gave_up": self.gave_up,
            "failed_to_join": self.failed_to_join,
            "ejected": self.ejected,
            "missing_inputs": self.missing_inputs,
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive:
                worker.close()
        self.context.term()


class SimWorker:
    """One simulated worker: a real ``WorkerState`` and real sockets, simulated libraries.
    A shell as ``shell.Worker`` is: what it reads becomes events for the state, whose
    instructions it carries out (a library's requests are simulated, ``simulate``)."""

    def __init__(self, swarm: Swarm, name: str, cores: int) -> None:
        self.swarm = swarm
        self.name = name
        self.alive = True
        #: joined in place of a preempted worker (not part of the join storm)
        self.replacement = False
        self.identity = uuid.uuid4().hex.encode()
        context = swarm.context
        sock = self.manager = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        if swarm.keys is not None:
            security.connect_as_worker(sock, swarm.keys.manager_public, swarm.keys)
        sock.connect(swarm.address)
        swarm.poller.register(sock, zmq.POLLIN)
        swarm.own(sock, self, "manager")
        self.store = Store()
        self.peers = _SwarmPeers(swarm, self, context, swarm.poller, self.store, swarm.drops, name)
        swarm.own(self.peers.server, self, "server")
        now = time.monotonic()
        self.state = WorkerState(
            self.store,
            name,
            self.peers.address,
            swarm.args.manager_timeout,
            10.0,
            now,
            peer_links=swarm.args.peer_links,
        )
        #: events for the state's next pass, and records for the manager not yet sent
        self.events: list[object] = []
        self.outbox: list[Any] = []
        self.register_pending = False
        #: a faulty worker (``--black-holes``, ``--stragglers``): it fails every task, or
        #: runs each this many times slower
        self.black_hole = False
        self.slowdown = 1.0
        #: tasks handed to a simulated library and not replied yet; those aborted
        self.running: set[int] = set()
        self.killed: set[int] = set()
        #: simulated libraries: when each one's slot is free again
        self.free_at: dict[int, float] = {}
        register = p.Register(
            p.PROTOCOL_VERSION,
            name,
            cores,
            swarm.args.memory_mb * 2**20,
            socket.gethostname(),
            self.peers.address,
            os.getpid(),
        )
        self.handle([Boot(register, cores)], now)  # its libraries, ready at once: it registers
        self.flush()

    def handle(self, events: list[object], now: float) -> None:
        """Hand the state ``events``; carry out its instructions (and again with what they
        answer, a simulated library's readiness or a peer that cannot be asked)."""
        pending = events
        while pending and self.alive:
            batch = pending[:]
            pending.clear()
            self.carry(self.state.handle(batch, now), pending, now)

    def carry(self, instructions: list[Any], events: list[object], now: float) -> None:
        for instruction in instructions:
            kind = type(instruction)
            if kind in p.TO_MANAGER:
                if kind is p.Register:
                    self.register_pending = True
                self.outbox.append(instruction)
            elif kind is ToLibrary:
                if type(instruction.request) is pipe.Run:
                    self.simulate(instruction.library_id, instruction.request, now)
                # (nothing is kept live: no export or forget to do)
            elif kind is AskPeer:
                self.peers.ask(instruction, events)
            elif kind is ClosePeer:
                self.peers.reset(instruction.address)
            elif kind is AnswerPeer:
                self.peers.answer_later(instruction)
            elif kind is SendStatus:  # as a real worker's heartbeat (``host.status``)
                held, spilled, bars = instruction
                self.outbox.append(p.Status(held, 0, 0, spilled, 0, bars))
            elif kind is StartLibrary:
                self.free_at[instruction.library_id] = 0.0
                events.append(FromLibrary(instruction.library_id, pipe.Ready(), now))
            elif kind is Leave:
                if instruction.unreachable:
                    logger.error("worker %s: %s", self.name, instruction.reason)
                    self.swarm.gave_up += 1
                self.close()
                return
            elif kind is EventFailed:
                logger.warning(
                    "worker %s could not handle %r: %r",
                    self.name,
                    instruction.event,
                    instruction.error,
                )

    def drain_manager(self) -> None:
        events = self.events
        for _ in range(1000):
            try:
                frames = self.manager.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            now = time.monotonic()
            try:
                messages = p.unpack([f.buffer for f in frames], p.TO_WORKER)
            except ProtocolError:
                continue
            for message in messages:
                kind = type(message)
                if kind is p.Welcome:
                    self.swarm.on_welcome(self)
                elif kind is p.Rejected:
                    logger.error("worker %s rejected: %s", self.name, message.reason)
                    self.close()
                    return
                elif kind is p.Shutdown:
                    if message.reason.startswith("ejected"):  # the swarm's workers are honest
                        logger.error("worker %s: %s", self.name, message.reason)
                        self.swarm.ejected.append(self.name)
                    self.outbox.append(p.Goodbye("shut down"))
                    self.flush()
                    self.close()
                    self.swarm.running = any(w.alive for w in self.swarm.workers)
                    return
                elif kind is p.Abort:
                    swarm_faults.abort(self, message.task_ids, now)
                    continue
                events.append(message)
            if not has_more(self.manager):
                return

    def check_timers(self, now: float) -> bool:
        """Whether a deadline is due (heartbeat, the manager's silence, a fetch): a
        ``Tick`` for the state's next pass."""
        if self.state.poll_timeout(now) > 0:
            return False
        self.events.append(Tick(time.time()))
        return True

    def pass_end(self, now: float) -> None:
        self.handle(self.events, now)
        if self.alive:
            self.flush()

    def simulate(self, lib: int, run: pipe.Run, now: float) -> None:
        """Compute the run's calls at once; their replies fall due one after the other
        on the library's slot, each when its declared duration has passed."""
        swarm = self.swarm
        decoder = swarm.decoder
        if run.functions:
            decoder.add_functions(run.functions)
        start = max(now, self.free_at[lib])
        chained: dict[int, Any] = {}
        scale = swarm.args.byte_scale
        jitter = swarm.args.jitter
        declared = swarm_workloads.DECLARED
        for call in run.calls:
            missing = [d for _, d, v in call.inputs if v is None and d not in chained]
            if missing:  # the worker's state sent a call ahead of its input: a bug report
                message = self.missing_inputs(call.task_id, missing)
                swarm.schedule(self, lib, start, pipe.Erred(call.task_id, None, "", message))
                continue
            values = {}
            for dep_key, dep_id, value in call.inputs:
                values[dep_key] = chained[dep_id] if value is None else loads(value)
            result = decoder.decode(call.payload)(values)
            seconds, nbytes = declared[0] * self.slowdown, declared[1]
            if jitter:
                seconds += swarm.random.uniform(0.0, jitter)
            chained[call.task_id] = result
            self.running.add(call.task_id)
            if self.black_hole:
                start += swarm_faults.BLACK_HOLE_SECONDS
                message = "RuntimeError: a black hole (a simulated broken install)"
                swarm.schedule(self, lib, start, pipe.Erred(call.task_id, None, "", message))
                continue
            scaled = int(nbytes * scale)
            header = pickle.dumps(result, protocol=5)
            serialized = Serialized(header, [_padding(scaled)] if scaled else [])
            swarm.declared_bytes += nbytes
            start += seconds
            done = pipe.Done(call.task_id, serialized, seconds, nbytes or serialized.nbytes)
            swarm.schedule(self, lib, start, done)
        self.free_at[lib] = start

    def missing_inputs(self, task_id: int, missing: list[int]) -> str:
        """A call whose inputs its library was never given: counted and logged as the
        scheduler's bug it is, and failed as a task that raised (the run goes on)."""
        self.swarm.missing_inputs.append((self.name, task_id, missing))
        logger.error(
            "worker %s: task %d reached its library without input(s) %s",
            self.name,
            task_id,
            missing,
        )
        return f"RuntimeError: task {task_id} reached its library without its inputs {missing}"

    def flush(self) -> None:
        outbox = self.outbox
        if outbox:
            messages = outbox[:]
            outbox.clear()
            try:
                send_batch(self.manager, p.encode(messages))
            except zmq.Again:
                outbox[:0] = messages
            else:
                if self.register_pending:  # the manager's deadline starts now
                    self.register_pending = False
                    self.handle([RegistrationSent()], time.monotonic())
        self.peers.flush(self.state.live, self.events)

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        swarm = self.swarm
        for sock in [self.manager, self.peers.server, *self.peers.clients.values()]:
            swarm.owners.pop(sock, None)
            try:
                swarm.poller.unregister(sock)
            except KeyError:
                pass
        self.manager.close(linger=0)
        self.peers.close()


class _SwarmPeers(PeerLinks):
    """A simulated worker's peer sockets, their owner recorded for the shared poller."""

    def __init__(self, swarm: Swarm, worker: SimWorker, *args: Any) -> None:
        self.swarm_owner = (swarm, worker)
        super().__init__(*args, host="127.0.0.1")

    def _client(self, address: str) -> Any:
        known = address in self.clients
        sock = super()._client(address)
        if not known:
            swarm, worker = self.swarm_owner
            swarm.own(sock, worker, "client")
        return sock

    def reset(self, address: str | None) -> None:
        sock = self.clients.get(address) if address else None
        if sock is not None:
            self.swarm_owner[0].owners.pop(sock, None)
        super().reset(address)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one process of simulated workers")
    parser.add_argument("--connection-file", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--cores", type=int, default=12)
    parser.add_argument("--memory-mb", type=int, default=48 * 1024)
    parser.add_argument("--first-index", type=int, default=0)
    parser.add_argument("--name-prefix", default="sim-")
    parser.add_argument("--byte-scale", type=float, default=0.001)
    parser.add_argument("--preempt", type=float, default=0.0)
    parser.add_argument("--preempt-window", type=float, default=30.0)
    parser.add_argument("--replace-after", type=float, default=5.0)
    parser.add_argument("--manager-timeout", type=float, default=120.0)
    parser.add_argument("--io-threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-links", type=int, default=8)
    parser.add_argument("--black-holes", type=float, default=0.0)
    parser.add_argument("--stragglers", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--stats", required=True)
    parser.add_argument("--profile", default=None, help="write cProfile's figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    swarm = Swarm(args)

    def stop(*_: Any) -> None:
        swarm.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    try:
        swarm.start()
        swarm.run()
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        stats = swarm.stats()
        swarm.close()
        with open(args.stats + ".tmp", "w") as file:
            json.dump(stats, file)
        os.replace(args.stats + ".tmp", args.stats)
    return 0
