"""The canonical form of a task for its cache key: a tree of tuples, hashed once.

``KeyWalker.node_key`` rewrites a node (a Dask task, a ``LegacyCall``) into plain values
that a hookless C pickler writes in one call, into BLAKE2b: no Python call per object, as
a pickler with ``persistent_id`` and ``reducer_override`` hooks makes
(``keys._KeyPickler``, still used for the objects the walker does not know). What
the tree holds:

- a scalar (``int``, ``float``, ``bool``, ``None``, ``bytes``, ``complex``; a ``str``
  that names no local file): itself;
- anything else: a tuple whose first element is a tag saying what it is, the rest laid
  out as that tag says: ``(TASK, class name, function, kwargs or None, *args)``, ``(REF,
  input's cache key)``, ``(DATA, value)``, ``(LEGACY, function, *args)``, ``(LIST,
  *items)``, ``(TUPLE, *items)``, ``(DICT, key, value, ...)`` in insertion order, ``(SET,
  *members)`` sorted by their canonical bytes, ``(CODE, digest)`` for a function or class
  (``KeyMaker.global_reduction``), ``(BUILTIN, module, name)``, ``(PARTIAL, function,
  args, keywords)``, ``(METHOD, function, object)``, ``(FILE, path, size, mtime)``,
  ``(OPAQUE, digest)`` for an object the walker does not know, pickled by the key pickler
  alone (a NumPy array, a user's class: a function or a path inside it still counts);
- a fused task (``Task.fuse``): ``(GRAPH, inputs, *tasks)``, its inner tasks by their
  place, not their names (``graph_tree``).

So a tree reads back one way only: a user's tuple ``("ref", b"...")`` is ``(TUPLE, "ref",
b"...")``, never a ``TaskRef``, and ``1``, ``1.0`` and ``True`` stay apart (pickle writes
each as its type). The pickler runs in fast mode (no memo): equal trees give equal bytes
whichever of their strings are one object. Containers nested deeper than ``MAX_NEST`` are
pickled by the key pickler (a structure too deep for it too leaves the task without a
key), and a node whose walk meets more than ``MAX_CONTAINERS`` containers is pickled by it
whole.

A mixin of ``keys.KeyMaker``, which provides local files' facts (``file_of``),
functions' digests (``global_reduction``) and the key pickler (``opaque``). Tasks are told
by their classes, not by Dask's version: a ``Task`` subclass is walked as a task (Dask's
containers: ``List``, ``Dict``...), its ``constructor`` keyword left out.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import types
from collections.abc import Callable, Hashable
from typing import Any

from dask._task_spec import Alias, DataNode, Task, TaskRef, _execute_subgraph

from daskvine_py.plan.graph import LegacyCall

Key = Hashable
CacheKey = bytes

#: Digest size of a cache key, bytes.
KEY_BYTES = 20
#: Containers nested deeper than this are pickled by the key pickler, as one object.
MAX_NEST = 32
#: Containers one node's walk may meet before the key pickler pickles the node whole: a
#: container met twice is walked twice (``x = [x, x]`` 60 times over would be 2**60 of
#: them), where the pickler's memo writes it once.
MAX_CONTAINERS = 100_000

# Tags: the first element of every tuple of a tree (small ints: two bytes each).
(
    TASK,
    REF,
    NODE,
    INPUT,
    DATA,
    LEGACY,
    GRAPH,
    LIST,
    TUPLE,
    DICT,
    SET,
    FROZENSET,
    CODE,
    BUILTIN,
    PARTIAL,
    METHOD,
    FILE,
    SLICE,
    RANGE,
    OPAQUE,
    SEEDS,
) = range(21)

#: Written as they are (a ``str`` is looked up as a file name first).
_SCALARS = frozenset({int, float, bool, type(None), bytes, complex})
#: The keyword of ``Task.kwargs`` left out: a container task's constructor, which its
#: class names.
_NOT_KWARGS = "constructor"
#: The attribute ``keys.uncached`` sets on a function.
UNCACHED_MARK = "_daskvine_uncached"


class Uncacheable(Exception):
    """Raised while a task is walked or pickled: the task cannot have a key."""


class TooLarge(Exception):
    """Raised when a walk meets more than ``MAX_CONTAINERS`` containers."""


def is_uncached(func: Any) -> bool:
    return getattr(func, UNCACHED_MARK, False) is True


class _Hasher:
    """The file a pickler writes to: bytes go straight into the hash."""

    __slots__ = ("hash",)

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=KEY_BYTES)  # replaced for every node

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return len(data)


def _fast_pickler(out: Any) -> pickle.Pickler:
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True  # no memo: the bytes do not depend on which objects are shared
    return pickler


class KeyWalker:
    """``node_key(node)``: the hash of a node's tree (``canon``).

    ``keys`` maps the names in scope to what reading them is written as: a cache key
    (bytes, read as ``(REF, key)``; None: keyless), or inside a fused graph ``(NODE, i)``
    and ``(INPUT, j)``. A chain or a fused graph is walked in a scope of its own; a name
    it does not hold is a task of the plan (or of a chain) around it.
    """

    # Provided by KeyMaker.
    _files: dict[str, Any]
    _globals: dict[int, tuple[Any, Any]]
    file_of: Callable[[str], Any]
    global_reduction: Callable[[Any], tuple[Any, ...]]
    opaque: Callable[[Any], bytes]
    key: Callable[[Any], CacheKey | None]

    def __init__(self, salt: bytes) -> None:
        self._salted = hashlib.blake2b(salt, digest_size=KEY_BYTES)
        self.keys: dict[Key, Any] = {}
        #: the fused graph being walked: (its tasks, the names numbered in order, scope)
        self._graph: tuple[dict[Any, Any], list[Key], dict[Key, Any]] | None = None
        #: (keys, graph) of the scopes around this one
        self._enclosing: list[tuple[dict[Key, Any], Any]] = []
        #: containers this node's walk may still meet (``MAX_CONTAINERS``)
        self._budget = MAX_CONTAINERS
        #: names read so far: a tree made while it stayed the same holds in any scope
        self._reads = 0
        self._out = _Hasher()
        self._tree_pickler = _fast_pickler(self._out)
        self._sort_buffer = io.BytesIO()
        self._sort_pickler = _fast_pickler(self._sort_buffer)

    # -- names ------------------------------------------------------------------------

    def ref_of(self, dep: Key) -> tuple[Any, ...]:
        """What reading a name is written as; a name without a key makes the task
        keyless, never a guess."""
        self._reads += 1
        key = self.keys.get(dep)
        if type(key) is bytes:
            return (REF, key)
        return self._resolve(dep, key)

    def _resolve(self, dep: Key, key: Any) -> tuple[Any, ...]:
        if type(key) is tuple:
            return key
        if key is None and dep not in self.keys:
            graph = self._graph
            if graph is not None and dep in graph[0]:
                # An inner task read for the first time: numbered, and walked in turn.
                inner, queue, scope = graph
                ref = scope[dep] = (NODE, len(queue))
                queue.append(dep)
                return ref
            # A task of the plan or of a chain around it, never a place in an enclosing
            # fused graph (its inputs are the way in, ``graph_tree``).
            for scope, _ in reversed(self._enclosing):
                if dep in scope:
                    key = scope[dep]
                    break
            if type(key) is bytes:
                return (REF, key)
        raise Uncacheable(f"input {dep!r} has no cache key")

    def _enter(self, scope: dict[Key, Any], graph: Any = None) -> None:
        self._enclosing.append((self.keys, self._graph))
        self.keys = scope
        self._graph = graph

    def _leave(self) -> None:
        self.keys, self._graph = self._enclosing.pop()

    # -- keys -------------------------------------------------------------------------

    def node_key(self, node: Any) -> CacheKey:
        """The cache key of a node of the plan. Raises ``Uncacheable``, or whatever the
        key pickler raises."""
        budget = self._budget
        self._budget = MAX_CONTAINERS
        try:
            kind = type(node)
            if kind is LegacyCall:  # (keys and scalars only: no container in it)
                return self.tree_key(self._legacy(node, 0))
            try:
                return self.tree_key(self.canon(node))
            except TooLarge:
                return self.tree_key((OPAQUE, self.opaque(node)))
        finally:
            self._budget = budget

    def tree_key(self, tree: Any) -> CacheKey:
        """BLAKE2b of a tree's pickle, after the salt (tuples and scalars: no hook runs,
        nothing walks in between)."""
        out = self._out
        out.hash = self._salted.copy()
        self._tree_pickler.dump(tree)
        return out.hash.digest()

    # -- the walk ---------------------------------------------------------------------

    def canon(self, obj: Any, depth: int = 0) -> Any:
        """``obj`` as it is written in a tree."""
        kind = type(obj)
        if kind in _SCALARS:
            return obj
        if kind is str:
            facts = self._files.get(obj, False)
            if facts is False:
                facts = self.file_of(obj)
            return facts or obj
        walk = _WALKS.get(kind)
        if walk is None:
            walk = _walk_for(kind)
        return walk(self, obj, depth)

    def _spend(self) -> None:
        budget = self._budget - 1
        if budget < 0:
            raise TooLarge
        self._budget = budget

    def _callable(self, func: Any, depth: int) -> Any:
        """A task's function; one marked ``uncached`` makes the task keyless. A callable
        other than a function (a partial, NumPy's functions) is walked once a run, kept
        with the functions (``_globals``), unless its tree read names."""
        known = self._globals.get(id(func))
        if known is not None and known[0] is func:
            return known[1]
        if type(func) is types.FunctionType:
            return self.global_reduction(func)  # (which checks the mark)
        if is_uncached(func):
            raise Uncacheable(f"{func!r} is marked uncached")
        reads = self._reads
        tree = self.canon(func, depth)
        if self._reads == reads:
            self._globals[id(func)] = (func, tree)
        return tree

    def _task(self, task: Any, depth: int) -> tuple[Any, ...]:
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(task))
        budget = self._budget - 1  # (``_spend`` and ``_callable``'s memo, inlined)
        if budget < 0:
            raise TooLarge
        self._budget = budget
        depth += 1
        func = task.func
        if func is _execute_subgraph:
            return self._fused(task, depth)
        known = self._globals.get(id(func))
        func = known[1] if known is not None and known[0] is func else self._callable(func, depth)
        kwargs = task.kwargs
        if kwargs and (len(kwargs) > 1 or _NOT_KWARGS not in kwargs):
            kwargs = self._kwargs(kwargs, depth)
        else:
            kwargs = None  # (none, or a container's constructor only)
        out = [TASK, type(task).__name__, func, kwargs]
        keys = self.keys
        for arg in task.args:  # (``canon``, with the commonest arguments inlined)
            kind = type(arg)
            if kind in _SCALARS:
                out.append(arg)
            elif kind is Alias or kind is TaskRef:
                self._reads += 1
                name = arg.target if kind is Alias else arg.key
                ref = keys.get(name)
                if type(ref) is bytes:
                    out.append((REF, ref))
                else:
                    out.append(ref if type(ref) is tuple else self._resolve(name, ref))
            elif kind is str:
                out.append(self.canon(arg))
            else:
                walk = _WALKS.get(kind) or _walk_for(kind)
                out.append(walk(self, arg, depth))
        return tuple(out)

    def _kwargs(self, kwargs: dict[Any, Any], depth: int) -> tuple[Any, ...]:
        """A task's keyword arguments but ``constructor``, as a dict."""
        out: list[Any] = [DICT]
        canon = self.canon
        files = self._files
        for name, value in kwargs.items():
            if name != _NOT_KWARGS:
                out.append(name if files.get(name, False) is None else canon(name))
                out.append(value if type(value) in _SCALARS else canon(value, depth))
        return tuple(out)

    def _fused(self, task: Any, depth: int) -> tuple[Any, ...]:
        inner, outkey, inkeys, *inputs = task.args
        if type(inner) is not dict or outkey not in inner or len(inkeys) != len(inputs):
            raise Uncacheable("a fused task of an unknown form")
        return self.graph_tree(inner, outkey, inkeys, inputs, depth)

    def graph_tree(
        self, inner: dict[Any, Any], outkey: Key, inkeys: Any, inputs: Any, depth: int = 0
    ) -> tuple[Any, ...]:
        """``(GRAPH, inputs, *tasks)``: a fused task, whatever names it uses inside (often
        tokens of objects that differ between two constructions of the same graph).

        Its tasks are those ``outkey`` needs: ``outkey`` first, then each in the order the
        ones before it first read it, read as ``(NODE, i)`` (their place). Its inputs
        (``inkeys``: a task's result as ``TaskRef``, or a literal value) are read as
        ``(INPUT, j)``; what each is, in the scope around the graph, is in ``inputs``:
        the graph is keyed the same wherever it is.
        """
        written: list[Any] = []
        scope: dict[Key, Any] = {}
        for j, (name, value) in enumerate(zip(inkeys, inputs, strict=True)):
            if type(value) is TaskRef:
                try:
                    ref = self.ref_of(value.key)
                except Uncacheable:
                    ref = None  # (keyless only if a task reads it)
            else:
                key = self.key(DataNode(None, value))
                ref = None if key is None else (REF, key)
            written.append(ref)
            scope[name] = None if ref is None else (INPUT, j)
        queue = [outkey]
        scope[outkey] = (NODE, 0)
        tree: list[Any] = [GRAPH, tuple(written)]
        canon = self.canon
        enclosing = self._enclosing  # (``_enter`` and ``_leave``, inlined)
        enclosing.append((self.keys, self._graph))
        self.keys, self._graph = scope, (inner, queue, scope)
        try:
            for name in queue:  # (grows as the tasks walked read others)
                tree.append(canon(inner[name], depth))
        finally:
            self.keys, self._graph = enclosing.pop()
        return tuple(tree)

    def _ref(self, ref: TaskRef, depth: int) -> tuple[Any, ...]:
        return self.ref_of(ref.key)

    def _alias(self, alias: Alias, depth: int) -> tuple[Any, ...]:
        return self.ref_of(alias.target)

    def _data(self, node: DataNode, depth: int) -> tuple[Any, ...]:
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(node))
        value = node.value
        if type(value) is list and _SCALARS.issuperset(map(type, value)):
            self._spend()
            return (DATA, (LIST, *value))  # (``_sequence``, inlined: a partition)
        return (DATA, self.canon(value, depth + 1))

    def _legacy(self, node: LegacyCall, depth: int) -> tuple[Any, ...]:
        func, *args = node.task
        known = self._globals.get(id(func))  # (``_callable``'s memo, inlined)
        func = known[1] if known is not None and known[0] is func else self._callable(func, depth)
        deps = node.dependencies
        if not deps and _SCALARS.issuperset(map(type, args)):
            return (LEGACY, func, *args)  # (the bulk of a big hand-built graph)
        ref_of = self.ref_of
        canon = self.canon
        return (LEGACY, func, *[ref_of(a) if a in deps else canon(a, depth + 1) for a in args])

    def _sequence(self, tag: int, items: Any, depth: int) -> tuple[Any, ...]:
        self._spend()
        if _SCALARS.issuperset(map(type, items)):  # (in C: the common case)
            return (tag, *items)
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(items))
        depth += 1
        canon = self.canon
        return (tag, *[canon(item, depth) for item in items])

    def _list(self, items: list[Any], depth: int) -> tuple[Any, ...]:
        return self._sequence(LIST, items, depth)

    def _tuple(self, items: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
        return self._sequence(TUPLE, items, depth)

    def _dict(self, mapping: dict[Any, Any], depth: int) -> tuple[Any, ...]:
        self._spend()
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(mapping))
        depth += 1
        canon = self.canon
        out: list[Any] = [DICT]
        for name, value in mapping.items():
            out.append(canon(name, depth))
            out.append(canon(value, depth))
        return tuple(out)

    def _members(self, tag: int, members: Any, depth: int) -> tuple[Any, ...]:
        """A set's members, sorted by their canonical bytes: an order that depends
        neither on the process (string hashing) nor on what the members are."""
        self._spend()
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(members))
        depth += 1
        canon = self.canon
        buffer, pickler = self._sort_buffer, self._sort_pickler

        def flat(member: Any) -> bytes:
            buffer.seek(0)
            buffer.truncate()
            pickler.dump(member)
            return buffer.getvalue()

        return (tag, *sorted([canon(m, depth) for m in members], key=flat))

    def _set(self, members: set[Any], depth: int) -> tuple[Any, ...]:
        return self._members(SET, members, depth)

    def _frozenset(self, members: frozenset[Any], depth: int) -> tuple[Any, ...]:
        return self._members(FROZENSET, members, depth)

    def _code(self, func: Any, depth: int) -> tuple[Any, ...]:
        known = self._globals.get(id(func))  # (global_reduction's memo, asked first)
        if known is not None and known[0] is func:
            memo: tuple[Any, ...] = known[1]
            return memo
        return self.global_reduction(func)

    def _builtin(self, func: Any, depth: int) -> tuple[Any, ...]:
        owner = func.__self__
        module = func.__module__
        if (owner is None or type(owner) is types.ModuleType) and type(module) is str:
            return (BUILTIN, module, func.__qualname__)
        return (OPAQUE, self.opaque(func))  # a method of an object: its object counts

    def _partial(self, part: functools.partial[Any], depth: int) -> tuple[Any, ...]:
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(part))
        depth += 1
        return (
            PARTIAL,
            self.canon(part.func, depth),
            self._sequence(TUPLE, part.args, depth),
            self._dict(part.keywords, depth),
        )

    def _method(self, method: types.MethodType, depth: int) -> tuple[Any, ...]:
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(method))
        depth += 1
        return (METHOD, self.canon(method.__func__, depth), self.canon(method.__self__, depth))

    def _slice(self, part: slice, depth: int) -> tuple[Any, ...]:
        if depth > MAX_NEST:
            return (OPAQUE, self.opaque(part))
        depth += 1
        canon = self.canon
        return (SLICE, canon(part.start, depth), canon(part.stop, depth), canon(part.step, depth))

    def _range(self, span: range, depth: int) -> tuple[Any, ...]:
        return (RANGE, span.start, span.stop, span.step)

    def _opaque(self, obj: Any, depth: int) -> tuple[Any, ...]:
        return (OPAQUE, self.opaque(obj))

    def _seeds(self, seeds: Any, depth: int) -> tuple[Any, ...]:
        """A NumPy ``SeedSequence`` (one per chunk of a ``dask.array.random`` array):
        what it is made from, which is all its numbers depend on."""
        entropy = seeds.entropy
        if type(entropy) is not int:  # None was replaced by drawn entropy; or a sequence
            return (OPAQUE, self.opaque(seeds))
        spawn_key = seeds.spawn_key
        if type(spawn_key) is not tuple or any(type(k) is not int for k in spawn_key):
            return (OPAQUE, self.opaque(seeds))
        return (SEEDS, entropy, spawn_key, seeds.pool_size, seeds.n_children_spawned)

    def _pathlike(self, obj: Any, depth: int) -> tuple[Any, ...]:
        path = obj.__fspath__()
        facts = self.file_of(path) if type(path) is str else None
        return facts or (OPAQUE, self.opaque(obj))


_Walk = Callable[[KeyWalker, Any, int], Any]
#: exact type -> how it is walked; other types are added as they are met (``_walk_for``)
_WALKS: dict[type, _Walk] = {
    TaskRef: KeyWalker._ref,
    Alias: KeyWalker._alias,
    DataNode: KeyWalker._data,
    Task: KeyWalker._task,
    LegacyCall: KeyWalker._legacy,
    list: KeyWalker._list,
    tuple: KeyWalker._tuple,
    dict: KeyWalker._dict,
    set: KeyWalker._set,
    frozenset: KeyWalker._frozenset,
    types.FunctionType: KeyWalker._code,
    type: KeyWalker._code,
    types.BuiltinFunctionType: KeyWalker._builtin,
    functools.partial: KeyWalker._partial,
    types.MethodType: KeyWalker._method,
    slice: KeyWalker._slice,
    range: KeyWalker._range,
}


def _walk_for(kind: type) -> _Walk:
    """How a type not in ``_WALKS`` is walked, found once per type: a ``Task`` subclass
    (Dask's containers) as a task, an ``os.PathLike`` as the file it names, anything else
    (subclasses of the types above too) by the key pickler. NumPy's ``SeedSequence`` is
    written as what makes it (a pickler would take 20-odd hooks for it)."""
    walk: _Walk
    if issubclass(kind, Task):
        walk = KeyWalker._task
    elif kind.__module__ == "numpy.random.bit_generator" and kind.__name__ == "SeedSequence":
        walk = KeyWalker._seeds
    elif getattr(kind, "__fspath__", None) is not None:
        walk = KeyWalker._pathlike
    else:
        walk = KeyWalker._opaque
    _WALKS[kind] = walk
    return walk
