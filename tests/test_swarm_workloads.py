"""The swarm's workloads (``benchmarks/swarm_workloads.py``): the graphs compute what they say,
have the sizes the paper gives, and their ideal times are right.

Small graphs are run on Dask's synchronous scheduler; the full sizes are only counted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dask
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import swarm_workloads as sw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def dependencies(graph: dict, key: object) -> tuple:
    return graph[key][3:]


@pytest.mark.parametrize(
    "name, tasks",
    [
        ("dv3-large", 1),
        ("dv3-large", 2),
        ("dv3-large", 9),
        ("dv3-large", 300),
        ("dv3-huge", 18),
        ("dv3-huge", 100),
        ("dv3-huge", 1_000),
        ("flat", 0),
        ("flat", 40),
        ("million", 1),
        ("million", 1_000),
    ],
)
def test_small_graphs_compute_what_they_expect(name, tasks):
    w = sw.build(name, tasks, seed=3)
    got = dask.get(w.graph, w.keys)
    assert w.result_ok(got), (got, w.expected)
    assert w.tasks == len(w.graph)
    assert w.ready_at_start == sum(1 for k in w.graph if not dependencies(w.graph, k))
    assert w.critical_path_s == pytest.approx(sw.critical_path(w.graph))
    assert w.total_work_s == pytest.approx(sum(t[1] for t in w.graph.values()))
    every_input = {d for k in w.graph for d in dependencies(w.graph, k)}
    assert every_input <= w.graph.keys()
    if name != "million":  # million's tasks count leaves, the others the whole graph
        assert w.tasks == tasks


def test_a_lost_task_changes_the_result():
    w = sw.build("dv3-huge", 200)
    graph = dict(w.graph)
    graph["fill-3-2"] = (sw.sim_task, 0.0, 0)  # a fill that never read its chunk
    assert dask.get(graph, w.keys) != w.expected


def test_dv3_large_full_size():
    w = sw.build("dv3-large")
    assert w.tasks == len(w.graph) == 17_000
    processing = [t for t in w.graph.values() if len(t) == 3]
    merges = [t for t in w.graph.values() if len(t) > 3]
    assert len(processing) == w.ready_at_start
    assert len(merges) == 17_000 - w.ready_at_start
    assert all(1.0 <= t[1] <= 10.0 for t in processing)
    assert all(0.1 <= t[1] <= 0.5 for t in merges)
    assert all(len(t) - 3 <= sw.FAN_IN for t in merges)
    # most short, some long
    assert sum(t[1] < 5.0 for t in processing) > 0.8 * len(processing)
    assert any(t[1] > 8.0 for t in processing)
    assert w.expected == 17_000
    # one final key that every task reaches
    inputs = {d for t in merges for d in t[3:]}
    assert [k for k in w.graph if k not in inputs] == [w.keys]


def test_dv3_huge_full_size():
    w = sw.build("dv3-huge")
    assert w.tasks == len(w.graph) == 185_000
    assert w.ready_at_start == 10_000
    assert all(len(t) - 3 <= sw.FAN_IN for t in w.graph.values())
    assert w.expected == 185_000 + (sw.DV3_HUGE_FILLS - 1) * 10_000
    loads = sum(k.startswith("load-") for k in w.graph)
    fills = sum(k.startswith("fill-") for k in w.graph)
    assert (loads, fills) == (10_000, 150_000)


def test_flat_and_million_full_size():
    w = sw.build("flat")
    assert w.tasks == w.ready_at_start == len(w.keys) == 10_000
    assert w.expected == [1] * 10_000
    assert w.total_work_s == 10_000.0 and w.critical_path_s == 1.0

    m = sw.build("million")
    assert m.ready_at_start == 1_000_000
    # 125,000 + 15,625 + 1,954 + 245 + 31 + 4 + 1 sums above them: issue 28's graph
    assert m.tasks == len(m.graph) == m.expected == 1_142_860
    assert m.total_work_s == 0.0


def test_the_same_seed_builds_the_same_graph_and_scale_scales_it():
    a = sw.build("dv3-large", 500, seed=1)
    b = sw.build("dv3-large", 500, seed=1)
    c = sw.build("dv3-large", 500, seed=1, scale=0.01)
    assert a.graph == b.graph
    assert c.total_work_s == pytest.approx(a.total_work_s * 0.01, rel=1e-4)
    assert c.critical_path_s == pytest.approx(a.critical_path_s * 0.01, rel=1e-4)
    assert sw.build("dv3-large", 500, seed=2).graph != a.graph


def test_critical_path_and_ideal_on_a_hand_checked_graph():
    t = sw.sim_task
    graph = {
        "a": (t, 1.0, 0),
        "b": (t, 4.0, 0),
        "c": (t, 2.0, 0, "a"),  # a-c: 3
        "d": (t, 0.5, 0, "b", "c"),  # b-d: 4.5
        "e": (t, 3.0, 0, "a"),  # a-e: 4
        "f": (t, 1.0, 0, "d", "e"),  # b-d-f: 5.5
    }
    assert sw.critical_path(graph) == 5.5
    assert dask.get(graph, "f") == 1 + (1 + 1 + (1 + 1)) + (1 + 1)
    w = sw.Workload("hand", graph, "f", 6, 11.5, 5.5, 2, 8)
    assert w.ideal_s(1) == 11.5
    assert w.ideal_s(2) == 5.75
    assert w.ideal_s(100) == 5.5


def test_sim_task_declares_and_sleeps_only_when_asked():
    assert sw.sim_task(0.25, 1234, 2, 3) == 6
    assert sw.DECLARED == [0.25, 1234]
    sw.set_sleep(True)
    try:
        assert sw.SLEEP
        assert sw.sim_task(0.0, 7) == 1
    finally:
        sw.set_sleep(False)
    assert sw.DECLARED == [0.0, 7]


def test_unknown_workload():
    with pytest.raises(ValueError, match="unknown workload"):
        sw.build("dv4")


@pytest.mark.integration
def test_distributed_runs_a_small_dv3_large_and_reports_it():
    pytest.importorskip("distributed")
    from swarm_distributed import run_distributed

    w = sw.build("dv3-large", 60, scale=0.001)
    out = run_distributed(w, workers=3, threads=2, timeout=60)
    assert out["error"] is None, out["error"]
    assert out["result_ok"] and out["tasks_done"] == 60
    assert (out["workers_registered"], out["cores"]) == (3, 6)
    assert out["makespan_s"] > 0 and out["ideal_s"] == pytest.approx(w.ideal_s(6), abs=1e-3)
    assert not sw.SLEEP  # the sleeping is switched off again


def test_distributed_reports_a_timeout_instead_of_raising():
    pytest.importorskip("distributed")
    from swarm_distributed import run_distributed

    w = sw.build("flat", 4, task_seconds=30.0)
    out = run_distributed(w, workers=1, threads=1, timeout=5)
    assert not out["result_ok"]
    assert out["error"].startswith("timeout")
    assert out["tasks_done"] < 4
    assert "teardown" not in out["error"]  # the sleeping tasks were woken: it closed in time
