"""What the live dashboard shows, kept and drawn in its server's thread; no sockets.

``DashboardView.update`` takes what the I/O thread hands over once a second
(``live.LiveView.dashboard``: the snapshot, the heartbeats heard since, bytes moved per
pair, failed runs) and keeps the last ``WINDOW`` seconds of it: each worker's merged bars
(``Status.activity``) and heartbeats, and the task counts of each snapshot. ``page``
draws a page from them with the performance report's own sections (``report``,
``report_resources``), fed a ``summary.Summary`` of the window: the dashboard and the
report are one rendering, so they never disagree. Its cost is here, in the dashboard's
thread, per request: none of it is in the manager's loop.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from daskvine_py.manager import drawing as draw
from daskvine_py.manager import report
from daskvine_py.manager import report_resources as resources
from daskvine_py.manager.summary import (
    Failure,
    MemorySample,
    RunWorker,
    Summary,
    TaskCounts,
    bar_run,
)
from daskvine_py.wire import protocol as p

#: Seconds of the past the pages draw.
WINDOW = 300.0
#: Workers drawn in the task stream and the memory charts (the busiest): a swarm of 600
#: would draw 7,200 lanes nobody can read, and cost the page seconds.
MAX_STREAM_WORKERS = 32
#: Names in the transfer matrix (those that moved the most); the rest are summed.
MAX_TRANSFER_NAMES = 16
#: Bars and heartbeats kept per worker (a heartbeat a second, a bar per lane in each).
MAX_BARS = 4096
MAX_BEATS = int(WINDOW) + 10
#: The pages: (name, title).
PAGES = (
    ("status", "Status"),
    ("stream", "Task stream"),
    ("workers", "Workers"),
    ("transfers", "Transfers"),
    ("failures", "Failures"),
)


class DashboardView:
    """The window's data and the pages drawn from it; see the module docstring."""

    def __init__(self) -> None:
        self.live: dict[str, Any] = {}
        self.bars: dict[str, deque[p.Bar]] = {}
        self.beats: dict[str, deque[tuple[float, p.Status]]] = {}
        self.samples: deque[tuple[float, int, int, int, int, int]] = deque(maxlen=MAX_BEATS)
        self.transfers: dict[tuple[str, str], int] = {}
        self.failures: list[dict[str, Any]] = []

    def update(self, data: dict[str, Any]) -> None:
        """What the I/O thread handed over (``live.ask_dashboard``)."""
        live = self.live = data["live"]
        for name, t, status in data["beats"]:
            if status.activity:
                self.bars.setdefault(name, deque(maxlen=MAX_BARS)).extend(status.activity)
            self.beats.setdefault(name, deque(maxlen=MAX_BEATS)).append((t, status))
        totals = live["totals"]
        if not self.samples or self.samples[-1][0] < live["t"]:
            left = sum(run["tasks"] - run["done"] - run["failed"] for run in live["runs"])
            waiting = max(0, left - totals["ready"] - totals["processing"])
            self.samples.append((live["t"], waiting, totals["ready"], totals["processing"],
                                 totals["running"], totals["tasks_done"]))  # fmt: skip
        self.transfers = data["transfers"]
        self.failures = data["failures"]
        self._forget(live["t"] - WINDOW, {w["name"] for w in live["workers"]})

    def _forget(self, before: float, connected: set[str]) -> None:
        """Bars and heartbeats older than the window; workers gone with nothing left in it."""
        for bars in self.bars.values():
            while bars and bars[0][3] < before:
                bars.popleft()
        for beats in self.beats.values():
            while beats and beats[0][0] < before:
                beats.popleft()
        for table in (self.bars, self.beats):
            for name in [n for n, kept in table.items() if not kept and n not in connected]:
                del table[name]

    def summary(self, now: float | None = None) -> Summary:
        """The window as the report's ``Summary``: times in seconds since its start."""
        now = self.live.get("t", time.time()) if now is None else now
        origin = now - WINDOW
        started = self.samples[0][0] if self.samples else now
        origin = max(origin, started - 1.0)
        summary = Summary({"event": "run", "run": "live", "started": origin})
        summary.end = {"duration": now - origin}
        for worker in self.live.get("workers", ()):
            summary.workers[worker["name"]] = RunWorker(
                worker["name"], worker["cores"], worker["hostname"], memory=worker["memory"]
            )
        for name, bars in self.bars.items():
            for lane, prefix, start, end, seconds, tasks in bars:
                if end >= origin:
                    summary.activity.append(bar_run({
                        "lane": lane, "prefix": prefix, "worker": name, "tasks": tasks,
                        "start": max(0.0, start - origin), "end": end - origin,
                        "serialization": seconds,
                    }))  # fmt: skip
        for name, beats in self.beats.items():
            summary.memory[name] = [
                MemorySample(t - origin, s.stored_bytes, s.spilled_bytes, s.peak_memory,
                             s.peak_library_memory, s.resident)  # fmt: skip
                for t, s in beats
            ]
            summary.workers.setdefault(name, RunWorker(name))
        summary.samples = [TaskCounts(t - origin, *counts) for t, *counts in self.samples
                           if t >= origin]  # fmt: skip
        summary.transfers = dict(self.transfers)
        summary.failures = [
            Failure(f["t"] - origin, f["kind"], f["key"], f["worker"], f["message"])
            for f in reversed(self.failures)
        ]
        summary.categories = dict(self.live.get("categories", {}))
        return summary

    def page(self, name: str) -> str:
        """The page's content (the part that is redrawn each second); ``KeyError`` for a
        page that does not exist."""
        draw_page = _PAGES[name]
        return draw_page(self, self.summary())

    # -- pages --------------------------------------------------------------------------

    def _status(self, summary: Summary) -> str:
        live = self.live
        totals = live.get("totals", {})
        manager = live.get("manager", {})
        rows = [
            ("workers", f"{totals.get('workers', 0):,} ({totals.get('cores', 0):,} cores)"),
            ("tasks", "{:,} ready at the manager, {:,} on workers, {:,} of them running".format(
                totals.get("ready", 0), totals.get("processing", 0), totals.get("running", 0))),
            ("done", f"{totals.get('tasks_done', 0):,} tasks, "
                     f"{totals.get('tasks_failed', 0):,} failed (since the manager started)"),
            ("bytes moved", draw.byte_size(totals.get("bytes_moved", 0))),
            ("results held", f"{draw.byte_size(totals.get('stored_bytes', 0))}, "
                             f"{draw.byte_size(totals.get('spilled_bytes', 0))} on disk"),
            ("manager", f"{manager.get('cpu_s', 0.0):.1f} CPU s in "
                        f"{manager.get('uptime_s', 0.0):.0f} s"),
        ]  # fmt: skip
        runs = [
            (f"run {run['id']}", draw.Raw(_progress(run["done"], run["failed"], run["tasks"])))
            for run in live.get("runs", ())
        ]
        return "".join((
            draw.section("Totals", "totals", draw.table(("", ""), rows, header=False)),
            draw.section("Runs in progress", "runs", draw.table(("run", "progress"), runs)
                         if runs else draw.empty("None.")),
            draw.section("Tasks over time", "tasks-over-time", report.tasks_over_time(summary)),
            draw.section("Categories", "categories", resources.categories(summary)),
        ))  # fmt: skip

    def _stream(self, summary: Summary) -> str:
        busy: dict[str, float] = {}
        for run in summary.activity:
            busy[run.worker] = busy.get(run.worker, 0.0) + run.end - run.start
        names = sorted(busy, key=lambda n: -busy[n])[:MAX_STREAM_WORKERS]
        colours = draw.colours_by_prefix(summary.activity)
        note = ""
        if len(summary.workers) > len(names):
            note = (f"<p class='note'>The {len(names)} busiest of {len(summary.workers):,} "
                    "workers in the window.</p>")  # fmt: skip
        body = report.timeline(summary, colours, sorted(names, key=draw.natural)) + note
        return draw.section(f"Task stream, the last {WINDOW:.0f} s", "stream", body)

    def _workers(self, summary: Summary) -> str:
        now = {w["name"]: w for w in self.live.get("workers", ())}
        busiest = sorted(summary.memory, key=lambda n: -max(
            (s.resident for s in summary.memory[n]), default=0))[:MAX_STREAM_WORKERS]
        summary.memory = {n: summary.memory[n] for n in busiest}
        return "".join((
            draw.section("Workers", "workers", resources.workers(summary, now)),
            draw.section("Memory per worker", "memory", resources.memory(summary)),
        ))  # fmt: skip

    def _transfers(self, summary: Summary) -> str:
        moved: dict[str, int] = {}
        for (source, destination), nbytes in summary.transfers.items():
            moved[source] = moved.get(source, 0) + nbytes
            moved[destination] = moved.get(destination, 0) + nbytes
        kept = set(sorted(moved, key=lambda n: -moved[n])[:MAX_TRANSFER_NAMES])
        shown: dict[tuple[str, str], int] = {}
        for (source, destination), nbytes in summary.transfers.items():
            pair = (source if source in kept else "(others)",
                    destination if destination in kept else "(others)")  # fmt: skip
            shown[pair] = shown.get(pair, 0) + nbytes
        summary.transfers = shown
        title = "Bytes moved since the manager started"
        return draw.section(title, "transfers", report.transfers(summary))

    def _failures(self, summary: Summary) -> str:
        return draw.section("Failed runs", "failures", report.failures(summary))


_PAGES = {
    "status": DashboardView._status,
    "stream": DashboardView._stream,
    "workers": DashboardView._workers,
    "transfers": DashboardView._transfers,
    "failures": DashboardView._failures,
}
assert set(_PAGES) == {name for name, _ in PAGES}


def _progress(done: int, failed: int, tasks: int) -> str:
    """A bar of the run's tasks done (and failed) of its plan's."""
    share = min(1.0, done / tasks) if tasks else 0.0
    text = f"{done:,} of {tasks:,} done" + (f", {failed:,} failed" if failed else "")
    return (f"<div class='progress'><div style='width:{share * 100:.1f}%'></div></div>"
            f"<span class='count'>{draw.escape(text)}</span>")  # fmt: skip
