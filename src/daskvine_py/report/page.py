"""The performance report of a run: one self-contained HTML file built from its event log.

``render(records)`` turns the records of ``events.py`` into a page a user can open or send:
no scripts, no network fetches, charts drawn as inline SVG (``drawing``). Sections:

- a summary (outcome, duration, tasks, workers, bytes), the options of the call and any
  further facts the run recorded (e.g. modules worth hoisting);
- tasks waiting, ready, queued on workers and running over time (the TaskVine study's
  figure 12), from the manager's periodic samples;
- one timeline per worker core of the tasks it ran, coloured by function (figure 13), the
  part of each bar its library spent (de)serializing hatched; adjacent tasks of one
  function closer than a pixel merge, so the page stays small for 10^5 tasks;
- each worker's memory over time, from its heartbeats (``resources``);
- the bytes moved between each (source, destination) pair (figure 7);
- run and serialization time per function; wall and CPU time, memory and bytes in and
  out per category (``resources``); the slowest tasks, and what failed.

Pure functions of the records: tested without workers, rebuilt from a saved log by
``python -m daskvine_py report run.jsonl -o run.html``. The records are gathered first
(``summary.summarize``); this module lays out the sections, ``drawing`` draws them.
"""

from __future__ import annotations

import datetime
import os
import statistics
from collections.abc import Iterable
from typing import Any

from daskvine_py.report import drawing as draw
from daskvine_py.report import resources
from daskvine_py.report.runinfo import MANAGER
from daskvine_py.report.summary import LANE_NAMES, Summary, TaskRun, summarize

#: Rows in the slowest-tasks table.
SLOWEST = 20
#: Failures listed in full; the rest are counted.
MAX_FAILURES = 50
#: The ids of the report's sections, in order (``<section id=...>``).
SECTIONS = (
    "summary",
    "options",
    "tasks-over-time",
    "worker-timeline",
    "workers",
    "memory",
    "transfers",
    "durations",
    "categories",
    "slowest",
    "failures",
)
#: Fields of the "end" record the summary shows in rows of their own, or elsewhere.
_SHOWN_ELSEWHERE = frozenset(
    {
        "event",
        "t",
        "outcome",
        "duration",
        "hoisting_candidates",
        "run_seconds",
        "serialization_seconds",
        "cache",
    }
)


def render(records: Iterable[dict[str, Any]]) -> str:
    """The report as one HTML document."""
    summary = summarize(records)
    colours = draw.colours_by_prefix(summary.tasks + summary.activity)
    title = f"daskvine_py run {summary.run.get('run', '?')}"
    body = [
        f"<h1>{draw.escape(title)}</h1>",
        draw.section("Summary", "summary", _summary_table(summary)),
        draw.section("Options", "options", _options(summary)),
        draw.section("Tasks over time", "tasks-over-time", tasks_over_time(summary)),
        draw.section("Worker timeline", "worker-timeline", timeline(summary, colours)),
        draw.section("Workers", "workers", resources.workers(summary)),
        draw.section("Memory per worker", "memory", resources.memory(summary)),
        draw.section("Transfers", "transfers", transfers(summary)),
        draw.section("Durations per function", "durations", _durations(summary, colours)),
        draw.section("Categories", "categories", resources.categories(summary)),
        draw.section("Slowest tasks", "slowest", _slowest(summary)),
        draw.section("Failures", "failures", failures(summary)),
    ]
    return draw.PAGE.format(title=draw.escape(title), style=draw.STYLE, body="\n".join(body))


def write_report(records: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Render the records and write the page to ``path``."""
    page = render(records)
    with open(path, "w", encoding="utf-8") as out:
        out.write(page)


# -- sections -------------------------------------------------------------------------


def _summary_table(summary: Summary) -> str:
    run, end = summary.run, summary.end or {}
    duration = summary.duration
    cores = sum(w.cores for w in summary.workers.values())
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
        ("duration", draw.seconds(duration)),
        ("tasks in the plan", f"{run.get('tasks', 0):,}"),
    ]
    if summary.has_events:
        done = len(summary.tasks)
        rate = f" ({done / duration:,.0f} tasks/s)" if duration > 0 else ""
        rows += [
            ("tasks finished", f"{done:,}{rate}"),
            ("tasks sent to workers", f"{summary.dispatched:,}"),
            ("workers", f"{len(summary.workers)} ({cores} core{'' if cores == 1 else 's'})"),
            ("bytes of results made", draw.byte_size(sum(t.nbytes for t in summary.tasks))),
        ]
    rows.append(("bytes moved", draw.byte_size(sum(summary.transfers.values()))))
    relayed = end.get("relayed") or []
    if relayed:  # flagged: workers that could not reach each other
        pairs = ", ".join(f"{h} → {r} {draw.byte_size(n)}" for h, r, n in relayed)
        rows.append(("⚠ through the manager (peers unreachable)", pairs))
    cache = end.get("cache")
    if isinstance(cache, dict):  # a run with the result cache (docs/cache.md)
        rows.append(("result cache", _cache_row(cache)))
    seconds = summary.seconds()
    if seconds is not None:
        run_seconds, serialization = seconds
        rows += [
            ("tasks' run time", draw.seconds(run_seconds)),
            (
                "(de)serialization",
                f"{draw.seconds(serialization)} "
                f"({_share(serialization, run_seconds)} of run + serialization)",
            ),
        ]
    for name, value in end.items():
        if name not in _SHOWN_ELSEWHERE:
            rows.append((name.replace("_", " "), draw.value_text(value)))
    out = draw.table(("", ""), rows, header=False)
    if not summary.has_events:
        out += (
            "<p class='note'>This run kept no event log: pass <code>report=</code> or "
            "<code>event_log=</code> to <code>get</code> to record its tasks.</p>"
        )
    return out


def _options(summary: Summary) -> str:
    options = summary.run.get("options") or {}
    out = draw.table(
        ("option", "value"), [(k, draw.value_text(v)) for k, v in sorted(options.items())]
    )
    hints = (summary.end or {}).get("hoisting_candidates")
    if hints:
        modules = ", ".join(f"<code>{draw.escape(str(m))}</code>" for m in hints)
        out += (
            f"<p class='hint' id='hoisting-candidates'>Modules worth importing once per "
            f"library process (<code>import_modules=</code>): {modules}</p>"
        )
    return out


def tasks_over_time(summary: Summary) -> str:
    samples = summary.samples
    if not samples:
        return draw.empty("No samples: the run kept no event log.")
    series = (
        ("waiting", "waiting (for inputs, or not submitted yet)", "#bab0ac"),
        ("ready", "ready (queued at the manager)", "#f28e2b"),
        ("queued", "sent, not running (queued on workers)", "#76b7b2"),
        ("running", "running (busy cores, for one-core tasks)", "#4e79a7"),
    )
    t_max = max(summary.duration, samples[-1].t, 1e-6)
    cores = _cores_over_time(summary)
    y_max = max(
        max(getattr(c, name) for c in samples for name, _, _ in series),
        1,
        max((n for _, n in cores), default=0),
    )
    height = 220
    chart = draw.Chart(t_max, y_max, height)
    parts = [chart.axes("seconds since start", "tasks")]
    if cores:  # the cores of the workers connected: what "running" could reach
        steps = []
        for index, (t, n) in enumerate(cores):
            x, y = chart.x(t), chart.y(n)
            if index:
                steps.append(f"L{x:.1f},{chart.y(cores[index - 1][1]):.1f}")
            steps.append(("M" if not index else "L") + f"{x:.1f},{y:.1f}")
        steps.append(f"L{chart.x(t_max):.1f},{chart.y(cores[-1][1]):.1f}")
        parts.append(
            f"<path class='series' data-series='cores' d='{' '.join(steps)}' fill='none' "
            "stroke='#59a14f' stroke-width='1.2' stroke-dasharray='4 3'>"
            "<title>cores of the connected workers</title></path>"
        )
    for worker in sorted(summary.workers.values(), key=lambda w: w.lost or 0.0):
        if worker.lost is not None:  # a worker lost: a mark where it went
            x = chart.x(worker.lost)
            parts.append(
                f"<line class='lost' x1='{x:.1f}' x2='{x:.1f}' y1='{chart.y(0):.1f}' "
                f"y2='{chart.y(y_max):.1f}' stroke='#e15759' stroke-width='1'>"
                f"<title>{draw.escape(worker.name)} lost at {worker.lost:.1f} s</title></line>"
            )
    for name, _, colour in series:
        path = []
        previous = None
        for counts in samples:
            x, y = chart.x(counts.t), chart.y(getattr(counts, name))
            if previous is not None:
                path.append(f"L{x:.1f},{previous:.1f}")  # a step: hold until the next sample
            path.append(("M" if previous is None else "L") + f"{x:.1f},{y:.1f}")
            previous = y
        parts.append(
            f"<path class='series' data-series='{name}' d='{' '.join(path)}' fill='none' "
            f"stroke='{colour}' stroke-width='1.6'><title>{draw.escape(name)}</title></path>"
        )
    legend = "".join(
        f"<span class='swatch' style='background:{c}'></span>{draw.escape(label)} "
        for _, label, c in series
    )
    if cores:
        legend += (
            "<span class='swatch' style='background:#59a14f'></span>cores of the connected workers "
        )
    if any(w.lost is not None for w in summary.workers.values()):
        legend += "<span class='swatch' style='background:#e15759'></span>a worker lost "
    return chart.svg("".join(parts)) + f"<p class='legend'>{legend}</p>"


def _cores_over_time(summary: Summary) -> list[tuple[float, int]]:
    """(time, cores of the workers connected then), at each join and loss; [] when the
    workers' cores are not known."""
    changes: dict[float, int] = {}
    for worker in summary.workers.values():
        if not worker.cores:
            continue
        changes[worker.joined] = changes.get(worker.joined, 0) + worker.cores
        if worker.lost is not None:
            changes[worker.lost] = changes.get(worker.lost, 0) - worker.cores
    steps = []
    total = 0
    for t in sorted(changes):
        total += changes[t]
        steps.append((t, total))
    return steps


def timeline(summary: Summary, colours: dict[str, str], names: list[str] | None = None) -> str:
    """Each worker's cores (its tasks, or its libraries' merged bars) and, below them, a
    lane of its inputs fetched and one of its results spilled; ``names``: these workers."""
    runs = summary.tasks + summary.activity
    if not runs:
        return draw.empty("No finished tasks recorded.")
    t_max = max(summary.duration, max(t.end for t in runs), 1e-6)
    by_worker: dict[str, list[TaskRun]] = {}
    for run in runs:
        by_worker.setdefault(run.worker, []).append(run)
    lanes_by_worker = {}
    for name in names if names is not None else sorted(summary.workers, key=draw.natural):
        own = by_worker.get(name, [])
        extra = [[t for t in own if t.prefix == lane] for lane in LANE_NAMES.values()]
        cores = [t for t in own if t.prefix not in LANE_NAMES.values()]
        lanes = draw.lay_lanes(cores, summary.workers[name].cores)
        lanes_by_worker[name] = lanes + [sorted(lane, key=_start) for lane in extra if lane]
    lane_height, gap = 12, 8
    rows = sum(max(1, len(lanes)) for lanes in lanes_by_worker.values())
    height = rows * lane_height + gap * len(lanes_by_worker)
    chart = draw.Chart(t_max, 1, height, left=110)
    parts = [draw.HATCH, chart.time_axis("seconds since start")]
    y = chart.top
    for name, lanes in lanes_by_worker.items():
        block = max(1, len(lanes)) * lane_height
        lost = summary.workers[name].lost
        parts.append(
            f"<text class='worker' x='{chart.left - 6}' y='{y + block / 2 + 4:.1f}' "
            f"text-anchor='end'>{draw.escape(draw.short(name, 16))}</text>"
        )
        parts.append(
            f"<rect x='{chart.left}' y='{y}' width='{chart.width}' height='{block}' "
            f"fill='#f4f4f4'/>"
        )
        for index, lane in enumerate(lanes):
            lane_y = y + index * lane_height + 1
            for bar in draw.merge_bars(lane, chart):
                parts.append(draw.bar_svg(bar, lane_y, lane_height - 2, colours))
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
    return chart.svg("".join(parts)) + draw.legend(colours, serializing)


def _start(task: TaskRun) -> float:
    return task.start


def transfers(summary: Summary) -> str:
    if not summary.transfers:
        return draw.empty("No bytes moved between workers or to the manager were recorded.")
    names = sorted({n for pair in summary.transfers for n in pair} - {MANAGER})
    sources = names + ([MANAGER] if any(s == MANAGER for s, _ in summary.transfers) else [])
    destinations = names + ([MANAGER] if any(d == MANAGER for _, d in summary.transfers) else [])
    peak = max(summary.transfers.values()) or 1
    head = "".join(f"<th>{draw.escape(draw.short(d, 14))}</th>" for d in destinations)
    rows = []
    for source in sources:
        cells = []
        for destination in destinations:
            nbytes = summary.transfers.get((source, destination), 0)
            alpha = 0.08 + 0.8 * nbytes / peak if nbytes else 0
            style = f" style='background:rgba(78,121,167,{alpha:.2f})'" if nbytes else ""
            cells.append(f"<td class='num'{style}>{draw.byte_size(nbytes) if nbytes else ''}</td>")
        rows.append(f"<tr><th>{draw.escape(draw.short(source, 14))}</th>{''.join(cells)}</tr>")
    total = draw.byte_size(sum(summary.transfers.values()))
    return (
        "<p>Rows send, columns receive.</p>"
        f"<table class='matrix'><tr><th>source \\ destination</th>{head}</tr>"
        f"{''.join(rows)}</table><p>Total: {total}</p>"
    )


def _durations(summary: Summary, colours: dict[str, str]) -> str:
    if not summary.tasks:
        return draw.empty("No finished tasks recorded.")
    by_prefix: dict[str, list[float]] = {}
    serialization: dict[str, float] = {}
    for task in summary.tasks:
        by_prefix.setdefault(task.prefix, []).append(task.duration)
        serialization[task.prefix] = serialization.get(task.prefix, 0.0) + task.serialization
    grand = sum(sum(d) for d in by_prefix.values())
    rows: list[tuple[Any, ...]] = []
    for prefix, durations in sorted(by_prefix.items(), key=lambda kv: -sum(kv[1])):
        total = sum(durations)
        share = 100 * total / (grand or 1e-12)
        bar = (
            f"<span class='barbox'><span class='bar' style='width:{share:.1f}%;"
            f"background:{colours.get(prefix, draw.PALETTE[-1])}'></span></span>"
        )
        rows.append(
            (
                prefix,
                f"{len(durations):,}",
                draw.seconds(total),
                draw.seconds(total / len(durations)),
                draw.seconds(statistics.median(durations)),
                draw.seconds(max(durations)),
                draw.Raw(f"{bar}<span>{share:.1f}%</span>"),
                draw.Raw(_serialization_cell(serialization[prefix], total)),
            )
        )
    all_serialization = sum(serialization.values())
    rows.append(
        (
            draw.Raw("<b>all functions</b>"),
            f"{len(summary.tasks):,}",
            draw.seconds(grand),
            draw.seconds(grand / len(summary.tasks)),
            "",
            "",
            "",
            draw.Raw(_serialization_cell(all_serialization, grand)),
        )
    )
    head = ("function", "tasks", "run time", "mean", "median", "max", "share", "serialization")
    return draw.table(head, rows) + (
        "<p class='note'>Run time is the functions' calls; serialization is the time their "
        "library processes spent unpickling the tasks' inputs and pickling their results "
        "besides, and its share of both.</p>"
    )


def _serialization_cell(seconds: float, run_seconds: float) -> str:
    share = _share(seconds, run_seconds)
    return f"<span class='serialization'>{draw.escape(draw.seconds(seconds))} ({share})</span>"


def _share(serialization: float, run_seconds: float) -> str:
    """``serialization``'s share of run + serialization, as text."""
    busy = serialization + run_seconds
    return f"{100 * serialization / busy:.1f}%" if busy > 0 else "0%"


def _slowest(summary: Summary) -> str:
    if not summary.tasks:
        return draw.empty("No finished tasks recorded.")
    slowest = sorted(summary.tasks, key=lambda t: -t.duration)[:SLOWEST]
    seconds = draw.seconds
    rows = [
        (
            draw.key_text(t.key),
            t.prefix,
            t.worker,
            seconds(t.duration),
            seconds(t.serialization),
            seconds(t.start),
            draw.byte_size(t.nbytes),
        )
        for t in slowest
    ]
    head = ("key", "function", "worker", "duration", "serialization", "started at", "result")
    return draw.table(head, rows)


def failures(summary: Summary) -> str:
    if not summary.failures:
        return draw.empty("None.")
    rows = []
    for failure in summary.failures[:MAX_FAILURES]:
        if failure.kind in ("worker_lost", "quarantined"):
            what, key = failure.kind.replace("_", " "), ""
        else:
            what, key = failure.kind, draw.key_text(failure.key)
        rows.append((draw.seconds(failure.t), what, key, failure.worker, _message(failure.message)))
    more = len(summary.failures) - MAX_FAILURES
    tail = f"<p>and {more} more</p>" if more > 0 else ""
    return draw.table(("at", "what", "key", "worker", "message"), rows) + tail


def _message(text: str) -> str:
    """A failure's message; one with a traceback shows its first line, the rest folded."""
    first, newline, _ = text.strip().partition("\n")
    if not newline:
        return text
    return draw.Raw(
        f"<details><summary>{draw.escape(first)}</summary><pre>{draw.escape(text)}</pre></details>"
    )


def _cache_row(cache: dict[str, Any]) -> str:
    """hits, misses, tasks run, bytes reused and time saved, in words."""

    def number(name: str) -> float:
        value = cache.get(name, 0)
        return value if isinstance(value, int | float) else 0

    return (
        f"{number('hits'):,.0f} hits, {number('misses'):,.0f} misses, "
        f"{number('uncached'):,.0f} uncached; {number('tasks_run'):,.0f} tasks run; "
        f"{draw.byte_size(int(number('bytes_reused')))} reused; "
        f"{draw.seconds(float(number('seconds_saved')))} of task time saved"
    )
