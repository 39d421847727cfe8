"""The graph layer: normalising every form Dask hands a scheduler, culling, cycles, order."""

from __future__ import annotations

import dataclasses
import operator
from unittest import mock

import dask
import dask.array as da
import pytest
from dask._task_spec import Alias, DataNode, Task, TaskRef
from dask.highlevelgraph import HighLevelGraph
from hypothesis import given, settings
from hypothesis import strategies as st

from daskvine_py.errors import GraphCycleError
from daskvine_py.plan.graph import build_plan, flatten_keys, ordered, pack_results


def inc(x):
    return x + 1


def test_legacy_tuples_become_nodes_with_dependencies():
    plan = build_plan({"x": 1, "y": (inc, "x"), "z": (operator.add, (inc, "x"), "y")}, "z")
    assert set(plan.nodes) == {"x", "y", "z"}
    assert plan.dependencies == {"x": frozenset(), "y": {"x"}, "z": {"x", "y"}}
    assert plan.outputs == ["z"]
    assert plan.nodes["z"]({"x": 1, "y": 2}) == 4


def test_culling_keeps_only_what_outputs_need():
    plan = build_plan(
        {"a": 1, "b": (inc, "a"), "c": (inc, "a"), "d": (inc, "c")}, ["b"], fuse=False
    )
    assert set(plan.nodes) == {"a", "b"}


def test_nested_keys_flatten_and_pack_like_dask():
    keys = [["x", ("y", 0)], "z", [[("w", 1, 2)]]]
    assert flatten_keys(keys) == ["x", ("y", 0), "z", ("w", 1, 2)]
    values = {"x": 1, ("y", 0): 2, "z": 3, ("w", 1, 2): 4}
    assert pack_results(keys, values) == ((1, 2), 3, ((4,),))
    assert pack_results(("y", 0), values) == 2


def test_duplicate_outputs_are_computed_once():
    plan = build_plan({"x": 1}, ["x", ["x"]])
    assert plan.outputs == ["x"]


def test_unknown_key_is_a_key_error():
    with pytest.raises(KeyError):
        build_plan({"x": 1}, ["x", "nope"])


def test_missing_dependency_names_both_keys():
    with pytest.raises(KeyError, match="'a' depends on 'gone'"):
        build_plan({"a": Task("a", inc, TaskRef("gone"))}, "a")


def test_cycle_is_reported_in_order():
    dsk = {"a": (inc, "b"), "b": (inc, "c"), "c": (inc, "a"), "x": (inc, "a"), "y": 1}
    with pytest.raises(GraphCycleError) as info:
        build_plan(dsk, ["y", "x"])
    cycle = info.value.cycle
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    # in execution order: each key is read by the next
    assert all(dsk[after][1] == before for before, after in zip(cycle, cycle[1:], strict=False))


def test_self_loop_is_a_cycle():
    with pytest.raises(GraphCycleError) as info:
        build_plan({"a": (inc, "a")}, "a")
    assert info.value.cycle == ["a", "a"]


def test_long_chain_needs_no_recursion():
    dsk = {f"x{i}": (inc, f"x{i - 1}") for i in range(1, 50_000)}
    dsk["x0"] = 0
    plan = build_plan(dsk, "x49999", fuse=False)
    assert len(plan) == 50_000
    assert plan.priorities["x0"] < plan.priorities["x49999"]


def test_task_spec_and_high_level_graph_and_collections():
    dsk = {"a": DataNode("a", 1), "b": Task("b", inc, TaskRef("a")), "c": Alias("c", "b")}
    assert set(build_plan(dsk, "c", fuse=False).nodes) == {"a", "b", "c"}
    hlg = HighLevelGraph({"l": {"x": 1, "y": (inc, "x")}}, {"l": set()})
    assert set(build_plan(hlg, "y", fuse=False).nodes) == {"x", "y"}
    x = da.ones(10, chunks=5).sum()
    plan = build_plan(x, x.__dask_keys__())
    assert plan.outputs == [x.__dask_keys__()[0]]


def test_objects_without_a_graph_are_refused():
    with pytest.raises(TypeError, match="cannot schedule"):
        build_plan(42, "x")


@st.composite
def dags(draw):
    n = draw(st.integers(1, 30))
    dsk = {}
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        dsk[f"k{i}"] = (sum, [f"k{j}" for j in sorted(deps)]) if deps else i
    return dsk


@settings(max_examples=60, deadline=None)
@given(dsk=dags(), data=st.data())
def test_plans_compute_what_dask_computes(dsk, data):
    outputs = data.draw(st.lists(st.sampled_from(sorted(dsk)), min_size=1, max_size=3))
    fuse = data.draw(st.booleans())
    ordered_by_dask = build_plan(dsk, outputs, fuse=fuse)
    with mock.patch("daskvine_py.plan.graph.DASK_ORDER_LIMIT", 0):
        ordered_linearly = build_plan(dsk, outputs, fuse=fuse)
    for plan in (ordered_by_dask, ordered_linearly):
        # The plan's order is its priorities', and it counts every task's readers.
        assert plan.order == sorted(plan.nodes, key=plan.priorities.__getitem__)
        readers = {key: 0 for key in plan.nodes}
        for deps in plan.dependencies.values():
            for dep in deps:
                readers[dep] += 1
        assert {k: plan.dependents.get(k, 0) for k in plan.nodes} == readers
        # Executing the plan's nodes in that order gives Dask's own answers.
        values = {}
        for key in plan.order:
            assert plan.dependencies[key] <= set(values)  # order respects dependencies
            values[key] = plan.nodes[key]({d: values[d] for d in plan.dependencies[key]})
        assert pack_results(outputs, values) == dask.get(dsk, outputs)


def test_large_graphs_take_the_linear_topological_order(monkeypatch):
    from daskvine_py.plan import graph

    monkeypatch.setattr(graph, "DASK_ORDER_LIMIT", 10)
    dsk = {f"a{i}": (inc, i) for i in range(20)}
    dsk.update({f"b{i}": (inc, f"a{i}") for i in range(20)})
    dsk["total"] = (sum, [f"b{i}" for i in range(20)])
    plan = build_plan(dsk, "total", fuse=False)
    rank = plan.priorities
    assert sorted(rank.values()) == list(range(41))
    assert all(rank[f"a{i}"] < rank[f"b{i}"] < rank["total"] for i in range(20))
    # depth first: each b right after its a
    assert all(rank[f"b{i}"] == rank[f"a{i}"] + 1 for i in range(20))


# --- light legacy tasks ------------------------------------------------------------------

_SCALARS = st.one_of(
    st.integers(-3, 3),
    st.floats(allow_nan=False),
    st.text(max_size=2),
    st.booleans(),
    st.none(),
    st.binary(max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(
        st.one_of(
            st.text(max_size=2),
            st.integers(-3, 3),
            st.tuples(st.text(max_size=1), st.integers(0, 2)),
        ),
        max_size=6,
        unique=True,
    ),
    args=st.lists(
        st.one_of(_SCALARS, st.tuples(st.text(max_size=1), st.integers(0, 2))), max_size=6
    ),
)
def test_light_legacy_tasks_mean_what_dask_makes_of_them(keys, args):
    from dask._task_spec import convert_legacy_task

    from daskvine_py.plan.graph import LegacyCall, light_dependencies

    graph = dict.fromkeys(keys, 0)
    task = (_pack, *args)
    deps = light_dependencies(task, graph)
    try:
        reference = convert_legacy_task("out", task, graph)
    except TypeError:  # something unhashable: Dask cannot take it either
        assert deps is None
        return
    if deps is None:  # left to Dask: a tuple argument that is not a key
        assert any(type(a) is tuple and a not in graph for a in args)
        return
    assert deps == frozenset(reference.dependencies)
    values = {key: ("value of", key) for key in deps}
    assert LegacyCall(task, deps)(values) == reference(values)


def test_anything_but_keys_and_scalars_is_left_to_dask():
    from daskvine_py.plan.graph import light_dependencies

    class MyInt(int):
        pass

    graph = {"x": 1, ("y", 0): 2}
    assert light_dependencies((inc, "x", ("y", 0), 1.5, None, b"b"), graph) == {"x", ("y", 0)}
    for task in [
        (inc, ["x"]),  # a list argument
        (inc, {"a": "x"}),  # a dict argument
        (inc, (inc, "x")),  # a nested task
        (inc, ("z", 0)),  # a tuple that is not a key
        (inc, MyInt(1)),  # a subclass
        "x",  # an alias
        (1, 2),  # not a task
        (),
    ]:
        assert light_dependencies(task, graph) is None, task


def _pack(*args):
    return args


def test_a_rewritten_graph_is_ordered_and_counted_anew():
    dsk = {("part", i): (inc, i) for i in range(40)}
    dsk["total"] = (sum, [("part", i) for i in range(40)])
    plan = build_plan(dsk, "total", reduction_arity=4, reduction_threshold=8)
    assert len(plan.nodes) > 41  # the sum became a tree
    assert sorted(plan.order, key=repr) == sorted(plan.nodes, key=repr)
    position = {key: i for i, key in enumerate(plan.order)}
    assert all(position[d] < position[k] for k, deps in plan.dependencies.items() for d in deps)
    assert all(len(deps) <= 4 for deps in plan.dependencies.values())  # no task reads 40
    assert sum(plan.dependents.values()) == sum(map(len, plan.dependencies.values()))
    values = {}
    for key in plan.order:
        values[key] = plan.nodes[key]({d: values[d] for d in plan.dependencies[key]})
    assert values["total"] == dask.get(dsk, "total") == sum(range(1, 41))


def test_the_linear_order_finishes_one_output_before_the_next():
    dsk = {}
    for g in range(5):
        for i in range(4):
            dsk[("leaf", g, i)] = (inc, i)
            dsk[("inc", g, i)] = (inc, ("leaf", g, i))
        dsk[("sum", g)] = (sum, [("inc", g, i) for i in range(4)])
    outputs = [("sum", g) for g in (3, 0, 4, 1, 2)]
    with mock.patch("daskvine_py.plan.graph.DASK_ORDER_LIMIT", 0):
        plan = build_plan(dsk, outputs, fuse=False)
    groups = [key[1] for key in plan.order]
    # each output's nine tasks in one stretch, in the order the outputs were asked for
    assert groups == [g for g in (3, 0, 4, 1, 2) for _ in range(9)]
    assert [key for key in plan.order if key[0] == "sum"] == outputs
    assert plan.dependents == {
        **{("leaf", g, i): 1 for g in range(5) for i in range(4)},
        **{("inc", g, i): 1 for g in range(5) for i in range(4)},
    }


# --- linear chains fused ------------------------------------------------------------------


def test_linear_chains_become_chains_of_at_most_the_limit():
    from daskvine_py.plan.fusion import FUSE_LIMIT, Chain

    n = 2 * FUSE_LIMIT + 44
    dsk = {"x0": 0, **{f"x{i}": (inc, f"x{i - 1}") for i in range(1, n)}}
    plan = build_plan(dsk, f"x{n - 1}")
    # cut every FUSE_LIMIT links; each chain named by its last link, reading the one before
    assert plan.order == [f"x{FUSE_LIMIT - 1}", f"x{2 * FUSE_LIMIT - 1}", f"x{n - 1}"]
    assert plan.dependencies == {
        f"x{FUSE_LIMIT - 1}": frozenset(),
        f"x{2 * FUSE_LIMIT - 1}": {f"x{FUSE_LIMIT - 1}"},
        f"x{n - 1}": {f"x{2 * FUSE_LIMIT - 1}"},
    }
    assert all(type(node) is Chain for node in plan.nodes.values())
    assert [len(node.links) for node in plan.nodes.values()] == [FUSE_LIMIT, FUSE_LIMIT, 44]
    values = {}
    for key in plan.order:
        values[key] = plan.nodes[key]({d: values[d] for d in plan.dependencies[key]})
    assert values[f"x{n - 1}"] == dask.get(dsk, f"x{n - 1}") == n - 1


def test_outputs_shared_results_and_joins_are_never_fused_away():
    dsk = {
        "a": 1,
        "b": (inc, "a"),  # read by c and d: stays
        "c": (inc, "b"),
        "d": (inc, "b"),
        "e": (inc, "c"),  # an output, read by f: stays
        "f": (inc, "e"),
        "g": (operator.add, "d", "f"),  # a join: its inputs are not links of it
        "h": (inc, "g"),
    }
    plan = build_plan(dsk, ["e", "h"])
    # a->b, c->e (e an output ends it), f stays alone (e is an output), g->h
    assert set(plan.nodes) == {"b", "d", "e", "f", "h"}
    assert plan.dependencies["h"] == {"d", "f"}
    assert plan.dependencies["e"] == {"b"}
    values = {}
    for key in plan.order:
        values[key] = plan.nodes[key]({d: values[d] for d in plan.dependencies[key]})
    assert pack_results(["e", "h"], values) == dask.get(dsk, ["e", "h"])


def test_a_link_that_raises_is_named_by_its_own_key():
    from daskvine_py.plan.fusion import link_key

    dsk = {"a": 1, "b": (inc, "a"), "c": (operator.truediv, "b", 0), "d": (inc, "c")}
    plan = build_plan(dsk, "d")
    assert list(plan.nodes) == ["d"]
    with pytest.raises(ZeroDivisionError) as info:
        plan.nodes["d"]({})
    assert link_key(info.value) == "c"
    # The last link is the task itself: nothing more to say.
    plan = build_plan({"a": 1, "b": (operator.truediv, "a", 0)}, "b")
    with pytest.raises(ZeroDivisionError) as info:
        plan.nodes["b"]({})
    assert link_key(info.value) is None


def test_unfusable_keys_stay_tasks_of_their_own():
    dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b"), "d": (inc, "c"), "e": (inc, "d")}
    # "c" carries settings of its own (an annotation): a -> b and d -> e fuse around it
    plan = build_plan(dsk, "e", unfusable={"c"})
    assert set(plan.nodes) == {"b", "c", "e"}
    assert plan.dependencies == {"b": frozenset(), "c": {"b"}, "e": {"c"}}
    values = {}
    for key in plan.order:
        values[key] = plan.nodes[key]({d: values[d] for d in plan.dependencies[key]})
    assert values["e"] == dask.get(dsk, "e")


def test_a_cached_run_orders_only_the_tasks_it_runs_the_others_rank_after():
    x = da.ones((8, 8), chunks=2)
    y = ((x + x.T).sum(axis=0) * 2).sum()
    graph, keys = y.__dask_graph__(), y.__dask_keys__()
    unordered = build_plan(graph, keys, fuse=False, order=False)
    assert unordered.priorities == {k: i for i, k in enumerate(unordered.order)}
    # What a rerun runs: the last stages (their inputs are the cache's hits).
    running = set(list(unordered.order)[len(unordered.order) // 2 :])
    with mock.patch("daskvine_py.plan.graph.order", wraps=dask.order.order) as ordering:
        plan = ordered(dataclasses.replace(unordered, running=running))
    assert ordering.call_count == 1  # (the part has shared inputs: dask.order ranks it)
    assert plan.order == unordered.order  # submitted inputs first, as before
    worst_running = max(plan.priorities[k] for k in running)
    assert all(plan.priorities[k] > worst_running for k in plan.nodes if k not in running)
    for key in running:  # dask.order's ranks among them: every input before its reader
        for dep in plan.dependencies[key] & running:
            assert plan.priorities[dep] < plan.priorities[key]
    # Ordered whole, it is build_plan's order.
    whole = build_plan(graph, keys, fuse=False)
    assert ordered(unordered).priorities == whole.priorities
