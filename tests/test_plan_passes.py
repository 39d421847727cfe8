"""The passes of ``get``, each alone on literal graphs: the one read of a graph into a
``Plan``, then rewrite, fusion, annotations, the cache's pass and ordering (issue 26).

Where a plan computes something, running its tasks in the plan's order gives what
Dask's synchronous scheduler (``dask.get``) gives for the original graph.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from unittest import mock

import dask
import pytest
from dask.highlevelgraph import HighLevelGraph
from hypothesis import given, settings
from hypothesis import strategies as st

from daskvine_py.cache.directory import DiskStore
from daskvine_py.cache.keys import KeyMaker, code_digests, task_keys
from daskvine_py.cache.result_cache import CachedRun, cached
from daskvine_py.plan import graph
from daskvine_py.plan.fusion import Chain
from daskvine_py.wire.serialize import TaskEncoder, dumps


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def execute(plan):
    """The plan's outputs by key, its tasks run in its order."""
    values = {}
    for key in plan.order:
        deps = plan.dependencies[key]
        assert deps <= values.keys()  # every task after what it reads
        values[key] = plan.nodes[key]({dep: values[dep] for dep in deps})
    return graph.pack_results(plan.structure, values)


#: a diamond beside an unneeded task: x -> (a, b) -> c
DIAMOND = {"x": 1, "a": (inc, "x"), "b": (operator.mul, "x", 10), "c": (add, "a", "b"), "u": 0}


# -- read -------------------------------------------------------------------------------


def test_read_culls_to_the_outputs_and_orders_depth_first():
    plan = graph.read(DIAMOND, ["c", ["a"]])
    assert set(plan.nodes) == {"x", "a", "b", "c"}  # "u" is culled
    assert plan.outputs == ["c", "a"] and plan.structure == ["c", ["a"]]
    assert plan.dependencies["c"] == {"a", "b"} and plan.dependencies["x"] == frozenset()
    assert plan.dependents == {"x": 2, "a": 1, "b": 1}
    assert plan.priorities == {} and plan.annotations == {}  # ordered later, nothing annotated
    assert execute(plan) == dask.get(DIAMOND, ["c", ["a"]]) == (12, (2,))


def test_read_looks_at_an_expression_once():
    class Expression:  # what dask 2025.4 on hands a scheduler
        graphs = annotations = 0

        def __dask_graph__(self):
            self.graphs += 1
            return DIAMOND

        def __dask_annotations__(self):
            self.annotations += 1
            return {"priority": {"a": 5}, "cache": {"b": False}}

    expression = Expression()
    plan = graph.read(expression, "c")
    assert (expression.graphs, expression.annotations) == (1, 1)
    assert plan.annotations == {"priority": {"a": 5}, "cache": {"b": False}}


def test_read_keeps_a_high_level_graphs_honoured_annotations_and_cache():
    layers = {
        "x": {"x": 1},
        "a": {"a": (inc, "x")},
        "c": {"c": (add, "a", "x")},
    }
    dependencies = {"x": set(), "a": {"x"}, "c": {"a", "x"}}
    hlg = HighLevelGraph(layers, dependencies)
    hlg.layers["a"].annotations = {"priority": 3, "colour": "red", "cache": False}
    hlg.layers["c"].annotations = {"retries": lambda key: 2}
    plan = graph.read(hlg, "c")
    assert plan.annotations == {"priority": {"a": 3}, "cache": {"a": False}, "retries": {"c": 2}}
    assert execute(plan) == dask.get(dict(hlg), "c") == 3


def test_read_names_what_is_missing():
    with pytest.raises(KeyError):
        graph.read(DIAMOND, "nope")


# -- rewritten ---------------------------------------------------------------------------


def test_rewritten_makes_a_large_fan_in_a_tree_computing_the_same():
    dsk = {f"x{i}": (inc, i) for i in range(40)}
    dsk["total"] = (sum, [f"x{i}" for i in range(40)])
    plan = graph.read(dsk, "total")
    tree = graph.rewritten(plan, arity=4, threshold=8)
    assert len(tree.nodes) > len(plan.nodes)  # partial sums were added
    assert max(len(deps) for deps in tree.dependencies.values()) <= 4
    assert set(tree.order) == set(tree.nodes)  # walked again: the new keys are ordered
    assert sum(tree.dependents.values()) == sum(map(len, tree.dependencies.values()))
    assert execute(tree) == dask.get(dsk, "total") == sum(range(1, 41))


def test_rewritten_leaves_a_plan_alone_when_off_or_too_small():
    plan = graph.read(DIAMOND, "c")
    assert graph.rewritten(plan, None) is plan
    assert graph.rewritten(plan, arity=4, threshold=8) is plan  # 4 tasks hold no such fan-in


# -- fused --------------------------------------------------------------------------------


CHAIN = {"a": 1, "b": (inc, "a"), "c": (inc, "b"), "d": (inc, "c"), "e": (inc, "d")}


def test_fused_makes_a_linear_chain_one_task():
    plan = graph.fused(graph.read(CHAIN, "e"))
    assert list(plan.nodes) == ["e"] and type(plan.nodes["e"]) is Chain
    assert plan.order == ["e"] and plan.dependents == {}
    assert execute(plan) == dask.get(CHAIN, "e") == 5


def test_fused_keeps_annotated_tasks_and_those_asked_for_apart():
    plan = dataclasses.replace(graph.read(CHAIN, "e"), annotations={"retries": {"c": 1}})
    assert set(graph.fused(plan).nodes) == {"b", "c", "e"}  # a -> b, c, d -> e
    assert set(graph.fused(plan, keep={"d"}).nodes) == {"b", "c", "d", "e"}
    # An annotation that is not a setting here (the cache's) does not keep a task apart.
    plan = dataclasses.replace(plan, annotations={"cache": {"c": False}})
    assert list(graph.fused(plan).nodes) == ["e"]
    assert execute(graph.fused(plan, keep={"c"})) == dask.get(CHAIN, "e")


def test_fused_returns_a_plan_without_chains_as_it_is():
    plan = graph.read(DIAMOND, "c")
    assert graph.fused(plan) is plan


# -- annotated ---------------------------------------------------------------------------


def test_annotated_settles_settings_for_the_plans_tasks_only():
    found = {
        "priority": {"a": 10, "u": 99},  # "u" is not in the plan
        "retries": {"b": 2},
        "resources": {"c": {"cores": 2}},
        "colour": {"a": "red"},  # not a setting here
    }
    plan = graph.annotated(dataclasses.replace(graph.read(DIAMOND, "c"), annotations=found))
    assert plan.user_priorities == {"a": 10}
    assert plan.settings is not None and plan.settings.retries == {"b": 2}
    assert plan.settings.placements["c"].cores == 2


def test_annotated_returns_a_plan_without_settings_as_it_is():
    plain = graph.read(DIAMOND, "c")
    assert graph.annotated(plain) is plain
    colours = dataclasses.replace(plain, annotations={"colour": {"a": "red"}})
    assert graph.annotated(colours) is colours


def test_annotated_names_the_key_of_a_value_that_means_nothing_here():
    plan = dataclasses.replace(graph.read(DIAMOND, "c"), annotations={"retries": {"b": -1}})
    with pytest.raises(ValueError, match="'b'"):
        graph.annotated(plan)


# -- ordered -----------------------------------------------------------------------------


def test_ordered_gives_every_task_a_rank_after_its_inputs():
    plan = graph.read(DIAMOND, "c")
    with mock.patch("daskvine_py.plan.graph.order", wraps=dask.order.order) as ordering:
        ranked = graph.ordered(plan)
    assert ordering.call_count == 1  # "x" has two readers: dask.order ranks them
    assert sorted(ranked.priorities.values()) == list(range(4))
    assert ranked.order == sorted(ranked.nodes, key=ranked.priorities.__getitem__)
    assert execute(ranked) == dask.get(DIAMOND, "c")


def test_ordered_puts_annotated_priorities_first():
    dsk = {f"t{i}": (inc, i) for i in range(4)}
    dsk["all"] = (sum, [f"t{i}" for i in range(4)])
    plan = graph.read(dsk, "all")
    ranked = graph.ordered(dataclasses.replace(plan, user_priorities={"t3": 1}))
    assert ranked.priorities["t3"] == 0
    assert ranked.order == plan.order  # the submission order stays every task after its inputs


def test_ordered_ranks_the_running_tasks_before_the_others():
    plan = dataclasses.replace(graph.read(DIAMOND, "c"), running={"b", "c"})
    ranked = graph.ordered(plan)
    assert max(ranked.priorities[k] for k in ("b", "c")) < ranked.priorities["x"]
    assert ranked.priorities["b"] < ranked.priorities["c"]
    assert ranked.order == plan.order  # still every task after its inputs


# -- the cache's pass --------------------------------------------------------------------


def _maker():
    return KeyMaker(TaskEncoder(), code_digests())


def test_the_cache_pass_plans_nothing_when_nothing_could_hit():
    plan = graph.read(DIAMOND, "c")
    with_cache = cached(plan, _maker(), set(), None)
    record = with_cache.cache
    assert isinstance(record, CachedRun) and record.keyed_on_submission
    assert with_cache.running is None and with_cache.dependents is plan.dependents
    assert record.info.plan == {} and record.info.deferred == frozenset()


def test_the_cache_pass_skips_what_a_hit_stands_for_and_counts_only_running_readers():
    plan = graph.read(DIAMOND, "c")
    keys = task_keys(plan, _maker())
    with_cache = cached(plan, _maker(), {keys["a"]}, None)  # a worker holds "a"'s result
    info = with_cache.cache.info
    assert info.plan == {"a": "hit"} and info.deferred == {"a"}
    assert with_cache.running == {"x", "b", "c"}
    assert with_cache.dependents == {"a": 1, "b": 1, "x": 1}  # "a" no longer reads "x"
    ranked = graph.ordered(with_cache)
    assert ranked.priorities["a"] == max(ranked.priorities.values())


def test_the_cache_pass_reads_results_from_the_directory(tmp_path):
    plan = graph.read(DIAMOND, "c")
    keys = task_keys(plan, _maker())
    store = DiskStore(tmp_path)
    store.put(keys["c"], dumps(12), 0.5)
    with_cache = cached(plan, _maker(), set(), store)
    info = with_cache.cache.info
    assert info.plan == {"c": "disk", "a": "skip", "b": "skip", "x": "skip"}
    assert info.seconds == {"c": 0.5} and with_cache.running == set()


def test_the_cache_pass_leaves_cache_false_tasks_uncached():
    plan = dataclasses.replace(graph.read(DIAMOND, "c"), annotations={"cache": {"b": False}})
    keys = task_keys(graph.read(DIAMOND, "c"), _maker())
    with_cache = cached(plan, _maker(), {keys["b"]}, None)
    assert with_cache.cache.info.keys["b"] is None  # never a hit: it always runs
    assert "b" in with_cache.running


# -- the passes together -----------------------------------------------------------------


def test_the_passes_in_their_order_compute_what_dask_computes():
    dsk = {f"x{i}": (inc, i) for i in range(40)}
    dsk.update({f"y{i}": (inc, f"x{i}") for i in range(40)})  # chains: fused
    dsk["total"] = (sum, [f"y{i}" for i in range(40)])  # a fan-in: rewritten
    dsk["more"] = (add, "total", "x0")
    plan = graph.read(dsk, ["more", "total"])
    plan = graph.rewritten(plan, arity=8, threshold=16)
    plan = graph.fused(plan)
    plan = graph.annotated(plan)
    plan = cached(plan, _maker(), set(), None)
    plan = graph.ordered(plan)
    assert execute(plan) == dask.get(dsk, ["more", "total"])
    built = graph.build_plan(dsk, ["more", "total"])  # the plan's own passes, for tools
    assert execute(built) == execute(plan)


@st.composite
def graphs(draw):
    """Random graphs of legacy tasks: sums of earlier keys (fan-ins), chains of ``inc``."""
    dsk = {}
    for i in range(draw(st.integers(1, 40))):
        inputs = draw(st.sets(st.integers(0, i - 1), max_size=6)) if i else set()
        if len(inputs) == 1:
            dsk[f"k{i}"] = (inc, f"k{inputs.pop()}")
        else:
            dsk[f"k{i}"] = (sum, [f"k{j}" for j in sorted(inputs)]) if inputs else i
    return dsk


@settings(max_examples=60, deadline=None)
@given(dsk=graphs(), data=st.data())
def test_every_plan_the_passes_make_computes_what_dask_computes(dsk, data):
    outputs = data.draw(st.lists(st.sampled_from(sorted(dsk)), min_size=1, max_size=3))
    priority = data.draw(st.dictionaries(st.sampled_from(sorted(dsk)), st.integers(-2, 2)))
    plan = dataclasses.replace(graph.read(dsk, outputs), annotations={"priority": priority})
    plan = graph.rewritten(plan, arity=2, threshold=3)
    if data.draw(st.booleans()):
        plan = graph.fused(plan)
    plan = graph.ordered(graph.annotated(plan))
    assert sorted(plan.priorities.values()) == list(range(len(plan.nodes)))
    assert execute(plan) == dask.get(dsk, outputs)


# -- get drops the plan once it is submitted ---------------------------------------------


@pytest.mark.parametrize("cache", [False, True])
def test_get_drops_the_plan_while_the_run_goes_on(shared_manager, monkeypatch, cache):
    """The state has the tasks once they are submitted: the plan's dicts are not kept
    alive through the run (the callbacks run in the caller's thread as it waits)."""
    from dask.callbacks import Callback

    plans = []
    ordered = graph.ordered

    def keep_a_reference(plan):
        plan = ordered(plan)
        plans.append(weakref.ref(plan))
        return plan

    monkeypatch.setattr(graph, "ordered", keep_a_reference)
    alive = []

    def posttask(key, result, dsk, state, worker_id):
        alive.append(plans[-1]() is not None)

    dsk = {"x": 1, "a": (inc, "x"), "b": (inc, "x"), "c": (add, "a", "b")}
    with Callback(posttask=posttask):
        assert shared_manager.get(dsk, "c", cache=cache) == dask.get(dsk, "c") == 4
    assert alive and not any(alive)
