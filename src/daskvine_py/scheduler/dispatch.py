"""Ready tasks to workers: the dispatch round, and what a worker is sent with a task.

A component of ``state.SchedulerState``. Each ``handle`` call ends with a round
(``dispatch``): annotated tasks first (``Constraints``), then every worker below its
saturation (``Saturation.extra``; tasks sent ahead of their inputs hold no core and do not
count: ``WorkerRecord.ahead``) takes the best task for it from the ready queue, one per
worker in turn, and the links behind it are sent ahead (``Locality``); when the queue runs
dry, idle cores ask busy workers for queued tasks back (``Stealing``). A task given to a
worker goes as an ``Execute`` (``assign``), preceded, once per worker, by its run's
``RunConfig`` and the functions it references; small inputs held at the manager travel
inside it, and their bytes are counted per worker (``BytesInlined``). A worker whose store
is full (``DiskFull``) gets no new work while another has room. A worker takes a task only
while the memory allotted to the tasks it holds fits its own (``Sizing``), looking past a
few tasks that do not for one that does (``LOOK_PAST``); the ``Execute`` carries the
task's allocation: cores and GPUs (its placement) and memory.

A round visits the workers that may have room, not all of them: a worker found at its
saturation bound is set aside until it reports something (``touch``) or joins; all are
visited after any event but a worker's report (a run submitted, cancelled or failed frees
or needs every worker) and every ``FULL_ROUND_EVERY`` rounds (a category's durations,
hence every bound, change without any one worker's report). On hundreds of workers the
round's cost follows the workers that changed, not the cluster. Spacing the full rounds
in time as well (0.25 s) and not touching a worker for a ``Started`` saved 2% of the
I/O thread's time on ``dv3-large`` (2 cores) but cost 20-40% more CPU per task on
``flat`` with 2,000 workers on 16 cores (docs/benchmarks.md, fourth pass): not kept.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING

from daskvine_py.scheduler.locality import peer_sources, target
from daskvine_py.scheduler.messages import (
    BytesInlined,
    Dispatched,
    EventDropped,
    WorkerId,
)
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import OUT_OF_BAND_MIN_BYTES

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: ``locations(task, deps)``: a task's inputs as its payload names them (``Caching``).
Locations = Callable[[TaskRecord, tuple[p.DepLocation, ...]], tuple[p.DepLocation, ...]]

#: Up to this many workers, every round visits them all (the cost is small; and small
#: clusters see a change of bound at once).
FULL_ROUND_WORKERS = 64
#: Past it, every this many rounds visit them all; the others visit only the workers that
#: may have room. Stealing, which looks at every worker, runs on those rounds only.
FULL_ROUND_EVERY = 32
#: Tasks a worker looks past, when the best one for it does not fit its memory now, for
#: one that does (those passed over are queued again): smaller tasks fill the cores that
#: larger ones leave idle, at a bounded cost per round.
LOOK_PAST = 8


class Dispatch:
    """The dispatch round and the ``Execute`` of each task sent; see the module docstring.

    It shares the context's ``workers``, ``queue`` and ``full`` (workers whose store is
    full) and its clock, and appends to its ``out``; ``extra`` (``Saturation``),
    ``send_ahead`` (``Locality``) and ``steal`` (``Stealing``) are the other components'
    steps; ``locations`` renames inputs for cache runs (``Caching``), only called while
    ``cache_runs`` is not empty; ``sizing``: what each task is allotted and where that
    fits; a task that cannot be sent aborts its run (``Failures.abort``).
    """

    __slots__ = (
        "ctx",
        "workers",
        "queue",
        "full",
        "out",
        "transition",
        "send",
        "abort",
        "constraints",
        "extra",
        "send_ahead",
        "steal",
        "locations",
        "cache_runs",
        "inlined",
        "open",
        "rounds",
        "everyone",
        "sizing",
    )

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.queue = ctx.queue
        self.full = ctx.full
        self.out = ctx.out
        self.transition = ctx.transition
        self.send = ctx.send
        self.abort = ctx.failures.abort
        self.constraints = ctx.constraints
        self.extra = ctx.saturation.extra
        self.send_ahead = ctx.locality.send_ahead
        self.steal = ctx.stealing.steal_for_idle_workers
        self.locations = ctx.caching.locations
        self.cache_runs = ctx.cache_runs
        self.sizing = ctx.sizing
        #: bytes of inputs sent inside ``Execute`` per worker in this ``handle`` call
        self.inlined: dict[WorkerRecord, int] = {}
        #: workers that may have room (an ordered set): the next round visits these
        self.open: dict[WorkerRecord, None] = {}
        #: rounds since the start: every ``FULL_ROUND_EVERY``-th visits every worker
        self.rounds = 0
        #: the next round visits every worker (set by the state after other events)
        self.everyone = True

    def load(self) -> tuple[int, int, int]:
        """Tasks ready (queued here), processing (sent to workers) and running (those of
        them that have a core), over every run."""
        processing = running = 0
        for worker in self.workers.values():
            held = len(worker.processing)
            processing += held
            running += min(held, worker.cores)
        return len(self.queue) + len(self.constraints), processing, running

    def worker_loads(self) -> dict[WorkerId, tuple[int, int]]:
        """Each worker's cores and the tasks it holds (queued there, fetching or running)."""
        return {wid: (worker.cores, len(worker.processing)) for wid, worker in self.workers.items()}

    def touch(self, worker: WorkerRecord) -> None:
        """``worker`` reported: it may have room again (a join visits every worker)."""
        self.open[worker] = None

    def dispatch(self) -> None:
        """Give ready tasks to workers below their saturation, one per worker per round.

        Workers first take their own (targeted) and untargeted work, and only then work
        targeted elsewhere: when both are free, a task runs where its inputs are. Then,
        if cores are idle and no task is queued here, take back tasks that wait
        unstarted on a worker with more tasks than cores.
        """
        if self.constraints.pending():
            self.constraints.dispatch()
        self.rounds += 1
        sizing = self.sizing
        every = (
            self.everyone
            or sizing.changed
            or len(self.workers) <= FULL_ROUND_WORKERS
            or self.rounds % FULL_ROUND_EVERY == 0
        )
        self.everyone = sizing.changed = False
        if every:
            workers = list(self.workers.values())
        else:
            known = self.workers
            workers = [w for w in self.open if known.get(w.id) is w]  # (not lost since)
        if self.full:
            # When every worker is full, waiting for room could wait forever: overflow.
            workers = [w for w in workers if not w.full] or workers
        queue, extra, transition = self.queue, self.extra, self.transition
        size_of, fits = sizing.size_of, sizing.fits
        saturated = set()
        for steal in (False, True):
            hungry = workers
            while hungry and queue:
                still_hungry = []
                for worker in hungry:
                    task = queue.peek_for(worker.id, steal)
                    if task is None:
                        continue
                    limit = worker.cores + extra(worker, task)
                    if len(worker.processing) - len(worker.ahead) >= limit:  # (startable)
                        saturated.add(worker)
                        continue
                    size = task.size or size_of(task)
                    # Allocations can only go past its memory if the largest one times the
                    # tasks it may hold does (``Sizing``): else nothing to add up.
                    if (size.slow or sizing.largest * limit > worker.memory) and not fits(
                        worker, task, size, limit
                    ):
                        found = self._look_past(worker, steal)
                        if found is None:
                            saturated.add(worker)  # (until it reports: a task of it ended)
                            continue
                        task = found
                    else:
                        queue.pop_for(worker.id, steal)
                    try:
                        transition(task, "processing", worker)
                        self.send_ahead(task, worker)
                    except Exception as exc:
                        what = f"sending task {task.key!r} (id {task.id}) to worker {worker.name}"
                        self.abort(task.run.id, exc, what)
                        continue
                    still_hungry.append(worker)
                hungry = still_hungry
        self.open = {w: None for w in workers if w not in saturated}
        if not queue and every:
            try:
                self.steal()
            except Exception as exc:  # stealing is an optimisation: runs go on without it
                self.out.append(EventDropped("taking queued tasks back for idle workers", exc))

    def _look_past(self, worker: WorkerRecord, steal: bool) -> TaskRecord | None:
        """The best task ``worker`` can take is too large for its memory now (or of a
        category it already runs one unmeasured task of): the first of the next
        ``LOOK_PAST`` that fits, taken from the queue; those passed over go back."""
        queue, sizing, extra = self.queue, self.sizing, self.extra
        held = worker.startable()
        passed = [queue.pop_for(worker.id, steal)]
        found = None
        for _ in range(LOOK_PAST):
            task = queue.pop_for(worker.id, steal)
            if task is None:
                break
            limit = worker.cores + extra(worker, task)
            size = task.size or sizing.size_of(task)
            if held < limit and sizing.fits(worker, task, size, limit):
                found = task
                break
            passed.append(task)
        full = self.full
        for task in passed:
            if task is not None:
                queue.push(task, task.priority, target(task, full))
        return found

    def assign(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Record ``task`` as processing on ``worker`` and send it there."""
        task.worker = worker
        task.sent_at = self.ctx.now
        # Only tasks that can start at once measure the round trip.
        task.sent_idle = task.missing == 0 and worker.startable() < worker.cores
        worker.processing[task] = None
        run = task.run
        send = self.send
        config_id = 0  # the defaults: nothing to announce
        if run.config is not None:
            config_id = run.id
            if run.id not in worker.configs:
                worker.configs.add(run.id)
                send(worker, run.config)
        for fid in task.functions:
            if fid not in worker.functions:
                worker.functions.add(fid)
                send(worker, p.Function(fid, _out_of_band(run.functions[fid])))
        config = run.config
        if task.reads and config is not None and config.input_peers:
            files = peer_sources(task, worker)  # (before its Execute: fetched beside it)
            if files:
                send(worker, p.FetchInputs(run.id, config.inputs, files))
        deps = tuple(_location(dep, worker) for dep in task.deps)
        if self.cache_runs:
            deps = self.locations(task, deps)  # results of other runs, by our keys
        for dep in deps:
            if dep.value is not None:  # inline: bytes moved from the manager
                self.inlined[worker] = self.inlined.get(worker, 0) + len(dep.value.header)
        size = task.size or self.sizing.size_of(task)
        memory = 0
        if worker.memory:  # (a worker with no memory figure is not sized)
            memory = task.asks or size.allocation
            if memory > worker.memory:  # (sent ahead, or placed: it gets what there is)
                memory = worker.memory
        task.memory = memory
        placement = task.placement
        cores, gpus = (1, 0) if placement is None else (placement.cores, placement.gpus)
        send(
            worker,
            p.Execute(
                task.id,
                task.key,
                task.payload,
                deps,
                task.is_output or task.echo,
                config_id,
                None if task.unread is None else not task.unread,
                cores,
                memory,
                gpus,
            ),
        )
        if run.watched:
            self.out.append(Dispatched(run.id, task.id, task.key, size.name, worker.name))

    def on_disk_full(self, worker: WorkerRecord, msg: p.DiskFull) -> None:
        """A full worker finishes what it holds and serves peers, but gets no new work."""
        full = msg.full
        if full is worker.full:
            return
        worker.full = full
        if full:
            self.full.add(worker)
            self.queue.forget_target(worker.id)
        else:
            self.full.discard(worker)

    def count_inlined(self) -> None:
        """The bytes moved inside ``Execute`` since the last call, per worker."""
        if self.inlined:
            for worker, nbytes in self.inlined.items():
                self.out.append(BytesInlined(worker.id, worker.name, nbytes))
            self.inlined = {}


def _out_of_band(code: bytes) -> bytes | pickle.PickleBuffer:
    """Large function bytes (big closures) travel as their own frame."""
    return pickle.PickleBuffer(code) if len(code) >= OUT_OF_BAND_MIN_BYTES else code


def _location(dep: TaskRecord, worker: WorkerRecord) -> p.DepLocation:
    """Where ``worker`` finds an input of a task: inline when small and not held there."""
    if dep.value is not None and worker not in dep.who_has:
        return p.DepLocation(dep.id, dep.key, (), dep.value)
    return p.DepLocation(dep.id, dep.key, _peers(dep, worker))


def _peers(dep: TaskRecord, worker: WorkerRecord) -> tuple[str, ...] | None:
    """Where ``worker`` finds an input: () it holds it, None it is computing it, else peers."""
    if worker in dep.who_has:
        return ()
    if dep.state == "processing":
        return None
    return tuple(holder.peer_address for holder in dep.who_has)
