"""Rewrite large associative reductions as balanced trees before scheduling.

Users do not always write trees: ``dask.delayed(sum)(parts)``, ``functools.reduce(operator.add,
parts)`` or ``acc = acc + part`` in a loop reach the scheduler as one task gathering thousands of
inputs, or as a chain thousands of tasks deep. Either way one worker ends up holding every input
at once (the TaskVine study saw 700 GB of cache and failed workers). This module finds two
shapes and rebuilds them as trees whose tasks read at most ``arity`` inputs each:

- a **flat fan-in**: one task applying a known reducer to a list of at least ``threshold``
  dependencies: ``sum(parts[, start])``, ``functools.reduce(op, parts[, initial])`` with an
  associative ``op``, ``numpy.sum(parts)`` / ``numpy.add.reduce(parts)`` along axis 0 or None,
  ``toolz.merge``, Coffea's ``accumulate``, and any function marked with :func:`associative`
  called as ``f(parts, **options)`` or ``f(*parts, **options)``;
- a **chain**: ``((a + b) + c) + d ...`` of one binary associative function (``operator.add``,
  ``mul``, ``and_``, ``or_``, ``xor``, ``concat``, ``numpy.add``, ``toolz.merge``, Coffea's
  ``add`` or a marked function), at least ``threshold`` operands long, across tasks (each link
  its own key, as ``dask.delayed`` builds it) or nested inside one task (legacy tuples).

Leaves keep their order, so a function that is associative but not commutative (list or tuple
concatenation, dict merges where later keys win) gives the same result. Integer sums are exact;
floating-point sums are regrouped too, so they may differ in the last bits, as with Dask's own
``split_every``. The reduced key keeps its name and its value; the interior links of a rewritten
chain disappear (nothing else read them); new keys are derived from the reduced key, its tree
level and an index, so the same graph always rewrites to the same keys. Only known or marked
functions are ever touched. Pure: it builds new ``GraphNode`` objects, never mutates its inputs.
"""

from __future__ import annotations

import builtins
import functools
import operator
import sys
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar, cast, overload

from dask._task_spec import Alias, GraphNode, List, Task, TaskRef, Tuple, convert_legacy_task
from dask.typing import Key as DaskKey

from daskvine_py.plan.legacy import Key, LegacyCall

__all__ = [
    "DEFAULT_ARITY",
    "DEFAULT_THRESHOLD",
    "associative",
    "is_associative",
    "may_reduce",
    "rewrite_reductions",
]

#: Inputs per task of a rewritten tree. Smaller bounds each reduction's memory more tightly
#: (about arity + 1 values alive) but makes the tree deeper: more tasks, and more levels on
#: the critical path, each a round trip and a transfer once workers are remote. Measured with
#: benchmarks/bench_rewrite.py (2 cores, Dask's threaded scheduler, one ``sum`` over 2,000
#: histograms of 8 MB; without rewriting it holds all 16 GB at once): arity 2 made 3,999
#: tasks and took 19.8 s (peak 124 MB), 4 took 13.7 s (159 MB), 8 took 13.7 s (231 MB), 16
#: took 20.7 s (326 MB). 4 and 8 tie on time here; 8 needs 4 levels for 2,000 inputs where
#: 4 needs 6, which is what counts across a network. See docs/rewrite.md.
DEFAULT_ARITY = 8

#: Fewest inputs a reduction needs before it is rewritten. It sits well above the fan-ins
#: Dask's collections already emit (``split_every`` is 4 per axis for arrays, 8 for bags and
#: dataframes, users rarely go past 16), so their trees are left alone, and low enough that a
#: few dozen large histograms never meet on one worker.
DEFAULT_THRESHOLD = 32

_ASSOCIATIVE_MARK = "_daskvine_associative"
_COMMUTATIVE_MARK = "_daskvine_commutative"

_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def associative(func: _F, *, commutative: bool = False) -> _F: ...


@overload
def associative(func: None = None, *, commutative: bool = False) -> Callable[[_F], _F]: ...


def associative(func: Any = None, *, commutative: bool = False) -> Any:
    """Mark ``func`` as associative, so large reductions with it may become trees.

    Use it bare (``@associative``) or with arguments (``@associative(commutative=True)``).
    The mark promises that regrouping does not change the result, in the form the function is
    called in the graph::

        f(a, f(b, c)) == f(f(a, b), c)                  # binary, in chains or functools.reduce
        f([*xs, *ys]) == f([f(xs), f(ys)])              # one list argument
        f(*xs, *ys) == f(f(*xs), f(*ys))                # many positional arguments

    Keyword arguments are passed unchanged to every call of the tree, so they must be
    options, not data (a start value belongs in ``sum``'s ``start``, not here). The order of
    the operands is always kept; ``commutative=True`` records on ``func`` that it need not be
    (nothing reads that yet).

    The mark is an attribute of the function itself, so it travels with cloudpickle whether
    the function is pickled by reference or by value. Returns ``func`` unchanged.
    """

    def mark(f: _F) -> _F:
        if not callable(f):
            raise TypeError(f"associative() needs a callable, not {type(f).__name__}")
        try:
            setattr(f, _ASSOCIATIVE_MARK, True)
            setattr(f, _COMMUTATIVE_MARK, bool(commutative))
        except (AttributeError, TypeError) as exc:
            raise TypeError(
                f"cannot mark {f!r} as associative: it takes no attributes (a builtin or a "
                "bound method?); mark a plain function that calls it instead"
            ) from exc
        return f

    return mark if func is None else mark(func)


def may_reduce(funcs: Iterable[Any]) -> bool:
    """Whether a legacy task calling one of ``funcs`` may be rewritten: a known or marked one."""
    known = _Known()
    return any(known.kind(f) or _marked(f) for f in funcs)


def is_associative(func: Any) -> bool:
    """Whether ``func`` is marked associative or is a known associative binary function."""
    return _Known().binary(func)


def rewrite_reductions(
    nodes: Mapping[Key, Any],
    dependencies: Mapping[Key, frozenset[Key]],
    outputs: Iterable[Key],
    arity: int | None = DEFAULT_ARITY,
    threshold: int = DEFAULT_THRESHOLD,
) -> tuple[dict[Key, Any], dict[Key, frozenset[Key]]]:
    """Return new ``(nodes, dependencies)`` where large reductions are balanced trees.

    ``nodes`` and ``dependencies`` are a (possibly culled) graph as ``graph.read``
    makes it; ``outputs`` are the keys the caller will read, which are never removed or
    changed in value. A reduction over at least ``threshold`` inputs, and more than
    ``arity``, becomes a tree whose tasks read at most ``arity`` inputs each. ``arity=None``
    turns rewriting off. The inputs are never mutated; nodes that are not rewritten are the
    same objects in the result, and every new entry of ``dependencies`` equals its node's
    ``dependencies``.
    """
    if arity is None:
        return dict(nodes), dict(dependencies)
    if not isinstance(arity, int) or isinstance(arity, bool) or arity < 2:
        raise ValueError(f"arity must be an integer >= 2 or None, not {arity!r}")
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 2:
        raise ValueError(f"threshold must be an integer >= 2, not {threshold!r}")
    if len(nodes) <= threshold:  # too small to hold a reduction of ``threshold`` inputs
        return dict(nodes), dict(dependencies)
    known = _Known()
    # Light legacy tasks (graph.LegacyCall) are left unconverted; those calling a known or
    # marked function may be reductions and become Tasks here.
    converted: dict[Key, Any] = {
        key: cast(GraphNode, convert_legacy_task(cast(DaskKey, key), node.task, nodes))
        for key, node in nodes.items()
        if type(node) is LegacyCall and (known.kind(node.task[0]) or _marked(node.task[0]))
    }
    original = nodes
    if converted:
        nodes = {**nodes, **converted}
    graph = _Graph(nodes, dependencies, outputs, known)

    trees: dict[Key, list[Task]] = {}
    absorbed: set[Key] = set()
    taken = set(nodes)
    for key, node in nodes.items():
        if type(node) is not Task:
            continue
        reduction = _match_fan_in(node, graph.known)
        if not _worth_a_tree(reduction, arity, threshold):
            reduction = None
            if _is_link(node, graph.known) and not graph.is_interior(key):
                reduction = graph.match_chain(key, node)
        if reduction is not None and _worth_a_tree(reduction, arity, threshold):
            trees[key] = _build_tree(key, reduction, arity, taken)
            absorbed.update(reduction.absorbed)

    new_nodes: dict[Key, Any] = {}
    new_dependencies: dict[Key, frozenset[Key]] = {}
    for key, node in original.items():  # untouched nodes stay the same objects
        if key in absorbed:
            continue
        for task in trees.get(key, ()):
            new_nodes[task.key] = task
            new_dependencies[task.key] = frozenset(task.dependencies)
        if key not in trees:
            new_nodes[key] = node
            deps = dependencies.get(key)
            new_dependencies[key] = frozenset(node.dependencies) if deps is None else deps
    return new_nodes, new_dependencies


# --- recognising reductions -------------------------------------------------------------


@dataclass(frozen=True)
class _Reduction:
    """A reduction found in the graph, and how to rebuild it one level at a time."""

    #: The operands in order: references, inline tasks or literals.
    terms: tuple[Any, ...]
    #: What ``threshold`` is compared with: operands that read other keys for a flat
    #: fan-in (a sum of literals gathers nothing), all operands for a chain (its depth).
    fan_in: int
    #: Builds one inner task of the tree: (new key, a run of operands) -> task.
    group: Callable[[Key, Sequence[Any]], Task]
    #: Rebuilds the reduced key itself over the partial results.
    root: Callable[[Sequence[Any]], Task]
    #: Keys of chain links that the rewritten tree replaces.
    absorbed: tuple[Key, ...] = ()


def _marked(func: Any) -> bool:
    try:
        return getattr(func, _ASSOCIATIVE_MARK, False) is True
    except Exception:  # an object whose __getattr__ raises something odd is simply unmarked
        return False


class _Known:
    """The known reducers that are loaded right now, looked up by identity.

    Optional libraries are found in ``sys.modules`` and never imported: a graph can only
    hold one of their functions if the library is already loaded.
    """

    __slots__ = ("kinds", "numpy_add")

    def __init__(self) -> None:
        #: id(function) -> (function, kind); the function is kept to check identity.
        self.kinds: dict[int, tuple[Any, str]] = {}
        numpy = sys.modules.get("numpy")
        coffea = sys.modules.get("coffea.processor.accumulator")
        #: numpy.add.reduce is a new bound method at every access: it is known by its owner.
        self.numpy_add = getattr(numpy, "add", None)
        entries = [
            (builtins.sum, "sum"),
            (functools.reduce, "reduce"),
            (getattr(numpy, "sum", None), "numpy"),
            (getattr(coffea, "accumulate", None), "accumulate"),
            *((getattr(sys.modules.get(name), "merge", None), "merge") for name in _TOOLZ),
            *((op, "binary") for op in _OPERATORS),
            (self.numpy_add, "binary"),
            (getattr(coffea, "add", None), "binary"),
        ]
        for func, kind in entries:
            if func is not None:
                self.kinds[id(func)] = (func, kind)

    def kind(self, func: Any) -> str | None:
        entry = self.kinds.get(id(func))
        if entry is not None and entry[0] is func:
            return entry[1]
        if (
            self.numpy_add is not None
            and type(func) is types.BuiltinMethodType
            and func.__self__ is self.numpy_add
            and func.__name__ == "reduce"
        ):
            return "numpy"
        return None

    def binary(self, func: Any) -> bool:
        """Whether ``func(a, b)`` is associative: known or marked."""
        return self.kind(func) in ("binary", "merge") or _marked(func)


#: Associative for every type they accept (concatenation and dict merges keep order).
#: ``iadd`` and friends are left out: folding them would mutate inputs other tasks read.
_OPERATORS = (
    operator.add,
    operator.mul,
    operator.and_,
    operator.or_,
    operator.xor,
    operator.concat,
)
_TOOLZ = ("toolz", "cytoolz")


def _same_func(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:  # bound methods are new objects at each access but compare equal
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _legacy_sequence_func() -> Any:
    """The function Dask wraps a legacy list argument in (a private helper of Dask).

    Asking ``convert_legacy_task`` once avoids naming that helper; if Dask later builds a
    ``List`` container instead, there is no legacy form to recognise.
    """
    probe = convert_legacy_task(None, ["x", "x"], {"x"})
    return probe.func if type(probe) is Task else None


_LEGACY_SEQUENCE = _legacy_sequence_func()


def _sequence(obj: Any) -> tuple[tuple[Any, ...], type] | None:
    """The items of a list or tuple argument, and the container that rebuilds it."""
    if type(obj) is List:
        return tuple(obj.args), List
    if type(obj) is Tuple:
        return tuple(obj.args), Tuple
    if (
        _LEGACY_SEQUENCE is not None
        and type(obj) is Task
        and obj.key is None
        and obj.func is _LEGACY_SEQUENCE
        and len(obj.kwargs) == 1
        and obj.kwargs.get("typ") in (list, tuple)
    ):
        return tuple(obj.args), List if obj.kwargs["typ"] is list else Tuple
    return None


def _reads_keys(term: Any) -> bool:
    return isinstance(term, TaskRef) or (isinstance(term, GraphNode) and bool(term.dependencies))


def _reference(term: Any) -> Key | None:
    """The key that ``term`` stands for, if it is a plain reference to one."""
    if isinstance(term, TaskRef):
        return term.key
    if type(term) is Alias:
        return term.target
    return None


def _reads(term: Any, key: Key) -> bool:
    """Whether evaluating ``term`` reads ``key``."""
    if isinstance(term, TaskRef):
        return term.key == key
    return isinstance(term, GraphNode) and key in term.dependencies


def _fold(key: Key, func: Any, terms: Sequence[Any]) -> Task:
    """``functools.reduce(func, [t0, t1, ...])``: a left fold keeps operand order.

    One flat task rather than ``func(func(t0, t1), t2)`` nested inline: building dask
    ``Task`` objects dominates the cost of a rewrite, and this needs two per run, not arity.
    """
    return Task(key, functools.reduce, func, List(*terms))


def _match_fan_in(node: Task, known: _Known) -> _Reduction | None:
    """A flat reduction ``node`` computes, or None."""
    func, args, kwargs = node.func, node.args, node.kwargs
    kind = known.kind(func)
    if kind is None and not _marked(func):
        return None  # the common case: most tasks are neither known nor marked
    producer = node.data_producer

    def replacing(position: int, container: type) -> Callable[[Sequence[Any]], Task]:
        # The reduced key keeps its call, start value included; only the list changes.
        def root(partials: Sequence[Any]) -> Task:
            new_args = (*args[:position], container(*partials), *args[position + 1 :])
            return Task(node.key, func, *new_args, _data_producer=producer, **kwargs)

        return root

    def list_form(position: int, group: Callable[[Key, Sequence[Any]], Task]) -> _Reduction | None:
        found = _sequence(args[position]) if len(args) > position else None
        if found is None:
            return None
        terms, container = found
        fan_in = sum(map(_reads_keys, terms))
        return _Reduction(terms, fan_in, group, replacing(position, container))

    def self_similar(position: int = 0) -> _Reduction | None:
        found = _sequence(args[position])
        if found is None:
            return None
        container = found[1]

        def group(key: Key, terms: Sequence[Any]) -> Task:
            new_args = (*args[:position], container(*terms), *args[position + 1 :])
            return Task(key, func, *new_args, **kwargs)

        return list_form(position, group)

    def varargs() -> _Reduction:
        def group(key: Key, terms: Sequence[Any]) -> Task:
            return Task(key, func, *terms, **kwargs)

        def root(partials: Sequence[Any]) -> Task:
            return Task(node.key, func, *partials, _data_producer=producer, **kwargs)

        return _Reduction(tuple(args), sum(map(_reads_keys, args)), group, root)

    if kind == "sum":
        # sum(parts, start): inner tasks add their run without the start value, which the
        # reduced key adds once, as before.
        if 1 <= len(args) <= 2 and set(kwargs) <= {"start"} and len(args) + len(kwargs) <= 2:
            return list_form(0, lambda key, terms: _fold(key, operator.add, terms))
        return None
    if kind == "reduce":
        if len(args) in (2, 3) and not kwargs and known.binary(args[0]):
            op = args[0]
            return list_form(1, lambda key, terms: _fold(key, op, terms))
        return None
    if kind == "numpy":
        # Stacking then reducing along axis 0 (or everything) regroups exactly; keepdims,
        # out, initial and where would be applied at every level, so they are not rewritten.
        if len(args) in (1, 2) and set(kwargs) <= {"axis", "dtype"}:
            if len(args) == 2 and "axis" in kwargs:
                return None
            axis = args[1] if len(args) == 2 else kwargs.get("axis")
            if axis is None or (type(axis) is int and axis == 0):
                return self_similar()
        return None
    if kind == "accumulate":
        # Coffea's accumulate(items, accum=None): a given accumulator is updated in place,
        # so only the reduced key receives it.
        if 1 <= len(args) <= 2 and set(kwargs) <= {"accum"} and len(args) + len(kwargs) <= 2:
            return list_form(0, lambda key, terms: Task(key, func, List(*terms)))
        return None
    if kind == "merge" or _marked(func):
        if kind == "merge" and set(kwargs) - {"factory"}:
            return None
        if len(args) == 1:
            return self_similar()
        if len(args) > 2:
            return varargs()
    return None


def _is_link(node: Any, known: _Known, func: Any = None) -> TypeGuard[Task]:
    """Whether ``node`` is one step ``op(x, y)`` of a chain (of ``func``, if given)."""
    return (
        type(node) is Task
        and len(node.args) == 2
        and not node.kwargs
        and (known.binary(node.func) if func is None else _same_func(node.func, func))
    )


_SEVERAL = object()  # stands for "more than one dependent" in _Graph.dependent


class _Graph:
    """Read-only views of the input graph that chain detection needs."""

    def __init__(
        self,
        nodes: Mapping[Key, Any],
        dependencies: Mapping[Key, frozenset[Key]],
        outputs: Iterable[Key],
        known: _Known,
    ) -> None:
        self.nodes = nodes
        self.known = known
        self.outputs = set(outputs)
        #: The one task that reads each key, or _SEVERAL.
        self.dependent: dict[Key, Any] = {}
        for key, deps in dependencies.items():
            for dep in deps:
                self.dependent[dep] = _SEVERAL if dep in self.dependent else key
        #: spine() of each task's own top-level link, computed once: both is_interior (for
        #: the reader) and match_chain (for the head) ask for it.
        self._spines: dict[Key, int | None] = {}

    def spine(self, node: Task, owner: Key, top_level: bool) -> int | None:
        """Which operand of link ``node`` continues its chain: 0 (left-deep), 1 or None.

        Inline links continue a chain anywhere. A link in another task continues it only
        from the operands of a task itself (``top_level``), if nothing else reads it, it is
        not an output and the other operand does not read it (so it is read exactly once).
        """
        if top_level and owner in self._spines:
            return self._spines[owner]
        side: int | None = None
        for candidate in (0, 1):
            operand, other = node.args[candidate], node.args[1 - candidate]
            if type(operand) is Task:
                if _is_link(operand, self.known, node.func):
                    side = candidate
                    break
                continue
            ref = _reference(operand) if top_level else None
            if (
                ref is not None
                and self.dependent.get(ref) == owner
                and ref not in self.outputs
                and _is_link(self.nodes.get(ref), self.known, node.func)
                and not _reads(other, ref)
            ):
                side = candidate
                break
        if top_level:
            self._spines[owner] = side
        return side

    def is_interior(self, key: Key) -> bool:
        """Whether link ``key`` is folded into the chain of the task that reads it."""
        owner = self.dependent.get(key)
        if owner is None or owner is _SEVERAL or key in self.outputs:
            return False
        parent, link = self.nodes.get(owner), self.nodes[key]
        if type(link) is not Task or not _is_link(parent, self.known, link.func):
            return False
        side = self.spine(parent, owner, top_level=True)
        return side is not None and _reference(parent.args[side]) == key

    def match_chain(self, key: Key, head: Task) -> _Reduction:
        """The chain that ends at ``head``, walked without recursion (chains can be 10^5 deep)."""
        func = head.func
        steps: list[tuple[int, Any]] = []  # (spine side, the other operand), head first
        absorbed: list[Key] = []
        node, owner, top_level = head, key, True
        while (side := self.spine(node, owner, top_level)) is not None:
            steps.append((side, node.args[1 - side]))
            operand = node.args[side]
            if type(operand) is Task:  # an inline link: same task, keep walking inside it
                node, top_level = operand, False
            else:  # a reference to a link that nothing else reads: it joins the tree
                owner = _reference(operand)
                absorbed.append(owner)
                node, top_level = cast(Task, self.nodes[owner]), True  # (a link: ``spine``)
        terms: deque[Any] = deque(node.args)
        for side, other in reversed(steps):
            # (an inline link of the same function off the spine is its terms, in order:
            # kept whole, one tree task would read its inputs besides its run's)
            if side == 0:
                terms.extend(self._flat(other, func))
            else:
                terms.extendleft(reversed(self._flat(other, func)))

        def group(new_key: Key, run: Sequence[Any]) -> Task:
            return _fold(new_key, func, run)

        def root(partials: Sequence[Any]) -> Task:
            return _fold(key, func, partials)

        return _Reduction(tuple(terms), len(terms), group, root, tuple(absorbed))

    def _flat(self, term: Any, func: Any) -> list[Any]:
        """``term``'s operands, in order, when it is an inline link of ``func`` (and theirs,
        without recursion); else ``[term]``."""
        flat: list[Any] = []
        stack = [term]
        while stack:
            top = stack.pop()
            if type(top) is Task and _is_link(top, self.known, func):
                stack.append(top.args[1])
                stack.append(top.args[0])
            else:
                flat.append(top)
        return flat


def _worth_a_tree(reduction: _Reduction | None, arity: int, threshold: int) -> bool:
    return reduction is not None and reduction.fan_in >= threshold and len(reduction.terms) > arity


# --- building trees ---------------------------------------------------------------------


def _tree_key(key: Key, level: int, index: int, taken: set[Key]) -> Key:
    """A new key for the ``index``-th task of ``level`` below ``key``, unused in the graph.

    ``"total"`` gives ``("total-tree", level, index)`` and ``("sum-1f2e", 3)`` gives
    ``("sum-1f2e-tree", 3, level, index)``, so ``dask.utils.key_split`` still names the
    reduction. A clash with an existing key adds another ``-tree``.
    """
    name, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
    suffix = "-tree"
    while True:
        candidate = (f"{name}{suffix}", *rest, level, index)
        if candidate not in taken:
            taken.add(candidate)
            return candidate
        suffix += "-tree"


def _runs(items: Sequence[Any], count: int) -> list[Sequence[Any]]:
    """``items`` cut into ``count`` consecutive runs whose lengths differ by at most one."""
    size, extra = divmod(len(items), count)
    runs, start = [], 0
    for index in range(count):
        stop = start + size + (index < extra)
        runs.append(items[start:stop])
        start = stop
    return runs


def _build_tree(key: Key, reduction: _Reduction, arity: int, taken: set[Key]) -> list[Task]:
    """The tasks of a balanced tree over ``reduction.terms``, the reduced key last.

    Each level cuts the operands into consecutive runs of at most ``arity`` (consecutive, so
    order is kept and a partial result is ready as soon as its run is), until the reduced
    key's own call needs no more than ``arity`` of them.
    """
    tasks: list[Task] = []
    current: Sequence[Any] = reduction.terms
    level = 0
    while len(current) > arity:
        partials: list[Any] = []
        for index, run in enumerate(_runs(current, -(-len(current) // arity))):
            if len(run) == 1:
                partials.append(run[0])  # a run of one needs no task
                continue
            task = reduction.group(_tree_key(key, level, index, taken), run)
            tasks.append(task)
            partials.append(TaskRef(task.key))
        current = partials
        level += 1
    tasks.append(reduction.root(current))
    return tasks
