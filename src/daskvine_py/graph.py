"""Turn whatever Dask hands a ``get`` into a plan the scheduler can run.

Dask gives a scheduler many shapes: plain dicts of legacy tuple tasks, ``HighLevelGraph``,
dicts of ``dask._task_spec`` nodes (``Task``, ``DataNode``, ``Alias``, nested containers),
and, since dask 2025.4, the expression object itself. ``build_plan`` normalises all of them
to ``GraphNode`` objects, culls to the requested keys, rejects cycles and missing keys with
errors that name them, and orders the tasks with ``dask.order``.

Everything here is pure: no sockets, no processes, no serialization.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dask._task_spec import GraphNode, convert_legacy_graph
from dask.order import order

from .errors import GraphCycleError

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
    requested key structure, nested lists included, for packing the results.
    """

    nodes: dict[Key, GraphNode]
    dependencies: dict[Key, frozenset[Key]]
    outputs: list[Key]
    priorities: dict[Key, int]
    structure: Any

    def __len__(self) -> int:
        return len(self.nodes)


def as_mapping(dsk: Any) -> Mapping:
    """The task mapping behind ``dsk``: expression objects are unwrapped."""
    if isinstance(dsk, Mapping):
        return dsk
    graph = getattr(dsk, "__dask_graph__", None)
    if graph is None:
        raise TypeError(
            f"cannot schedule an object of type {type(dsk).__name__}: expected a task "
            "mapping, a HighLevelGraph or a Dask expression"
        )
    return graph()


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


def build_plan(dsk: Any, keys: Any, rewrite: Rewrite | None = None) -> Plan:
    """Normalise ``dsk``, cull it to ``keys``, optionally ``rewrite`` it, and order it.

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
    all_nodes = convert_legacy_graph(mapping)
    nodes, dependencies = cull(all_nodes, outputs)
    topological = topological_order(dependencies)
    if rewrite is not None:
        nodes, dependencies = rewrite(nodes, dependencies, outputs)
        if len(nodes) != len(topological) or nodes.keys() != set(topological):
            topological = topological_order(dependencies)
    if 1 < len(nodes) <= DASK_ORDER_LIMIT:
        priorities = order(nodes, dependencies=dict(dependencies))
    else:
        priorities = {key: i for i, key in enumerate(topological)}
    return Plan(nodes, dependencies, outputs, priorities, keys)


def cull(
    nodes: Mapping[Key, GraphNode], outputs: Iterable[Key]
) -> tuple[dict[Key, GraphNode], dict[Key, frozenset[Key]]]:
    """The nodes the outputs need, and their dependencies; iterative, no recursion."""
    needed: dict[Key, GraphNode] = {}
    dependencies: dict[Key, frozenset[Key]] = {}
    stack = list(outputs)
    while stack:
        key = stack.pop()
        if key in needed:
            continue
        node = nodes[key]
        needed[key] = node
        deps = frozenset(node.dependencies)
        dependencies[key] = deps
        for dep in deps:
            if dep not in nodes:
                raise KeyError(f"task {key!r} depends on {dep!r}, which is not in the graph")
            if dep not in needed:
                stack.append(dep)
    return needed, dependencies


def topological_order(dependencies: Mapping[Key, frozenset[Key]]) -> list[Key]:
    """Keys with every dependency before its dependents, depth first.

    Raises ``GraphCycleError`` with the keys of one cycle, if there is any. Ready keys are
    taken last-in first-out, so a dependent runs soon after its inputs: the order finishes
    what it started, which keeps few intermediates alive.
    """
    remaining = {key: len(deps) for key, deps in dependencies.items()}
    dependents: dict[Key, list[Key]] = {key: [] for key in dependencies}
    for key, deps in dependencies.items():
        for dep in deps:
            dependents[dep].append(key)
    ready = [key for key, count in remaining.items() if count == 0]
    ready.reverse()  # the first roots of the graph come out first
    ordered = []
    while ready:
        key = ready.pop()
        ordered.append(key)
        for child in dependents[key]:
            remaining[child] -= 1
            if remaining[child] == 0:
                ready.append(child)
    if len(ordered) != len(dependencies):
        stuck = {k for k, c in remaining.items() if c}
        raise GraphCycleError(_find_cycle(dependencies, stuck))
    return ordered


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
