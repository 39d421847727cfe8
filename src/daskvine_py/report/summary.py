"""A run's event records gathered for its report: tasks, samples, workers and failures.

``summarize(records)`` reads the JSON records of ``events.py`` (an ``EventLog``'s, or a
saved log's from ``read_events``) once, joining each task's dispatch to its completion,
into a ``Summary`` of typed records the report's sections read (``page.py``). No HTML.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TaskRun:
    """One task that finished, as the report sees it: its library worked on it from
    ``start`` to ``end``, ``serialization`` seconds of which unpickling its inputs and
    pickling its result, the rest running its function (``duration``)."""

    id: int
    key: Any
    prefix: str
    worker: str
    start: float
    end: float
    nbytes: int
    serialization: float = 0.0
    #: CPU seconds of its call and its own peak resident bytes, above its process's size
    #: as it began (0: it grew its process by nothing, or not recorded)
    cpu: float = 0.0
    peak_memory: int = 0
    #: tasks it stands for: more than one for a worker's merged bar (``Status.activity``)
    tasks: int = 1

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start - self.serialization)


@dataclass(slots=True)
class RunWorker:
    """A worker that took part in the run ("worker" records, or only named by a task or a
    loss): its cores (0 when unknown), and when it was lost, if it was."""

    name: str
    cores: int = 0
    host: str = ""
    lost: float | None = None
    #: when it joined the run (seconds since its start; 0: there at the start)
    joined: float = 0.0
    #: its ``--memory`` in bytes (0: not recorded)
    memory: int = 0


@dataclass(slots=True)
class MemorySample:
    """A worker's heartbeat ("memory"), in bytes: results held (stored and live), those of
    them spilled to disk, the worker process's peak and its largest library's, and the
    resident bytes of the worker and its libraries together."""

    t: float
    stored: int
    spilled: int
    peak: int
    library_peak: int
    resident: int = 0


@dataclass(slots=True)
class TaskCounts:
    """One of the manager's periodic samples ("sample"): the run's tasks by state."""

    t: float
    waiting: int
    ready: int
    processing: int
    running: int
    done: int = 0

    @property
    def queued(self) -> int:
        """Sent to workers, not running yet (queued there)."""
        return max(0, self.processing - self.running)


@dataclass(slots=True)
class Failure:
    """What went wrong during the run: a task that raised ("erred") or whose process died
    ("crashed"), or a worker lost ("worker_lost", ``key`` None, ``message`` the reason) or
    quarantined ("quarantined", the same: docs/faults.md)."""

    t: float
    kind: str
    key: Any
    worker: str
    message: str


#: What the lanes of a worker's fetches and spills are called (``Status.activity``).
LANE_NAMES = {-1: "(fetching inputs)", -2: "(spilling results)"}


def bar_run(record: dict[str, Any]) -> TaskRun:
    """A "bar" record (tasks of one prefix a lane ran back to back, or a lane's fetches or
    spills) as a ``TaskRun`` of ``tasks`` tasks, named by its lane when not a library's."""
    prefix = LANE_NAMES.get(record["lane"], record["prefix"])
    tasks = int(record.get("tasks", 1))
    return TaskRun(
        -1,
        f"{tasks} × {prefix}",
        prefix,
        record["worker"],
        record["start"],
        record["end"],
        0,
        record.get("serialization", 0.0),
        tasks=tasks,
    )


@dataclass(slots=True)
class _Sent:
    """A task's "dispatch" record, kept until its "done" record names it by id."""

    key: Any
    prefix: str


@dataclass
class Summary:
    """A run's records, grouped for rendering. ``run`` and ``end`` are the log's first
    and last records as they are: their fields are the options and facts of the run."""

    run: dict[str, Any]
    end: dict[str, Any] | None = None
    workers: dict[str, RunWorker] = field(default_factory=dict)
    tasks: list[TaskRun] = field(default_factory=list)
    samples: list[TaskCounts] = field(default_factory=list)
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    dispatched: int = 0
    #: each worker's heartbeats, in time order
    memory: dict[str, list[MemorySample]] = field(default_factory=dict)
    #: workers' merged bars ("bar"): inputs fetched and results spilled in a report; every
    #: lane in the dashboard's task stream (``live.pages``)
    activity: list[TaskRun] = field(default_factory=list)
    #: the "categories" record's: each category's fields by name (``Category``); None:
    #: the log has none (written before categories were)
    categories: dict[str, dict[str, Any]] | None = None

    @property
    def has_events(self) -> bool:
        """False for a run that kept no event log (only its summary is known)."""
        return bool(self.dispatched or self.tasks or self.samples)

    @property
    def duration(self) -> float:
        if self.end is not None and "duration" in self.end:
            return float(self.end["duration"])
        times = [t.end for t in self.tasks] + [s.t for s in self.samples]
        return max(times, default=0.0)

    def seconds(self) -> tuple[float, float] | None:
        """Seconds the run's tasks ran and (de)serialized: the run's own totals
        (``RunInfo``, every finished task), else the sums over the recorded tasks (a log
        from before the totals were kept); None when neither is known."""
        end = self.end or {}
        if "run_seconds" in end:
            return float(end["run_seconds"]), float(end.get("serialization_seconds", 0.0))
        if self.tasks:
            return sum(t.duration for t in self.tasks), sum(t.serialization for t in self.tasks)
        return None


def summarize(records: Iterable[dict[str, Any]]) -> Summary:
    """Group event records (``events.EventLog.records`` or ``read_events``) by kind."""
    records = iter(records)
    first = next(records, None)
    if first is None or first.get("event") != "run":
        raise ValueError("an event log starts with its 'run' record")
    summary = Summary(first)
    workers = summary.workers
    dispatched: dict[int, _Sent] = {}
    for record in records:
        kind = record.get("event")
        if kind == "dispatch":
            summary.dispatched += 1
            dispatched[record["id"]] = _Sent(record["key"], record["prefix"])
        elif kind == "done":
            sent = dispatched.get(record["id"])
            summary.tasks.append(
                TaskRun(
                    record["id"],
                    record["id"] if sent is None else sent.key,
                    "?" if sent is None else sent.prefix,
                    record["worker"],
                    record["start"],
                    record["end"],
                    record["nbytes"],
                    record.get("serialization", 0.0),  # not in logs of older versions
                    record.get("cpu", 0.0),
                    record.get("peak_memory", 0),
                )
            )
        elif kind == "bar":
            summary.activity.append(bar_run(record))
        elif kind == "sample":
            t, done = record["t"], record.get("done", 0)
            ready, processing, running = record["ready"], record["processing"], record["running"]
            summary.samples.append(
                TaskCounts(t, record["waiting"], ready, processing, running, done)
            )
        elif kind == "worker":
            name = record["worker"]
            if name not in workers:  # the first record of a worker tells its cores
                workers[name] = RunWorker(
                    name,
                    int(record.get("cores") or 0),
                    str(record.get("host", "")),
                    joined=float(record.get("t", 0.0)),
                    memory=int(record.get("memory") or 0),
                )
        elif kind == "worker_lost":
            name = record["worker"]
            workers.setdefault(name, RunWorker(name)).lost = record["t"]
            summary.failures.append(
                Failure(record["t"], "worker_lost", None, name, record["reason"])
            )
        elif kind == "quarantined":
            summary.failures.append(
                Failure(record["t"], "quarantined", None, record["worker"], record["reason"])
            )
        elif kind in ("erred", "crashed"):
            sent = dispatched.get(record["id"])
            key = record["id"] if sent is None else sent.key
            summary.failures.append(
                Failure(record["t"], kind, key, record["worker"], record["message"])
            )
        elif kind == "memory":
            summary.memory.setdefault(record["worker"], []).append(
                MemorySample(
                    record["t"],
                    record.get("stored_bytes", 0),
                    record.get("spilled_bytes", 0),
                    record.get("peak_memory", 0),
                    record.get("peak_library_memory", 0),
                    record.get("resident", 0),
                )
            )
        elif kind == "categories":
            summary.categories = dict(record.get("categories") or {})
        elif kind == "transfer":
            pair = (record["source"], record["destination"])
            summary.transfers[pair] = summary.transfers.get(pair, 0) + record["bytes"]
        elif kind == "end":
            summary.end = record
    for task in summary.tasks:
        if task.worker not in workers:
            workers[task.worker] = RunWorker(task.worker)
    for name in [*summary.memory, *(bar.worker for bar in summary.activity)]:
        if name not in workers:
            workers[name] = RunWorker(name)
    return summary
