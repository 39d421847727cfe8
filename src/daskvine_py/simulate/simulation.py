"""One seeded simulation: a manager, workers, a network, a clock, runs and faults.

Everything random comes from one ``random.Random(seed)`` (which also seeds the ``random``
module for the run: the worker's fetches shuffle holders with it); nothing reads a wall
clock, no thread or socket is used, so a seed replays exactly (``Outcome.trace``).

Time is a float of simulated seconds and advances from one event to the next (a heap of
(time, sequence, action)). The network keeps ZeroMQ's promise and no more: messages on
one connection (manager -> a worker, a worker -> the manager, a worker's requests to a
peer, that peer's answers) arrive in the order sent, each after a random delay, while
connections interleave freely. A node takes everything that arrived in one pass, as the
real loops drain their sockets; each pass is a *step*, and the invariants are checked
after every step (``invariants``).

Faults, drawn per seed: workers of different speeds and clock rates; preemption (gone
without a goodbye: the manager learns it when the connection closes, a moment later, or
from its silence); clean leaves; replacements that join under new names; libraries that
run out of memory; tasks whose code raises (the workload's ``boom``); several runs at
once, some cancelled; with ``Config.liar``, a worker that answers every task with None.
"""

from __future__ import annotations

import functools
import heapq
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from daskvine_py.plan.graph import build_plan
from daskvine_py.scheduler.messages import (
    NewTask,
    RunCache,
    RunDone,
    RunFailed,
    RunOutput,
    SubmitRun,
)
from daskvine_py.simulate import workloads as wl
from daskvine_py.simulate.invariants import Checker, RunRecord, Violation
from daskvine_py.simulate.manager_node import TIMER_PERIOD, ManagerNode, hashed_by_id
from daskvine_py.simulate.worker_node import Faults, WorkerNode
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import TaskEncoder


@dataclass
class Config:
    """What one seed may draw from."""

    workers: int = 4
    tasks: int = 40
    cores: tuple[int, ...] = (1, 1, 2, 3)
    #: runs submitted over the simulation (at least one)
    runs: tuple[int, int] = (1, 3)
    shapes: tuple[str, ...] = wl.SHAPES
    #: share of tasks whose code raises, in the runs that have any (a third of them)
    fail: float = 0.05
    retries: int = 3
    preempt: float = 0.3  #: probability that a worker is preempted
    leave: float = 0.1  #: probability that a worker leaves cleanly
    oom: float = 0.05  #: probability a worker's libraries run out of memory now and then
    cancel: float = 0.15  #: probability a run is cancelled
    #: probability that a seed's runs use the result cache: the same graph, again
    cache: float = 0.25
    #: probability that a seed's second worker (w1) lies: it answers every task with
    #: None, which makes the honest tasks reading it raise (the liar of issue 38)
    liar: float = 0.0
    #: one-way network delay: (minimum, typical) seconds, plus rare long stalls
    delay: tuple[float, float] = (0.0001, 0.003)
    #: a stall (one message in 100): between these many seconds
    stall: tuple[float, float] = (0.05, 0.5)
    #: simulated seconds after which an unfinished run is a violation
    horizon: float = 900.0
    #: tasks that read remote files (``Workload.reads``) are submitted naming them, so
    #: the manager places them where a node's input cache holds them; False: not named
    #: (their bytes are still reported and counted), for comparison
    input_locality: bool = True
    #: bytes of each node's input cache (0: no bound)
    node_disk: int = 0
    #: the given runs (``Simulation(workloads=...)``) go one after another, each
    #: submitted a moment after the one before it ended (an analysis iterated); False:
    #: each at a random time in the first 10 s
    in_turn: bool = False


@dataclass
class Outcome:
    seed: int
    steps: int
    time: float
    violations: list[Violation]
    #: one line per step: what ran, when (the replay test compares them)
    trace: list[str] = field(default_factory=list)


class Simulation:
    """See the module docstring. ``run()`` once."""

    def __init__(
        self,
        seed: int,
        config: Config | None = None,
        trace: bool = False,
        workloads: list[wl.Workload] | None = None,
    ) -> None:
        self.seed = seed
        self.config = config or Config()
        #: the runs' graphs (e.g. hypothesis's); None: drawn from the seed
        self.workloads = workloads
        self.rng = random.Random(seed)
        #: the name of the worker that lies (``Config.liar``); None: every one is honest
        self.liar: str | None = None
        if self.config.liar and self.rng.random() < self.config.liar:
            self.liar = "w1"
        self.time = 0.0
        self.sequence = 0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.steps = 0
        self.trace: list[str] | None = [] if trace else None
        self.workers: dict[str, WorkerNode] = {}
        self.by_ident: dict[bytes, WorkerNode] = {}
        self.by_address: dict[str, WorkerNode] = {}
        #: per connection (sender, receiver, channel): when its last message arrives
        self.conn_last: dict[tuple[str, str, str], float] = {}
        #: batches on their way that say more than "I am here" (``_news``): the views
        #: may agree only once none is (a Release or a Replicas may be stalled for
        #: seconds on a slow link)
        self.in_flight = 0
        self.manager = ManagerNode(self, lambda: self.time)
        self.checker = Checker(self)
        self.runs: dict[int, RunRecord] = {}
        self.planned = 0  #: runs to submit in all
        self.pending: dict[str, bool] = {}
        self.next_worker = 0
        self.durations: dict[wl.Key, float] = {}
        self.sizes: dict[wl.Key, int] = {}
        #: injected faults that may legitimately fail a task's attempts
        self.crash_faults = 0
        self.oom_faults = 0
        #: the runs use the result cache (``Config.cache``)
        self.cached = False
        #: per worker name: the last false claim the scheduler logged about it
        self.said: dict[str, str] = {}
        #: the remote files a task reads, by key (the workloads'), and each file
        #: obtained: (time, run, bytes, source: ``p.INPUT_FROM_*``)
        self.reads: dict[wl.Key, tuple[str, int]] = {}
        self.file_reads: list[tuple[float, int, int, int]] = []
        #: the run submitted last (the one whose tasks read files now, runs one by one)
        self.current_run = 0
        #: per run: when it ended (simulated seconds), and the runs submitted in turn
        #: that wait for the one before them (``Config.in_turn``)
        self.ended_at: dict[int, float] = {}
        self.waiting: list[tuple[int, wl.Workload]] = []

    # -- the Host of the nodes ----------------------------------------------------------

    def now(self) -> float:
        return self.time

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.sequence += 1
        heapq.heappush(self.heap, (self.time + max(0.0, delay), self.sequence, action))

    def _delay(self) -> float:
        low, typical = self.config.delay
        if self.rng.random() < 0.01:  # a stall: a busy link, a slow receiver
            return self.rng.uniform(*self.config.stall)
        return low + self.rng.expovariate(1.0 / typical)

    def _transmit(
        self,
        sender: str,
        receiver: str,
        channel: str,
        action: Callable[[], None],
        records: Sequence[object] = (),
    ) -> None:
        """Deliver on a FIFO connection: never before what was sent on it earlier.
        ``records``: what the batch carries, counted in ``in_flight`` if it is news."""
        conn = (sender, receiver, channel)
        at = max(self.time + self._delay(), self.conn_last.get(conn, 0.0))
        self.conn_last[conn] = at
        if _news(records):
            self.in_flight += 1
            action = functools.partial(self._arrived, action)
        self.sequence += 1
        heapq.heappush(self.heap, (at, self.sequence, action))

    def _arrived(self, action: Callable[[], None]) -> None:
        """News arrives (``in_flight``): ``action`` takes it."""
        self.in_flight -= 1
        action()

    def to_manager(self, sender: WorkerNode, messages: list[p.ToManager]) -> None:
        ident = sender.identity

        def arrive() -> None:
            self.manager.from_worker(ident, messages)
            self._pass("manager")

        self._transmit(sender.name, "manager", "up", arrive, messages)

    def send(self, worker: bytes, messages: list[p.ToWorker]) -> None:
        node = self.by_ident.get(worker)
        if node is None:
            return

        def arrive() -> None:
            if node.alive:
                node.deliver("manager", messages)
                self._pass(node.name)

        self._transmit("manager", node.name, "down", arrive, messages)

    def to_peer(self, sender: WorkerNode, address: str, link: int, request: p.GetData) -> None:
        peer = self.by_address.get(address)
        if peer is None:
            return  # nobody there: the request is never answered (the fetch times out)

        def arrive() -> None:
            if peer.alive:
                peer.deliver("request", (sender.address, link, request))
                self._pass(peer.name)

        self._transmit(sender.name, peer.name, f"ask{link}", arrive, (request,))

    def reply_to_peer(self, sender: WorkerNode, peer: str, link: int, data: list[p.Data]) -> None:
        node = self.by_address.get(peer)
        if node is None:
            return

        def arrive() -> None:
            if node.alive and sender.alive:  # a dead server's socket took its answers along
                node.deliver("data", (sender.address, link, data))
                self._pass(node.name)

        self._transmit(sender.name, node.name, f"answer{link}", arrive, data)

    def broken(self, node: str, step: str, what: str) -> None:
        self.checker.violation(step, f"{node}: {what}")

    def died(self, node: WorkerNode) -> None:
        """A worker's process died (its state raised): its connection closes."""
        self.after(0.001, lambda: self.manager.disconnected(node.identity))
        self.after(self.rng.uniform(0.5, 10.0), self._replace)

    # -- the Listener of the manager ------------------------------------------------------

    def run_output(self, ev: RunOutput) -> None:
        self.checker.output(ev)

    def run_ended(self, ev: RunDone | RunFailed) -> None:
        self.ended_at.setdefault(ev.run_id, self.time)
        self.checker.ended(ev)
        if self.waiting:  # (``Config.in_turn``) the next one, now
            run_id, workload = self.waiting.pop(0)
            self.after(0.001, functools.partial(self.submit, run_id, workload))

    def lost(self, worker: bytes, reason: str) -> None:
        self.checker.lost(worker, reason)

    # -- passes ---------------------------------------------------------------------------

    def _pass(self, name: str) -> None:
        """Schedule a pass of ``name`` soon, unless one is due already."""
        if self.pending.get(name):
            return
        self.pending[name] = True
        self.after(self.rng.uniform(0.0, 0.0005), lambda: self._step(name))

    def _step(self, name: str) -> None:
        self.pending[name] = False
        self.steps += 1
        if name == "manager":
            self.manager.step()
        else:
            node = self.workers[name]
            if not node.alive:
                return
            node.step()
        if self.trace is not None:
            self.trace.append(f"{self.time:.6f} {name}")
        self.checker.after_step(name)

    def _manager_timer(self) -> None:
        self.manager.timers()
        self._pass("manager")
        self.after(TIMER_PERIOD, self._manager_timer)

    def _worker_timer(self, node: WorkerNode) -> None:
        if not node.alive:
            return
        self._pass(node.name)
        self.after(max(0.01, min(node.wake_in(), 5.0)), lambda: self._worker_timer(node))

    # -- workers ----------------------------------------------------------------------------

    def file_read(self, node: WorkerNode, url: str, nbytes: int, source: int) -> None:
        self.file_reads.append((self.time, self.current_run, nbytes, source))

    def add_worker(self) -> WorkerNode:
        rng = self.rng
        name = f"w{self.next_worker}"
        self.next_worker += 1
        speed = rng.choice((0.5, 1.0, 1.0, 1.0, 2.0))
        oom = 0.05 if rng.random() < self.config.oom else 0.0
        clock = (rng.uniform(0, 1000), rng.uniform(0.98, 1.02))
        node = WorkerNode(
            self,
            name,
            rng.choice(self.config.cores),
            random.Random(rng.random()),
            self._duration,
            self._size,
            Faults(speed, oom, name == self.liar),
            clock,
            reads=self.reads.get,
            disk=self.config.node_disk,
        )
        self.workers[name] = node
        self.by_ident[node.identity] = node
        self.by_address[node.address] = node
        self._pass(name)
        self.after(0.0, lambda: self._worker_timer(node))
        if len(self.workers) > 1:  # the first one stays, so that every run can end
            if rng.random() < self.config.preempt:
                self.after(rng.uniform(0.05, 20.0), lambda: self.preempt(node))
            elif rng.random() < self.config.leave:
                self.after(rng.uniform(0.05, 20.0), lambda: self.leave(node))
        return node

    def _duration(self, key: wl.Key) -> float:
        return self.durations.get(key, 0.01)

    def _size(self, key: wl.Key) -> int:
        return self.sizes.get(key, 8)

    def preempt(self, node: WorkerNode) -> None:
        """Gone without a goodbye; the manager learns when its connection closes (soon,
        or, one time in three, only from its silence); a replacement joins later."""
        if not node.alive:
            return
        node.vanish()
        self.crash_faults += 1
        self.checker.gone(node, "preempted")
        if self.rng.random() < 2 / 3:
            closed = functools.partial(self.manager.disconnected, node.identity)
            self.after(self.rng.uniform(0.001, 2.0), closed)
        self.after(self.rng.uniform(0.5, 10.0), self._replace)

    def leave(self, node: WorkerNode) -> None:
        if not node.alive:
            return
        node.leave("leaving")
        self.crash_faults += 1  # (its running tasks are lost with it)
        self.checker.gone(node, "left")
        self.after(self.rng.uniform(0.5, 10.0), self._replace)

    def _replace(self) -> None:
        if not self.finished():
            self.add_worker()

    # -- runs -------------------------------------------------------------------------------

    def submit(self, run_id: int, workload: wl.Workload) -> None:
        plan = build_plan(workload.graph, workload.outputs)
        encoder = TaskEncoder()
        tasks = []
        for key in plan.order:
            payload, functions = encoder.encode(plan.nodes[key])
            deps = tuple(plan.dependencies[key])
            # A kind is one function, as in Dask's graphs: the tasks that raise are theirs.
            raises = workload.graph.get(key, (None,))[0] is wl.boom
            prefix = "boom" if raises else _prefix(key)
            read = workload.reads.get(key)
            if read is not None:
                self.reads[key] = read
            named = (read[0],) if read is not None and self.config.input_locality else ()
            tasks.append(
                NewTask(
                    key,
                    payload,
                    functions,
                    deps,
                    plan.priorities[key],
                    prefix,
                    plan.dependents.get(key, 0),
                    named,
                )
            )
            self.durations.setdefault(key, _seconds(key, plan.nodes[key], workload))
            self.sizes.setdefault(key, workload.nbytes.get(key, 8))
        cache = None
        if self.cached:  # cache keys name the graph and the key: the same graph hits
            keys: dict[wl.Key, bytes | None] = {
                key: f"{self.seed}/{workload.name}/{key!r}".encode() for key in plan.order
            }
            cache = RunCache(keys)
        event = SubmitRun(
            run_id, tasks, plan.outputs, self.config.retries, encoder.functions, cache=cache
        )
        self.runs[run_id] = RunRecord(run_id, workload, wl.reference(workload), self.time)
        self.current_run = run_id
        self.manager.submit(event)
        self._pass("manager")

    def cancel(self, run_id: int) -> None:
        record = self.runs.get(run_id)  # (None: waiting for its turn, ``Config.in_turn``)
        if record is not None and record.ended is None:
            record.cancelled = True
            self.manager.cancel(run_id)
            self._pass("manager")

    def _quiet(self) -> bool:
        """No library runs a call, no worker keeps a task or a fetch, no news is on its
        way (``in_flight``), and the manager knows only live workers."""
        if self.in_flight:
            return False
        for node in self.workers.values():
            if node.alive and (node.busy() or node.leaks()):
                return False
        return all(self.workers[name].alive for name in self.manager.known_workers())

    def finished(self) -> bool:
        if len(self.runs) < self.planned:
            return False
        return all(r.ended is not None or r.cancelled for r in self.runs.values())

    # -- the whole simulation ------------------------------------------------------------------

    def run(self) -> Outcome:
        """Run the seed to its end; what broke. The warnings the scheduler logs about
        false claims are kept (``said``), to name the report each violation is about."""
        handler = _Said(self.said)
        logger = logging.getLogger("daskvine_py.manager")
        level, propagate = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # (the violations say what matters, with their seed)
        # The worker's fetches shuffle a result's holders with the module's generator:
        # seeded too, and given back as it was.
        outside = random.getstate()
        random.seed(self.rng.random())
        try:
            with hashed_by_id():
                return self._run()
        finally:
            random.setstate(outside)
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate

    def _run(self) -> Outcome:
        rng, config = self.rng, self.config
        for _ in range(config.workers):
            self.add_worker()
        self.after(0.0, self._manager_timer)
        given = self.workloads
        first: wl.Workload | None = None
        runs = self.planned = rng.randint(*config.runs) if given is None else len(given)
        self.cached = given is None and rng.random() < config.cache
        if self.cached:
            runs = self.planned = max(2, runs)
        for run_id in range(1, runs + 1):
            if given is not None:
                workload = given[run_id - 1]
            else:
                shape = rng.choice(config.shapes)
                fail = config.fail if rng.random() < 1 / 3 else 0.0
                size = rng.randint(max(1, config.tasks // 4), config.tasks)
                workload = wl.make(shape, random.Random(rng.random()), size, fail)
                if self.cached:  # the same graph again
                    workload = first = workload if first is None else first
            submit_at = 0.0 if run_id == 1 else rng.uniform(0.0, 10.0)
            if run_id > 1 and given is not None and config.in_turn:
                self.waiting.append((run_id, workload))
            else:
                self.after(submit_at, functools.partial(self.submit, run_id, workload))
            if rng.random() < config.cancel:
                cancel = functools.partial(self.cancel, run_id)
                self.after(submit_at + rng.uniform(0.0, 5.0), cancel)
        finished: float | None = None  # when the last run ended
        quiet: float | None = None  # since when nothing runs and every worker is known
        while self.heap:
            at, _, action = heapq.heappop(self.heap)
            if at > config.horizon:
                break
            self.time = at
            action()
            if self.checker.fatal:
                break
            if finished is None and self.finished():
                finished = self.time
                if self.cached:  # what the cache keeps goes, so that the views can agree
                    self.manager.clear_cache()
                    self._pass("manager")
            if finished is not None:
                if not self._quiet():
                    quiet = None
                elif quiet is None:
                    quiet = self.time
                # heartbeats pass, releases arrive; a worker gone without a word is lost
                # once silent long enough: then the views must agree
                if quiet is not None and self.time >= quiet + 3.0:
                    break
                if self.time > finished + 2 * self.manager.liveness.timeout + 30.0:
                    break
        self.checker.at_end(settled=finished is not None)
        return Outcome(self.seed, self.steps, self.time, self.checker.violations, self.trace or [])


#: Records that say only that their sender is there, or how it is: the only ones that
#: keep travelling once everything is done.
_BEAT: frozenset[type] = frozenset({p.Heartbeat, p.Status})


def _news(records: Sequence[object]) -> bool:
    """Whether a batch carries anything but heartbeats."""
    return any(type(record) not in _BEAT for record in records)


def _seconds(key: wl.Key, node: object, workload: wl.Workload) -> float:
    """A task's simulated seconds; a fused chain's is the sum of its links'."""
    links = getattr(node, "links", None)
    if links is not None:
        return sum(workload.durations.get(link, 0.01) for link, _ in links)
    return workload.durations.get(key, 0.01)


class _Said(logging.Handler):
    """Keeps the scheduler's last warning about each worker's false claims."""

    def __init__(self, said: dict[str, str]) -> None:
        super().__init__(logging.WARNING)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        if "reported" in str(record.msg) and isinstance(record.args, tuple) and record.args:
            self.said[str(record.args[0])] = record.getMessage()


def _prefix(key: wl.Key) -> str:
    """A task's kind, as ``dask.utils.key_split`` names the simulator's keys: the words
    before the first number ("fill-3-1" -> "fill", "chain4-2" -> "chain4")."""
    words = []
    for word in str(key).split("-"):
        if word.isdigit():
            break
        words.append(word)
    return "-".join(words) or str(key)
