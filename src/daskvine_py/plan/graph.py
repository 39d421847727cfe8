"""Any Dask graph into one ``Plan``, read once, and the passes it goes through to run.

Dask gives a scheduler many shapes: plain dicts of legacy tuple tasks, ``HighLevelGraph``,
dicts of ``dask._task_spec`` nodes (``Task``, ``DataNode``, ``Alias``, nested containers),
and, since dask 2025.4, the expression object itself. ``read`` is the one look at what
Dask handed over: it normalises every shape to ``GraphNode`` objects (light legacy tasks
stay ``legacy.LegacyCall``), culls to the requested keys, rejects cycles and missing keys
with errors that name them, and keeps the annotations the graph form carries. Then each
pass takes the plan and returns one, in this order (``build_plan`` runs them, for
``Manager.get`` as for tests and tools):

1. ``rewritten``: large reductions as balanced trees (``rewrite``);
2. ``fused``: linear chains as one task each (``fusion``); annotated tasks stay apart;
3. ``annotated``: the annotations settled into per-task settings and user priorities;
4. the cache's pass (``cache.result_cache.Cache.prepare``, above this package, handed to
   ``build_plan``): what a cached run need not run, and the readers of what it runs;
5. ``ordered``: priorities and the submission order, decided here and nowhere else.

Everything here is pure: no sockets, no processes, no serialization.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Container, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, cast

import dask
from dask._task_spec import Alias, DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from dask.highlevelgraph import HighLevelGraph
from dask.order import order
from dask.typing import Key as DaskKey

from daskvine_py.errors import GraphCycleError
from daskvine_py.plan.annotations import (
    RunSettings,
    annotated_keys,
    reprioritize,
    settle,
    uncached_keys,
)
from daskvine_py.plan.annotations import read as read_annotations
from daskvine_py.plan.fusion import Chain, fuse_chains
from daskvine_py.plan.legacy import Key, LegacyCall, light_dependencies
from daskvine_py.plan.rewrite import DEFAULT_THRESHOLD, may_reduce, rewrite_reductions

__all__ = [
    "DASK_ORDER_LIMIT",
    "EARLY_EVERY",
    "Early",
    "Key",
    "LegacyCall",
    "Node",
    "Pass",
    "Plan",
    "Seen",
    "annotated",
    "as_mapping",
    "build_plan",
    "convert",
    "cull",
    "depth_first",
    "flatten_keys",
    "fused",
    "light_dependencies",
    "ordered",
    "pack_results",
    "read",
    "rewritten",
]

#: Largest graph ordered with ``dask.order``, whose memory-aware order costs some 20 µs
#: per task (seconds for 10^5 tasks, before anything runs). Larger graphs take the
#: depth-first topological order, which is linear and also finishes what it starts.
DASK_ORDER_LIMIT = 50_000

#: What a plan's task is: a Dask node, a light legacy task, or a fused chain.
Node = GraphNode | LegacyCall | Chain

#: What sees the keys of a big graph as ``read`` finds them: ``early(size, annotated)``
#: (the graph's tasks, whether it carries annotations) returns None or a ``Seen``, which
#: is called every ``EARLY_EVERY`` keys with the keys done so far (each after its
#: dependencies: the walk's order) and the nodes and dependencies found so far, until it
#: returns False. The manager submits a big graph's first tasks this way (``streaming``).
Seen = Callable[[list[Key], dict[Key, Node], dict[Key, frozenset[Key]]], bool]
Early = Callable[[int, bool], Seen | None]
EARLY_EVERY = 4096


@dataclass(frozen=True)
class Plan:
    """A culled task graph and what the passes made of it: the one record ``get`` runs.

    Passes never mutate a plan: each returns a new one (``dataclasses.replace``), sharing
    what it did not change.
    """

    #: each needed key's task
    nodes: dict[Key, Node]
    #: per key, the keys it reads
    dependencies: dict[Key, frozenset[Key]]
    #: the flat requested keys (no duplicates, in order)
    outputs: list[Key]
    #: the requested key structure, nested lists included, for packing the results
    structure: Any
    #: every key after its dependencies: the depth-first walk's order until ``ordered``
    #: makes it the priorities' (the walk that culls provides it, so a big graph is not
    #: sorted or walked again before its first task is sent)
    order: list[Key]
    #: per key, the tasks that read it (absent: none); after the cache's pass, only the
    #: tasks that will run
    dependents: dict[Key, int]
    #: per key, its rank (lower runs first): set by ``ordered`` ({} before)
    priorities: dict[Key, int] = field(default_factory=dict)
    #: the annotations the graph carried, ``{annotation: {key: value}}`` ({}: none)
    annotations: Mapping[str, Mapping[Key, Any]] = field(default_factory=dict)
    #: what the annotations ask of the scheduler beyond priorities (``annotated``)
    settings: RunSettings | None = None
    #: priorities users annotated, which ``ordered`` puts first (``annotated``)
    user_priorities: Mapping[Key, float] = field(default_factory=dict)
    #: the tasks that will run, set by the cache's pass (None: all of them)
    running: AbstractSet[Key] | None = None
    #: the cache's pass's record for submission and the state, ``CachedRun`` (the cache
    #: is above this package, which cannot name it); None for a run without the cache
    cache: Any = None

    def __len__(self) -> int:
        return len(self.nodes)


def convert(key: Key, value: Any, keys: Container[Key]) -> GraphNode:
    """``value`` as a ``GraphNode``, as ``convert_legacy_graph`` would make it."""
    if isinstance(value, GraphNode):
        return value
    node = convert_legacy_task(cast(DaskKey, key), value, keys)
    if isinstance(node, Alias) and node.target == key:
        raise KeyError(f"task {key!r} is an alias of itself")
    if not isinstance(node, GraphNode):
        node = DataNode(key, node)
    return node


def as_mapping(dsk: Any) -> Mapping[Key, Any]:
    """The task mapping behind ``dsk``: expression objects are unwrapped."""
    if isinstance(dsk, dict):
        return dsk
    if isinstance(dsk, Mapping):
        to_dict = getattr(dsk, "to_dict", None)  # a HighLevelGraph: one pass over layers
        return to_dict() if to_dict is not None else dict(dsk)
    graph = getattr(dsk, "__dask_graph__", None)
    if graph is None:
        raise TypeError(
            f"cannot schedule an object of type {type(dsk).__name__}: expected a task "
            "mapping, a HighLevelGraph or a Dask expression"
        )
    return as_mapping(graph())


_UNKNOWN = object()


def skip_delayed_cull(dsk: Any) -> None:
    """Give the expression ``dask.compute`` hands over for ``dask.delayed`` objects its
    optimized graph without their optimizer's cull, which ``read`` does once anyway.

    ``dask.delayed.optimize`` culls the graph of each group of delayed objects layer by
    layer, each layer against all the keys asked for: with one layer per object,
    10,000 objects cost about 4.3 s on the development machine (0.002 s without), the most
    of such a ``compute`` and of Dask's own schedulers' too. Only that optimizer is
    skipped, and only while ``optimization.fuse.delayed`` is off (its only other step);
    any other collection's optimizer runs as Dask would run it. An expression of another
    shape (another version of Dask) is left alone."""
    if type(dsk).__name__ != "_HLGExprSequence" or "_optimized_dsk" in vars(dsk):
        return
    delayed = sys.modules.get("dask.delayed")
    cull_only = getattr(delayed, "optimize", None)
    if cull_only is None or dask.config.get("optimization.fuse.delayed", False):
        return
    graphs = []
    for group in getattr(dsk, "operands", ()):
        hlg = getattr(group, "hlg", None)
        optimizer: Any = getattr(group, "low_level_optimizer", _UNKNOWN)
        if not isinstance(hlg, HighLevelGraph) or optimizer is _UNKNOWN:
            return
        if optimizer is not None and optimizer is not cull_only:
            hlg = optimizer(hlg, group.__dask_keys__())
        graphs.append(hlg)
    if graphs:
        vars(dsk)["_optimized_dsk"] = HighLevelGraph.merge(*graphs)  # (a cached property)


def flatten_keys(keys: Any) -> list[Key]:
    """Flatten nested lists of keys; tuples are keys themselves (``("x", 0)``)."""
    if not isinstance(keys, list):
        return [keys]
    out: list[Key] = []
    stack: list[Iterable[Any]] = [iter(keys)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def pack_results(structure: Any, values: Mapping[Key, Any]) -> Any:
    """Results in the shape of the requested keys: nested lists become tuples.

    This is the convention of Dask's own schedulers (``nested_get``).
    """
    if isinstance(structure, list):
        return tuple(pack_results(item, values) for item in structure)
    return values[structure]


# -- the read and the passes ------------------------------------------------------------


def read(dsk: Any, keys: Any, early: Early | None = None) -> Plan:
    """The plan of ``keys`` in ``dsk``: the one read of what Dask handed over.

    Raises ``KeyError`` for a requested key that is not in the graph or a dependency
    that nothing produces, and ``GraphCycleError`` naming the keys of a cycle (after
    ``early`` saw the keys found before it, if it was given; see ``Early``).
    """
    skip_delayed_cull(dsk)
    found = read_annotations(dsk)  # before the mapping: a HighLevelGraph's layers
    mapping = as_mapping(dsk)
    outputs = list(dict.fromkeys(flatten_keys(keys)))
    for key in outputs:
        if key not in mapping:
            raise KeyError(key)
    seen = None if early is None else early(len(mapping), bool(found))
    nodes, dependencies, topological, readers = cull(mapping, outputs, seen)
    return Plan(nodes, dependencies, outputs, keys, topological, readers, annotations=found)


def rewritten(plan: Plan, arity: int | None, threshold: int = DEFAULT_THRESHOLD) -> Plan:
    """``plan`` with its reductions of at least ``threshold`` inputs as trees of
    ``arity`` inputs per task (``rewrite.rewrite_reductions``); None: as it is."""
    if arity is None or len(plan.nodes) <= threshold:  # too small to hold such a reduction
        return plan
    if _only_light(plan.nodes.values()):  # a big hand-built graph: no copy, no walk
        return plan
    nodes, dependencies = rewrite_reductions(
        plan.nodes, plan.dependencies, plan.outputs, arity, threshold
    )
    return _regraphed(plan, nodes, dependencies)


def _only_light(nodes: Iterable[Node]) -> bool:
    """Whether every task is a light legacy task calling neither a known reducer nor a
    marked function: ``rewrite_reductions`` would leave such a graph as it is."""
    if any(type(node) is not LegacyCall for node in nodes):
        return False
    try:
        funcs = {cast(LegacyCall, node).task[0] for node in nodes}
    except TypeError:  # an unhashable callable: let the rewrite look at every task
        return False
    return not may_reduce(funcs)


def fused(plan: Plan, keep: AbstractSet[Key] = frozenset()) -> Plan:
    """``plan`` with its linear chains as one task each (``fusion.fuse_chains``).

    Annotated tasks keep their own settings, and ``keep`` (the cache's ``cache=False``
    tasks) their own runs: neither is ever a link of a chain.
    """
    unfusable = annotated_keys(plan.annotations) if plan.annotations else set()
    if keep:
        unfusable |= keep
    nodes, dependencies, readers = fuse_chains(
        plan.nodes, plan.dependencies, plan.dependents, plan.outputs, unfusable=unfusable
    )
    if nodes is plan.nodes:
        return plan
    order = [key for key in plan.order if key in nodes]
    return dataclasses.replace(
        plan, nodes=nodes, dependencies=dependencies, dependents=readers, order=order
    )


def annotated(plan: Plan) -> Plan:
    """``plan`` with its annotations settled for its tasks: the ``settings`` the scheduler
    applies and the ``user_priorities`` that ``ordered`` puts first.

    Run after the passes that change the tasks, so that the settings name the tasks that
    run. Raises ``ValueError`` naming the key and the annotation for a value that means
    nothing here (``annotations.settle``).
    """
    if not plan.annotations:
        return plan
    user, settings = settle(plan.annotations, plan.nodes)
    if not user and settings is None:
        return plan
    return dataclasses.replace(plan, settings=settings, user_priorities=user)


def ordered(plan: Plan) -> Plan:
    """``plan`` with its priorities, and its keys in that order: the one place it is decided.

    ``dask.order`` ranks the tasks that run (``plan.running``; all when None); the
    others (results a cached run has, kept as lineage) rank after them in the plan's
    order, which then stays the depth-first one (every key after its dependencies).
    Annotated priorities go first (``annotations.reprioritize``).
    """
    nodes, dependencies, running = plan.nodes, plan.dependencies, plan.running
    keys = plan.order
    if running is not None and len(running) < len(nodes):
        deps = {key: dependencies[key] & running for key in running}
        readers: dict[Key, int] = {}
        for found in deps.values():
            for dep in found:
                readers[dep] = readers.get(dep, 0) + 1
        ranks = _dask_order({key: nodes[key] for key in running}, deps, readers)
        if ranks is None:
            ranks = {key: i for i, key in enumerate(k for k in keys if k in running)}
        after = len(ranks)
        priorities = {key: ranks.get(key, after + i) for i, key in enumerate(keys)}
    else:
        ranks = _dask_order(nodes, dependencies, plan.dependents)
        if ranks is None:
            priorities = {key: i for i, key in enumerate(keys)}
        else:
            priorities, keys = ranks, sorted(nodes, key=ranks.__getitem__)
    if plan.user_priorities:
        priorities = reprioritize(priorities, plan.user_priorities)
    return dataclasses.replace(plan, priorities=priorities, order=keys)


#: A pass of a layer above this package (the cache's, ``Cache.prepare``): takes the plan
#: and returns one.
Pass = Callable[[Plan], Plan]


def build_plan(
    dsk: Any,
    keys: Any,
    *,
    early: Early | None = None,
    reduction_arity: int | None = None,
    reduction_threshold: int = DEFAULT_THRESHOLD,
    fuse: bool | None = None,
    unfusable: AbstractSet[Key] = frozenset(),
    cache: Pass | None = None,
    order: bool = True,
) -> Plan:
    """The plan of ``keys`` in ``dsk``: ``read``, then the passes in their order, the one
    pipeline ``Manager.get`` runs and tests and tools call.

    ``early`` sees the keys as the read finds them (``Early``); ``reduction_arity`` and
    ``reduction_threshold`` rewrite large reductions (``rewritten``; None: no rewrite);
    ``fuse`` fuses linear chains (None: unless the cache's pass runs, whose tasks are
    cached one by one), leaving alone ``unfusable`` keys (read after the read, so a set
    ``early`` fills counts) and, in a cached run, the tasks marked ``cache=False``;
    annotations are then settled (``annotated``); ``cache`` is the cache's pass; and
    ``order`` decides the priorities (``ordered``; False: the depth-first order, for tests).
    """
    plan = read(dsk, keys, early)
    if not plan.outputs:
        return plan
    plan = rewritten(plan, reduction_arity, reduction_threshold)
    if fuse if fuse is not None else cache is None:
        keep = unfusable
        if cache is not None and plan.annotations:  # cached one by one, never in a chain
            keep = keep | uncached_keys(plan.annotations)
        plan = fused(plan, keep)
    plan = annotated(plan)
    if cache is not None:
        plan = cache(plan)
    if order:
        return ordered(plan)
    return dataclasses.replace(plan, priorities={key: i for i, key in enumerate(plan.order)})


def _regraphed(plan: Plan, nodes: dict[Key, Node], dependencies: dict[Key, frozenset[Key]]) -> Plan:
    """``plan`` with a new graph computing the same outputs; walked again only when
    its keys changed (a rewritten tree adds keys, an untouched graph keeps its own)."""
    if nodes.keys() == plan.nodes.keys():
        return dataclasses.replace(plan, nodes=nodes, dependencies=dependencies)
    roots = itertools.chain(plan.outputs, dependencies)
    _, order, readers = depth_first(roots, dependencies.__getitem__, dependencies)
    return dataclasses.replace(
        plan, nodes=nodes, dependencies=dependencies, order=order, dependents=readers
    )


def _dask_order(
    nodes: Mapping[Key, Any], dependencies: Mapping[Key, frozenset[Key]], readers: Mapping[Key, int]
) -> dict[Key, int] | None:
    """``dask.order``'s priorities; None where the depth-first order does as well.

    Independent tasks, and trees where every result has one reader, need no ordering
    beyond the depth-first walk's, which finishes each subtree before the next one
    (dask.order would spend some 5-20 µs a task finding that out).
    """
    if not 1 < len(nodes) <= DASK_ORDER_LIMIT or max(readers.values(), default=0) <= 1:
        return None
    # dask.order reads the tasks themselves: it gets legacy tuples as they were.
    graph = {k: _as_dask_task(k, v, dependencies[k]) for k, v in nodes.items()}
    return cast(dict[Key, int], order(cast(Any, graph), dependencies=cast(Any, dependencies)))


def _as_dask_task(key: Key, node: Any, dependencies: frozenset[Key]) -> Any:
    """What dask.order is shown of a node: a chain as a task of the chain's inputs (its
    links name keys dask.order is not shown), a legacy task as it was."""
    if type(node) is Chain:
        return Task(key, _chain, *[TaskRef(cast(DaskKey, dep)) for dep in dependencies])
    return node.task if type(node) is LegacyCall else node


def _chain(*inputs: Any) -> None:
    """Stands for a chain in what dask.order sees; never called."""


def cull(
    graph: Mapping[Key, Any], outputs: Iterable[Key], early: Seen | None = None
) -> tuple[dict[Key, Node], dict[Key, frozenset[Key]], list[Key], dict[Key, int]]:
    """The nodes the outputs need, their dependencies, an order and each key's readers.

    One ``depth_first`` walk from the outputs. Only the needed tasks are converted, and
    light legacy tasks not at all (``LegacyCall``). ``early``: see ``Early``.
    """
    needed: dict[Key, Node] = {}

    def convert_needed(key: Key) -> frozenset[Key]:
        value = graph[key]
        deps = light_dependencies(value, graph)
        if deps is not None:
            needed[key] = LegacyCall(value, deps)
            return deps
        node = needed[key] = convert(key, value, graph)
        return frozenset(node.dependencies)

    def seen(done: list[Key], dependencies: dict[Key, frozenset[Key]]) -> bool:
        assert early is not None
        return early(done, needed, dependencies)

    dependencies, ordered, readers = depth_first(
        outputs, convert_needed, graph, None if early is None else seen
    )
    return needed, dependencies, ordered, readers


def depth_first(
    roots: Iterable[Key],
    dependencies_of: Callable[[Key], frozenset[Key]],
    known: Container[Key],
    early: Callable[[list[Key], dict[Key, frozenset[Key]]], bool] | None = None,
) -> tuple[dict[Key, frozenset[Key]], list[Key], dict[Key, int]]:
    """Walk from ``roots`` (in their order) through ``dependencies_of``, iteratively.

    Returns the dependencies of every key reached, the keys in post-order (each after its
    dependencies, one root's keys finished before the next root's start, which keeps few
    intermediates alive) and how many tasks read each key (keys nobody reads are absent).
    A dependency met again while its own walk is unfinished is a cycle: ``GraphCycleError``;
    one outside ``known`` is a ``KeyError`` naming both keys. ``early(keys done so far,
    dependencies)`` is called every ``EARLY_EVERY`` keys until it returns False.
    """
    dependencies: dict[Key, frozenset[Key]] = {}
    ordered: list[Key] = []
    mark = EARLY_EVERY if early is not None else -1
    listed: set[Key] = set()
    readers: dict[Key, int] = {}
    for root in roots:
        if root in dependencies:
            continue
        deps = dependencies[root] = dependencies_of(root)
        stack = [(root, iter(deps))]
        while stack:
            key, unvisited = stack[-1]
            for dep in unvisited:
                readers[dep] = readers.get(dep, 0) + 1
                if dep in dependencies:
                    if dep not in listed:  # on the current path: a loop
                        path = [k for k, _ in stack]
                        stuck = set(path[path.index(dep) :])
                        raise GraphCycleError(_find_cycle(dependencies, stuck))
                    continue
                if dep not in known:
                    raise KeyError(f"task {key!r} depends on {dep!r}, which is not in the graph")
                deps = dependencies[dep] = dependencies_of(dep)
                stack.append((dep, iter(deps)))
                break
            else:
                stack.pop()
                listed.add(key)
                ordered.append(key)
                if len(ordered) == mark:
                    assert early is not None
                    mark = mark + EARLY_EVERY if early(ordered, dependencies) else -1
    return dependencies, ordered, readers


def _find_cycle(dependencies: Mapping[Key, frozenset[Key]], stuck: set[Key]) -> list[Key]:
    """Walk dependencies among stuck keys until one repeats: that loop is a cycle."""
    key = next(iter(stuck))
    path: list[Key] = []
    seen: dict[Key, int] = {}
    while key not in seen:
        seen[key] = len(path)
        path.append(key)
        key = next(dep for dep in dependencies[key] if dep in stuck)
    cycle = path[seen[key] :]
    cycle.reverse()  # list the cycle in execution order: dependency before dependent
    return cycle + [cycle[0]]
