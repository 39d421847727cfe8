"""The event log of one run: what the manager saw, compact, machine-readable, replayable.

Recorded only when a ``get`` asks for it (``report=`` or ``event_log=``): the manager's I/O
thread appends a typed, slotted record per event (``DispatchEntry``, ``DoneEntry``, ...:
``Entry``) to an ``EventLog``, nothing more (no formatting, no I/O). When the run ends the
log becomes JSON records, one object per line, each entry writing its own (``record()``)::

    {"event": "run", "format": 1, "run": 3, "started": 1769000000.1, "tasks": 10000, ...}
    {"event": "worker", "t": 0.0, "worker": "local-0", "cores": 1, "host": "node7", ...}
    {"event": "dispatch", "t": 0.0031, "id": 17, "key": ["noop", 3], "prefix": "noop", ...}
    {"event": "done", "t": 0.0052, "id": 17, "worker": "local-0", "start": 0.0041,
     "end": 0.0049, "nbytes": 28, "serialization": 0.0001, "cpu": 0.0007,
     "peak_memory": 0, "category": "noop"}
    {"event": "sample", "t": 0.1, "waiting": 0, "ready": 5210, "processing": 36, ...}
    {"event": "memory", "t": 1.0, "worker": "local-0", "stored_bytes": 2048, ...}
    {"event": "transfer", "source": "local-0", "destination": "manager", "bytes": 80}
    {"event": "categories", "categories": {"noop": {"tasks": 10000, "wall_s": 0.2, ...}}}
    {"event": "end", "t": 1.93, "outcome": "done", ...}

JSON lines because a log is written once and read rarely: it appends, greps, and loads
with ``pandas.read_json(path, lines=True)`` or ten lines of Python, with no schema to ship.
A path ending in ``.gz`` is gzip-compressed (about ten times smaller). Times ``t`` are
seconds since the run started, on the manager's clock; ``start``/``end`` of a task are the
worker's own clock, on the same scale (remote workers need synchronised clocks for them to
line up; a worker clock ahead of the manager's is clamped to when the result arrived).
A task's ``start`` is when its library began on it: ``end - start`` is its run time plus its
``serialization`` (unpickling inputs, pickling the result); logs written before
``serialization`` was recorded lack the field, and read as 0. Its ``category`` is written
with the log, from its dispatch (nothing more is kept per task while the run goes on).
"memory" records are the workers' heartbeats (``p.Status``), each kept only when it
differs from that worker's last; "categories" is ``RunInfo.categories`` as the run ended.

The performance report (``page.py``) is built from these records alone, so
``python -m daskvine_py report run.jsonl -o run.html`` rebuilds it later.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, cast

from daskvine_py.report.runinfo import RunInfo
from daskvine_py.wire import protocol as p

#: Version of the record layout, in the "run" record; bumped on incompatible changes.
FORMAT = 1


@dataclass(slots=True)
class WorkerEntry:
    """A worker took part in the run ("worker"): joined during it, or was there at its start."""

    t: float
    worker: str
    cores: int
    host: str
    memory: int = 0  #: its ``--memory`` in bytes (0: not known)

    def record(self) -> dict[str, Any]:
        return {
            "event": "worker",
            "t": round(self.t, 6),
            "worker": self.worker,
            "cores": self.cores,
            "host": self.host,
            "memory": self.memory,
        }


@dataclass(slots=True)
class WorkerLostEntry:
    """A worker was lost during the run ("worker_lost"), and why."""

    t: float
    worker: str
    reason: str

    def record(self) -> dict[str, Any]:
        return {
            "event": "worker_lost",
            "t": round(self.t, 6),
            "worker": self.worker,
            "reason": self.reason,
        }


@dataclass(slots=True)
class QuarantinedEntry:
    """A worker was quarantined during the run ("quarantined": it got no new tasks), and
    why; or released from it (``reason`` says so)."""

    t: float
    worker: str
    reason: str

    def record(self) -> dict[str, Any]:
        return {
            "event": "quarantined",
            "t": round(self.t, 6),
            "worker": self.worker,
            "reason": self.reason,
        }


@dataclass(slots=True)
class DispatchEntry:
    """A task was sent to a worker ("dispatch"); ``task_id`` joins it to its outcome."""

    t: float
    task_id: int
    key: Hashable
    prefix: str
    worker: str

    def record(self) -> dict[str, Any]:
        return {
            "event": "dispatch",
            "t": round(self.t, 6),
            "id": self.task_id,
            "key": _jsonable_key(self.key),
            "prefix": self.prefix,
            "worker": self.worker,
        }


@dataclass(slots=True)
class DoneEntry:
    """A task's result arrived ("done"); ``end`` is the worker's finish on the run's scale,
    ``duration`` the call's seconds and ``serialization`` its library's seconds unpickling
    its inputs and pickling its result besides; ``cpu`` the call's CPU seconds and
    ``peak_memory`` its own peak resident bytes, above its process's size as it began
    (``TaskDone``'s)."""

    t: float
    task_id: int
    worker: str
    end: float
    duration: float
    nbytes: int
    serialization: float = 0.0
    cpu: float = 0.0
    peak_memory: int = 0

    def record(self) -> dict[str, Any]:
        start = self.end - self.duration - self.serialization  # when its library began on it
        return {
            "event": "done",
            "t": round(self.t, 6),
            "id": self.task_id,
            "worker": self.worker,
            "start": round(start, 6),
            "end": round(self.end, 6),
            "nbytes": self.nbytes,
            "serialization": round(self.serialization, 6),
            "cpu": round(self.cpu, 6),
            "peak_memory": self.peak_memory,
        }


@dataclass(slots=True)
class ErredEntry:
    """A task raised ("erred"); ``message`` is the exception's repr."""

    t: float
    task_id: int
    worker: str
    message: str

    def record(self) -> dict[str, Any]:
        return {
            "event": "erred",
            "t": round(self.t, 6),
            "id": self.task_id,
            "worker": self.worker,
            "message": self.message,
        }


@dataclass(slots=True)
class CrashedEntry:
    """A task's process died or its worker was lost under it ("crashed")."""

    t: float
    task_id: int
    worker: str
    message: str

    def record(self) -> dict[str, Any]:
        return {
            "event": "crashed",
            "t": round(self.t, 6),
            "id": self.task_id,
            "worker": self.worker,
            "message": self.message,
        }


@dataclass(slots=True)
class SampleEntry:
    """The run's task counts by state, taken periodically ("sample")."""

    t: float
    waiting: int
    ready: int
    processing: int
    running: int
    done: int

    def record(self) -> dict[str, Any]:
        return {
            "event": "sample",
            "t": round(self.t, 6),
            "waiting": self.waiting,
            "ready": self.ready,
            "processing": self.processing,
            "running": self.running,
            "done": self.done,
        }


@dataclass(slots=True)
class MemoryEntry:
    """A worker's heartbeat ("memory"): bytes of results it holds (``stored_bytes``, live
    ones included; ``spilled_bytes`` of them on disk), the peak resident bytes of its own
    process (``peak_memory``) and the largest of its libraries' (``peak_library_memory``:
    since their current task began, where the worker measures tasks), and the resident
    bytes of the worker and its libraries together (``resident``)."""

    t: float
    worker: str
    status: p.Status

    def record(self) -> dict[str, Any]:
        fields = self.status._asdict()
        del fields["activity"]  # (its fetches and spills: "bar" records)
        return {"event": "memory", "t": round(self.t, 6), "worker": self.worker, **fields}


@dataclass(slots=True)
class BarEntry:
    """A worker's inputs fetched or results spilled ("bar"), merged by the worker
    (``Status.activity``, its lanes below 0): ``start``/``end`` on the run's clock, as a
    task's, ``tasks`` the fetches or spills it stands for."""

    worker: str
    bar: p.Bar
    wall_start: float

    def record(self) -> dict[str, Any]:
        lane, prefix, start, end, seconds, tasks = self.bar
        return {
            "event": "bar",
            "worker": self.worker,
            "lane": lane,
            "prefix": prefix,
            "start": round(start - self.wall_start, 6),
            "end": round(end - self.wall_start, 6),
            "serialization": seconds,
            "tasks": tasks,
        }


@dataclass(slots=True)
class CategoriesEntry:
    """What the run's tasks took, by category ("categories", once, as the run ended):
    each ``Category``'s fields (``RunInfo.categories``), unrounded (JSON keeps a float
    exactly), so the report shows what ``last_run`` holds."""

    categories: dict[str, dict[str, float | int]]

    def record(self) -> dict[str, Any]:
        return {"event": "categories", "categories": self.categories}


@dataclass(slots=True)
class TransferEntry:
    """Bytes moved from ``source`` to ``destination`` over the whole run ("transfer")."""

    source: str
    destination: str
    nbytes: int

    def record(self) -> dict[str, Any]:
        return {
            "event": "transfer",
            "source": self.source,
            "destination": self.destination,
            "bytes": self.nbytes,
        }


#: What an ``EventLog`` holds between the run's record and its end record; each entry
#: type is named after the ``event`` its ``record()`` writes.
Entry = (
    WorkerEntry
    | WorkerLostEntry
    | DispatchEntry
    | DoneEntry
    | ErredEntry
    | CrashedEntry
    | SampleEntry
    | TransferEntry
    | QuarantinedEntry
    | MemoryEntry
    | BarEntry
    | CategoriesEntry
)


class EventLog:
    """Events of one run, appended by the manager's I/O thread as ``Entry`` records.

    ``mono_start`` and ``wall_start`` are the run's start on the manager's monotonic clock
    (the ``now`` of every call) and on the wall clock (what workers' ``finished`` uses).
    """

    __slots__ = (
        "run_id",
        "wall_start",
        "mono_start",
        "tasks",
        "options",
        "entries",
        "info",
        "statuses",
    )

    def __init__(
        self, run_id: int, wall_start: float, mono_start: float, tasks: int, options: dict[Any, Any]
    ) -> None:
        self.run_id = run_id
        self.wall_start = wall_start
        self.mono_start = mono_start
        self.tasks = tasks
        self.options = options
        #: the run's events, in the order the manager saw them; times since the start
        self.entries: list[Entry] = []
        #: the "end" record's extra fields, set by ``end``
        self.info: dict[str, Any] | None = None
        #: each worker's last heartbeat recorded: an unchanged one is not recorded again
        self.statuses: dict[str, tuple[int, ...]] = {}

    def worker(self, now: float, name: str, cores: int, host: str, memory: int = 0) -> None:
        self.entries.append(WorkerEntry(now - self.mono_start, name, cores, host, memory))

    def worker_lost(self, now: float, name: str, reason: str) -> None:
        self.entries.append(WorkerLostEntry(now - self.mono_start, name, reason))

    def quarantined(self, now: float, name: str, reason: str) -> None:
        self.entries.append(QuarantinedEntry(now - self.mono_start, name, reason))

    def dispatch(self, now: float, task_id: int, key: Hashable, prefix: str, worker: str) -> None:
        self.entries.append(DispatchEntry(now - self.mono_start, task_id, key, prefix, worker))

    def done(
        self,
        now: float,
        task_id: int,
        worker: str,
        duration: float,
        finished: float,
        nbytes: int,
        serialization: float = 0.0,
        cpu: float = 0.0,
        peak_memory: int = 0,
    ) -> None:
        t = now - self.mono_start
        end = finished - self.wall_start if finished else t
        self.entries.append(
            DoneEntry(
                t, task_id, worker, min(end, t), duration, nbytes, serialization, cpu, peak_memory
            )
        )

    def erred(self, now: float, task_id: int, worker: str, message: str) -> None:
        self.entries.append(ErredEntry(now - self.mono_start, task_id, worker, message))

    def crashed(self, now: float, task_id: int, worker: str, reason: str) -> None:
        self.entries.append(CrashedEntry(now - self.mono_start, task_id, worker, reason))

    def sample(
        self, now: float, waiting: int, ready: int, processing: int, running: int, done: int
    ) -> None:
        self.entries.append(
            SampleEntry(now - self.mono_start, waiting, ready, processing, running, done)
        )

    def memory(self, now: float, worker: str, status: p.Status) -> None:
        """A worker's heartbeat, when it says something new of that worker."""
        for bar in status.activity:
            if bar[0] < 0:  # fetches and spills: the tasks' own lanes are "done" records
                self.entries.append(BarEntry(worker, bar, self.wall_start))
        figures = status[:5]  # (the memory figures: activity differs every time)
        if self.statuses.get(worker) != figures:
            self.statuses[worker] = figures
            self.entries.append(MemoryEntry(now - self.mono_start, worker, status))

    def end(self, now: float, outcome: str, info: RunInfo) -> None:
        """Close the log with the run's outcome and what ``RunInfo`` knows (transfers,
        categories...)."""
        self.info = {"t": now - self.mono_start, "outcome": outcome, **_info_fields(info)}
        for (source, destination), nbytes in sorted(getattr(info, "transfers", {}).items()):
            self.entries.append(TransferEntry(source, destination, nbytes))
        categories = getattr(info, "categories", None) or {}
        self.entries.append(
            CategoriesEntry({name: c.fields() for name, c in sorted(categories.items())})
        )

    # -- records ------------------------------------------------------------------------

    def records(self) -> Iterator[dict[str, Any]]:
        """The log as JSON-able records, the "run" record first and the "end" record last."""
        yield {
            "event": "run",
            "format": FORMAT,
            "run": self.run_id,
            "started": self.wall_start,
            "tasks": self.tasks,
            "options": _jsonable(self.options),
        }
        prefixes: dict[int, str] = {}  # each task's category, from its dispatch
        for entry in list(self.entries):  # a snapshot: a cancelled run may still grow
            record = entry.record()
            if isinstance(entry, DispatchEntry):
                prefixes[entry.task_id] = entry.prefix
            elif isinstance(entry, DoneEntry | ErredEntry | CrashedEntry):
                record["category"] = prefixes.get(entry.task_id, "")
            yield record
        if self.info is not None:
            yield {"event": "end", **_jsonable(self.info)}


def summary_records(info: RunInfo) -> list[dict[str, Any]]:
    """Records of a run that kept no event log: its options, outcome, transfers and
    categories only."""
    log = EventLog(info.run_id, info.started, 0.0, info.tasks, info.options)
    log.end(info.duration, info.outcome, info)
    return list(log.records())


def write_events(records: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write records as JSON lines; gzip-compressed when ``path`` ends in ``.gz``."""
    with _open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":"), default=repr))
            out.write("\n")


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of an event log written by ``write_events`` (``.gz`` or plain)."""
    records = []
    with _open(path, "r") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{os.fspath(path)}:{number}: not a JSON record: {exc}") from exc
            if not isinstance(record, dict) or "event" not in record:
                raise ValueError(f"{os.fspath(path)}:{number}: not an event record")
            records.append(record)
    if not records or records[0]["event"] != "run":
        raise ValueError(f"{os.fspath(path)}: not a daskvine_py event log (no 'run' record)")
    if records[0].get("format") != FORMAT:
        raise ValueError(
            f"{os.fspath(path)}: event log format {records[0].get('format')!r}, "
            f"this version reads {FORMAT}"
        )
    return records


def _open(path: str | os.PathLike[str], mode: str) -> IO[str]:
    if os.fspath(path).endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))  # text: mode "t"
    return open(path, mode, encoding="utf-8")  # noqa: SIM115


def _info_fields(info: Any) -> dict[str, Any]:
    """What ``RunInfo`` holds beyond the run record and the transfers (e.g. hints)."""
    duration = getattr(info, "duration", 0.0)  # read before the check narrows its type
    if not dataclasses.is_dataclass(info):
        return {}
    # (``categories``: a record of their own, ``CategoriesEntry``)
    skip = {
        "run_id",
        "options",
        "tasks",
        "started",
        "finished",
        "outcome",
        "transfers",
        "events",
        "categories",
    }
    out = {name: value for name, value in vars(info).items() if name not in skip}
    if not out.get("relayed", True):
        del out["relayed"]  # written only when results went through the manager
    if not out.get("verified", True):
        del out["verified"]  # written only for a run with ``verify``
    out["duration"] = duration
    return out


def _jsonable_key(key: Hashable) -> Any:
    """Dask keys: strings stay, tuples become lists, anything else its ``str``."""
    if isinstance(key, str | int | float):
        return key
    if isinstance(key, tuple):
        return [_jsonable_key(part) for part in key]
    return str(key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)
