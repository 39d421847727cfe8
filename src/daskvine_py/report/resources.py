"""The report's sections on resources: what each category of tasks took, and each
worker's memory over time.

``categories(summary)`` is a table of the run's "categories" record, the very figures of
``Manager.last_run.categories``, so the page and the run's record never disagree.
``memory(summary)`` draws one chart per worker from its heartbeats ("memory" records),
held as steps from one heartbeat to the next. Laid out by ``page.py``, drawn with
``drawing``.
"""

from __future__ import annotations

from typing import Any

from daskvine_py.report import drawing as draw
from daskvine_py.report.summary import LANE_NAMES, MemorySample, RunWorker, Summary
from daskvine_py.sizes import peak_memory

#: Workers drawn in the memory section, those that held the most first; the rest are named.
MAX_MEMORY_CHARTS = 32
#: The bytes of a "MB" in the categories table: MiB, as ``Category``'s ``*_mb`` fields.
MB = 2**20
#: What the memory charts draw of each heartbeat: (field, label, colour).
MEMORY_SERIES = (
    ("resident", "worker and libraries, resident", "#76b7b2"),
    ("library_peak", "largest library's peak (since its current task began)", "#4e79a7"),
    ("stored", "results held (live and stored)", "#f28e2b"),
    ("spilled", "of them spilled to disk", "#e15759"),
    ("peak", "worker process's peak", "#bab0ac"),
)
#: The worker's --memory is drawn when it is within this factor of what was measured (the
#: default, the node's memory, would flatten the lines).
BUDGET_IN_VIEW = 4.0

_HEAD = (
    "category",
    "tasks",
    "wall s",
    "CPU s",
    "CPU/wall",
    "peak memory",
    "allocated MB",
    "exhausted",
    "input MB",
    "output MB",
    "failed",
)
#: The input cache's columns (``cache_inputs``), shown when some category read files.
_FILES_HEAD = ("files from storage MB", "from cache MB", "from peers MB")
_FILE_FIELDS = ("file_bytes_from_storage", "file_bytes_from_cache", "file_bytes_from_peers")


def categories(summary: Summary) -> str:
    """A row per category, the heaviest (most wall time) first, and their totals."""
    known = summary.categories
    if known is None:
        return draw.empty("Not recorded: the log was written before categories were.")
    if not known:
        return draw.empty("No task finished.")
    rows: list[tuple[Any, ...]] = []
    totals = {
        "tasks": 0,
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "peak_memory_mb": 0.0,
        "exhausted": 0,
        "input_bytes": 0,
        "output_bytes": 0,
        "failed": 0,
        **dict.fromkeys(_FILE_FIELDS, 0),
    }
    files = any(_number(fields, field) for fields in known.values() for field in _FILE_FIELDS)
    ordered = sorted(known.items(), key=lambda kv: (-_number(kv[1], "wall_s"), kv[0]))
    for name, fields in ordered:
        rows.append(_row(name, fields, files=files))
        for field in totals:
            if field == "peak_memory_mb":
                totals[field] = max(totals[field], _number(fields, field))
            else:
                totals[field] += _number(fields, field)
    if len(rows) > 1:
        rows.append(_row(draw.Raw("<b>all categories</b>"), totals, False, files))
    head = _HEAD + _FILES_HEAD if files else _HEAD
    files_note = (
        " Files: the remote input files the tasks obtained through their nodes' input "
        "cache (<code>cache_inputs</code>), whole, once per task that read each: fetched "
        "from their servers, found in the node's cache, or fetched from a peer."
        if files
        else ""
    )
    return draw.table(head, rows) + (
        "<p class='note'>A category is the prefix of its tasks' keys (dask's "
        "<code>key_split</code>); the figures are <code>manager.last_run.categories</code>. "
        "Wall s: the tasks' calls; CPU s: their processes' CPU time then (above wall: "
        "threads); peak memory: the most one task grew its process while it ran, above "
        "the process's size as the task began (its own memory, not the interpreter's "
        "and its modules' base; &lt; 1 MiB: less, or none); "
        "allocated: what each task was allotted (0: no allotment), exhausted: tasks "
        "stopped past it; input: bytes of results the tasks read, output: bytes they "
        "made. A task run twice counts twice; failed: tasks that raised or whose process "
        "died. MB and MiB: 2<sup>20</sup> bytes." + files_note + "</p>"
    )


def _row(
    name: Any, fields: dict[str, Any], allocated: bool = True, files: bool = False
) -> tuple[Any, ...]:
    wall, cpu = _number(fields, "wall_s"), _number(fields, "cpu_s")
    row: tuple[Any, ...] = (
        name,
        f"{int(_number(fields, 'tasks')):,}",
        amount(wall),
        amount(cpu),
        f"{cpu / wall:.2f}" if wall > 0 else "",
        _peak(fields),
        amount(_number(fields, "allocated_memory_mb")) if allocated else "",
        f"{int(_number(fields, 'exhausted')):,}",
        amount(_number(fields, "input_bytes") / MB),
        amount(_number(fields, "output_bytes") / MB),
        f"{int(_number(fields, 'failed')):,}",
    )
    if files:
        row += tuple(amount(_number(fields, field) / MB) for field in _FILE_FIELDS)
    return row


def _peak(fields: dict[str, Any]) -> str:
    """The largest growth of one of its tasks; blank where none was measured (every
    task failed)."""
    if not (_number(fields, "tasks") or _number(fields, "exhausted")):
        return ""
    return peak_memory(_number(fields, "peak_memory_mb"))


def amount(value: float) -> str:
    """Seconds or MB in a cell: whole above 100, two decimals above 1, else three
    significant digits (a category of quick tasks is not all zeros)."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _number(fields: dict[str, Any], name: str) -> float:
    value = fields.get(name, 0)
    return value if isinstance(value, int | float) else 0


def memory(summary: Summary) -> str:
    """A chart per worker of its heartbeats, the workers that held the most first."""
    if not summary.memory:
        return draw.empty(
            "No heartbeat recorded: workers send one when they have been silent for the "
            "manager's heartbeat_interval, so a short run or busy workers may send none."
        )
    ranked = sorted(summary.memory.items(), key=lambda kv: (-_highest(kv[1]), kv[0]))
    shown, rest = ranked[:MAX_MEMORY_CHARTS], ranked[MAX_MEMORY_CHARTS:]
    t_max = max(summary.duration, max(s[-1].t for _, s in ranked), 1e-6)
    parts = []
    for name, samples in sorted(shown, key=lambda kv: draw.natural(kv[0])):
        worker = summary.workers.get(name) or RunWorker(name)
        parts.append(
            f"<figure class='memory' data-worker='{draw.escape(name)}'>"
            f"<figcaption>{draw.escape(name)}{_budget_text(worker)}</figcaption>"
            f"{_chart(samples, worker, t_max)}</figure>"
        )
    legend = "".join(
        f"<span class='swatch' style='background:{colour}'></span>{draw.escape(label)} "
        for _, label, colour in MEMORY_SERIES
    )
    if any("class='budget'" in part for part in parts):
        legend += "<span class='swatch' style='background:#59a14f'></span>its --memory "
    tail = ""
    if rest:
        names = ", ".join(draw.escape(n) for n in sorted((n for n, _ in rest), key=draw.natural))
        tail = f"<p class='note'>Not drawn ({len(rest)} held less): {names}</p>"
    return (
        "".join(parts)
        + f"<p class='legend'>{legend}</p>"
        + tail
        + (
            "<p class='note'>From the workers' heartbeats, one per <code>heartbeat_interval</code>"
            ", each held until the next. A library's peak is reset as each of its tasks "
            "begins.</p>"
        )
    )


def _highest(samples: list[MemorySample]) -> int:
    return max(max(s.resident, s.library_peak, s.stored, s.peak) for s in samples)


def _budget_text(worker: RunWorker) -> str:
    return f" (--memory {draw.byte_size(worker.memory)})" if worker.memory else ""


def _chart(samples: list[MemorySample], worker: RunWorker, t_max: float) -> str:
    """One worker's series in MB, as steps; its --memory when in view."""
    highest = _highest(samples) / MB
    budget = worker.memory / MB
    in_view = 0 < budget <= max(highest, 1.0) * BUDGET_IN_VIEW
    y_max = max(highest, budget if in_view else 0.0, 1.0) * 1.05
    chart = draw.Chart(t_max, y_max, 110)
    parts = [chart.axes("seconds since start", "MB")]
    if in_view:
        y = chart.y(budget)
        parts.append(
            f"<line class='budget' x1='{chart.left}' x2='{chart.left + chart.width}' "
            f"y1='{y:.1f}' y2='{y:.1f}' stroke='#59a14f' stroke-dasharray='4 3'>"
            f"<title>--memory {draw.byte_size(worker.memory)}</title></line>"
        )
    for field, label, colour in MEMORY_SERIES:
        values = [getattr(s, field) / MB for s in samples]
        if not any(values):
            continue
        path = []
        for index, (sample, value) in enumerate(zip(samples, values, strict=True)):
            x, y = chart.x(sample.t), chart.y(value)
            if index:
                path.append(f"L{x:.1f},{chart.y(values[index - 1]):.1f}")
            path.append(("L" if index else "M") + f"{x:.1f},{y:.1f}")
        path.append(f"L{chart.x(t_max):.1f},{chart.y(values[-1]):.1f}")
        parts.append(
            f"<path class='series' data-series='{field}' d='{' '.join(path)}' fill='none' "
            f"stroke='{colour}' stroke-width='1.6'><title>{draw.escape(label)}</title></path>"
        )
    return chart.svg("".join(parts))


def workers(
    summary: Summary,
    now: dict[str, dict[str, Any]] | None = None,
    ran: dict[str, int] | None = None,
) -> str:
    """A row per worker: its cores and budget, its last heartbeat's memory, the tasks it
    ran (the report's; ``ran``: counted already, the dashboard's window's) and, given
    ``now`` (the live snapshot's workers by name), what it holds now and when it was last
    heard from."""
    if not summary.workers:
        return draw.empty("No worker recorded.")
    if ran is None:
        ran = {}
        for task in summary.tasks + summary.activity:
            if task.prefix not in LANE_NAMES.values():
                ran[task.worker] = ran.get(task.worker, 0) + task.tasks
    head = [
        "worker",
        "host",
        "cores",
        "--memory",
        "resident",
        "results held",
        "spilled",
        "tasks run",
    ]
    if now is not None:
        head += ["tasks held", "last heard", "new tasks"]
    rows = []
    for name in sorted(summary.workers, key=draw.natural):
        worker = summary.workers[name]
        last = (summary.memory.get(name) or [MemorySample(0.0, 0, 0, 0, 0)])[-1]
        row: list[Any] = [
            name,
            worker.host,
            worker.cores or "",
            draw.byte_size(worker.memory),
            draw.byte_size(last.resident),
            draw.byte_size(last.stored),
            draw.byte_size(last.spilled),
            f"{ran.get(name, 0):,}",
        ]
        if now is not None:
            live = now.get(name, {})
            row += [
                live.get("tasks", ""),
                draw.seconds(float(live.get("last_heard_s", 0.0))),
                live.get("quarantined") or ("lost" if worker.lost is not None else "yes"),
            ]
        elif worker.lost is not None:
            row[0] = draw.Raw(f"{draw.escape(name)} <span class='lost'>(lost)</span>")
        rows.append(row)
    return draw.table(head, rows)
