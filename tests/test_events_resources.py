"""What tasks and workers took, in the event log and the report, from literal events: each
task's CPU, peak memory and category on its "done" record, the run's categories (the
figures of ``last_run.categories``) and the workers' heartbeats as memory over time."""

from __future__ import annotations

import re

import pytest

from daskvine_py.manager.registry import WorkerInfo
from daskvine_py.manager.watching import Run, Watching
from daskvine_py.report.events import EventLog, read_events, summary_records, write_events
from daskvine_py.report.page import render
from daskvine_py.report.resources import MAX_MEMORY_CHARTS
from daskvine_py.report.runinfo import RunInfo
from daskvine_py.report.summary import summarize
from daskvine_py.scheduler.categories import Categories
from daskvine_py.wire import protocol as p
from test_events import section, section_rows

MB = 2**20


class _Result:
    """An input as the state sees it: a result of ``nbytes`` (``TaskRecord.nbytes``)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def _categories() -> Categories:
    """Two "load" tasks reading nothing, one "sum" reading both; a "load" that raised."""
    categories = Categories()
    categories.done("load", 0.5, 0.25, 300 * MB, nbytes=4 * MB)
    categories.done("load", 1.5, 1.75, 200 * MB, nbytes=6 * MB)
    categories.done("sum", 0.25, 0.5, 10 * MB, nbytes=8, inputs=[_Result(4 * MB), _Result(6 * MB)])
    categories.fail("load")
    return categories


def _small_categories() -> Categories:
    """Tasks that grew their process by nothing, by a few pages, and a category whose
    only task raised (nothing measured)."""
    categories = Categories()
    categories.done("inc", 0.001, 0.001, 0)
    categories.done("add", 0.001, 0.001, 12 * 4096)
    categories.fail("bad")
    return categories


def _log() -> EventLog:
    log = EventLog(5, wall_start=1000.0, mono_start=0.0, tasks=3, options={})
    log.worker(0.0, "w1", 1, "node1", memory=512 * MB)
    log.worker(0.0, "w2", 1, "node2", memory=2**40)  # a terabyte: not drawn
    log.dispatch(0.0, 1, ("load", 0), "load", "w1")
    log.dispatch(0.0, 2, ("load", 1), "load", "w2")
    log.memory(0.5, "w1", p.Status(0, 50 * MB, 300 * MB))
    log.memory(0.5, "w2", p.Status(0, 50 * MB, 200 * MB))
    log.done(0.6, 1, "w1", 0.5, 1000.55, 4 * MB, 0.0, cpu=0.25, peak_memory=300 * MB)
    log.done(1.6, 2, "w2", 1.5, 1001.55, 6 * MB, 0.0, cpu=1.75, peak_memory=200 * MB)
    log.dispatch(1.6, 3, "sum", "sum", "w1")
    log.memory(1.7, "w1", p.Status(4 * MB, 50 * MB, 300 * MB))
    log.memory(1.8, "w1", p.Status(4 * MB, 50 * MB, 300 * MB))  # unchanged: not recorded
    log.memory(1.9, "w1", p.Status(10 * MB, 50 * MB, 60 * MB, 6 * MB))
    log.done(2.0, 3, "w1", 0.25, 1001.95, 8, 0.1, cpu=0.5, peak_memory=10 * MB)
    info = RunInfo(5, {}, 3, 1000.0, 1002.0, "done")
    info.categories = dict(_categories())
    log.end(2.0, "done", info)
    return log


def _rows(page: str, name: str) -> dict[str, list[str]]:
    return {row[0]: row for row in section_rows(page, name) if row}


def test_categories_sum_their_tasks_bytes_in_and_out_and_count_failures():
    load, total = _categories()["load"], _categories()["sum"]
    assert (load.tasks, load.input_bytes, load.output_bytes, load.failed) == (2, 0, 10 * MB, 1)
    assert (total.tasks, total.input_bytes, total.output_bytes, total.failed) == (1, 10 * MB, 8, 0)
    assert load.peak_memory_mb == 300 and load.cpu_s == 2.0 and load.wall_s == 2.0
    assert set(load.fields()) == set(type(load).__slots__)


def test_done_records_carry_each_tasks_cpu_peak_memory_and_category(tmp_path):
    write_events(_log().records(), tmp_path / "run.jsonl")
    records = read_events(tmp_path / "run.jsonl")
    done = {r["id"]: r for r in records if r["event"] == "done"}
    assert [(d["cpu"], d["peak_memory"], d["category"]) for d in done.values()] == [
        (0.25, 300 * MB, "load"),
        (1.75, 200 * MB, "load"),
        (0.5, 10 * MB, "sum"),
    ]
    tasks = summarize(records).tasks
    assert [(t.cpu, t.peak_memory) for t in tasks] == [
        (0.25, 300 * MB),
        (1.75, 200 * MB),
        (0.5, 10 * MB),
    ]


def test_the_categories_record_is_last_runs_figures_and_the_report_tabulates_them(tmp_path):
    log = _log()
    write_events(log.records(), tmp_path / "run.jsonl")
    records = read_events(tmp_path / "run.jsonl")
    (record,) = [r for r in records if r["event"] == "categories"]
    assert records[-2] is record and records[-1]["event"] == "end"
    assert record["categories"] == {name: c.fields() for name, c in _categories().items()}

    rows = _rows(render(records), "categories")
    assert rows["category"] == [
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
    ]
    assert rows["load"] == [
        "load",
        "2",
        "2.00",
        "2.00",
        "1.00",
        "300 MiB",
        "0",
        "0",
        "0",
        "10.00",
        "1",
    ]
    assert rows["sum"] == [
        "sum",
        "1",
        "0.25",
        "0.5",
        "2.00",
        "10.0 MiB",
        "0",
        "0",
        "10.00",
        "7.63e-06",
        "0",
    ]
    assert rows["all categories"][1:6] == ["3", "2.25", "2.50", "1.11", "300 MiB"]
    assert list(rows)[1:] == ["load", "sum", "all categories"]  # the heaviest first


def test_the_report_shows_a_peak_under_one_mib_as_such_not_as_zero():
    info = RunInfo(7, {}, 3, 100.0, 101.0, "failed")
    info.categories = dict(_small_categories())
    rows = _rows(render(summary_records(info)), "categories")
    assert rows["inc"][5] == "< 1 MiB"  # grew by nothing: under 1 MiB, not "0"
    assert rows["add"][5] == "< 1 MiB"  # 48 kB
    assert rows["bad"][5] == ""  # its one task raised: nothing was measured
    assert rows["all categories"][5] == "< 1 MiB"


def test_a_run_without_a_log_still_reports_its_categories():
    info = RunInfo(4, {}, 3, 100.0, 101.0, "done")
    info.categories = dict(_categories())
    rows = _rows(render(summary_records(info)), "categories")
    assert rows["load"][1] == "2" and rows["sum"][8] == "10.00"
    assert "No task finished." in render(summary_records(RunInfo(6, {}, 0, 0.0, 1.0, "done")))


def test_heartbeats_are_kept_when_they_change_and_drawn_per_worker():
    records = list(_log().records())
    memory = [r for r in records if r["event"] == "memory"]
    assert [(r["worker"], r["t"]) for r in memory] == [
        ("w1", 0.5),
        ("w2", 0.5),
        ("w1", 1.7),
        ("w1", 1.9),
    ]
    assert memory[-1] == {
        "event": "memory",
        "t": 1.9,
        "worker": "w1",
        "stored_bytes": 10 * MB,
        "peak_memory": 50 * MB,
        "peak_library_memory": 60 * MB,
        "spilled_bytes": 6 * MB,
        "resident": 0,
    }
    workers = summarize(records).workers
    assert (workers["w1"].memory, workers["w2"].memory) == (512 * MB, 2**40)

    drawn = section(render(records), "memory")
    assert re.findall(r"data-worker='([^']+)'", drawn) == ["w1", "w2"]
    figures = drawn.split("<figure")[1:]
    w1, w2 = figures
    for series in ("library_peak", "peak"):
        assert w1.count(f"data-series='{series}'") == 1
        assert w2.count(f"data-series='{series}'") == 1
    assert "data-series='spilled'" in w1 and "data-series='spilled'" not in w2  # never spilled
    assert "class='budget'" in w1 and "class='budget'" not in w2  # 1 TB would flatten it
    assert "--memory 536.9 MB" in w1
    # w1's library peak: 300 MB from 0.5 s, 60 MB from 1.9 s to the end (2.0 s); the
    # chart's top is 512 MB and 5% more, 110 pixels high from y = 10.
    path = re.search(r"data-series='library_peak' d='([^']+)'", w1).group(1)
    points = [tuple(float(v) for v in p[1:].split(",")) for p in path.split()]
    top = 512 * 1.05

    def y(mb: float) -> float:
        return 120 - 110 * mb / top

    assert [round(py, 1) for _, py in points] == [
        round(y(v), 1) for v in (300, 300, 300, 300, 60, 60)
    ]
    assert points[-1][0] == pytest.approx(60 + 880)  # held to the end of the run


def test_the_memory_section_says_when_no_worker_beat():
    log = EventLog(1, 0.0, 0.0, 0, {})
    log.end(1.0, "done", RunInfo(1, {}, 0, 0.0, 1.0, "done"))
    assert "No heartbeat recorded" in section(render(log.records()), "memory")


def test_past_the_chart_limit_the_workers_that_held_least_are_named_not_drawn():
    log = EventLog(1, 0.0, 0.0, 0, {})
    for i in range(MAX_MEMORY_CHARTS + 2):
        log.memory(0.5, f"w{i}", p.Status(0, MB, (i + 1) * MB))
    drawn = section(render(log.records()), "memory")
    assert drawn.count("<figure") == MAX_MEMORY_CHARTS
    assert "Not drawn (2 held less): w0, w1" in drawn


def _info(name: str, memory: int) -> WorkerInfo:
    return WorkerInfo(p.Register(p.PROTOCOL_VERSION, name, 1, memory, "node", "tcp://x:1", 1))


def test_watching_feeds_heartbeats_and_budgets_to_runs_with_a_log_only():
    watching = Watching(lambda: (0, 0, 0))
    logged, plain = Run(1), Run(2)
    for run in (logged, plain):
        run.info = RunInfo(run.id, {}, 1)
    logged.log = EventLog(1, 1000.0, 10.0, 1, {})
    beating, silent = _info("w1", 64 * MB), _info("w2", 32 * MB)
    beating.status = p.Status(1, 2, 3)
    watching.start(logged, True, [beating, silent], 10.0)
    watching.start(plain, True, [beating, silent], 10.0)  # a progress bar only
    watching.worker_joined(10.5, "w3", 2, "node", 16 * MB)
    watching.status(11.0, "w3", p.Status(4, 5, 6))
    records = list(logged.log.records())
    assert [(r["worker"], r["memory"]) for r in records if r["event"] == "worker"] == [
        ("w1", 64 * MB),
        ("w2", 32 * MB),
        ("w3", 16 * MB),
    ]
    # w2 never beat: nothing to draw of it yet
    assert [
        (r["worker"], r["t"], r["peak_library_memory"]) for r in records if r["event"] == "memory"
    ] == [("w1", 0.0, 3), ("w3", 1.0, 6)]
    assert plain.log is None
