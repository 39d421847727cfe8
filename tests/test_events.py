"""Event logs and the HTML report as pure functions of literal events: no workers."""

from __future__ import annotations

import re
import typing
from html.parser import HTMLParser

import pytest

from daskvine_py import ProtocolError, RunOptions
from daskvine_py import protocol as p
from daskvine_py.events import (
    _RECORD,
    Dispatched,
    Entry,
    EventLog,
    Finished,
    read_events,
    summary_records,
    write_events,
)
from daskvine_py.report import SECTIONS, TaskRun, _Chart, _lanes, _merge, _ticks, render, summarize
from daskvine_py.runinfo import MANAGER, RunInfo


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
    done = next(r for r in records if r["event"] == "done")
    # The worker's clock, on the run's scale: ended at 0.35 s, ran 0.2 s.
    assert done == {"event": "done", "t": 0.4, "id": 1, "worker": "w1", "start": 0.15,
                    "end": 0.35, "nbytes": 8}  # fmt: skip
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


def test_a_log_written_by_the_tuple_version_loads_as_todays(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(_OLD_LOG)
    assert read_events(path) == list(_log().records())


def test_entries_are_named_records_and_each_type_has_its_record():
    entries = _log().entries
    assert type(entries[3]) is Dispatched and entries[3].key == ("inc", 0)
    done = entries[7]
    assert type(done) is Finished and (done.id, done.worker, done.nbytes) == (1, "w1", 8)
    assert (done.end, done.duration) == pytest.approx((0.35, 0.2))
    assert set(_RECORD) == set(typing.get_args(Entry))


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
    assert summary.workers["w2"]["lost"] == pytest.approx(0.7)
    assert summary.transfers == {("w1", "w2"): 800, ("w2", MANAGER): 16}
    assert [f["event"] for f in summary.failures] == ["erred", "worker_lost"]
    assert summary.failures[0]["key"] == "total"


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
    assert page.count("class='task'") == 2  # two finished tasks on the timeline
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
    tasks = [TaskRun(i, i, "f", "w", start, start + 1.0, 0) for i, start in
             enumerate([0.0, 0.0, 0.5, 1.0, 1.0, 1.5])]  # fmt: skip
    lanes = _lanes(tasks, cores=2)
    assert len(lanes) == 2
    for lane in _lanes(tasks, cores=0):  # cores unknown: as many lanes as needed
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:], strict=False))
    assert len(_lanes(tasks, cores=0)) == 3


def test_merge_joins_neighbours_closer_than_a_pixel():
    chart = _Chart(t_max=1.0, y_max=1, height=10)  # 880 px per second
    lane = [TaskRun(i, i, "f", "w", i * 1e-4, i * 1e-4 + 5e-5, 0) for i in range(100)]
    lane.append(TaskRun(100, 100, "g", "w", 0.5, 0.6, 0))
    rects = _merge(lane, chart)
    assert [(r[2], r[3]) for r in rects] == [("f", 100), ("g", 1)]


def test_ticks_are_round():
    assert _ticks(1.0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert _ticks(217) == [0, 50, 100, 150, 200]
    assert _ticks(0) == [0.0]


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
