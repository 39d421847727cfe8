"""Tree rewriting of large reductions (issue 6): pure graph in, pure graph out."""

from __future__ import annotations

import dataclasses
import functools
import operator
import sys
import types
from typing import Any

import cloudpickle
import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
import toolz
from dask._task_spec import DataNode, List, Task, TaskRef
from dask.local import get_sync
from dask.order import order
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py.plan.graph import LegacyCall, build_plan, convert
from daskvine_py.plan.rewrite import (
    _COMMUTATIVE_MARK,
    DEFAULT_ARITY,
    DEFAULT_THRESHOLD,
    associative,
    is_associative,
    rewrite_reductions,
)


def as_graph_nodes(nodes):
    """``nodes`` with every ``LegacyCall`` converted: a graph Dask's own schedulers run."""
    return {
        key: convert(key, node.task, nodes) if type(node) is LegacyCall else node
        for key, node in nodes.items()
    }


def is_commutative(func):
    """Whether ``associative(func, commutative=True)`` marked ``func``."""
    return getattr(func, _COMMUTATIVE_MARK, False) is True


# --- functions the graphs use: values are tuples of ints, so order errors show -----------


def make(i):
    return (i,)


@associative
def concat2(a, b):
    return a + b


@associative
def concat_all(*parts):
    return tuple(x for part in parts for x in part)


@associative
def concat_list(parts):
    return tuple(x for part in parts for x in part)


@associative(commutative=True)
def merge_sorted(parts):
    return tuple(sorted(x for part in parts for x in part))


def plain_concat2(a, b):
    return a + b


def plain_concat_list(parts):
    return tuple(x for part in parts for x in part)


UNMARKED = {make, plain_concat2, plain_concat_list}


def rewrite(dsk, outputs, arity=4, threshold=8):
    plan = build_plan(dsk, outputs, fuse=False)
    nodes, deps = rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs, arity, threshold)
    # Light legacy tasks as the Tasks they stand for (for get_sync), each converted once so
    # that "left alone" can still be checked by identity.
    tasks: dict[int, Any] = {}

    def converted(graph):
        return {
            key: tasks.setdefault(id(node), convert(key, node.task, graph))
            if type(node) is LegacyCall
            else node
            for key, node in graph.items()
        }

    return dataclasses.replace(plan, nodes=converted(plan.nodes)), converted(nodes), deps


def check_consistent(nodes, deps):
    assert set(nodes) == set(deps)
    for key, node in nodes.items():
        assert deps[key] == frozenset(node.dependencies), key
        assert deps[key] <= nodes.keys(), key


# --- recognised shapes -------------------------------------------------------------------


def test_delayed_sum_becomes_a_tree_with_bounded_fan_in():
    parts = [dask.delayed(make)(i, dask_key_name=f"p{i}") for i in range(100)]
    total = dask.delayed(sum)(parts, (), dask_key_name="total")
    plan, nodes, deps = rewrite(dict(total.__dask_graph__()), ["total"])
    check_consistent(nodes, deps)
    assert max(len(d) for d in deps.values()) <= 4
    assert get_sync(nodes, "total") == tuple(range(100))
    assert all(nodes[f"p{i}"] is plan.nodes[f"p{i}"] for i in range(100))
    new = set(nodes) - set(plan.nodes)
    assert ("total-tree", 0, 0) in new and all(k[0] == "total-tree" for k in new)


def test_sum_without_start_adds_the_implicit_zero_once():
    dsk = {f"x{i}": i for i in range(40)}
    dsk["s"] = (sum, [f"x{i}" for i in range(40)])
    dsk["t"] = (sum, [f"x{i}" for i in range(40)], 1000)
    _, nodes, _ = rewrite(dsk, ["s", "t"])
    assert get_sync(nodes, ["s", "t"]) == (780, 1780)


def test_delayed_chain_is_rebuilt_and_its_links_disappear():
    parts = [dask.delayed(make)(i, dask_key_name=f"p{i}") for i in range(200)]
    acc = functools.reduce(operator.add, parts)  # ((p0 + p1) + p2) + ...: 199 add tasks
    plan, nodes, deps = rewrite(dict(acc.__dask_graph__()), [acc.key])
    check_consistent(nodes, deps)
    assert get_sync(nodes, acc.key) == tuple(range(200))
    assert len(nodes) < len(plan.nodes)
    assert max(len(d) for d in deps.values()) <= 4
    # the tree is shallow: longest path from a leaf to the output
    depth = {}
    for key in sorted(nodes, key=order(nodes, dependencies=deps).get):
        depth[key] = 1 + max((depth[d] for d in deps[key]), default=0)
    assert depth[acc.key] <= 6


def test_right_deep_and_inline_chains():
    keys = [f"x{i}" for i in range(30)]
    dsk = {k: (make, i) for i, k in enumerate(keys)}
    left = keys[0]
    right = keys[-1]
    for k in keys[1:]:
        left = (operator.add, left, k)  # one task, nested inline
    for k in reversed(keys[:-1]):
        right = (concat2, k, right)
    dsk["left"], dsk["right"] = left, right
    plan, nodes, deps = rewrite(dsk, ["left", "right"])
    check_consistent(nodes, deps)
    assert get_sync(nodes, ["left", "right"]) == (tuple(range(30)), tuple(range(30)))
    assert len(deps["left"]) <= 4 and len(deps["right"]) <= 4


def test_reduce_with_and_without_initial_keeps_order():
    dsk = {f"x{i}": (make, i) for i in range(50)}
    refs = [f"x{i}" for i in range(50)]
    dsk["r"] = (functools.reduce, operator.add, refs)
    dsk["ri"] = (functools.reduce, concat2, refs, (-1,))
    dsk["u"] = (functools.reduce, plain_concat2, refs)
    plan, nodes, _ = rewrite(dsk, ["r", "ri", "u"])
    assert get_sync(nodes, ["r", "ri", "u"]) == get_sync(dsk, ["r", "ri", "u"])
    assert nodes["r"] is not plan.nodes["r"] and nodes["ri"] is not plan.nodes["ri"]
    assert nodes["u"] is plan.nodes["u"]  # plain_concat2 is not marked


def test_marked_list_and_varargs_functions():
    refs = [f"x{i}" for i in range(40)]
    dsk = {k: (make, i) for i, k in enumerate(refs)}
    dsk["l"] = (concat_list, refs)
    dsk["v"] = (concat_all, *refs)
    dsk["c"] = (merge_sorted, list(reversed(refs)))
    dsk["u"] = (plain_concat_list, refs)
    plan, nodes, deps = rewrite(dsk, ["l", "v", "c", "u"])
    check_consistent(nodes, deps)
    assert get_sync(nodes, ["l", "v", "c", "u"]) == get_sync(dsk, ["l", "v", "c", "u"])
    assert nodes["u"] is plan.nodes["u"]
    assert all(len(deps[k]) <= 4 for k in "lvc")


def test_numpy_sums_where_exact_and_not_otherwise():
    refs = [f"a{i}" for i in range(40)]
    dsk = {k: (np.full, 3, i, np.int8) for i, k in enumerate(refs)}  # int8 sums overflow: exact?
    dsk["sum"] = (np.sum, refs)
    dsk["sum0"] = Task("sum0", np.sum, List(*map(TaskRef, refs)), axis=0)
    dsk["addred"] = Task("addred", np.add.reduce, List(*map(TaskRef, refs)))
    dsk["keep"] = Task("keep", np.sum, List(*map(TaskRef, refs)), axis=0, keepdims=True)
    dsk["axis1"] = Task("axis1", np.sum, List(*map(TaskRef, refs)), axis=1)
    outs = ["sum", "sum0", "addred", "keep", "axis1"]
    plan, nodes, _ = rewrite(dsk, outs)
    for got, want in zip(get_sync(nodes, outs), get_sync(dsk, outs), strict=True):
        np.testing.assert_array_equal(got, want)
        assert np.asarray(got).dtype == np.asarray(want).dtype
    assert nodes["keep"] is plan.nodes["keep"] and nodes["axis1"] is plan.nodes["axis1"]
    assert all(nodes[k] is not plan.nodes[k] for k in ("sum", "sum0", "addred"))


def test_dict_merges_keep_later_keys_winning():
    refs = [f"d{i}" for i in range(40)]
    dsk = {k: DataNode(k, {"shared": i, k: i}) for i, k in enumerate(refs)}
    dsk["m"] = (toolz.merge, refs)
    dsk["mv"] = (toolz.merge, *refs)
    chain = refs[0]
    for k in refs[1:]:
        chain = (operator.or_, chain, k)
    dsk["or"] = chain
    plan, nodes, _ = rewrite(dsk, ["m", "mv", "or"])
    got = get_sync(nodes, ["m", "mv", "or"])
    assert got == get_sync(dsk, ["m", "mv", "or"])
    assert got[0]["shared"] == 39
    assert all(nodes[k] is not plan.nodes[k] for k in ("m", "mv", "or"))


def test_coffea_accumulate_is_known_without_importing_coffea(monkeypatch):
    module = types.ModuleType("coffea.processor.accumulator")

    def accumulate(items, accum=None):
        items = [x for x in items if x is not None]
        if accum is None:
            accum, items = items[0], items[1:]
        for x in items:
            accum = accum + x
        return accum

    module.accumulate = accumulate
    monkeypatch.setitem(sys.modules, "coffea.processor.accumulator", module)
    refs = [f"x{i}" for i in range(40)]
    dsk = {k: (make, i) for i, k in enumerate(refs)}
    dsk["acc"] = (accumulate, refs)
    dsk["acc0"] = (accumulate, refs, (-1,))
    plan, nodes, _ = rewrite(dsk, ["acc", "acc0"])
    assert get_sync(nodes, ["acc", "acc0"]) == get_sync(dsk, ["acc", "acc0"])
    assert nodes["acc"] is not plan.nodes["acc"] and nodes["acc0"] is not plan.nodes["acc0"]


# --- what is left alone ------------------------------------------------------------------


def test_dask_collections_own_tree_reductions_are_left_alone():
    x = da.ones((1000,), chunks=5).sum(split_every=8)
    b = db.from_sequence(range(2000), npartitions=400).map(make).sum()
    for obj in (x, b):
        plan = build_plan(dict(obj.__dask_graph__()), obj.__dask_keys__(), fuse=False)
        nodes, deps = rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs)
        assert nodes == plan.nodes and all(nodes[k] is plan.nodes[k] for k in nodes)
        assert deps == plan.dependencies


def test_small_reductions_and_links_with_other_readers_are_left_alone():
    refs = [f"x{i}" for i in range(20)]
    dsk = {k: (make, i) for i, k in enumerate(refs)}
    dsk["small"] = (sum, refs[:7], ())
    dsk["c1"] = (operator.add, "x0", "x1")
    prev = "c1"
    for i, k in enumerate(refs[2:]):
        dsk[f"c{i + 2}"] = (operator.add, prev, k)
        prev = f"c{i + 2}"
    dsk["reader"] = (plain_concat2, "c10", "x0")  # c10 has a second reader: the chain stops
    outs = ["small", prev, "reader", "c5"]  # c5 is an output: it stays and stops the chain
    plan, nodes, deps = rewrite(dsk, outs, arity=2, threshold=3)
    check_consistent(nodes, deps)
    assert nodes["small"] is not plan.nodes["small"]
    assert get_sync(nodes, outs) == get_sync(dsk, outs)
    for key in ("c5", "c10", "reader", prev):
        assert key in nodes
    plan, untouched, _ = rewrite(dsk, outs, arity=8, threshold=8)
    assert untouched["small"] is plan.nodes["small"]


def test_chain_through_inline_links_and_links_read_twice():
    dsk = {k: (make, i) for i, k in enumerate("abcdefg")}
    dsk["c1"] = (operator.add, (operator.add, "a", "b"), "c")  # inline, then a task
    dsk["c2"] = (operator.add, "c1", "d")
    dsk["c3"] = (operator.add, "c2", "e")
    dsk["twice"] = (operator.add, "f", "g")
    dsk["both"] = (operator.add, (operator.add, "twice", "twice"), "c3")  # reads `twice` twice
    plan, nodes, deps = rewrite(dsk, ["both"], arity=2, threshold=3)
    check_consistent(nodes, deps)
    assert get_sync(nodes, "both") == get_sync(dsk, "both")
    assert "twice" in nodes and nodes["twice"] is plan.nodes["twice"]
    assert not {"c1", "c2"} & nodes.keys()  # folded into the chain that ends at c3


def test_arity_none_turns_rewriting_off_and_bad_values_are_refused():
    dsk = {f"x{i}": i for i in range(100)}
    dsk["s"] = (sum, list(dsk))
    plan = build_plan(dsk, "s", fuse=False)
    nodes, deps = rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs, arity=None)
    assert nodes == plan.nodes and nodes is not plan.nodes and deps == plan.dependencies
    for arity, threshold in [(1, 8), (0, 8), (True, 8), (2.0, 8), (4, 1)]:
        with pytest.raises(ValueError):
            rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs, arity, threshold)


# --- keys, determinism, no mutation, integration ----------------------------------------


def test_tuple_keys_and_clashes_give_fresh_deterministic_keys():
    refs = [("x", i) for i in range(20)]
    dsk = {k: (make, k[1]) for k in refs}
    dsk[("s", 3)] = (sum, refs, ())
    dsk[("s-tree", 3, 0, 0)] = (make, -1)  # what the first inner key would be
    outs = [("s", 3), ("s-tree", 3, 0, 0)]
    _, first, _ = rewrite(dsk, outs)
    _, second, _ = rewrite(dict(dsk), outs)
    assert list(first) == list(second)
    assert ("s-tree-tree", 3, 0, 0) in first
    assert first[("s-tree", 3, 0, 0)].func is make
    assert get_sync(first, outs) == (tuple(range(20)), (-1,))


def test_long_chain_is_walked_without_recursion():
    n = 20_000
    dsk = {"x0": (0,)}
    for i in range(1, n):
        dsk[f"x{i}"] = (operator.add, f"x{i - 1}", (i,))
    plan, nodes, deps = rewrite(
        dsk, [f"x{n - 1}"], arity=DEFAULT_ARITY, threshold=DEFAULT_THRESHOLD
    )
    assert len(nodes) < n // 2
    assert get_sync(nodes, f"x{n - 1}") == tuple(range(n))


def test_marks_survive_cloudpickle_by_value_and_by_reference():
    def local_combine(a, b):  # a local function: cloudpickle sends it by value
        return a + b

    associative(local_combine, commutative=True)
    copy = cloudpickle.loads(cloudpickle.dumps(local_combine))
    assert copy is not local_combine and is_associative(copy) and is_commutative(copy)
    assert cloudpickle.loads(cloudpickle.dumps(concat2)) is concat2
    assert is_associative(concat2) and not is_commutative(concat2)
    assert is_associative(operator.add) and not is_associative(plain_concat2)


def test_builtins_cannot_be_marked():
    with pytest.raises(TypeError, match="mark a plain function"):
        associative(max)
    with pytest.raises(TypeError):
        associative(42)


# --- property tests: random graphs ---------------------------------------------------------

# Each kind: (function used, how the reduction is written). "chain" kinds build one task per
# link or nest the links inline; the rest are one task over a list (or varargs).
KINDS = [
    "sum",
    "reduce",
    "reduce_init",
    "marked_list",
    "marked_varargs",
    "marked_commutative",
    "marked_reduce",
    "unmarked_list",
    "unmarked_reduce",
    "chain_add",
    "chain_marked",
    "chain_unmarked",
    "chain_right",
]


def list_node(kind, terms):
    if kind == "sum":
        return (sum, terms, ())
    if kind == "reduce":
        return (functools.reduce, operator.add, terms)
    if kind == "reduce_init":
        return (functools.reduce, operator.add, terms, (-1,))
    if kind == "marked_list":
        return (concat_list, terms)
    if kind == "marked_varargs":
        return (concat_all, *terms)
    if kind == "marked_commutative":
        return (merge_sorted, terms)
    if kind == "marked_reduce":
        return (functools.reduce, concat2, terms)
    if kind == "unmarked_list":
        return (plain_concat_list, terms)
    return (functools.reduce, plain_concat2, terms)


@st.composite
def random_graphs(draw):
    """A legacy/Task-spec mix of leaves and reductions over earlier keys."""
    dsk = {}
    nleaves = draw(st.integers(1, 25))
    for i in range(nleaves):
        if draw(st.booleans()):
            dsk[f"leaf-{i}"] = (i,)
        else:
            dsk[f"leaf-{i}"] = (make, i)
    pool = list(dsk)
    for r in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(KINDS))
        n = draw(st.integers(1, 40))
        terms = []
        for j in range(n):
            choice = draw(st.integers(0, 9))
            if choice == 0:
                terms.append((make, 1000 * (r + 1) + j))  # inline task
            else:
                terms.append(draw(st.sampled_from(pool)))
        name = f"red-{r}"
        if kind.startswith("chain"):
            func = {"chain_unmarked": plain_concat2, "chain_marked": concat2}.get(
                kind, operator.add
            )
            inline = draw(st.booleans())
            acc = terms[0]
            for j, term in enumerate(terms[1:]):
                link = (func, term, acc) if kind == "chain_right" else (func, acc, term)
                if inline or j == len(terms) - 2:
                    acc = link
                else:
                    acc = f"{name}-link-{j}"
                    dsk[acc] = link
                    pool.append(acc)  # later reductions may read a link: it must stay
            dsk[name] = acc  # one term only: an alias of it, or its inline task
        elif draw(st.booleans()):
            dsk[name] = list_node(kind, terms)
        else:  # the same reduction in Task-spec form, as dask.delayed builds it now
            legacy = list_node(kind, terms)
            args = [
                List(*(TaskRef(t) if isinstance(t, str) else Task(None, *t) for t in a))
                if isinstance(a, list)
                else (TaskRef(a) if isinstance(a, str) else a)
                for a in legacy[1:]
            ]
            if kind == "marked_varargs":
                args = [TaskRef(t) if isinstance(t, str) else Task(None, *t) for t in terms]
            dsk[name] = Task(name, legacy[0], *args)
        pool.append(name)
    extra = draw(st.lists(st.sampled_from(pool), max_size=3, unique=True))
    outputs = list(dict.fromkeys([name, *extra]))  # the last reduction, and maybe more
    arity = draw(st.integers(2, 5))
    threshold = draw(st.integers(2, 10))
    return dsk, outputs, arity, threshold


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_rewrite_to_the_same_results(case):
    dsk, outputs, arity, threshold = case
    expected = get_sync(dsk, outputs)
    plan = build_plan(dsk, outputs, fuse=False)
    nodes_before = dict(plan.nodes)
    args_before = {k: getattr(v, "args", None) for k, v in plan.nodes.items()}
    deps_before = dict(plan.dependencies)

    nodes, deps = rewrite_reductions(
        plan.nodes, plan.dependencies, plan.outputs, arity=arity, threshold=threshold
    )
    converted = as_graph_nodes(plan.nodes)  # light legacy tasks as the Tasks they stand for

    # no mutation of the input
    assert plan.nodes == nodes_before and all(plan.nodes[k] is v for k, v in nodes_before.items())
    assert all(getattr(v, "args", None) is args_before[k] for k, v in plan.nodes.items())
    assert plan.dependencies == deps_before
    # same results, outputs kept, dependencies consistent
    check_consistent(nodes, deps)
    assert set(plan.outputs) <= nodes.keys()
    assert get_sync(as_graph_nodes(nodes), outputs) == expected
    # unmarked functions are never touched; removed keys were chain links nobody else reads
    for key, node in converted.items():
        if isinstance(node, Task) and (
            node.func in UNMARKED or (node.args and node.args[0] is plain_concat2)
        ):
            assert nodes[key] is plan.nodes[key]
        if key not in nodes:
            assert key not in plan.outputs and node.func in (operator.add, concat2)
    # new tasks read at most `arity` inputs; the same graph gives the same keys
    for key in nodes.keys() - plan.nodes.keys():
        assert len(deps[key]) <= arity
    again, _ = rewrite_reductions(plan.nodes, plan.dependencies, plan.outputs, arity, threshold)
    assert list(again) == list(nodes)
    # the result can be ordered, as the manager will do next
    if len(nodes) > 1:
        order(nodes, dependencies=deps)
