"""The report's building blocks: SVG charts, worker lanes and HTML formatting.

Everything here turns numbers and ``summary.TaskRun`` records into markup, escaped, and
knows nothing of a run's sections (``page.py``): scales and axes (``Chart``), tasks laid
on a worker's cores (``lay_lanes``) and merged below a pixel (``merge_bars``), tables,
numbers in words, the page's style.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from daskvine_py.report.summary import TaskRun
from daskvine_py.sizes import byte_size as byte_size  # (the sections' ``draw.byte_size``)

#: Width of the charts' plotting area, pixels.
PLOT_WIDTH = 880
#: The hatching of the parts of the timeline's bars spent (de)serializing.
SERIALIZING = "serializing"
#: Colours for functions, most time-consuming first; the rest share the last one.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#86bcb6",
    "#d37295",
    "#bab0ac",
)

# -- charts ---------------------------------------------------------------------------


class Chart:
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
        for tick in ticks(self.t_max):
            x = self.x(tick)
            parts.append(
                f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{self.bottom}' y2='{self.bottom + 4}' "
                f"stroke='#444'/><text x='{x:.1f}' y='{self.bottom + 16}' "
                f"text-anchor='middle'>{tick_label(tick)}</text>"
            )
        parts.append(
            f"<text x='{self.left + self.width / 2}' y='{self.bottom + 32}' "
            f"text-anchor='middle'>{escape(label)}</text>"
        )
        return "".join(parts)

    def axes(self, x_label: str, y_label: str) -> str:
        parts = [self.time_axis(x_label)]
        parts.append(
            f"<line x1='{self.left}' x2='{self.left}' y1='{self.top}' y2='{self.bottom}' "
            f"stroke='#444'/>"
        )
        for tick in ticks(self.y_max):
            y = self.y(tick)
            parts.append(
                f"<line x1='{self.left}' x2='{self.left + self.width}' y1='{y:.1f}' "
                f"y2='{y:.1f}' stroke='#e5e5e5'/><text x='{self.left - 6}' y='{y + 4:.1f}' "
                f"text-anchor='end'>{tick_label(tick)}</text>"
            )
        parts.append(
            f"<text x='14' y='{self.top + self.height / 2}' text-anchor='middle' "
            f"transform='rotate(-90 14 {self.top + self.height / 2})'>{escape(y_label)}</text>"
        )
        return "".join(parts)

    def svg(self, content: str) -> str:
        width = self.left + self.width + 20
        height = self.bottom + 40
        return (
            f"<svg width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img'>{content}</svg>"
        )


def lay_lanes(tasks: list[TaskRun], cores: int) -> list[list[TaskRun]]:
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


@dataclass(slots=True)
class Bar:
    """One rectangle of a lane: a task, or neighbours of one function merged."""

    x0: float
    x1: float
    prefix: str
    count: int
    key: str  #: the first task's
    run: float  #: seconds of the tasks' calls
    serialization: float  #: seconds of their (de)serialization


def merge_bars(lane: list[TaskRun], chart: Chart) -> list[Bar]:
    """Rectangles of one lane: neighbours of one function less than a pixel apart merge."""
    out: list[Bar] = []
    current: Bar | None = None  # the last one, still growing
    for task in lane:
        x0 = chart.x(task.start)
        x1 = max(chart.x(task.end), x0 + 1.0)  # at least a pixel, or tiny tasks vanish
        if current is not None and task.prefix == current.prefix and x0 - current.x1 < 1.0:
            current.x1 = max(current.x1, x1)
            current.count += task.tasks
            current.run += task.duration
            current.serialization += task.serialization
            continue
        current = Bar(
            x0, x1, task.prefix, task.tasks, key_text(task.key), task.duration, task.serialization
        )
        out.append(current)
    return out


def bar_svg(bar: Bar, y: float, height: int, colours: dict[str, str]) -> str:
    """A bar in its function's colour, hatched where its library (de)serialized.

    A library unpickles a task's inputs, calls its function, then pickles its result, and
    reports the two serializations' sum: half is drawn before the run, half after. A bar
    of merged tasks (each under a pixel) shows their summed shares the same way.
    """
    x0, x1 = bar.x0, bar.x1
    if bar.count > 1:
        label = f"{bar.prefix}: {bar.count} task{'' if bar.count == 1 else 's'}"
    else:
        label = f"{bar.key} ({bar.prefix})"
    label += f"; run {seconds(bar.run)}, (de)serialization {seconds(bar.serialization)}"
    out = [
        f"<rect class='task' x='{x0:.2f}' y='{y}' width='{x1 - x0:.2f}' height='{height}' "
        f"fill='{colours.get(bar.prefix, PALETTE[-1])}'><title>{escape(label)}</title></rect>"
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


def natural(name: str) -> list[Any]:
    """Sort key putting local-2 before local-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def colours_by_prefix(tasks: Sequence[TaskRun]) -> dict[str, str]:
    total: dict[str, float] = {}
    for task in tasks:
        total[task.prefix] = total.get(task.prefix, 0.0) + task.duration
    ranked = sorted(total, key=lambda p: -total[p])
    return {p: PALETTE[min(i, len(PALETTE) - 1)] for i, p in enumerate(ranked)}


def legend(colours: dict[str, str], extra: str = "") -> str:
    """Swatches of the functions' colours; ``extra``: markup of further entries."""
    shown = list(colours.items())[: len(PALETTE)]
    items = "".join(
        f"<span class='swatch' style='background:{c}'></span>{escape(short(p, 30))} "
        for p, c in shown
    )
    more = " (and others, in grey)" if len(colours) > len(PALETTE) else ""
    return f"<p class='legend'>{items}{more}{extra}</p>"


def ticks(limit: float, count: int = 6) -> list[float]:
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


def tick_label(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.3g}"


# -- formatting -----------------------------------------------------------------------


class Raw(str):
    """Markup to put in a table cell as it is."""


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], header: bool = True) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = []
        for index, cell in enumerate(row):
            text = cell if isinstance(cell, Raw) else escape(str(cell))
            tag = "th" if not header and index == 0 else "td"
            cells.append(f"<{tag}>{text}</{tag}>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def section(title: str, anchor: str, content: str) -> str:
    return f"<section id='{anchor}'><h2>{escape(title)}</h2>{content}</section>"


def empty(text: str) -> str:
    return f"<p class='note'>{escape(text)}</p>"


def escape(text: str) -> str:
    return html.escape(text, quote=True)


def key_text(key: Any) -> str:
    if isinstance(key, list):
        return "(" + ", ".join(repr(k) if isinstance(k, str) else key_text(k) for k in key) + ")"
    return str(key)


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def value_text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return str(value)


def seconds(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.0f} µs"


#: White stripes over a bar's colour: the parts of the timeline spent (de)serializing.
HATCH = (
    f"<defs><pattern id='{SERIALIZING}' width='4' height='4' patternUnits='userSpaceOnUse' "
    "patternTransform='rotate(45)'><rect width='2' height='4' fill='#fff' "
    "fill-opacity='0.8'/></pattern></defs>"
)

STYLE = """
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
figure.memory { margin: 6px 0; } figcaption { font-weight: 600; font-size: 13px; }
"""

PAGE = """<!DOCTYPE html>
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
