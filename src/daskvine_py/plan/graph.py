"""Turn whatever Dask hands a ``get`` into a plan the scheduler can run.

Dask gives a scheduler many shapes: plain dicts of legacy tuple tasks, ``HighLevelGraph``,
dicts of ``dask._task_spec`` nodes (``Task``, ``DataNode``, ``Alias``, nested containers),
and, since dask 2025.4, the expression object itself. ``build_plan`` normalises all of them
to ``GraphNode`` objects, culls to the requested keys, rejects cycles and missing keys with
errors that name them, and orders the tasks with ``dask.order``.

Legacy tasks whose arguments are all keys or scalars (``(inc, ("x", 1))``, the bulk of a
big hand-built graph) are not converted: building a ``Task`` costs several microseconds,
which for 10^5 tasks is seconds before the first task can run. They become ``LegacyCall``
objects, which hold the original tuple and run it the way its ``Task`` would.

Everything here is pure: no sockets, no processes, no serialization.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Container, Hashable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from dask._task_spec import Alias, DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from dask.order import order

from daskvine_py.errors import GraphCycleError
from daskvine_py.plan.fusion import Chain, fuse_chains

Key = Hashable

#: Largest graph ordered with ``dask.order``, whose memory-aware order costs some 20 µs
#: per task (seconds for 10^5 tasks, before anything runs). Larger graphs take the
#: depth-first topological order, which is linear and also finishes what it starts.
DASK_ORDER_LIMIT = 50_000


@dataclass(frozen=True)
class Plan:
    """A culled, ordered task graph, ready to be scheduled.

    ``nodes`` maps each needed key to its ``GraphNode``; ``dependencies`` holds, per key,
    the keys it reads; ``outputs`` are the flat requested keys (no duplicates, in order);
    ``priorities`` comes from ``dask.order`` (lower runs first); ``structure`` is the
    requested key structure, nested lists included, for packing the results. ``order``
    lists the keys by priority (every key after its dependencies) and ``dependents``
    counts, per key, the tasks that read it (keys nobody reads are absent): both come
    from the walk that culls the graph, so a big graph is not sorted or walked again
    before its first task is sent.
    """

    nodes: dict[Key, GraphNode | LegacyCall]
    dependencies: dict[Key, frozenset[Key]]
    outputs: list[Key]
    priorities: dict[Key, int]
    structure: Any
    order: list[Key]
    dependents: dict[Key, int]

    def __len__(self) -> int:
        return len(self.nodes)


class LegacyCall:
    """A legacy task ``(func, *args)`` whose arguments are keys or scalars, unconverted.

    Called with its inputs by key, it calls ``func`` with each argument that is a key
    replaced by that input: what ``convert_legacy_task`` would build, without building
    it. ``light_dependencies`` decides which tasks qualify and finds ``dependencies``.
    """

    __slots__ = ("task", "dependencies")

    def __init__(self, task: tuple, dependencies: frozenset[Key]) -> None:
        self.task = task
        self.dependencies = dependencies

    def __call__(self, values: Mapping[Key, Any]) -> Any:
        task = self.task
        if not self.dependencies:
            return task[0](*task[1:])
        deps = self.dependencies
        return task[0](*[values[arg] if arg in deps else arg for arg in task[1:]])

    def __reduce__(self) -> tuple:
        return (LegacyCall, (self.task, self.dependencies))

    def __repr__(self) -> str:
        return f"LegacyCall({self.task!r})"


#: Scalar argument types that ``convert_legacy_task`` checks against the graph's keys...
_KEY_SCALARS = frozenset({int, float, str, bool})
#: ...and scalars it passes through as they are.
_PLAIN_SCALARS = frozenset({bytes, type(None)})


def light_dependencies(value: Any, keys: Container) -> frozenset[Key] | None:
    """The dependencies of a legacy task made of keys and scalars; None for anything else.

    Exact types only: a subclass, a container, a dict or a nested task may mean something
    else to Dask, so those tasks are converted by Dask itself.
    """
    if type(value) is not tuple or not value or not callable(value[0]):
        return None
    deps = []
    for arg in value[1:]:
        kind = type(arg)
        if kind in _KEY_SCALARS:
            if arg in keys:
                deps.append(arg)
        elif kind is tuple:
            try:
                if arg not in keys:
                    return None  # a literal tuple, or a nested task
            except TypeError:  # unhashable inside
                return None
            deps.append(arg)
        elif kind not in _PLAIN_SCALARS:
            return None
    return frozenset(deps)


def convert(key: Key, value: Any, keys: Container) -> GraphNode:
    """``value`` as a ``GraphNode``, as ``convert_legacy_graph`` would make it."""
    if isinstance(value, GraphNode):
        return value
    node = convert_legacy_task(key, value, keys)
    if isinstance(node, Alias) and node.target == key:
        raise KeyError(f"task {key!r} is an alias of itself")
    if not isinstance(node, GraphNode):
        node = DataNode(key, node)
    return node


def as_mapping(dsk: Any) -> Mapping:
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


def flatten_keys(keys: Any) -> list[Key]:
    """Flatten nested lists of keys; tuples are keys themselves (``("x", 0)``)."""
    if not isinstance(keys, list):
        return [keys]
    out: list[Key] = []
    stack: list[Iterable] = [iter(keys)]
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


Rewrite = Callable[
    [dict[Key, GraphNode], dict[Key, frozenset[Key]], list[Key]],
    tuple[dict[Key, GraphNode], dict[Key, frozenset[Key]]],
]


def build_plan(
    dsk: Any,
    keys: Any,
    rewrite: Rewrite | None = None,
    fuse: bool = True,
    unfusable: Container[Key] = (),
    order: bool = True,
) -> Plan:
    """Normalise ``dsk``, cull it to ``keys``, optionally ``rewrite`` it, ``fuse`` its
    linear chains (``fusion.fuse_chains``; ``unfusable`` keys stay tasks of their own),
    and ``order`` it (``prioritized``; else its priorities are its depth-first order).

    Raises ``KeyError`` for a requested key that is not in the graph or a dependency
    that nothing produces, and ``GraphCycleError`` naming the keys of a cycle.
    ``rewrite(nodes, dependencies, outputs)`` returns a new graph computing the same
    outputs (the tree rewriting of reductions); it runs on the culled, acyclic graph.
    """
    mapping = as_mapping(dsk)
    outputs = list(dict.fromkeys(flatten_keys(keys)))
    for key in outputs:
        if key not in mapping:
            raise KeyError(key)
    nodes, dependencies, topological, readers = cull(mapping, outputs)
    if rewrite is not None:
        old_keys = nodes.keys()
        nodes, dependencies = rewrite(nodes, dependencies, outputs)
        if nodes.keys() != old_keys:  # a tree adds keys; untouched graphs keep theirs
            roots = itertools.chain(outputs, dependencies)
            _, topological, readers = depth_first(roots, dependencies.__getitem__, dependencies)
    if fuse:
        fused, dependencies, readers = fuse_chains(
            nodes, dependencies, readers, outputs, unfusable=unfusable
        )
        if fused is not nodes:
            nodes = fused
            topological = [key for key in topological if key in nodes]
    priorities = {key: i for i, key in enumerate(topological)}
    plan = Plan(nodes, dependencies, outputs, priorities, keys, topological, readers)
    return prioritized(plan) if order else plan


def prioritized(plan: Plan, running: AbstractSet[Key] | None = None) -> Plan:
    """``plan`` with ``dask.order``'s priorities, and its keys in that order.

    ``running``: only these tasks are ordered (those a cached run computes); the others
    (results the cache has, kept as lineage) rank after them in the plan's order, which
    stays the depth-first one (every key after its dependencies).
    """
    nodes, dependencies = plan.nodes, plan.dependencies
    if running is not None and len(running) < len(nodes):
        deps = {key: dependencies[key] & running for key in running}
        readers: dict[Key, int] = {}
        for found in deps.values():
            for dep in found:
                readers[dep] = readers.get(dep, 0) + 1
        ranks = _dask_order({key: nodes[key] for key in running}, deps, readers)
        if ranks is None:
            ranks = {key: i for i, key in enumerate(k for k in plan.order if k in running)}
        after = len(ranks)
        priorities = {key: ranks.get(key, after + i) for i, key in enumerate(plan.order)}
        return dataclasses.replace(plan, priorities=priorities)
    ranks = _dask_order(nodes, dependencies, plan.dependents)
    if ranks is None:
        return plan
    return dataclasses.replace(plan, priorities=ranks, order=sorted(nodes, key=ranks.__getitem__))


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
    return order(graph, dependencies=dict(dependencies))


def _as_dask_task(key: Key, node: Any, dependencies: frozenset[Key]) -> Any:
    """What dask.order is shown of a node: a chain as a task of the chain's inputs (its
    links name keys dask.order is not shown), a legacy task as it was."""
    if type(node) is Chain:
        return Task(key, _chain, *[TaskRef(dep) for dep in dependencies])
    return node.task if type(node) is LegacyCall else node


def _chain(*inputs: Any) -> None:
    """Stands for a chain in what dask.order sees; never called."""


def cull(
    graph: Mapping[Key, Any], outputs: Iterable[Key]
) -> tuple[dict[Key, GraphNode | LegacyCall], dict[Key, frozenset[Key]], list[Key], dict[Key, int]]:
    """The nodes the outputs need, their dependencies, an order and each key's readers.

    One ``depth_first`` walk from the outputs. Only the needed tasks are converted, and
    light legacy tasks not at all (``LegacyCall``).
    """
    needed: dict[Key, GraphNode | LegacyCall] = {}

    def convert_needed(key: Key) -> frozenset[Key]:
        value = graph[key]
        deps = light_dependencies(value, graph)
        if deps is not None:
            needed[key] = LegacyCall(value, deps)
            return deps
        node = needed[key] = convert(key, value, graph)
        return frozenset(node.dependencies)

    dependencies, ordered, readers = depth_first(outputs, convert_needed, graph)
    return needed, dependencies, ordered, readers


def depth_first(
    roots: Iterable[Key], dependencies_of: Callable[[Key], frozenset[Key]], known: Container
) -> tuple[dict[Key, frozenset[Key]], list[Key], dict[Key, int]]:
    """Walk from ``roots`` (in their order) through ``dependencies_of``, iteratively.

    Returns the dependencies of every key reached, the keys in post-order (each after its
    dependencies, one root's keys finished before the next root's start, which keeps few
    intermediates alive) and how many tasks read each key (keys nobody reads are absent).
    A dependency met again while its own walk is unfinished is a cycle: ``GraphCycleError``;
    one outside ``known`` is a ``KeyError`` naming both keys.
    """
    dependencies: dict[Key, frozenset[Key]] = {}
    ordered: list[Key] = []
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
