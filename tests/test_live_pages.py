"""``live/pages.py`` without a server: what the I/O thread hands over becomes
the window's ``Summary``, and each page is drawn by the report's own sections."""

from __future__ import annotations

import re
import time

import pytest

from daskvine_py.live.pages import PAGES, WINDOW, DashboardView
from daskvine_py.wire import protocol as p

NOW = 1_000_000.0


def _live(t: float, done: int, workers: tuple[str, ...] = ("w1", "w2")) -> dict:
    return {
        "t": t,
        "manager": {"cpu_s": 1.5, "uptime_s": 60.0},
        "totals": {
            "workers": len(workers),
            "cores": 2 * len(workers),
            "waiting": 86,
            "ready": 5,
            "processing": 4,
            "running": 3,
            "tasks_done": done,
            "tasks_failed": 1,
            "bytes_moved": 4096,
            "stored_bytes": 2048,
            "spilled_bytes": 0,
        },
        "runs": [
            {
                "id": 1,
                "tasks": 100,
                "done": done,
                "failed": 0,
                "started": t - 5,
                "categories": {
                    "inc": {"planned": 90, "done": done, "failed": 0},
                    "sum": {"planned": 10, "done": 0, "failed": 1},
                },
            }
        ],
        "categories": {
            "inc": {
                "tasks": done,
                "failed": 0,
                "wall_s": 0.5,
                "cpu_s": 0.4,
                "peak_memory_mb": 1.0,
                "allocated_memory_mb": 0.0,
                "exhausted": 0,
            },
            "add": {
                "tasks": done,
                "failed": 0,
                "wall_s": 0.1,
                "cpu_s": 0.1,
                "peak_memory_mb": 0.0,
                "allocated_memory_mb": 0.0,
                "exhausted": 0,
            },
        },
        "workers": [
            {
                "name": name,
                "hostname": "node",
                "cores": 2,
                "gpus": 0,
                "tasks": 4,
                "memory": 2**30,
                "resident": 2**27,
                "stored_bytes": 1024,
                "spilled_bytes": 0,
                "last_heard_s": 0.4,
                "quarantined": "",
            }
            for name in workers
        ],
    }


def _status(*bars: p.Bar) -> p.Status:
    return p.Status(1024, 2**26, 2**26, 0, 2**27, activity=bars)


def _data(t: float, done: int, beats: list, failures: list | None = None) -> dict:
    return {
        "live": _live(t, done),
        "beats": beats,
        "transfers": {("w1", "w2"): 800, ("w2", "manager"): 16},
        "failures": failures or [],
    }


def test_every_page_draws_what_was_handed_over():
    view = DashboardView()
    view.update(_data(NOW - 10, 10, []))  # the page opened 10 s ago
    view.update(
        _data(
            NOW - 1,
            10,
            [
                (
                    "w1",
                    NOW - 1,
                    _status(
                        (0, "inc", NOW - 3, NOW - 2, 0.1, 40),
                        (1, "sum", NOW - 3, NOW - 1.5, 0.0, 2),
                        (p.FETCH_LANE, "fetch", NOW - 2.5, NOW - 2.4, 0.0, 3),
                    ),
                ),
                ("w2", NOW - 1, _status((0, "inc", NOW - 2, NOW - 1, 0.0, 60))),
            ],
        )
    )
    failure = {
        "t": NOW,
        "run": 2,
        "kind": "erred",
        "key": ["bad", 0],
        "worker": "w1",
        "message": "builtins.ZeroDivisionError: division by zero\nTraceback ...\n"
        "  line 1, in bad\nZeroDivisionError: division by zero",
    }
    view.update(_data(NOW, 30, [("w1", NOW, _status())], [failure]))
    pages = {name: view.page(name) for name, _ in PAGES}

    status = pages["status"]
    assert "30 of 100 done" in status and "width:30.0%" in status
    progress = _section(status, "progress")  # per category, the most tasks first
    assert progress.index(">inc<") < progress.index(">sum<")
    assert "30 of 90 done" in progress and "0 of 10 done, 1 failed" in progress
    assert ">inc<" in status  # the categories table, the report's own
    rows = [
        re.findall(r"<td>(.*?)</td>", row)
        for row in _section(status, "categories").split("</tr>")[1:]
    ]
    peaks = {cells[0]: cells[5] for cells in rows if cells}
    assert peaks["inc"] == "1.0 MiB" and peaks["add"] == "&lt; 1 MiB"  # not "0"
    assert status.count("class='series'") >= 4  # tasks over time: three samples drawn

    stream = pages["stream"]
    titles = re.findall(r"<title>([^<]*)</title>", stream)
    assert "inc: 40 tasks; run 900 ms, (de)serialization 100 ms" in titles
    assert any(t.startswith("(fetching inputs): 3 tasks") for t in titles)
    assert any(t.startswith("inc: 60 tasks") for t in titles)
    assert ">w1<" in stream and ">w2<" in stream

    workers = pages["workers"]
    assert workers.count("<tr>") >= 3 and "node" in workers and "134.2 MB" in workers
    assert "<th>tasks held</th>" in workers and "<th>last heard</th>" in workers
    assert "class='memory'" in workers  # the report's memory charts
    assert "800 B" in pages["transfers"]
    assert (
        "<details><summary>builtins.ZeroDivisionError: division by zero</summary>"
        in (pages["failures"])
    )
    with pytest.raises(KeyError):
        view.page("nope")


def test_a_worker_not_heard_from_since_the_page_opened_has_a_row_and_no_chart():
    view = DashboardView()
    view.update(_data(NOW, 1, [("w1", NOW, _status())]))  # w2: no heartbeat yet
    workers = view.page("workers")
    assert ">w2<" in _section(workers, "workers")
    assert "data-worker='w1'" in workers and "data-worker='w2'" not in workers


def test_the_window_forgets_what_is_older_and_workers_gone():
    view = DashboardView()
    view.update(
        _data(
            NOW,
            1,
            [
                ("w1", NOW, _status((0, "inc", NOW - 1, NOW, 0.0, 1))),
                ("w9", NOW, _status((0, "old", NOW - 1, NOW, 0.0, 1))),
            ],
        )
    )
    assert set(view.bars) == {"w1", "w9"}
    later = NOW + WINDOW + 10  # (past the stream's window too)
    view.update(
        {
            **_data(later, 2, [("w1", later, _status((0, "inc", later - 1, later, 0, 5)))]),
            "live": _live(later, 2, ("w1",)),
        }
    )
    assert set(view.bars) == {"w1"} and [b[5] for b in view.bars["w1"][0]] == [5]
    assert view.ran == {"w1": 6} and view.busy == {"w1": pytest.approx(1.0)}
    assert list(view.beats) == ["w1"]
    summary = view.summary()
    assert [t.tasks for t in summary.activity] == [5]
    # alike neighbours on a lane merge as they come; another prefix does not
    view.update(
        {
            **_data(
                later + 1,
                3,
                [
                    (
                        "w1",
                        later + 1,
                        _status(
                            (0, "inc", later, later + 0.5, 0.1, 2),
                            (0, "sum", later + 0.5, later + 1, 0, 1),
                        ),
                    )
                ],
            ),
            "live": _live(later + 1, 3, ("w1",)),
        }
    )
    assert list(view.bars["w1"][0]) == [
        (0, "inc", later - 1, later + 0.5, 0.1, 7),
        (0, "sum", later + 0.5, later + 1, 0, 1),
    ]
    assert summary.end == {"duration": pytest.approx(WINDOW)}


def test_heartbeats_are_kept_only_while_a_dashboard_asks(monkeypatch):
    from daskvine_py.manager import watching as w

    watching = w.Watching(lambda: (0, 0, 0))
    watching.status(0.0, "w1", _status())
    assert watching.beats is None  # nobody asked: nothing kept
    watching.beats = []  # (what ``LiveView.dashboard`` starts with)
    watching.status(0.0, "w1", _status())
    assert [(name, status) for name, _, status in watching.beats] == [("w1", _status())]
    monkeypatch.setattr(w, "MAX_BEATS", 3)
    for _ in range(3):
        watching.status(0.0, "w1", _status())
    assert watching.beats is None  # not asked for since: let go


def _section(page: str, anchor: str) -> str:
    match = re.search(rf"<section id='{anchor}'>.*?</section>", page, re.S)
    assert match, anchor
    return match.group(0)


def _tasks_run(table: str) -> dict[str, str]:
    """The workers table's "tasks run" column, by worker."""
    head = re.findall(r"<th>([^<]*)</th>", table.split("</tr>")[0])
    column = head.index("tasks run")
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in table.split("</tr>")[1:]]
    return {cells[0]: cells[column] for cells in rows if cells}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_report_keeps_what_the_dashboard_showed(manager, tmp_path):
    """The run's report and the dashboard of a fresh manager draw the same categories and
    the same tasks run per worker: one rendering, from per-task records and from bars."""
    import dask
    import dask.array as da

    from daskvine_py.manager.live import ask_dashboard

    def ask() -> dict:
        return ask_dashboard(manager._command, manager._raise_if_dead, 10.0)

    view = DashboardView()
    view.update(ask())  # the page opens: heartbeats are kept from now on
    x = (da.arange(4000, chunks=100) * 2).sum()
    path = tmp_path / "run.html"
    (got,) = dask.compute(x, scheduler=manager.get, report=path)
    assert got == dask.compute(x, scheduler="sync")[0]
    tasks = manager.last_run.tasks
    report = path.read_text()
    expected = _tasks_run(_section(report, "workers"))
    assert sum(int(n.replace(",", "")) for n in expected.values()) == tasks
    deadline = time.monotonic() + 60
    while True:  # until every worker's heartbeat since the run's end has come
        view.update(ask())
        shown = _tasks_run(_section(view.page("workers"), "workers"))
        if shown == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert shown == expected
    assert _section(view.page("status"), "categories") == _section(report, "categories")


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_dashboard_address_taken_or_malformed_is_named_and_nothing_is_left():
    import socket
    import threading

    from daskvine_py import Manager

    before = set(threading.enumerate())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=rf"cannot listen on {address} \(dashboard_address\)"):
            Manager(dashboard_address=address)
    with pytest.raises(ValueError, match="dashboard_address must be 'host:port'"):
        Manager(dashboard_address="localhost:http")
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
