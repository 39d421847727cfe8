"""Every graph form Dask hands a scheduler, on real workers, checked against sync Dask."""

from __future__ import annotations

import logging
import operator
import threading

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pandas as pd
import pytest
from dask._task_spec import Alias, DataNode, List, Task, TaskRef
from dask.highlevelgraph import HighLevelGraph

pytestmark = pytest.mark.integration


def inc(x):
    return x + 1


def test_array_reduction(shared_manager):
    x = da.random.default_rng(0).random((1000, 1000), chunks=250)
    y = (x + x.T).mean(axis=0).sum()
    (got,) = dask.compute(y, scheduler=shared_manager.get)
    (want,) = dask.compute(y, scheduler="sync")
    assert got == want


def test_array_result_is_an_array(shared_manager):
    x = da.arange(100, chunks=10).reshape(10, 10) * 2
    got = x.compute(scheduler=shared_manager.get)
    np.testing.assert_array_equal(got, x.compute(scheduler="sync"))


def test_bag(shared_manager):
    b = db.from_sequence(range(1000), npartitions=20).map(inc).filter(lambda v: v % 3)
    got = dask.compute(b.sum(), b.frequencies(), scheduler=shared_manager.get)
    assert got == dask.compute(b.sum(), b.frequencies(), scheduler="sync")


def test_dataframe_groupby(shared_manager):
    dd = pytest.importorskip("dask.dataframe")
    rng = np.random.default_rng(1)
    pdf = pd.DataFrame({"key": rng.integers(0, 10, 10_000), "value": rng.random(10_000)})
    df = dd.from_pandas(pdf, npartitions=8)
    got = df.groupby("key").value.mean().compute(scheduler=shared_manager.get)
    want = df.groupby("key").value.mean().compute(scheduler="sync")
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index())


def test_delayed_with_nested_outputs(shared_manager):
    parts = [dask.delayed(inc)(i) for i in range(10)]
    total = dask.delayed(sum)(parts)
    got = dask.compute({"total": total, "parts": parts}, scheduler=shared_manager.get)
    assert got == ({"total": 55, "parts": list(range(1, 11))},)


def test_task_spec_objects(shared_manager):
    dsk = {
        "a": DataNode("a", 10),
        "b": Task("b", operator.add, TaskRef("a"), 5),
        "c": Alias("c", "b"),
        "d": Task("d", sum, List(TaskRef("a"), Task(None, inc, TaskRef("b")), 1)),
    }
    assert shared_manager.get(dsk, ["a", "b", "c", "d"]) == (10, 15, 15, 27)
    assert shared_manager.get(dsk, [["d"], "c"]) == ((27,), 15)


def test_high_level_graph_and_literals(shared_manager):
    layers = {
        "in": {"x": 1, "y": [1, 2, 3]},
        "out": {"z": (sum, "y"), "w": (operator.add, "x", "z")},
    }
    graph = HighLevelGraph(layers, {"in": set(), "out": {"in"}})
    assert shared_manager.get(graph, "w") == 7
    assert shared_manager.get(graph, ["y", "x"]) == ([1, 2, 3], 1)


def test_whatever_dask_compute_passes_is_accepted(shared_manager):
    """Since dask 2025.4 ``dask.compute`` hands the scheduler an expression, not a mapping."""
    seen = []

    def get(dsk, keys, **kwargs):
        seen.append(type(dsk))
        return shared_manager.get(dsk, keys, **kwargs)

    x = da.ones((100, 100), chunks=50).sum()
    assert dask.compute(x, scheduler=get) == (10_000,)
    assert seen and all(hasattr(t, "__dask_graph__") or hasattr(t, "items") for t in seen)


def test_collection_object_is_unwrapped(shared_manager):
    x = da.ones((100, 100), chunks=50).sum()
    assert shared_manager.get(x, x.__dask_keys__()) == (10_000,)


def test_culling_runs_only_what_is_needed(shared_manager):
    calls = {"bad": (operator.truediv, 1, 0), "x": (inc, 1), "y": (inc, "x")}
    assert shared_manager.get(calls, "y") == 3  # "bad" would raise if it ran


def test_unknown_option_is_a_clear_error(shared_manager):
    with pytest.raises(TypeError, match="unknown option"):
        shared_manager.get({"x": 1}, "x", no_such_option=True)


def test_empty_key_list(shared_manager):
    assert shared_manager.get({"x": 1}, []) == ()


def test_several_threads_share_one_manager(shared_manager):
    results = {}

    def compute(i):
        b = db.from_sequence(range(i * 100, (i + 1) * 100), npartitions=10).map(inc).sum()
        results[i] = b.compute(scheduler=shared_manager.get)

    threads = [threading.Thread(target=compute, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: sum(range(i * 100 + 1, (i + 1) * 100 + 1)) for i in range(4)}


def test_same_graph_twice_at_once(shared_manager):
    dsk = {f"x{i}": (inc, f"x{i - 1}") for i in range(1, 200)}
    dsk["x0"] = 0
    out = [None, None]

    def run(i):
        out[i] = shared_manager.get(dsk, "x199")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == [199, 199]


def test_intermediates_are_released_after_a_run(shared_manager):
    x = da.random.default_rng(2).random((400, 400), chunks=100)
    assert dask.compute((x @ x.T).sum(), scheduler=shared_manager.get)[0] > 0
    state = shared_manager._state
    assert not state.tasks and not state.runs
    assert all(not w.has_what and not w.processing for w in state.workers.values())


def test_no_log_lines_per_task_below_debug(shared_manager, caplog):
    with caplog.at_level(logging.INFO, logger="daskvine_py"):
        b = db.from_sequence(range(500), npartitions=100).map(inc).sum()
        assert b.compute(scheduler=shared_manager.get) == sum(range(1, 501))
    assert len([r for r in caplog.records if r.name.startswith("daskvine_py")]) < 5


def test_large_reductions_are_rewritten_as_trees(shared_manager):
    import daskvine_py
    from daskvine_py.options import RunOptions
    from daskvine_py.plan.graph import build_plan
    from daskvine_py.plan.rewrite import DEFAULT_ARITY, DEFAULT_THRESHOLD

    assert (RunOptions().reduction_arity, RunOptions().reduction_threshold) == (
        DEFAULT_ARITY,
        DEFAULT_THRESHOLD,
    )

    @daskvine_py.associative
    def merge(*parts):
        return sorted(x for part in parts for x in part)

    parts = [dask.delayed(inc)(i) for i in range(200)]
    total = dask.delayed(sum)(parts)
    lists = [dask.delayed(lambda i: [i])(i) for i in range(100)]
    merged = dask.delayed(merge)(*lists)
    want = dask.compute(total, merged, scheduler="sync")
    assert dask.compute(total, merged, scheduler=shared_manager.get) == want
    off = dask.compute(total, merged, scheduler=shared_manager.get, reduction_arity=None)
    assert off == want
    # What ran: the 200-input sum became a tree of at most 8 inputs per task.
    dsk = dict(total.__dask_graph__())
    plan = build_plan(dsk, total.key, reduction_arity=DEFAULT_ARITY)
    assert max(len(deps) for deps in plan.dependencies.values()) <= DEFAULT_ARITY
    with pytest.raises(ValueError, match="reduction_arity"):
        shared_manager.get(dsk, total.key, reduction_arity=1)


@pytest.mark.timeout(60)
def test_tiny_tasks_with_large_results_do_not_jam_the_library_pipes(shared_manager):
    """Regression: batches of inputs written while a library wrote big results deadlocked."""
    dsk = {f"big{i}": (np.full, 100_000, float(i)) for i in range(300)}
    dsk.update({f"sum{i}": (np.sum, f"big{i}") for i in range(300)})
    keys = [f"sum{i}" for i in range(300)] + [f"big{i}" for i in range(0, 300, 50)]
    got = shared_manager.get(dsk, keys)
    want = dask.get(dsk, keys)
    assert got[:300] == tuple(want[:300])
    assert all(np.array_equal(a, b) for a, b in zip(got[300:], want[300:], strict=True))


def _append_line(path, key, seconds):
    """A task with a side effect: running it twice would write its line twice."""
    import time

    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"{key}\n")
    return key


def test_tasks_with_side_effects_run_exactly_once(manager, tmp_path):
    """Fresh workers (no duration estimates yet) take uneven work and then take some back
    for whoever is idle: that must never run a task twice. Dask's disk shuffle relies on
    it (each shuffle task appends to files), and so do tasks like these."""
    durations = [0.05 if i % 50 == 49 else 0.0 for i in range(300)]
    for round in range(4):  # new keys each round: their durations are unknown again
        path = str(tmp_path / f"log{round}")
        dsk = {(f"t{round}", i): (_append_line, path, i, d) for i, d in enumerate(durations)}
        assert sorted(manager.get(dsk, list(dsk))) == list(range(300))
        with open(path) as f:
            lines = f.read().split()
        assert sorted(map(int, lines)) == list(range(300)), f"round {round}"


def test_disk_shuffle_groupby_on_fresh_workers(manager):
    ddf = pd.DataFrame({"key": np.arange(20_000) % 97, "value": np.linspace(0, 1, 20_000)})
    df = __import__("dask.dataframe", fromlist=["x"]).from_pandas(ddf, npartitions=40)
    with dask.config.set({"dataframe.shuffle.method": "disk"}):
        result = df.groupby("key").value.mean(split_out=4)
        expected = result.compute(scheduler="sync")
        got = result.compute(scheduler=manager.get)
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index())
