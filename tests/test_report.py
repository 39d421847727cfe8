"""Progress bars, event logs and reports of real runs on local workers; the report in Chromium."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser

import dask
import dask.array as da
import numpy as np
import pytest

from browser import CHROMIUM
from browser import chromium as _chromium
from browser import probed as _probed
from daskvine_py.report.events import read_events
from daskvine_py.report.page import SECTIONS
from daskvine_py.report.runinfo import MANAGER


def _inc(x):
    return x + 1


def _fail(x):
    return 1 / 0


def _array():
    x = da.arange(4_000, chunks=100)
    return ((x + 1) * 2).sum()


#: Floats in each intermediate array of the serialization tests: 4 MB.
_BIG = 500_000


def _big(i):
    return np.full(_BIG, float(i))


def _shift(a, b):
    return a + 0.5 * b


def _total(*parts):
    return float(sum(part.sum() for part in parts))


def _crossing() -> tuple[dict, list]:
    """Eight big arrays, each read with its neighbour's: the neighbours are made on both
    workers, and the total reads every one of them on one."""
    n = 8
    dsk: dict = {("big", i): (_big, i) for i in range(n)}
    dsk.update({("shift", i): (_shift, ("big", i), ("big", (i + 1) % n)) for i in range(n)})
    dsk["total"] = (_total, *[("shift", i) for i in range(n)])
    return dsk, ["total"]


def _chain() -> tuple[dict, list]:
    """One big array through twenty steps: each reads the last, live in its library."""
    dsk: dict = {("link", 0): (_big, 1)}
    dsk.update({("link", i): (_shift, ("link", i - 1), ("link", i - 1)) for i in range(1, 20)})
    dsk["end"] = (_total, ("link", 19))
    return dsk, ["end"]


def _row_cells(page: str, section: str) -> dict[str, list[str]]:
    """The cells of a section's table rows, by their first cell."""

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                self.rows[-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    start = re.search(f"<section id=['\"]{section}['\"]>", page).start()  # ours, Chromium's
    rows = Rows()
    rows.feed(page[start : page.index("</section>", start)])
    return {row[0]: row for row in rows.rows if row}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.tasks = 0
        self.attrs: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs["id"])
        if tag == "rect" and attrs.get("class") == "task":
            self.tasks += 1
        if tag == "html":
            self.attrs = {k: v or "" for k, v in attrs.items()}


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


@pytest.mark.integration
def test_report_and_event_log_of_a_real_run(shared_manager, tmp_path):
    report, log = tmp_path / "run.html", tmp_path / "run.jsonl"
    y = _array()
    (got,) = dask.compute(y, scheduler=shared_manager.get, report=report, event_log=str(log))
    (expected,) = dask.compute(y, scheduler="sync")
    assert got == expected

    info = shared_manager.last_run
    page = _parse(report.read_text())
    assert page.sections == list(SECTIONS)
    assert page.tasks > 0
    records = read_events(log)
    done = {r["id"] for r in records if r["event"] == "done"}
    assert len(done) == info.tasks  # every task of the plan finished once at least
    workers = {r["worker"] for r in records if r["event"] == "worker"}
    assert workers == set(shared_manager.workers)
    assert records[-1]["event"] == "end" and records[-1]["outcome"] == "done"
    assert all(0 <= r["start"] <= r["end"] for r in records if r["event"] == "done")
    assert any(r["event"] == "sample" and r["done"] == info.tasks for r in records)

    # The report rebuilt from the log is the same page.
    again = tmp_path / "again.html"
    subprocess.run(
        [sys.executable, "-m", "daskvine_py", "report", str(log), "-o", str(again)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert again.read_text() == report.read_text()
    # And so is the one the manager writes for its last run.
    later = tmp_path / "later.html"
    shared_manager.report(later)
    assert later.read_text() == report.read_text()


@pytest.mark.integration
def test_serialization_of_big_arrays_crossing_workers_is_reported(shared_manager, tmp_path):
    """Issue 15: serialization per function beside run time, and its totals in last_run."""
    report, log = tmp_path / "run.html", tmp_path / "run.jsonl"
    dsk, keys = _crossing()
    got = shared_manager.get(dsk, keys, report=report, event_log=log)
    assert got == dask.get(dsk, keys)
    info = shared_manager.last_run
    assert info.serialization_seconds > 0 and info.run_seconds > 0
    assert 0 < info.serialization_share < 1
    assert any(MANAGER not in pair for pair in info.transfers)  # arrays crossed workers

    # The totals are the sums over the tasks the log recorded (rounded to microseconds).
    done = [r for r in read_events(log) if r["event"] == "done"]
    assert len(done) == info.tasks == 17
    tolerance = 3e-6 * len(done)
    assert sum(r["serialization"] for r in done) == pytest.approx(
        info.serialization_seconds, abs=tolerance
    )
    ran = sum(r["end"] - r["start"] - r["serialization"] for r in done)
    assert ran == pytest.approx(info.run_seconds, abs=tolerance)

    page = report.read_text()
    durations = _row_cells(page, "durations")
    head = durations["function"]
    assert head[2] == "run time" and head[-1] == "serialization"
    assert {"big", "shift", "total", "all functions"} <= set(durations)
    for name in ("big", "shift", "total", "all functions"):
        assert re.fullmatch(r"\S+ \S+ \(\d+\.\d%\)", durations[name][-1]), durations[name]
    summary = _row_cells(page, "summary")
    assert "of run + serialization" in summary["(de)serialization"][1]
    assert "(de)serializing" in page  # the timeline's legend


@pytest.mark.integration
def test_a_chain_that_stays_live_reports_its_totals_without_an_event_log(shared_manager):
    dsk, keys = _chain()
    assert shared_manager.get(dsk, keys) == dask.get(dsk, keys)
    info = shared_manager.last_run
    assert info.events is None  # nothing recorded per task, and yet:
    assert info.run_seconds > 0 and info.serialization_seconds >= 0
    assert 0 <= info.serialization_share < 1


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_serialization_report_renders_in_headless_chromium(shared_manager, tmp_path):
    report = tmp_path / "run.html"
    dsk, keys = _crossing()
    assert shared_manager.get(dsk, keys, report=report) == dask.get(dsk, keys)
    text = report.read_text()
    dom = _chromium(tmp_path, "--dump-dom", _probed(tmp_path, text, "probed.html"))
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = _parse(dom.stdout)
    assert page.attrs.get("data-loaded") == "1", dom.stdout[:500]
    assert "data-errors" not in page.attrs, page.attrs["data-errors"]
    assert page.attrs.get("data-resources") == "0"  # the hatching is no fetch either
    assert page.sections == list(SECTIONS) and page.tasks > 0
    assert _row_cells(dom.stdout, "durations")["function"][-1] == "serialization"
    assert 'id="serializing"' in dom.stdout  # the timeline's hatching, as Chromium read it


@pytest.mark.integration
def test_a_failed_run_still_writes_its_report(shared_manager, tmp_path):
    report = tmp_path / "failed.html"
    dsk = {("a", i): (_inc, i) for i in range(10)}
    dsk["bad"] = (_fail, ("a", 3))
    with pytest.raises(ZeroDivisionError):
        shared_manager.get(dsk, ["bad", ("a", 0)], report=report)
    assert shared_manager.last_run.outcome == "failed"
    text = report.read_text()
    assert "ZeroDivisionError" in text and "failed" in text


@pytest.mark.integration
def test_options_apply_to_one_call_only(shared_manager, tmp_path):
    dsk = {("a", i): (_inc, i) for i in range(20)}
    keys = [("a", i) for i in range(20)]
    assert shared_manager.get(dsk, keys, event_log=tmp_path / "one.jsonl.gz") == tuple(
        dask.get(dsk, keys)
    )
    assert shared_manager.last_run.events is not None
    assert shared_manager.get(dsk, keys) == tuple(dask.get(dsk, keys))
    assert shared_manager.last_run.events is None  # nothing recorded when not asked
    assert not shared_manager._watched
    summary = tmp_path / "summary.html"
    shared_manager.report(summary)
    assert "kept no event log" in summary.read_text()
    assert len(read_events(tmp_path / "one.jsonl.gz")) > 20


@pytest.mark.integration
def test_progress_bar_counts_every_task(shared_manager, capsys):
    dsk = {("a", i): (_inc, i) for i in range(300)}
    keys = [("a", i) for i in range(300)]
    assert shared_manager.get(dsk, keys, progress=True) == tuple(dask.get(dsk, keys))
    err = capsys.readouterr().err
    assert "daskvine_py" in err and "300/300" in err and "100%" in err


@pytest.mark.integration
def test_progress_is_off_when_stderr_is_not_a_terminal(shared_manager, capsys):
    dsk = {("a", i): (_inc, i) for i in range(30)}
    keys = [("a", i) for i in range(30)]
    assert not sys.stderr.isatty()
    assert shared_manager.get(dsk, keys) == tuple(dask.get(dsk, keys))
    assert capsys.readouterr().err == ""


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium(shared_manager, tmp_path):
    report = tmp_path / "run.html"
    y = _array()
    (got,) = dask.compute(y, scheduler=shared_manager.get, report=report)
    assert got == dask.compute(y, scheduler="sync")[0]
    text = report.read_text()

    dom = _chromium(tmp_path, "--dump-dom", _probed(tmp_path, text, "probed.html"))
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = _parse(dom.stdout)
    assert page.attrs.get("data-loaded") == "1", dom.stdout[:500]
    assert "data-errors" not in page.attrs, page.attrs["data-errors"]
    assert page.attrs.get("data-resources") == "0"  # self-contained: nothing fetched
    assert page.sections == list(SECTIONS) and page.tasks > 0
    assert "CONSOLE" not in dom.stderr, dom.stderr[-2000:]

    # The probe does see errors: a page with a broken script and a missing image.
    broken = text.replace("</body>", "<img src='missing.png'><script>nope(</script></body>")
    bad = _chromium(tmp_path, "--dump-dom", _probed(tmp_path, broken, "broken.html"))
    assert "data-errors" in _parse(bad.stdout).attrs

    shot = tmp_path / "run.png"
    done = _chromium(
        tmp_path,
        "--hide-scrollbars",
        "--window-size=1100,2400",
        f"--screenshot={shot}",
        report.as_uri(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("DASKVINE_PY_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["DASKVINE_PY_KEEP_SCREENSHOT"])
    assert np.isfinite(got)


@pytest.mark.integration
def test_progress_bar_closes_when_a_task_fails(shared_manager, capsys):
    dsk = {("a", i): (_inc, i) for i in range(5)}
    dsk["bad"] = (_fail, ("a", 0))
    with pytest.raises(ZeroDivisionError):
        shared_manager.get(dsk, ["bad", ("a", 1)], progress=True)
    err = capsys.readouterr().err
    assert "daskvine_py" in err and err.endswith("\n")  # closed: the line is finished
    assert shared_manager.get({"x": (_inc, 1)}, "x", progress=True) == 2


@pytest.mark.integration
def test_progress_bar_closes_on_ctrl_c(shared_manager, capsys, monkeypatch):
    import tqdm

    drawn = threading.Event()

    class Bar(tqdm.tqdm):
        """tqdm's bar, telling the test once it is on the screen."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drawn.set()

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    dsk = {f"s{i}": (time.sleep, 0.2) for i in range(50)}
    main = threading.get_ident()

    def interrupt():
        if drawn.wait(60):
            signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            shared_manager.get(dsk, list(dsk), progress=True, event_log=None)
    finally:
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert shared_manager.last_run.outcome == "cancelled"
    err = capsys.readouterr().err
    assert "/50" in err and err.endswith("\n")
    assert shared_manager.get({"x": (_inc, 41)}, "x") == 42


def test_a_cached_runs_numbers_are_a_row_of_the_summary():
    """Issue 17: hits, misses, tasks run, bytes reused and time saved, in words."""
    from daskvine_py.report.events import summary_records
    from daskvine_py.report.page import render
    from daskvine_py.report.runinfo import RunInfo

    info = RunInfo(7, {"cache": True}, 19, 1.0e9, 1.0e9 + 2.0, "done")
    info.cache = {
        "hits": 12,
        "misses": 7,
        "uncached": 0,
        "tasks_run": 7,
        "bytes_reused": 3 * 2**20,
        "seconds_saved": 4.5,
    }
    page = render(summary_records(info))
    assert "result cache" in page
    assert "12 hits, 7 misses, 0 uncached; 7 tasks run; 3.1 MB reused" in page
    assert "4.50 s of task time saved" in page


def test_tasks_over_time_draws_the_cores_connected_and_marks_each_worker_lost():
    from daskvine_py.report.page import render

    records = [
        {"event": "run", "t": 0.0, "run_id": 1, "tasks": 4},
        {"event": "worker", "t": 0.0, "worker": "a", "cores": 12, "host": "n1"},
        {"event": "worker", "t": 0.0, "worker": "b", "cores": 12, "host": "n2"},
        {
            "event": "sample",
            "t": 0.5,
            "waiting": 0,
            "ready": 2,
            "processing": 20,
            "running": 20,
            "done": 0,
        },
        {"event": "worker_lost", "t": 1.0, "worker": "b", "reason": "preempted"},
        {"event": "worker", "t": 2.0, "worker": "c", "cores": 12, "host": "n3"},
        {
            "event": "sample",
            "t": 2.5,
            "waiting": 0,
            "ready": 0,
            "processing": 4,
            "running": 4,
            "done": 20,
        },
        {"event": "end", "t": 3.0, "outcome": "done", "duration": 3.0},
    ]
    page = render(records)
    cores = re.search(r"data-series='cores' d='([^']*)'", page)
    assert cores is not None
    # 24 cores, 12 after b's loss, 24 again once c joins: the step has two levels.
    levels = {round(float(y), 1) for y in re.findall(r"[ML][\d.]+,([\d.]+)", cores.group(1))}
    assert len(levels) == 2
    lost = re.findall(r"<line class='lost'[^>]*><title>([^<]*)</title>", page)
    assert lost == ["b lost at 1.0 s"]
