"""The event log of one run: what the manager saw, compact, machine-readable, replayable.

Recorded only when a ``get`` asks for it (``report=`` or ``event_log=``): the manager's I/O
thread appends a tuple per event to an ``EventLog``, nothing more (no formatting, no I/O).
When the run ends the log becomes records, one JSON object per line::

    {"event": "run", "format": 1, "run": 3, "started": 1769000000.1, "tasks": 10000, ...}
    {"event": "worker", "t": 0.0, "worker": "local-0", "cores": 1, "host": "node7"}
    {"event": "dispatch", "t": 0.0031, "id": 17, "key": ["noop", 3], "prefix": "noop", ...}
    {"event": "done", "t": 0.0052, "id": 17, "worker": "local-0", "start": 0.0041, ...}
    {"event": "sample", "t": 0.1, "waiting": 0, "ready": 5210, "processing": 36, ...}
    {"event": "transfer", "source": "local-0", "destination": "manager", "bytes": 80}
    {"event": "end", "t": 1.93, "outcome": "done", ...}

JSON lines because a log is written once and read rarely: it appends, greps, and loads
with ``pandas.read_json(path, lines=True)`` or ten lines of Python, with no schema to ship.
A path ending in ``.gz`` is gzip-compressed (about ten times smaller). Times ``t`` are
seconds since the run started, on the manager's clock; ``start``/``end`` of a task are the
worker's own clock, on the same scale (remote workers need synchronised clocks for them to
line up; a worker clock ahead of the manager's is clamped to when the result arrived).

The performance report (``report.py``) is built from these records alone, so
``python -m daskvine_py report run.jsonl -o run.html`` rebuilds it later.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

#: Version of the record layout, in the "run" record; bumped on incompatible changes.
FORMAT = 1


class EventLog:
    """Events of one run, appended by the manager's I/O thread as plain tuples.

    ``mono_start`` and ``wall_start`` are the run's start on the manager's monotonic clock
    (the ``now`` of every call) and on the wall clock (what workers' ``finished`` uses).
    """

    __slots__ = ("run_id", "wall_start", "mono_start", "tasks", "options", "entries", "info")

    def __init__(
        self, run_id: int, wall_start: float, mono_start: float, tasks: int, options: dict
    ) -> None:
        self.run_id = run_id
        self.wall_start = wall_start
        self.mono_start = mono_start
        self.tasks = tasks
        self.options = options
        #: (kind, seconds since start, *fields), in the order the manager saw them
        self.entries: list[tuple] = []
        #: the "end" record's extra fields, set by ``end``
        self.info: dict[str, Any] | None = None

    def worker(self, now: float, name: str, cores: int, host: str) -> None:
        self.entries.append(("worker", now - self.mono_start, name, cores, host))

    def worker_lost(self, now: float, name: str, reason: str) -> None:
        self.entries.append(("worker_lost", now - self.mono_start, name, reason))

    def dispatch(self, now: float, task_id: int, key: Hashable, prefix: str, worker: str) -> None:
        self.entries.append(("dispatch", now - self.mono_start, task_id, key, prefix, worker))

    def done(
        self, now: float, task_id: int, worker: str, duration: float, finished: float, nbytes: int
    ) -> None:
        t = now - self.mono_start
        end = finished - self.wall_start if finished else t
        self.entries.append(("done", t, task_id, worker, min(end, t), duration, nbytes))

    def erred(self, now: float, task_id: int, worker: str, message: str) -> None:
        self.entries.append(("erred", now - self.mono_start, task_id, worker, message))

    def crashed(self, now: float, task_id: int, worker: str, reason: str) -> None:
        self.entries.append(("crashed", now - self.mono_start, task_id, worker, reason))

    def sample(
        self, now: float, waiting: int, ready: int, processing: int, running: int, done: int
    ) -> None:
        self.entries.append(
            ("sample", now - self.mono_start, waiting, ready, processing, running, done)
        )

    def end(self, now: float, outcome: str, info: Any) -> None:
        """Close the log with the run's outcome and what ``RunInfo`` knows (transfers...)."""
        self.info = {"t": now - self.mono_start, "outcome": outcome, **_info_fields(info)}
        for (source, destination), nbytes in sorted(getattr(info, "transfers", {}).items()):
            self.entries.append(("transfer", 0.0, source, destination, nbytes))

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
        for entry in list(self.entries):  # a snapshot: a cancelled run may still grow
            kind = entry[0]
            t = round(entry[1], 6)
            if kind == "dispatch":
                _, _, task_id, key, prefix, worker = entry
                yield {"event": kind, "t": t, "id": task_id, "key": _jsonable_key(key),
                       "prefix": prefix, "worker": worker}  # fmt: skip
            elif kind == "done":
                _, _, task_id, worker, end, duration, nbytes = entry
                yield {"event": kind, "t": t, "id": task_id, "worker": worker,
                       "start": round(end - duration, 6), "end": round(end, 6),
                       "nbytes": nbytes}  # fmt: skip
            elif kind == "sample":
                _, _, waiting, ready, processing, running, done = entry
                yield {"event": kind, "t": t, "waiting": waiting, "ready": ready,
                       "processing": processing, "running": running, "done": done}  # fmt: skip
            elif kind == "worker":
                _, _, name, cores, host = entry
                yield {"event": kind, "t": t, "worker": name, "cores": cores, "host": host}
            elif kind == "worker_lost":
                yield {"event": kind, "t": t, "worker": entry[2], "reason": entry[3]}
            elif kind in ("erred", "crashed"):
                yield {"event": kind, "t": t, "id": entry[2], "worker": entry[3],
                       "message": entry[4]}  # fmt: skip
            elif kind == "transfer":
                _, _, source, destination, nbytes = entry
                yield {"event": kind, "source": source, "destination": destination,
                       "bytes": nbytes}  # fmt: skip
        if self.info is not None:
            yield {"event": "end", **_jsonable(self.info)}


def summary_records(info: Any) -> list[dict[str, Any]]:
    """Records of a run that kept no event log: its options, outcome and transfers only."""
    log = EventLog(info.run_id, info.started, 0.0, info.tasks, info.options)
    log.end(info.duration, info.outcome, info)
    return list(log.records())


def write_events(records: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write records as JSON lines; gzip-compressed when ``path`` ends in ``.gz``."""
    with _open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":"), default=repr))
            out.write("\n")


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
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


def _open(path: str | os.PathLike, mode: str) -> io.TextIOBase:
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")  # noqa: SIM115


def _info_fields(info: Any) -> dict[str, Any]:
    """What ``RunInfo`` holds beyond the run record and the transfers (e.g. hints)."""
    if not dataclasses.is_dataclass(info):
        return {}
    skip = {"run_id", "options", "tasks", "started", "finished", "outcome", "transfers", "events"}
    out = {name: value for name, value in vars(info).items() if name not in skip}
    out["duration"] = info.duration
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
