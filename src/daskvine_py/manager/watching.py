"""Run watching and accounting for the manager's I/O thread; no sockets.

``Watching`` holds the runs callers wait on (``Run``), counts bytes moved per (source,
destination) name, and feeds the watched runs (a progress bar, a report or an event log)
from the instructions the scheduler state emits for them: ``state.TaskFinished``,
``state.Dispatched``, plus the workers joining, leaving and beating (their memory), and
the state's ``load()`` for samples. It never reads the state's records. Unwatched runs
cost nothing here: the state emits nothing for them, and the loop skips sampling when
none is watched. Every run's ``RunInfo`` gets its bytes moved and what its tasks took
(summed by the state, by category, and handed over with ``RunDone`` or ``RunFailed``)
when it ends (``settle``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from queue import SimpleQueue

from daskvine_py.manager.registry import WorkerInfo
from daskvine_py.manager.shipping import NOTHING, Shipped
from daskvine_py.report.events import EventLog
from daskvine_py.report.runinfo import MANAGER, RunInfo
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.messages import BytesRelayed
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

#: Samples of task counts in an event log: every 5 ms at first, then spaced to keep about
#: this many per run length (a few thousand for an hour), so short and long runs both
#: draw a smooth tasks-over-time chart from a small log.
SAMPLES_PER_RUN = 1000
#: Heartbeats kept for a dashboard between two of its requests, at most: a minute of 600
#: workers'. A dashboard that stopped asking (closed) costs no more than that.
MAX_BEATS = 36_000


class TaskSent:
    """On a run's feed: ``key`` was sent to ``worker`` (Dask's ``pretask``)."""

    __slots__ = ("key", "worker")

    def __init__(self, key: Hashable, worker: str) -> None:
        self.key = key
        self.worker = worker


class TaskReported:
    """On a run's feed: ``worker`` reported on ``key`` (Dask's ``posttask`` when the report
    is a ``TaskDone``); ``report`` is its ``TaskDone``, ``TaskErred`` or ``TaskCrashed``."""

    __slots__ = ("key", "worker", "report")

    def __init__(
        self, key: Hashable, worker: str, report: p.TaskDone | p.TaskErred | p.TaskCrashed
    ) -> None:
        self.key = key
        self.worker = worker
        self.report = report


#: What a run's feed carries, in the order the I/O thread saw it; None ends it.
FeedItem = TaskSent | TaskReported


#: Parts of a run (``manager.SUBMIT_PART`` tasks each) the caller may have sent ahead of
#: the I/O thread. Enough to keep the state busy while the caller reads the next one; a
#: 10^5-leaf tree had its whole graph queued without a bound (137 B a task at the peak).
PARTS_AHEAD = 4


class Run:
    """What a caller of ``get`` waits on; filled by the I/O thread."""

    __slots__ = (
        "id",
        "values",
        "done",
        "failure",
        "info",
        "finished_tasks",
        "log",
        "next_sample",
        "transfers_before",
        "relayed",
        "feed",
        "planned",
        "annotated",
        "shipped",
        "parts_ahead",
    )

    def __init__(self, run_id: int) -> None:
        self.id = run_id
        #: parts of it sent and not yet taken by the I/O thread: the caller waits for a
        #: slot before each (``Manager._send_part``), the I/O thread frees one per part it
        #: takes, so a graph read faster than the state builds its records does not pile
        #: up in the queue between them (``PARTS_AHEAD``)
        self.parts_ahead = threading.Semaphore(PARTS_AHEAD)
        self.info: RunInfo  # set by ``get`` with the run's options and size
        #: the manager's transfer counts when the run started (I/O thread only)
        self.transfers_before: dict[tuple[str, str], int] = {}
        #: (holder, reader) -> bytes that went through the manager (``BytesRelayed``)
        self.relayed: dict[tuple[str, str], int] = {}
        #: the outputs that came back, by key, as they came (``RunOutput``)
        self.values: dict[Hashable, Serialized] = {}
        self.done = threading.Event()
        self.failure: s.RunFailed | BaseException | None = None
        #: tasks finished so far, counted by the I/O thread for watched runs only
        self.finished_tasks = 0
        #: the run's event log, when it keeps one, and when it takes its next sample
        self.log: EventLog | None = None
        self.next_sample = 0.0
        #: its tasks by category as submitted (the caller's thread counts them, part by
        #: part; the live view copies it), and the categories annotated apart by key
        self.planned: dict[str, int] = {}
        self.annotated: Mapping[Hashable, str] = {}
        #: what it ships (``shipping.Shipped``), resolved once when ``get`` begins
        self.shipped: Shipped = NOTHING
        #: what the caller's Dask callbacks are told, when it has any (``callbacks``):
        #: ``TaskSent`` and ``TaskReported`` records, then None
        self.feed: SimpleQueue[FeedItem | None] | None = None


class Watching:
    """The runs in progress, the watched ones among them, and the bytes moved.

    Parameters
    ----------
    load
        The scheduler state's ``load``: tasks ready, processing and running, for samples.
    """

    def __init__(self, load: Callable[[], tuple[int, int, int]]) -> None:
        self._load = load
        #: runs in progress by id
        self.runs: dict[int, Run] = {}
        #: runs with a progress bar or an event log
        self.watched: dict[int, Run] = {}
        #: bytes moved per (source, destination) name since the start
        self.transfers: dict[tuple[str, str], int] = {}
        #: worker names by peer address, kept after they leave for late reports
        self.names_by_peer: dict[str, str] = {}
        #: bytes moved since the start, all pairs together (the live view's total)
        self.moved = 0
        #: told of each run as it settles (``live.LiveView``); None: nobody
        self.settled: Callable[[Run], None] | None = None
        #: the heartbeats heard while a dashboard asks for them (``live.LiveView``), as
        #: (worker name, ``time.time()``, ``Status``); None: nobody does
        self.beats: list[tuple[str, float, p.Status]] | None = None

    # -- runs -------------------------------------------------------------------------

    def start(self, run: Run, watch: bool, workers: Iterable[WorkerInfo], now: float) -> None:
        """A run was submitted; ``workers``: those connected."""
        self.runs[run.id] = run
        run.transfers_before = dict(self.transfers)
        if not watch:
            return
        self.watched[run.id] = run
        if run.log is not None:
            for info in workers:
                run.log.worker(now, info.name, info.cores, info.hostname, info.memory)
                if info.status.peak_memory:  # (0: no heartbeat yet)
                    run.log.memory(now, info.name, info.status)
            self._sample(now, [run])

    def pop(self, run_id: int, now: float) -> Run | None:
        """Forget a run that ended; a watched one gets its last sample first."""
        run = self.watched.pop(run_id, None)
        if run is not None and run.log is not None:
            self._sample(now, [run])
        run = self.runs.pop(run_id, None)
        if run is not None and run.feed is not None:
            run.feed.put(None)  # the caller's callbacks have heard everything
        return run

    def settle(self, run: Run, ended: s.RunDone | s.RunFailed | None = None) -> None:
        """The bytes moved while ``run`` went on (runs at the same time share them), and
        the seconds its tasks ran and (de)serialized, which the state sums in ``ended``."""
        if ended is not None:
            run.info.run_seconds = ended.run_seconds
            run.info.serialization_seconds = ended.serialization_seconds
            run.info.categories = dict(ended.categories)
            if type(ended) is s.RunDone:
                run.info.verified = ended.verified
        run.info.relayed = [[h, r, n] for (h, r), n in run.relayed.items()]
        before = run.transfers_before
        run.info.transfers = {
            pair: nbytes - before.get(pair, 0)
            for pair, nbytes in self.transfers.items()
            if nbytes != before.get(pair, 0)
        }
        if self.settled is not None:
            self.settled(run)

    def output(self, output: s.RunOutput) -> None:
        """An output's value, kept on its run for the caller."""
        run = self.runs.get(output.run_id)
        if run is not None:
            run.values[output.key] = output.value

    def end(self, ended: s.RunDone | s.RunFailed, now: float) -> None:
        """The state ended a run: its caller wakes (to raise, if it failed)."""
        run = self.pop(ended.run_id, now)
        if run is None:
            return
        if type(ended) is s.RunFailed:
            run.failure = ended
        self.settle(run, ended)
        run.done.set()

    def fail(self, run_id: int, error: BaseException, now: float) -> bool:
        """End a run with ``error``, an error of the manager's own (the state did not end
        it); False if it had ended already."""
        run = self.pop(run_id, now)
        if run is None:
            return False
        run.failure = error
        try:
            self.settle(run)
        finally:
            run.done.set()
        return True

    def clear(self) -> list[Run]:
        """Forget every run; those that were in progress."""
        runs = list(self.runs.values())
        self.runs.clear()
        self.watched.clear()
        return runs

    # -- accounting -------------------------------------------------------------------

    def count(self, source: str, destination: str, nbytes: int) -> None:
        pair = (source, destination)
        self.transfers[pair] = self.transfers.get(pair, 0) + nbytes
        self.moved += nbytes

    def relayed(self, moved: BytesRelayed) -> None:
        """Both legs of a result relayed through the manager, and the run's tally."""
        self.count(moved.holder, MANAGER, moved.nbytes)
        self.count(MANAGER, moved.reader, moved.nbytes)
        run = self.runs.get(moved.run_id)
        if run is not None:
            pair = (moved.holder, moved.reader)
            run.relayed[pair] = run.relayed.get(pair, 0) + moved.nbytes

    def received(self, destination: str, message: p.Transfers) -> None:
        """What a worker fetched from peers, by the peers' names where known."""
        for address, nbytes in message.received:  # checked: (str, int) pairs
            self.count(self.names_by_peer.get(address, address), destination, nbytes)

    # -- what watched runs see --------------------------------------------------------

    def task_finished(self, finished: s.TaskFinished, now: float) -> None:
        """Count and log a task's end (the state reports only those of watched runs)."""
        run = self.watched.get(finished.run_id)
        if run is None:
            return
        message, worker = finished.report, finished.worker
        if run.feed is not None:
            run.feed.put(TaskReported(finished.key, worker, message))
        if type(message) is p.TaskDone:
            run.finished_tasks += 1
        if run.log is None:
            return
        if type(message) is p.TaskDone:  # (``type(message) is``: what mypy narrows by)
            run.log.done(
                now,
                message.task_id,
                worker,
                message.duration,
                message.finished,
                message.nbytes,
                message.serialization,
                message.cpu,
                message.peak_memory,
            )
        elif type(message) is p.TaskErred:
            run.log.erred(now, message.task_id, worker, message.message)
        elif type(message) is p.TaskCrashed:
            run.log.crashed(now, message.task_id, worker, message.reason)

    def dispatched(self, sent: s.Dispatched, now: float) -> None:
        run = self.watched.get(sent.run_id)
        if run is None:
            return
        if run.feed is not None:
            run.feed.put(TaskSent(sent.key, sent.worker))
        if run.log is not None:
            run.log.dispatch(now, sent.task_id, sent.key, sent.prefix, sent.worker)

    def worker_joined(
        self, now: float, name: str, cores: int, hostname: str, memory: int = 0
    ) -> None:
        for run in self.watched.values():
            if run.log is not None:
                run.log.worker(now, name, cores, hostname, memory)

    def status(self, now: float, name: str, status: p.Status) -> None:
        """A worker's heartbeat: its memory over time, in the logs of watched runs and
        for a dashboard, whose list is let go once past ``MAX_BEATS`` (nobody asks)."""
        beats = self.beats
        if beats is not None:
            beats.append((name, time.time(), status))
            if len(beats) > MAX_BEATS:
                self.beats = None
        for run in self.watched.values():
            if run.log is not None:
                run.log.memory(now, name, status)

    def worker_lost(self, now: float, name: str, reason: str) -> None:
        for run in self.watched.values():
            if run.log is not None:
                run.log.worker_lost(now, name, reason)

    def sample_due(self, now: float) -> None:
        due = [
            run for run in self.watched.values() if run.log is not None and now >= run.next_sample
        ]
        if due:
            self._sample(now, due)

    def _sample(self, now: float, runs: Iterable[Run]) -> None:
        """Task counts for the tasks-over-time chart. Ready, processing and running count
        every run's tasks (they are one queue); waiting is this run's remainder."""
        ready, processing, running = self._load()
        for run in runs:
            if run.log is not None:
                done = run.finished_tasks
                waiting = max(0, run.info.tasks - done - ready - processing)
                run.log.sample(now, waiting, ready, processing, running, done)
                run.next_sample = now + max(0.005, (now - run.log.mono_start) / SAMPLES_PER_RUN)
