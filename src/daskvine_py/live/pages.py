"""What the live dashboard shows, kept and drawn in its server's thread; no sockets.

``DashboardView.update`` takes what the manager's I/O thread hands over once a second
(``manager.live.LiveView.dashboard``: the snapshot, the heartbeats heard since, bytes
moved per pair, failed runs) and keeps the last ``WINDOW`` seconds of it: each worker's merged bars
(``Status.activity``) and heartbeats, and the task counts of each snapshot. ``page``
draws a page from them with the performance report's own sections (``report.page``,
``report.resources``), fed a ``summary.Summary`` of the window: the dashboard and the
report are one rendering, so they never disagree. Its cost is here, in the dashboard's
thread, per request: none of it is in the manager's loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from daskvine_py.report import drawing as draw
from daskvine_py.report import page, resources
from daskvine_py.report.summary import (
    Failure,
    MemorySample,
    RunWorker,
    Summary,
    TaskCounts,
    bar_run,
)
from daskvine_py.wire import protocol as p

#: Seconds of the past the pages draw, and the task stream (whose bars are many more).
WINDOW = 300.0
STREAM_WINDOW = 60.0
#: Workers drawn in the task stream and the memory charts (the busiest): a swarm of 600
#: would draw 7,200 lanes nobody can read, and cost the page seconds.
MAX_STREAM_WORKERS = 16
#: Rows of the workers table (those holding the most tasks) and memory charts (those
#: holding the most memory): 600 rows and charts are megabytes redrawn each second.
MAX_WORKER_ROWS = 100
MAX_MEMORY_CHARTS = 8
#: A lane's bars of one prefix closer than this merge as they arrive: a pixel of the
#: stream's width (its chart is 880 pixels wide), below which nothing shows anyway.
MERGE_GAP = STREAM_WINDOW / 880
#: Names in the transfer matrix (those that moved the most); the rest are summed.
MAX_TRANSFER_NAMES = 16
#: Bars and heartbeats kept per worker (a heartbeat a second, a bar per lane in each).
MAX_BARS = 1024  # (per lane)
MAX_BEATS = int(WINDOW) + 10
#: Categories shown per run in progress (those of the most tasks).
MAX_CATEGORIES = 20
#: The pages: (name, title); each is drawn by the view's method ``_<name>``.
PAGES = (
    ("status", "Status"),
    ("stream", "Task stream"),
    ("workers", "Workers"),
    ("transfers", "Transfers"),
    ("failures", "Failures"),
)
_TITLES = dict(PAGES)


class DashboardView:
    """The window's data and the pages drawn from it; see the module docstring."""

    def __init__(self) -> None:
        self.live: dict[str, Any] = {}
        #: per worker, per lane: its bars in the stream's window, alike neighbours merged
        self.bars: dict[str, dict[int, deque[p.Bar]]] = {}
        self.beats: dict[str, deque[tuple[float, p.Status]]] = {}
        self.samples: deque[tuple[float, int, int, int, int, int]] = deque(maxlen=MAX_BEATS)
        self.transfers: dict[tuple[str, str], int] = {}
        self.failures: list[dict[str, Any]] = []
        #: per worker: seconds its libraries' bars kept cover, and the tasks they ran
        #: since the page opened (kept as bars come and go: no page walks every bar)
        self.busy: dict[str, float] = {}
        self.ran: dict[str, int] = {}

    def update(self, data: dict[str, Any]) -> None:
        """What the I/O thread handed over (``live.ask_dashboard``)."""
        live = self.live = data["live"]
        for name, t, status in data["beats"]:
            if status.activity:
                self._add_bars(name, status.activity)
            self.beats.setdefault(name, deque(maxlen=MAX_BEATS)).append((t, status))
        totals = live["totals"]
        if not self.samples or self.samples[-1][0] < live["t"]:
            self.samples.append(
                (
                    live["t"],
                    totals["waiting"],
                    totals["ready"],
                    totals["processing"],
                    totals["running"],
                    totals["tasks_done"],
                )
            )
        self.transfers = data["transfers"]
        self.failures = data["failures"]
        self._forget(live["t"], {w["name"] for w in live["workers"]})

    def _add_bars(self, name: str, bars: tuple[p.Bar, ...]) -> None:
        lanes = self.bars.setdefault(name, {})
        busy, ran = self.busy.get(name, 0.0), self.ran.get(name, 0)
        for bar in bars:
            lane = bar[0]
            if lane >= 0:
                busy += bar[3] - bar[2]
                ran += bar[5]
            kept = lanes.get(lane)
            if kept is None:
                kept = lanes[lane] = deque(maxlen=MAX_BARS)
            elif kept and kept[-1][1] == bar[1] and bar[2] - kept[-1][3] < MERGE_GAP:
                last = kept[-1]
                kept[-1] = (
                    lane,
                    bar[1],
                    last[2],
                    max(last[3], bar[3]),
                    last[4] + bar[4],
                    last[5] + bar[5],
                )
                continue
            if len(kept) == MAX_BARS:
                busy -= _busy(kept.popleft())
            kept.append(bar)
        self.busy[name], self.ran[name] = busy, ran

    def _forget(self, now: float, connected: set[str]) -> None:
        """Bars and heartbeats older than their windows; workers gone with nothing left."""
        stream, window = now - STREAM_WINDOW, now - WINDOW
        for name, lanes in self.bars.items():
            for bars in lanes.values():
                while bars and bars[0][3] < stream:
                    self.busy[name] -= _busy(bars.popleft())
        for beats in self.beats.values():
            while beats and beats[0][0] < window:
                beats.popleft()
        for name in [
            n for n, lanes in self.bars.items() if not any(lanes.values()) and n not in connected
        ]:
            del self.bars[name], self.busy[name], self.ran[name]
        for name in [n for n, kept in self.beats.items() if not kept and n not in connected]:
            del self.beats[name]

    def summary(
        self,
        bars_of: Iterable[str] | None = None,
        memory_of: Iterable[str] | None = None,
        window: float = WINDOW,
    ) -> Summary:
        """The last ``window`` seconds as the report's ``Summary``, times in seconds since
        its start: the bars and heartbeats of the workers named (None: all), and every
        worker's last heartbeat."""
        now = self.live.get("t", time.time())
        origin = now - window
        started = self.samples[0][0] if self.samples else now
        origin = max(origin, started - 1.0)
        summary = Summary({"event": "run", "run": "live", "started": origin})
        summary.end = {"duration": now - origin}
        for worker in self.live.get("workers", ()):
            summary.workers[worker["name"]] = RunWorker(
                worker["name"], worker["cores"], worker["hostname"], memory=worker["memory"]
            )
        for name in self.bars if bars_of is None else bars_of:
            for lane, prefix, start, end, seconds, tasks in (
                bar for bars in self.bars.get(name, {}).values() for bar in bars
            ):
                if end >= origin:
                    summary.activity.append(
                        bar_run(
                            {
                                "lane": lane,
                                "prefix": prefix,
                                "worker": name,
                                "tasks": tasks,
                                "start": max(0.0, start - origin),
                                "end": end - origin,
                                "serialization": seconds,
                            }
                        )
                    )
        whole = set(self.beats if memory_of is None else memory_of)
        for name, beats in self.beats.items():
            summary.memory[name] = [
                MemorySample(
                    t - origin,
                    s.stored_bytes,
                    s.spilled_bytes,
                    s.peak_memory,
                    s.peak_library_memory,
                    s.resident,
                )
                for t, s in (beats if name in whole else list(beats)[-1:])
            ]
            summary.workers.setdefault(name, RunWorker(name))
        summary.samples = [
            TaskCounts(t - origin, *counts) for t, *counts in self.samples if t >= origin
        ]
        summary.transfers = dict(self.transfers)
        summary.failures = [
            Failure(max(0.0, f["t"] - origin), f["kind"], f["key"], f["worker"], f["message"])
            for f in reversed(self.failures)
        ]
        summary.categories = dict(self.live.get("categories", {}))
        return summary

    def page(self, name: str) -> str:
        """The page's content (the part that is redrawn each second); ``KeyError`` for a
        page that does not exist."""
        if name not in _TITLES:
            raise KeyError(name)
        draw_page: Callable[[], str] = getattr(self, f"_{name}")  # (``_status``...)
        return draw_page()

    # -- pages --------------------------------------------------------------------------

    def _status(self) -> str:
        summary = self.summary(bars_of=(), memory_of=())
        live = self.live
        totals = live.get("totals", {})
        manager = live.get("manager", {})
        rows = [
            ("workers", f"{totals.get('workers', 0):,} ({totals.get('cores', 0):,} cores)"),
            (
                "tasks",
                "{:,} ready at the manager, {:,} on workers, {:,} of them running".format(
                    totals.get("ready", 0), totals.get("processing", 0), totals.get("running", 0)
                ),
            ),
            (
                "done",
                f"{totals.get('tasks_done', 0):,} tasks, "
                f"{totals.get('tasks_failed', 0):,} failed (since the manager started)",
            ),
            ("bytes moved", draw.byte_size(totals.get("bytes_moved", 0))),
            (
                "results held",
                f"{draw.byte_size(totals.get('stored_bytes', 0))}, "
                f"{draw.byte_size(totals.get('spilled_bytes', 0))} on disk",
            ),
            (
                "manager",
                f"{manager.get('cpu_s', 0.0):.1f} CPU s in {manager.get('uptime_s', 0.0):.0f} s",
            ),
        ]
        runs = [
            (f"run {run['id']}", draw.Raw(_progress(run["done"], run["failed"], run["tasks"])))
            for run in live.get("runs", ())
        ]
        return "".join(
            (
                draw.section("Totals", "totals", draw.table(("", ""), rows, header=False)),
                draw.section(
                    "Runs in progress",
                    "runs",
                    draw.table(("run", "progress"), runs) if runs else draw.empty("None."),
                ),
                draw.section("Progress per category", "progress", _per_category(live)),
                draw.section("Tasks over time", "tasks-over-time", page.tasks_over_time(summary)),
                draw.section("Categories", "categories", resources.categories(summary)),
            )
        )

    def _stream(self) -> str:
        names = sorted(self.busy, key=lambda n: -self.busy[n])[:MAX_STREAM_WORKERS]
        summary = self.summary(bars_of=names, memory_of=(), window=STREAM_WINDOW)
        colours = draw.colours_by_prefix(summary.activity)
        note = ""
        if len(summary.workers) > len(names):
            note = (
                f"<p class='note'>The {len(names)} busiest of {len(summary.workers):,} "
                "workers in the window.</p>"
            )
        body = page.timeline(summary, colours, sorted(names, key=draw.natural)) + note
        return draw.section(f"Task stream, the last {STREAM_WINDOW:.0f} s", "stream", body)

    def _workers(self) -> str:
        now = {w["name"]: w for w in self.live.get("workers", ())}
        resident = {name: int(w.get("resident", 0)) for name, w in now.items()}
        busiest = sorted(resident, key=lambda n: -resident[n])[:MAX_MEMORY_CHARTS]
        summary = self.summary(bars_of=(), memory_of=busiest)
        everyone = summary.workers
        if len(everyone) > MAX_WORKER_ROWS:
            held = sorted(everyone, key=lambda n: -int(now.get(n, {}).get("tasks", 0)))
            summary.workers = {n: everyone[n] for n in held[:MAX_WORKER_ROWS]}
        table = resources.workers(summary, now, self.ran)
        if len(everyone) > MAX_WORKER_ROWS:
            table += (
                f"<p class='note'>The {MAX_WORKER_ROWS} of {len(everyone):,} workers "
                "holding the most tasks.</p>"
            )
        summary.workers = everyone
        summary.memory = {n: summary.memory[n] for n in busiest if n in summary.memory}
        return "".join(
            (
                draw.section("Workers", "workers", table),
                draw.section("Memory per worker", "memory", resources.memory(summary)),
            )
        )

    def _transfers(self) -> str:
        summary = self.summary(bars_of=(), memory_of=())
        moved: dict[str, int] = {}
        for (source, destination), nbytes in summary.transfers.items():
            moved[source] = moved.get(source, 0) + nbytes
            moved[destination] = moved.get(destination, 0) + nbytes
        kept = set(sorted(moved, key=lambda n: -moved[n])[:MAX_TRANSFER_NAMES])
        shown: dict[tuple[str, str], int] = {}
        for (source, destination), nbytes in summary.transfers.items():
            pair = (
                source if source in kept else "(others)",
                destination if destination in kept else "(others)",
            )
            shown[pair] = shown.get(pair, 0) + nbytes
        summary.transfers = shown
        title = "Bytes moved since the manager started"
        return draw.section(title, "transfers", page.transfers(summary))

    def _failures(self) -> str:
        summary = self.summary(bars_of=(), memory_of=())
        return draw.section("Failed runs", "failures", page.failures(summary))


def _per_category(live: dict[str, Any]) -> str:
    """Each run's categories: their tasks done (and failed) of those submitted."""
    rows = []
    for run in live.get("runs", ()):
        categories = run.get("categories", {})
        for name in sorted(categories, key=lambda n: -categories[n]["planned"])[:MAX_CATEGORIES]:
            counts = categories[name]
            bar = _progress(counts["done"], counts["failed"], counts["planned"])
            rows.append((f"run {run['id']}", name, draw.Raw(bar)))
    if not rows:
        return draw.empty("No run in progress.")
    return draw.table(("run", "category", "progress"), rows) + (
        "<p class='note'>Of each category's tasks submitted so far (a big graph's arrive "
        "in parts); a task run twice counts twice.</p>"
    )


def _busy(bar: p.Bar) -> float:
    """Seconds a bar of a library's lane covers (0 for fetches and spills)."""
    return bar[3] - bar[2] if bar[0] >= 0 else 0.0


def _progress(done: int, failed: int, tasks: int) -> str:
    """A bar of the run's tasks done (and failed) of its plan's."""
    share = min(1.0, done / tasks) if tasks else 0.0
    text = f"{done:,} of {tasks:,} done" + (f", {failed:,} failed" if failed else "")
    return (
        f"<div class='progress'><div style='width:{share * 100:.1f}%'></div></div>"
        f"<span class='count'>{draw.escape(text)}</span>"
    )
