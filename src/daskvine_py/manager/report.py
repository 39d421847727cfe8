"""The performance report of a run: one self-contained HTML file built from its event log.

``render(records)`` turns the records of ``events.py`` into a page a user can open or send:
no scripts, no network fetches, charts drawn here as inline SVG. Sections:

- a summary (outcome, duration, tasks, workers, bytes), the options of the call and any
  further facts the run recorded (e.g. modules worth hoisting);
- tasks waiting, ready, queued on workers and running over time (the TaskVine study's
  figure 12), from the manager's periodic samples;
- one timeline per worker core of the tasks it ran, coloured by function (figure 13), the
  part of each bar its library spent (de)serializing hatched; adjacent tasks of one
  function closer than a pixel merge, so the page stays small for 10^5 tasks;
- the bytes moved between each (source, destination) pair (figure 7);
- run and serialization time per function, the slowest tasks, and what failed.

Pure functions of the records: tested without workers, rebuilt from a saved log by
``python -m daskvine_py report run.jsonl -o run.html``.
"""

from __future__ import annotations

import datetime
import html
import math
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from daskvine_py.manager.runinfo import MANAGER

#: Width of the charts' plotting area, pixels.
PLOT_WIDTH = 880
#: Rows in the slowest-tasks table.
SLOWEST = 20
#: Failures listed in full; the rest are counted.
MAX_FAILURES = 50
#: The ids of the report's sections, in order (``<section id=...>``).
SECTIONS = (
    "summary", "options", "tasks-over-time", "worker-timeline", "transfers", "durations",
    "slowest", "failures",
)  # fmt: skip
#: Fields of the "end" record the summary shows in rows of their own, or elsewhere.
_SHOWN_ELSEWHERE = frozenset(
    {"event", "t", "outcome", "duration", "hoisting_candidates", "run_seconds",
     "serialization_seconds", "cache"}
)  # fmt: skip
#: The hatching of the parts of the timeline's bars spent (de)serializing.
SERIALIZING = "serializing"
#: Colours for functions, most time-consuming first; the rest share the last one.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#bab0ac",
)  # fmt: skip


@dataclass
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

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start - self.serialization)


@dataclass
class Summary:
    """A run's records, grouped for rendering."""

    run: dict[str, Any]
    end: dict[str, Any] | None = None
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: list[TaskRun] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    dispatched: int = 0

    @property
    def has_events(self) -> bool:
        """False for a run that kept no event log (only its summary is known)."""
        return bool(self.dispatched or self.tasks or self.samples)

    @property
    def duration(self) -> float:
        if self.end is not None and "duration" in self.end:
            return float(self.end["duration"])
        times = [t.end for t in self.tasks] + [s["t"] for s in self.samples]
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
    dispatched: dict[int, tuple[Any, str]] = {}
    for record in records:
        kind = record.get("event")
        if kind == "dispatch":
            summary.dispatched += 1
            dispatched[record["id"]] = (record["key"], record["prefix"])
        elif kind == "done":
            key, prefix = dispatched.get(record["id"], (record["id"], "?"))
            summary.tasks.append(
                TaskRun(
                    record["id"],
                    key,
                    prefix,
                    record["worker"],
                    record["start"],
                    record["end"],
                    record["nbytes"],
                    record.get("serialization", 0.0),  # not in logs of older versions
                )  # fmt: skip
            )
        elif kind == "sample":
            summary.samples.append(record)
        elif kind == "worker":
            summary.workers.setdefault(record["worker"], dict(record))
        elif kind == "worker_lost":
            summary.workers.setdefault(record["worker"], {"worker": record["worker"]})
            summary.workers[record["worker"]]["lost"] = record["t"]
            summary.failures.append(record)
        elif kind in ("erred", "crashed"):
            key, _ = dispatched.get(record["id"], (record["id"], "?"))
            summary.failures.append({**record, "key": key})
        elif kind == "transfer":
            pair = (record["source"], record["destination"])
            summary.transfers[pair] = summary.transfers.get(pair, 0) + record["bytes"]
        elif kind == "end":
            summary.end = record
    for task in summary.tasks:
        summary.workers.setdefault(task.worker, {"worker": task.worker})
    return summary


def render(records: Iterable[dict[str, Any]]) -> str:
    """The report as one HTML document."""
    summary = summarize(records)
    colours = _colours(summary.tasks)
    title = f"daskvine_py run {summary.run.get('run', '?')}"
    body = [
        f"<h1>{_e(title)}</h1>",
        _section("Summary", "summary", _summary_table(summary)),
        _section("Options", "options", _options(summary)),
        _section("Tasks over time", "tasks-over-time", _tasks_over_time(summary)),
        _section("Worker timeline", "worker-timeline", _timeline(summary, colours)),
        _section("Transfers", "transfers", _transfers(summary)),
        _section("Durations per function", "durations", _durations(summary, colours)),
        _section("Slowest tasks", "slowest", _slowest(summary)),
        _section("Failures", "failures", _failures(summary)),
    ]
    return _PAGE.format(title=_e(title), style=_STYLE, body="\n".join(body))


def write_report(records: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    """Render the records and write the page to ``path``."""
    page = render(records)
    with open(path, "w", encoding="utf-8") as out:
        out.write(page)


# -- sections -------------------------------------------------------------------------


def _summary_table(summary: Summary) -> str:
    run, end = summary.run, summary.end or {}
    duration = summary.duration
    cores = sum(int(w.get("cores", 0) or 0) for w in summary.workers.values())
    started = run.get("started")
    when = (
        datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
        if isinstance(started, int | float) and started > 0
        else "?"
    )
    rows = [
        ("outcome", end.get("outcome", "unfinished")),
        ("started", when),
        ("duration", _seconds(duration)),
        ("tasks in the plan", f"{run.get('tasks', 0):,}"),
    ]
    if summary.has_events:
        done = len(summary.tasks)
        rate = f" ({done / duration:,.0f} tasks/s)" if duration > 0 else ""
        rows += [
            ("tasks finished", f"{done:,}{rate}"),
            ("tasks sent to workers", f"{summary.dispatched:,}"),
            ("workers", f"{len(summary.workers)} ({cores} cores)"),
            ("bytes of results made", _bytes(sum(t.nbytes for t in summary.tasks))),
        ]
    rows.append(("bytes moved", _bytes(sum(summary.transfers.values()))))
    relayed = end.get("relayed") or []
    if relayed:  # flagged: workers that could not reach each other
        pairs = ", ".join(f"{h} → {r} {_bytes(n)}" for h, r, n in relayed)
        rows.append(("⚠ through the manager (peers unreachable)", pairs))
    cache = end.get("cache")
    if isinstance(cache, dict):  # a run with the result cache (docs/cache.md)
        rows.append(("result cache", _cache_row(cache)))
    seconds = summary.seconds()
    if seconds is not None:
        run_seconds, serialization = seconds
        rows += [
            ("tasks' run time", _seconds(run_seconds)),
            ("(de)serialization", f"{_seconds(serialization)} "
                                  f"({_share(serialization, run_seconds)} of run + serialization)"),
        ]  # fmt: skip
    for name, value in end.items():
        if name not in _SHOWN_ELSEWHERE:
            rows.append((name.replace("_", " "), _value(value)))
    out = _table(("", ""), rows, header=False)
    if not summary.has_events:
        out += (
            "<p class='note'>This run kept no event log: pass <code>report=</code> or "
            "<code>event_log=</code> to <code>get</code> to record its tasks.</p>"
        )
    return out


def _options(summary: Summary) -> str:
    options = summary.run.get("options") or {}
    out = _table(("option", "value"), [(k, _value(v)) for k, v in sorted(options.items())])
    hints = (summary.end or {}).get("hoisting_candidates")
    if hints:
        modules = ", ".join(f"<code>{_e(str(m))}</code>" for m in hints)
        out += (
            f"<p class='hint' id='hoisting-candidates'>Modules worth importing once per "
            f"library process (<code>import_modules=</code>): {modules}</p>"
        )
    return out


def _tasks_over_time(summary: Summary) -> str:
    samples = summary.samples
    if not samples:
        return _empty("No samples: the run kept no event log.")
    series = (
        ("waiting", "waiting (for inputs, or not submitted yet)", "#bab0ac"),
        ("ready", "ready (queued at the manager)", "#f28e2b"),
        ("queued", "sent, not running (queued on workers)", "#76b7b2"),
        ("running", "running", "#4e79a7"),
    )
    points = [{**s, "queued": max(0, s["processing"] - s["running"])} for s in samples]
    t_max = max(summary.duration, points[-1]["t"], 1e-6)
    y_max = max(max(p[name] for p in points for name, _, _ in series), 1)
    height = 220
    chart = _Chart(t_max, y_max, height)
    parts = [chart.axes("seconds since start", "tasks")]
    for name, _, colour in series:
        path = []
        previous = None
        for p in points:
            x, y = chart.x(p["t"]), chart.y(p[name])
            if previous is not None:
                path.append(f"L{x:.1f},{previous:.1f}")  # a step: hold until the next sample
            path.append(("M" if previous is None else "L") + f"{x:.1f},{y:.1f}")
            previous = y
        parts.append(
            f"<path class='series' data-series='{name}' d='{' '.join(path)}' fill='none' "
            f"stroke='{colour}' stroke-width='1.6'><title>{_e(name)}</title></path>"
        )
    legend = "".join(
        f"<span class='swatch' style='background:{c}'></span>{_e(label)} " for _, label, c in series
    )
    return chart.svg("".join(parts)) + f"<p class='legend'>{legend}</p>"


def _timeline(summary: Summary, colours: dict[str, str]) -> str:
    if not summary.tasks:
        return _empty("No finished tasks recorded.")
    t_max = max(summary.duration, max(t.end for t in summary.tasks), 1e-6)
    lanes_by_worker = {
        name: _lanes(
            [t for t in summary.tasks if t.worker == name],
            int(summary.workers[name].get("cores") or 0),
        )
        for name in sorted(summary.workers, key=_natural)
    }
    lane_height, gap = 12, 8
    rows = sum(max(1, len(lanes)) for lanes in lanes_by_worker.values())
    height = rows * lane_height + gap * len(lanes_by_worker)
    chart = _Chart(t_max, 1, height, left=110)
    parts = [_HATCH, chart.time_axis("seconds since start")]
    y = chart.top
    for name, lanes in lanes_by_worker.items():
        block = max(1, len(lanes)) * lane_height
        lost = summary.workers[name].get("lost")
        parts.append(
            f"<text class='worker' x='{chart.left - 6}' y='{y + block / 2 + 4:.1f}' "
            f"text-anchor='end'>{_e(_short(name, 16))}</text>"
        )
        parts.append(
            f"<rect x='{chart.left}' y='{y}' width='{chart.width}' height='{block}' "
            f"fill='#f4f4f4'/>"
        )
        for index, lane in enumerate(lanes):
            lane_y = y + index * lane_height + 1
            for bar in _merge(lane, chart):
                parts.append(_bar(bar, lane_y, lane_height - 2, colours))
        if lost is not None:
            x = chart.x(lost)
            parts.append(
                f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y}' y2='{y + block}' stroke='#e15759' "
                f"stroke-width='2'><title>worker lost</title></line>"
            )
        y += block + gap
    serializing = (
        "<span class='swatch hatched'></span>(de)serializing: unpickling inputs before the "
        "run, pickling the result after it (half of the time each: the worker reports their "
        "sum)"
    )
    return chart.svg("".join(parts)) + _legend(colours, serializing)


def _transfers(summary: Summary) -> str:
    if not summary.transfers:
        return _empty("No bytes moved between workers or to the manager were recorded.")
    names = sorted({n for pair in summary.transfers for n in pair} - {MANAGER})
    sources = names + ([MANAGER] if any(s == MANAGER for s, _ in summary.transfers) else [])
    destinations = names + ([MANAGER] if any(d == MANAGER for _, d in summary.transfers) else [])
    peak = max(summary.transfers.values()) or 1
    head = "".join(f"<th>{_e(_short(d, 14))}</th>" for d in destinations)
    rows = []
    for source in sources:
        cells = []
        for destination in destinations:
            nbytes = summary.transfers.get((source, destination), 0)
            alpha = 0.08 + 0.8 * nbytes / peak if nbytes else 0
            style = f" style='background:rgba(78,121,167,{alpha:.2f})'" if nbytes else ""
            cells.append(f"<td class='num'{style}>{_bytes(nbytes) if nbytes else ''}</td>")
        rows.append(f"<tr><th>{_e(_short(source, 14))}</th>{''.join(cells)}</tr>")
    total = _bytes(sum(summary.transfers.values()))
    return (
        "<p>Rows send, columns receive.</p>"
        f"<table class='matrix'><tr><th>source \\ destination</th>{head}</tr>"
        f"{''.join(rows)}</table><p>Total: {total}</p>"
    )


def _durations(summary: Summary, colours: dict[str, str]) -> str:
    if not summary.tasks:
        return _empty("No finished tasks recorded.")
    by_prefix: dict[str, list[float]] = {}
    serialization: dict[str, float] = {}
    for task in summary.tasks:
        by_prefix.setdefault(task.prefix, []).append(task.duration)
        serialization[task.prefix] = serialization.get(task.prefix, 0.0) + task.serialization
    grand = sum(sum(d) for d in by_prefix.values())
    rows = []
    for prefix, durations in sorted(by_prefix.items(), key=lambda kv: -sum(kv[1])):
        total = sum(durations)
        share = 100 * total / (grand or 1e-12)
        bar = (
            f"<span class='barbox'><span class='bar' style='width:{share:.1f}%;"
            f"background:{colours.get(prefix, PALETTE[-1])}'></span></span>"
        )
        rows.append((
            prefix, f"{len(durations):,}", _seconds(total), _seconds(total / len(durations)),
            _seconds(statistics.median(durations)), _seconds(max(durations)),
            _Raw(f"{bar}<span>{share:.1f}%</span>"),
            _Raw(_serialization_cell(serialization[prefix], total)),
        ))  # fmt: skip
    all_serialization = sum(serialization.values())
    rows.append((
        _Raw("<b>all functions</b>"), f"{len(summary.tasks):,}", _seconds(grand),
        _seconds(grand / len(summary.tasks)), "", "", "",
        _Raw(_serialization_cell(all_serialization, grand)),
    ))  # fmt: skip
    head = ("function", "tasks", "run time", "mean", "median", "max", "share", "serialization")
    return _table(head, rows) + (
        "<p class='note'>Run time is the functions' calls; serialization is the time their "
        "library processes spent unpickling the tasks' inputs and pickling their results "
        "besides, and its share of both.</p>"
    )


def _serialization_cell(seconds: float, run_seconds: float) -> str:
    share = _share(seconds, run_seconds)
    return f"<span class='serialization'>{_e(_seconds(seconds))} ({share})</span>"


def _share(serialization: float, run_seconds: float) -> str:
    """``serialization``'s share of run + serialization, as text."""
    busy = serialization + run_seconds
    return f"{100 * serialization / busy:.1f}%" if busy > 0 else "0%"


def _slowest(summary: Summary) -> str:
    if not summary.tasks:
        return _empty("No finished tasks recorded.")
    slowest = sorted(summary.tasks, key=lambda t: -t.duration)[:SLOWEST]
    rows = [
        (_key(t.key), t.prefix, t.worker, _seconds(t.duration), _seconds(t.serialization),
         _seconds(t.start), _bytes(t.nbytes))
        for t in slowest
    ]  # fmt: skip
    head = ("key", "function", "worker", "duration", "serialization", "started at", "result")
    return _table(head, rows)


def _failures(summary: Summary) -> str:
    if not summary.failures:
        return _empty("None.")
    rows = []
    for record in summary.failures[:MAX_FAILURES]:
        kind = record["event"]
        if kind == "worker_lost":
            rows.append((_seconds(record["t"]), "worker lost", "", record["worker"],
                         record["reason"]))  # fmt: skip
        else:
            rows.append((_seconds(record["t"]), kind, _key(record["key"]), record["worker"],
                         record["message"]))  # fmt: skip
    more = len(summary.failures) - MAX_FAILURES
    tail = f"<p>and {more} more</p>" if more > 0 else ""
    return _table(("at", "what", "key", "worker", "message"), rows) + tail


# -- drawing --------------------------------------------------------------------------


class _Chart:
    """Scales and axes of one SVG chart: time across, a count or lanes down."""

    def __init__(self, t_max: float, y_max: float, height: int, left: int = 60) -> None:
        self.t_max = t_max
        self.y_max = y_max
        self.left = left
        self.top = 10
        self.width = PLOT_WIDTH
        self.height = height
        self.bottom = self.top + height

    def x(self, t: float) -> float:
        return self.left + self.width * max(0.0, t) / self.t_max

    def y(self, value: float) -> float:
        return self.bottom - self.height * value / self.y_max

    def time_axis(self, label: str) -> str:
        parts = [
            f"<line x1='{self.left}' x2='{self.left + self.width}' y1='{self.bottom}' "
            f"y2='{self.bottom}' stroke='#444'/>"
        ]
        for tick in _ticks(self.t_max):
            x = self.x(tick)
            parts.append(
                f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{self.bottom}' y2='{self.bottom + 4}' "
                f"stroke='#444'/><text x='{x:.1f}' y='{self.bottom + 16}' "
                f"text-anchor='middle'>{_tick_label(tick)}</text>"
            )
        parts.append(
            f"<text x='{self.left + self.width / 2}' y='{self.bottom + 32}' "
            f"text-anchor='middle'>{_e(label)}</text>"
        )
        return "".join(parts)

    def axes(self, x_label: str, y_label: str) -> str:
        parts = [self.time_axis(x_label)]
        parts.append(
            f"<line x1='{self.left}' x2='{self.left}' y1='{self.top}' y2='{self.bottom}' "
            f"stroke='#444'/>"
        )
        for tick in _ticks(self.y_max):
            y = self.y(tick)
            parts.append(
                f"<line x1='{self.left}' x2='{self.left + self.width}' y1='{y:.1f}' "
                f"y2='{y:.1f}' stroke='#e5e5e5'/><text x='{self.left - 6}' y='{y + 4:.1f}' "
                f"text-anchor='end'>{_tick_label(tick)}</text>"
            )
        parts.append(
            f"<text x='14' y='{self.top + self.height / 2}' text-anchor='middle' "
            f"transform='rotate(-90 14 {self.top + self.height / 2})'>{_e(y_label)}</text>"
        )
        return "".join(parts)

    def svg(self, content: str) -> str:
        width = self.left + self.width + 20
        height = self.bottom + 40
        return (
            f"<svg width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img'>{content}</svg>"
        )


def _lanes(tasks: list[TaskRun], cores: int) -> list[list[TaskRun]]:
    """Tasks of one worker laid out on lanes (its cores) so that none overlap.

    Each task goes on the first lane free when it starts. Batched tasks may report
    overlapping times; past ``cores`` lanes (when known) the lane freed soonest takes them.
    """
    lanes: list[list[TaskRun]] = []
    ends: list[float] = []
    for task in sorted(tasks, key=lambda t: t.start):
        free = next((i for i, end in enumerate(ends) if end <= task.start + 1e-9), None)
        if free is None:
            if cores and len(lanes) >= cores:
                free = min(range(len(ends)), key=ends.__getitem__)
            else:
                lanes.append([])
                ends.append(0.0)
                free = len(lanes) - 1
        lanes[free].append(task)
        ends[free] = max(ends[free], task.end)
    return lanes


class _Bar(NamedTuple):
    """One rectangle of a lane: a task, or neighbours of one function merged."""

    x0: float
    x1: float
    prefix: str
    count: int
    key: str  #: the first task's
    run: float  #: seconds of the tasks' calls
    serialization: float  #: seconds of their (de)serialization


def _merge(lane: list[TaskRun], chart: _Chart) -> list[_Bar]:
    """Rectangles of one lane: neighbours of one function less than a pixel apart merge."""
    out: list[_Bar] = []
    current: list[Any] | None = None
    for task in lane:
        x0 = chart.x(task.start)
        x1 = max(chart.x(task.end), x0 + 1.0)  # at least a pixel, or tiny tasks vanish
        if current is not None and task.prefix == current[2] and x0 - current[1] < 1.0:
            current[1] = max(current[1], x1)
            current[3] += 1
            current[5] += task.duration
            current[6] += task.serialization
            continue
        if current is not None:
            out.append(_Bar(*current))
        current = [x0, x1, task.prefix, 1, _key(task.key), task.duration, task.serialization]
    if current is not None:
        out.append(_Bar(*current))
    return out


def _bar(bar: _Bar, y: float, height: int, colours: dict[str, str]) -> str:
    """A bar in its function's colour, hatched where its library (de)serialized.

    A library unpickles a task's inputs, calls its function, then pickles its result, and
    reports the two serializations' sum: half is drawn before the run, half after. A bar
    of merged tasks (each under a pixel) shows their summed shares the same way.
    """
    x0, x1 = bar.x0, bar.x1
    if bar.count > 1:
        label = f"{bar.prefix}: {bar.count} tasks"
    else:
        label = f"{bar.key} ({bar.prefix})"
    label += f"; run {_seconds(bar.run)}, (de)serialization {_seconds(bar.serialization)}"
    out = [
        f"<rect class='task' x='{x0:.2f}' y='{y}' width='{x1 - x0:.2f}' height='{height}' "
        f"fill='{colours.get(bar.prefix, PALETTE[-1])}'><title>{_e(label)}</title></rect>"
    ]
    busy = bar.run + bar.serialization
    half = (x1 - x0) * bar.serialization / busy / 2 if busy > 0 else 0.0
    if half >= 0.05:  # narrower is invisible: leave it out of the page
        for start in (x0, x1 - half):
            out.append(
                f"<rect class='{SERIALIZING}' x='{start:.2f}' y='{y}' width='{half:.2f}' "
                f"height='{height}' fill='url(#{SERIALIZING})'/>"
            )
    return "".join(out)


def _natural(name: str) -> list[Any]:
    """Sort key putting local-2 before local-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _colours(tasks: Sequence[TaskRun]) -> dict[str, str]:
    total: dict[str, float] = {}
    for task in tasks:
        total[task.prefix] = total.get(task.prefix, 0.0) + task.duration
    ranked = sorted(total, key=lambda p: -total[p])
    return {p: PALETTE[min(i, len(PALETTE) - 1)] for i, p in enumerate(ranked)}


def _legend(colours: dict[str, str], extra: str = "") -> str:
    """Swatches of the functions' colours; ``extra``: markup of further entries."""
    shown = list(colours.items())[: len(PALETTE)]
    items = "".join(
        f"<span class='swatch' style='background:{c}'></span>{_e(_short(p, 30))} " for p, c in shown
    )
    more = " (and others, in grey)" if len(colours) > len(PALETTE) else ""
    return f"<p class='legend'>{items}{more}{extra}</p>"


def _ticks(limit: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to ``limit``."""
    if limit <= 0:
        return [0.0]
    raw = limit / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if step * factor >= raw:
            step *= factor
            break
    return [i * step for i in range(int(limit / step + 1e-9) + 1)]


def _tick_label(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.3g}"


# -- formatting -----------------------------------------------------------------------


class _Raw(str):
    """Markup to put in a table cell as it is."""


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], header: bool = True) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = []
        for index, cell in enumerate(row):
            text = cell if isinstance(cell, _Raw) else _e(str(cell))
            tag = "th" if not header and index == 0 else "td"
            cells.append(f"<{tag}>{text}</{tag}>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _section(title: str, anchor: str, content: str) -> str:
    return f"<section id='{anchor}'><h2>{_e(title)}</h2>{content}</section>"


def _empty(text: str) -> str:
    return f"<p class='note'>{_e(text)}</p>"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _key(key: Any) -> str:
    if isinstance(key, list):
        return "(" + ", ".join(repr(k) if isinstance(k, str) else _key(k) for k in key) + ")"
    return str(key)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cache_row(cache: dict[str, Any]) -> str:
    """hits, misses, tasks run, bytes reused and time saved, in words."""

    def number(name: str) -> float:
        value = cache.get(name, 0)
        return value if isinstance(value, int | float) else 0

    return (
        f"{number('hits'):,.0f} hits, {number('misses'):,.0f} misses, "
        f"{number('uncached'):,.0f} uncached; {number('tasks_run'):,.0f} tasks run; "
        f"{_bytes(int(number('bytes_reused')))} reused; "
        f"{_seconds(float(number('seconds_saved')))} of task time saved"
    )


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return str(value)


def _seconds(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.0f} µs"


def _bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value} TB"


#: White stripes over a bar's colour: the parts of the timeline spent (de)serializing.
_HATCH = (
    f"<defs><pattern id='{SERIALIZING}' width='4' height='4' patternUnits='userSpaceOnUse' "
    "patternTransform='rotate(45)'><rect width='2' height='4' fill='#fff' "
    "fill-opacity='0.8'/></pattern></defs>"
)

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 1000px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.num { text-align: right; } th { font-weight: 600; }
table.matrix td { min-width: 70px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg text.worker { font-size: 11px; }
.legend { font-size: 12px; } .note { color: #666; } .hint { background: #fff7e0; padding: 6px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px; }
.swatch.hatched { background: repeating-linear-gradient(45deg, #888 0 2px, #fff 2px 4px); }
.barbox { display: inline-block; width: 120px; margin-right: 6px; vertical-align: middle; }
.bar { display: block; height: 10px; min-width: 1px; }
td { white-space: nowrap; } td.wrap { white-space: normal; }
code { background: #f2f2f2; padding: 0 3px; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
</body>
</html>
"""
