"""Event logs and the HTML report as pure functions of literal events: no workers."""

from __future__ import annotations

import re
import typing
from html.parser import HTMLParser

import pytest

from daskvine_py import ProtocolError, RunOptions
from daskvine_py.manager.watching import Run, Watching
from daskvine_py.report.drawing import Chart, lay_lanes, merge_bars, ticks
from daskvine_py.report.events import (
    DispatchEntry,
    DoneEntry,
    Entry,
    EventLog,
    read_events,
    summary_records,
    write_events,
)
from daskvine_py.report.page import SECTIONS, render
from daskvine_py.report.runinfo import MANAGER, RunInfo
from daskvine_py.report.summary import TaskRun, summarize
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p


def _log() -> EventLog:
    """Two workers, three tasks (one a tuple key), a failure, a lost worker, transfers."""
    log = EventLog(7, wall_start=1000.0, mono_start=50.0, tasks=4, options={"retries": 3})
    log.worker(50.0, "w1", 2, "node1")
    log.worker(50.0, "w2", 1, "node2")
    log.sample(50.0, 4, 0, 0, 0, 0)
    log.dispatch(50.1, 1, ("inc", 0), "inc", "w1")
    log.dispatch(50.1, 2, ("inc", 1), "inc", "w2")
    log.dispatch(50.1, 3, "total", "total", "w1")
    log.sample(50.2, 1, 0, 3, 3, 0)
    log.memory(50.3, "w1", p.Status(8, 60 * 2**20, 90 * 2**20))
    # the same figures: not recorded again; its fetches are (its tasks' bar is not)
    bars = ((0, "inc", 1000.1, 1000.2, 0.0, 2), (p.FETCH_LANE, "fetch", 1000.25, 1000.3, 0.0, 3))
    log.memory(50.35, "w1", p.Status(8, 60 * 2**20, 90 * 2**20, activity=bars))
    log.done(50.4, 1, "w1", duration=0.2, finished=1000.35, nbytes=8)
    log.done(50.5, 2, "w2", duration=0.3, finished=1000.45, nbytes=8)
    log.erred(50.6, 3, "w1", "ZeroDivisionError('division by zero')")
    log.worker_lost(50.7, "w2", "silent for 31 s")
    log.sample(50.7, 0, 0, 0, 0, 2)
    info = RunInfo(7, {"retries": 3}, 4, 1000.0, 1000.8, "failed")
    info.transfers = {("w1", "w2"): 800, ("w2", MANAGER): 16}
    log.end(50.8, "failed", info)
    return log


def test_records_carry_every_event_in_order():
    records = list(_log().records())
    kinds = [r["event"] for r in records]
    assert kinds[0] == "run" and kinds[-1] == "end"
    assert kinds.count("dispatch") == 3 and kinds.count("done") == 2
    assert kinds.count("transfer") == 2 and kinds.count("sample") == 3
    assert kinds.count("memory") == 1 and "activity" not in records[kinds.index("memory")]
    assert records[kinds.index("bar")] == {
        "event": "bar",
        "worker": "w1",
        "lane": -1,
        "prefix": "fetch",
        "start": 0.25,
        "end": 0.3,
        "serialization": 0.0,
        "tasks": 3,
    }
    done = next(r for r in records if r["event"] == "done")
    # The worker's clock, on the run's scale: ended at 0.35 s, ran 0.2 s.
    assert done == {
        "event": "done",
        "t": 0.4,
        "id": 1,
        "worker": "w1",
        "start": 0.15,
        "end": 0.35,
        "nbytes": 8,
        "serialization": 0.0,
        "cpu": 0.0,
        "peak_memory": 0,
        "category": "inc",
    }
    dispatch = next(r for r in records if r["event"] == "dispatch")
    assert dispatch["key"] == ["inc", 0] and dispatch["prefix"] == "inc"
    assert records[-1]["outcome"] == "failed" and records[-1]["duration"] == pytest.approx(0.8)


def test_a_worker_clock_ahead_is_clamped_to_when_the_result_arrived():
    log = EventLog(1, wall_start=1000.0, mono_start=0.0, tasks=1, options={})
    log.done(0.5, 1, "w", duration=0.1, finished=1009.0, nbytes=1)  # 9 s ahead
    log.done(0.6, 2, "w", duration=0.1, finished=0.0, nbytes=1)  # unknown
    done = [r for r in log.records() if r["event"] == "done"]
    assert [(r["start"], r["end"]) for r in done] == [(0.4, 0.5), (0.5, 0.6)]


@pytest.mark.parametrize("name", ["run.jsonl", "run.jsonl.gz"])
def test_write_then_read_round_trips(tmp_path, name):
    records = list(_log().records())
    write_events(records, tmp_path / name)
    assert read_events(tmp_path / name) == records


#: ``_log()`` as the version that kept its entries as plain tuples wrote it: the format is
#: the same, so logs written before entries became named records still load.
_OLD_LOG = """\
{"event":"run","format":1,"run":7,"started":1000.0,"tasks":4,"options":{"retries":3}}
{"event":"worker","t":0.0,"worker":"w1","cores":2,"host":"node1"}
{"event":"worker","t":0.0,"worker":"w2","cores":1,"host":"node2"}
{"event":"sample","t":0.0,"waiting":4,"ready":0,"processing":0,"running":0,"done":0}
{"event":"dispatch","t":0.1,"id":1,"key":["inc",0],"prefix":"inc","worker":"w1"}
{"event":"dispatch","t":0.1,"id":2,"key":["inc",1],"prefix":"inc","worker":"w2"}
{"event":"dispatch","t":0.1,"id":3,"key":"total","prefix":"total","worker":"w1"}
{"event":"sample","t":0.2,"waiting":1,"ready":0,"processing":3,"running":3,"done":0}
{"event":"done","t":0.4,"id":1,"worker":"w1","start":0.15,"end":0.35,"nbytes":8}
{"event":"done","t":0.5,"id":2,"worker":"w2","start":0.15,"end":0.45,"nbytes":8}
{"event":"erred","t":0.6,"id":3,"worker":"w1","message":"ZeroDivisionError('division by zero')"}
{"event":"worker_lost","t":0.7,"worker":"w2","reason":"silent for 31 s"}
{"event":"sample","t":0.7,"waiting":0,"ready":0,"processing":0,"running":0,"done":2}
{"event":"transfer","source":"w1","destination":"w2","bytes":800}
{"event":"transfer","source":"w2","destination":"manager","bytes":16}
{"event":"end","t":0.7999999999999972,"outcome":"failed","hoisting_candidates":[],"duration":0.7999999999999545}
"""


#: Fields of the records added since ``_OLD_LOG`` was written (issues 15 and 30), and
#: records (issue 30).
_NEWER_FIELDS = {
    "serialization",
    "run_seconds",
    "serialization_seconds",
    "cache",
    "memory",
    "cpu",
    "peak_memory",
    "category",
}
_NEWER_EVENTS = {"memory", "categories", "bar"}


def test_a_log_written_by_the_tuple_version_loads_as_todays(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(_OLD_LOG)
    today = [
        {k: v for k, v in r.items() if k not in _NEWER_FIELDS}
        for r in _log().records()
        if r["event"] not in _NEWER_EVENTS
    ]
    assert read_events(path) == today
    # Without the fields, tasks read as never (de)serialized.
    old = summarize(read_events(path))
    assert [t.duration for t in old.tasks] == pytest.approx([0.2, 0.3])
    assert [t.serialization for t in old.tasks] == [0.0, 0.0]
    assert old.seconds() == pytest.approx((0.5, 0.0))
    page = render(read_events(path))
    assert "(de)serialization" in page
    assert "Not recorded: the log was written before categories were." in page


def test_entries_are_named_records_and_each_type_has_its_record():
    log = _log()
    entries = log.entries
    assert type(entries[3]) is DispatchEntry and entries[3].key == ("inc", 0)
    done = entries[9]
    assert type(done) is DoneEntry and (done.task_id, done.worker, done.nbytes) == (1, "w1", 8)
    assert (done.end, done.duration) == pytest.approx((0.35, 0.2))
    kinds = typing.get_args(Entry)
    log.crashed(50.9, 4, "w1", "library died")
    entries = log.entries
    assert entries[-1].record() == {
        "event": "crashed",
        "t": 0.9,
        "id": 4,
        "worker": "w1",
        "message": "library died",
    }
    log.quarantined(51.0, "w2", "slow")
    assert entries[-1].record() == {
        "event": "quarantined",
        "t": 1.0,
        "worker": "w2",
        "reason": "slow",
    }
    assert {type(entry) for entry in entries} == set(kinds)  # every kind, in that order
    for kind in kinds:  # slotted, and named after the event its record writes
        assert not hasattr(kind(*[0] * len(kind.__slots__)), "__dict__")
    for entry, record in zip(entries, list(log.records())[1:-1], strict=True):  # run...end
        record.pop("category", None)  # joined from the task's dispatch as the log is written
        assert record == entry.record()
        assert type(entry).__name__ == record["event"].title().replace("_", "") + "Entry"


def test_read_rejects_what_is_not_an_event_log(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("hello\n")
    with pytest.raises(ValueError, match=r"x.jsonl:1: not a JSON record"):
        read_events(path)
    path.write_text('{"event": "done"}\n')
    with pytest.raises(ValueError, match="no 'run' record"):
        read_events(path)
    path.write_text('{"event": "run", "format": 99}\n')
    with pytest.raises(ValueError, match="format 99"):
        read_events(path)


def test_summarize_joins_dispatches_and_completions():
    summary = summarize(_log().records())
    assert [(t.key, t.prefix, t.worker) for t in summary.tasks] == [
        (["inc", 0], "inc", "w1"),
        (["inc", 1], "inc", "w2"),
    ]
    assert summary.workers["w2"].lost == pytest.approx(0.7)
    assert (summary.workers["w1"].cores, summary.workers["w1"].host) == (2, "node1")
    assert summary.transfers == {("w1", "w2"): 800, ("w2", MANAGER): 16}
    assert [f.kind for f in summary.failures] == ["erred", "worker_lost"]
    assert summary.failures[0].key == "total" and summary.failures[1].key is None
    assert summary.failures[1].message == "silent for 31 s"
    assert [(c.t, c.processing, c.running, c.queued) for c in summary.samples][1] == (
        pytest.approx(0.2),
        3,
        3,
        0,
    )


def test_a_task_starts_when_its_library_began_unpickling_its_inputs():
    log = EventLog(1, wall_start=1000.0, mono_start=0.0, tasks=1, options={})
    log.dispatch(0.0, 1, ("load", 0), "load", "w")
    log.done(1.0, 1, "w", duration=0.25, finished=1000.9, nbytes=8, serialization=0.5)
    (done,) = [r for r in log.records() if r["event"] == "done"]
    assert (done["start"], done["end"], done["serialization"]) == (0.15, 0.9, 0.5)
    (task,) = summarize(log.records()).tasks
    assert (task.duration, task.serialization) == pytest.approx((0.25, 0.5))


def _serializing_log() -> EventLog:
    """Four tasks of two functions: "load" unpickles big inputs, "total" does not."""
    log = EventLog(2, wall_start=1000.0, mono_start=0.0, tasks=4, options={})
    log.worker(0.0, "w1", 1, "node1")
    log.worker(0.0, "w2", 1, "node2")
    for task_id, (key, worker) in enumerate(
        [(("load", 0), "w1"), (("load", 1), "w2"), (("load", 2), "w1"), ("total", "w2")], 1
    ):
        log.dispatch(0.0, task_id, key, key[0] if isinstance(key, tuple) else key, worker)
    # (task, worker, run seconds, serialization seconds, finished on the worker's clock)
    for task_id, worker, run, ser, finished in [
        (1, "w1", 0.5, 0.25, 1000.75),
        (2, "w2", 0.75, 1.0, 1001.75),
        (3, "w1", 0.25, 0.25, 1001.5),
        (4, "w2", 0.5, 0.0, 1002.25),
    ]:
        log.done(finished - 1000.0 + 0.01, task_id, worker, run, finished, 8, ser)
    info = RunInfo(2, {}, 4, 1000.0, 1002.5, "done")
    info.run_seconds, info.serialization_seconds = 2.0, 1.5
    log.end(2.5, "done", info)
    return log


class _Rows(HTMLParser):
    """The text of every table row, cell by cell."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def section(page: str, name: str) -> str:
    """A report's section, by its id (other report tests read them too)."""
    start = page.index(f"<section id='{name}'>")
    return page[start : page.index("</section>", start)]


def section_rows(page: str, name: str) -> list[list[str]]:
    """The text of a report section's table rows, cell by cell."""
    parser = _Rows()
    parser.feed(section(page, name))
    return parser.rows


def test_serialization_per_function_beside_run_time_and_in_total():
    page = render(_serializing_log().records())
    rows = section_rows(page, "durations")
    assert rows[0] == [
        "function",
        "tasks",
        "run time",
        "mean",
        "median",
        "max",
        "share",
        "serialization",
    ]
    by_function = {row[0]: row for row in rows[1:]}
    assert by_function["load"][1:3] == ["3", "1.50 s"]
    assert by_function["load"][-1] == "1.50 s (50.0%)"  # 1.5 of 1.5 + 1.5
    assert by_function["total"][1:3] == ["1", "500 ms"]
    assert by_function["total"][-1] == "0 µs (0.0%)"
    assert by_function["all functions"][1:3] == ["4", "2.00 s"]
    assert by_function["all functions"][-1] == "1.50 s (42.9%)"  # 1.5 of 2 + 1.5
    summary = dict(row for row in section_rows(page, "summary") if len(row) == 2)
    assert summary["tasks' run time"] == "2.00 s"
    assert summary["(de)serialization"] == "1.50 s (42.9% of run + serialization)"
    assert "run seconds" not in summary  # the totals show once, formatted
    slowest = section_rows(page, "slowest")
    assert slowest[0][3:5] == ["duration", "serialization"]
    assert slowest[1][:5] == ["('load', 1)", "load", "w2", "750 ms", "1.00 s"]


def test_the_timeline_hatches_serialization_half_before_and_half_after_the_run():
    page = render(_serializing_log().records())
    timeline = page[page.index("<section id='worker-timeline'>") :]
    timeline = timeline[: timeline.index("</section>")]
    assert "(de)serializing" in timeline  # the legend's entry
    assert timeline.count("class='task'") == 4
    # Three tasks serialized: each bar has a hatched part at each end.
    hatched = re.findall(
        r"<rect class='serializing' x='([\d.]+)' y='[\d.]+' "
        r"width='([\d.]+)'",
        timeline,
    )
    assert len(hatched) == 6
    bars = re.findall(r"<rect class='task' x='([\d.]+)' y='[\d.]+' width='([\d.]+)'", timeline)
    # ("load", 1) on w2 (its first lane, after w1's two tasks): 1.0 s of serialization
    # around a 0.75 s run, from 0.0 s to 1.75 s; 880 pixels for 2.5 s, from x = 110.
    x0, width = (float(v) for v in bars[2])
    assert (x0, width) == pytest.approx((110, 880 * 1.75 / 2.5), abs=0.01)
    before, after = [(float(x), float(w)) for x, w in hatched[4:6]]
    assert before == pytest.approx((x0, 880 * 0.5 / 2.5), abs=0.01)  # 0.5 s: half of 1.0
    assert after == pytest.approx((x0 + width - 880 * 0.5 / 2.5, 880 * 0.5 / 2.5), abs=0.01)


def test_merged_bars_sum_their_tasks_run_and_serialization():
    chart = Chart(t_max=1.0, y_max=1, height=10)
    lane = [
        TaskRun(i, i, "f", "w", i * 1e-4, i * 1e-4 + 5e-5, 0, serialization=1e-5)
        for i in range(100)
    ]
    (bar,) = merge_bars(lane, chart)
    assert bar.count == 100
    assert (bar.run, bar.serialization) == pytest.approx((100 * 4e-5, 100 * 1e-5))


def test_the_totals_reach_last_run_and_the_summary_of_a_run_without_a_log():
    watching = Watching(lambda: (0, 0, 0))
    run = Run(3)
    run.info = RunInfo(3, {}, 10, 100.0, 102.5, "done")
    watching.settle(run, s.RunDone(3, run_seconds=4.0, serialization_seconds=1.0))
    assert (run.info.run_seconds, run.info.serialization_seconds) == (4.0, 1.0)
    assert run.info.serialization_share == pytest.approx(0.2)
    page = render(summary_records(run.info))
    summary = dict(row for row in section_rows(page, "summary") if len(row) == 2)
    assert summary["(de)serialization"] == "1.00 s (20.0% of run + serialization)"
    assert "kept no event log" in page


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "section":
            self.ids.append(dict(attrs)["id"])


def test_render_has_every_section_and_fetches_nothing():
    page = render(_log().records())
    parser = _Sections()
    parser.feed(page)
    assert parser.ids == list(SECTIONS)
    assert "script" not in parser.tags and "link" not in parser.tags
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", page)
    # two finished tasks on the timeline, and a lane of w1's inputs fetched
    assert page.count("class='task'") == 3 and "(fetching inputs): 3 tasks" in page
    assert "ZeroDivisionError" in page and "silent for 31 s" in page
    assert "800 B" in page  # the w1 -> w2 cell of the transfer matrix
    assert "failed" in page


def test_render_escapes_keys_and_messages():
    log = EventLog(1, 0.0, 0.0, 1, {})
    log.dispatch(0.1, 1, "<script>alert(1)</script>", "<b>", "w")
    log.erred(0.2, 1, "w", "<img src=x onerror=alert(1)>")
    page = render(log.records())
    assert "<script>alert" not in page and "<img" not in page


def test_hoisting_candidates_show_as_a_hint():
    info = RunInfo(1, {}, 1, 0.0, 1.0, "done")
    info.hoisting_candidates = ["numpy", "awkward"]  # added by the library-modes work
    page = render(summary_records(info))
    assert "id='hoisting-candidates'" in page and "<code>awkward</code>" in page


def test_a_run_without_a_log_renders_its_summary():
    info = RunInfo(3, {"retries": 1}, 10, 100.0, 102.5, "done")
    info.transfers = {("a", MANAGER): 2_000_000}
    page = render(summary_records(info))
    assert "kept no event log" in page and "2.0 MB" in page and "2.50 s" in page


def test_lanes_never_overlap_within_the_cores():
    tasks = [
        TaskRun(i, i, "f", "w", start, start + 1.0, 0)
        for i, start in enumerate([0.0, 0.0, 0.5, 1.0, 1.0, 1.5])
    ]
    lanes = lay_lanes(tasks, cores=2)
    assert len(lanes) == 2
    for lane in lay_lanes(tasks, cores=0):  # cores unknown: as many lanes as needed
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:], strict=False))
    assert len(lay_lanes(tasks, cores=0)) == 3


def test_merge_joins_neighbours_closer_than_a_pixel():
    chart = Chart(t_max=1.0, y_max=1, height=10)  # 880 px per second
    lane = [TaskRun(i, i, "f", "w", i * 1e-4, i * 1e-4 + 5e-5, 0) for i in range(100)]
    lane.append(TaskRun(100, 100, "g", "w", 0.5, 0.6, 0))
    rects = merge_bars(lane, chart)
    assert [(r.prefix, r.count) for r in rects] == [("f", 100), ("g", 1)]


def test_ticks_are_round():
    assert ticks(1.0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert ticks(217) == [0, 50, 100, 150, 200]
    assert ticks(0) == [0.0]


def test_report_options_are_validated():
    assert RunOptions(progress=None, report="r.html", event_log=None).report == "r.html"
    with pytest.raises(ValueError, match="progress must be"):
        RunOptions(progress="yes")
    with pytest.raises(ValueError, match="report must be a path"):
        RunOptions(report=3)


def test_task_done_carries_the_workers_finish_time():
    assert p.TaskDone(1, 2, 0.1, None).finished == 0.0  # older senders: unknown
    p.check_fields(p.TaskDone(1, 2, 0.1, None, 1769000000.5))
    with pytest.raises(ProtocolError, match="TaskDone.finished"):
        p.check_fields(p.TaskDone(1, 2, 0.1, None, "late"))


def test_results_relayed_through_the_manager_are_flagged_in_the_summary():
    log = EventLog(8, wall_start=1000.0, mono_start=50.0, tasks=2, options={})
    log.worker(50.0, "w1", 1, "node1")
    log.worker(50.0, "w2", 1, "node2")
    info = RunInfo(8, {}, 2, 1000.0, 1000.5, "done")
    info.transfers = {("w1", MANAGER): 5000, (MANAGER, "w2"): 5000}
    info.relayed = [["w1", "w2", 5000]]
    log.end(50.5, "done", info)
    page = render(log.records())
    assert "peers unreachable" in page and "w1 → w2" in page
    assert "peers unreachable" not in render(_log().records())  # only when it happened
