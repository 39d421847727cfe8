"""Cache keys: what a task computes, named by content (a Merkle chain over the graph).

A task's key hashes its function, its literal arguments and the keys of its inputs, never
Dask's name for it (the same name can carry different work, and ``dask.delayed`` names
impure calls with a fresh uuid each time). The node is rewritten into a canonical tree of
tuples (``walk``, which says how) and that tree is pickled once, into BLAKE2b. In the
tree, in place of what the node holds:

- an input (``TaskRef``, a legacy task's argument that is a key, an ``Alias`` target): the
  input's cache key; a task without a key (not cacheable) makes its readers keyless too;
- a function, class or method defined in an importable module (pickled by name): its name,
  the digest of its code (``co_code``, constants, names; not line numbers or file names),
  the digests of the functions and classes of the same module it names, and the version
  of its package; a function pickled by value (``__main__``, lambdas, closures): the hash
  of its cloudpickle bytes (``serialize.TaskEncoder``), which hold its code and closure;
- a string or ``os.PathLike`` that names an existing local file: the path, its size and
  its modification time;
- a set: its members sorted (string hashing differs between processes);
- an object the walker does not know (a NumPy array, a user's class): the digest of its
  pickle through ``_KeyPickler``, which writes the replacements above wherever it meets
  them inside the object.

A task is not cacheable when its function is marked ``uncached``, when
``dask.annotate(cache=False)`` covers it, when it cannot be pickled, or when one of its
inputs is not cacheable. ``docs/cache.md`` lists what a key cannot see.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import pickle
import stat
import sys
import types
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import cloudpickle
from dask._task_spec import Alias, DataNode, Task, TaskRef

from daskvine_py.cache.walk import (
    CODE,
    FILE,
    KEY_BYTES,
    UNCACHED_MARK,
    KeyWalker,
    Uncacheable,
    _Hasher,
    is_uncached,
)
from daskvine_py.plan.fusion import Chain
from daskvine_py.plan.graph import LegacyCall, Plan, convert
from daskvine_py.wire.serialize import TaskEncoder

Key = Hashable
CacheKey = bytes

#: Bumped when what a key covers, or how it is written, changes: older keys (on disk)
#: then simply miss. The Python version goes with it: code objects, and so code digests,
#: differ between them.
KEY_VERSION = b"daskvine-cache-3"
_SALT = KEY_VERSION + "-py{}.{}".format(*sys.version_info[:2]).encode()
#: Strings longer than this are not looked up as file names.
MAX_PATH = 4096

_F = TypeVar("_F")
_by_reference = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)
_STDLIB = frozenset(sys.stdlib_module_names) | {"builtins", "__main__"}


def uncached(func: _F) -> _F:
    """Mark ``func`` so that tasks calling it are never cached, nor anything that reads
    their results (a side effect, a clock, unseeded random numbers). Returns ``func``."""
    if not callable(func):
        raise TypeError(f"uncached() needs a callable, not {type(func).__name__}")
    try:
        setattr(func, UNCACHED_MARK, True)
    except (AttributeError, TypeError) as exc:
        raise TypeError(
            f"cannot mark {func!r} as uncached: it takes no attributes (a builtin?); "
            "mark a plain function that calls it instead"
        ) from exc
    return func


# Stand-ins the key pickler writes in place of what it replaces; only hashed, never loaded.
def _ref(key: CacheKey) -> None: ...
def _call(kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None: ...
def _data(value: Any) -> None: ...
def _legacy(func: Any, args: tuple[Any, ...]) -> None: ...
def _partial(func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None: ...
def _method(func: Any, owner: Any) -> None: ...
def _code(digest: bytes) -> None: ...
def _set(members: tuple[Any, ...]) -> None: ...
def _array(dtype: str, shape: tuple[Any, ...], data: bytes) -> None: ...
def _dtype(dtype: str) -> None: ...


_STAND_INS = (_ref, _call, _data, _legacy, _partial, _method, _code, _set, _array, _dtype)
#: The key pickler's memo before each object: the stand-ins are written as references to
#: it (two bytes), not looked up and written by name each time.
_SEEDED_MEMO = {id(stand_in): (i, stand_in) for i, stand_in in enumerate(_STAND_INS)}


class _KeyPickler(pickle.Pickler):
    """Pickles an object the walker does not know (``KeyMaker.opaque``), with the same
    replacements (inputs, functions, files, sets) wherever it meets them inside it."""

    def __init__(self, maker: KeyMaker) -> None:
        self.out = _Hasher()
        super().__init__(self.out, protocol=5)
        self.maker = maker
        self.files = maker._files
        #: whether it wrote an input's key: what it wrote then holds in this scope only
        self.read_inputs = False

    def persistent_id(self, obj: Any) -> Any:  # called for every object: cheap first
        kind = type(obj)
        if kind in _PLAIN:
            return None
        if kind is str:
            facts = self.files.get(obj, False)
            return self.maker.file_of(obj) if facts is False else facts
        if kind is set or kind is frozenset:
            try:
                return (_set, tuple(sorted(obj)))
            except TypeError:
                return (_set, tuple(sorted(obj, key=repr)))
        # A missed attribute lookup on a type walks its MRO: asked once per type.
        fspath = _FSPATH.get(kind, _UNSEEN)
        if fspath is _UNSEEN:
            fspath = _FSPATH[kind] = getattr(kind, "__fspath__", None)
        if fspath is not None:
            path = fspath(obj)
            return self.maker.file_of(path) if type(path) is str else None
        return None

    def reducer_override(self, obj: Any) -> Any:
        maker = self.maker
        if isinstance(obj, Task):
            if is_uncached(obj.func):
                raise Uncacheable(f"{obj.func!r} is marked uncached")
            kwargs = {k: v for k, v in obj.kwargs.items() if k != "constructor"}
            return _call, (type(obj).__name__, obj.func, obj.args, kwargs)
        kind = type(obj)
        if kind is TaskRef:
            self.read_inputs = True
            return _ref, (maker.ref_of(obj.key),)
        if kind is DataNode:
            return _data, (obj.value,)
        if kind is Alias:
            self.read_inputs = True
            return _ref, (maker.ref_of(obj.target),)
        if kind is LegacyCall:
            self.read_inputs = True
            func, *args = obj.task
            deps = obj.dependencies
            args = tuple((_ref, maker.ref_of(a)) if a in deps else a for a in args)
            return _legacy, (func, args)
        if kind is functools.partial:
            return _partial, (obj.func, obj.args, obj.keywords)
        if kind is types.MethodType:
            return _method, (obj.__func__, obj.__self__)
        if kind is types.FunctionType or kind is type:
            if obj in _STAND_INS:
                return NotImplemented  # written by name, as any module-level function
            return _code, maker.global_reduction(obj)[1:]
        numpy = _NUMPY.get(kind, _UNSEEN)
        if numpy is _UNSEEN:
            numpy = _NUMPY[kind] = _numpy_reduction(kind)
        return NotImplemented if numpy is None else numpy(obj)


_PLAIN = frozenset({int, float, bool, bytes, type(None), tuple, list, dict, complex})
#: type -> its ``__fspath__`` (None: not a path), for ``_KeyPickler.persistent_id``
_FSPATH: dict[type, Any] = {}
_UNSEEN = object()
#: type -> how the key pickler writes a NumPy array or dtype of that type (None: as pickle)
_NUMPY: dict[type, Any] = {}


def _numpy_reduction(kind: type) -> Any:
    """NumPy's arrays and dtypes of fixed-size values, written as their dtype's string
    (kind, size, byte order, unit) and their data in C order: what they hold, in a few
    objects, where NumPy's own reduction takes some twenty hooks."""
    np = sys.modules.get("numpy")  # (a NumPy type means NumPy is imported)
    if np is None:
        return None
    if kind is np.ndarray:
        return _reduce_array
    if issubclass(kind, np.dtype):
        return _reduce_dtype
    return None


def _plain_dtype(dtype: Any) -> bool:
    return dtype.kind in "biufcmMSU" and dtype.names is None and dtype.metadata is None


def _reduce_array(array: Any) -> Any:
    if not _plain_dtype(array.dtype):
        return NotImplemented  # (objects, records, NumPy's variable-width strings)
    data = array if array.flags.c_contiguous else array.copy(order="C")
    data = data.reshape(-1).view("u1")  # (datetimes have no buffer of their own)
    data.flags.writeable = False  # (written as bytes, whether or not the array is)
    return _array, (array.dtype.str, array.shape, pickle.PickleBuffer(data))


def _reduce_dtype(dtype: Any) -> Any:
    return (_dtype, (dtype.str,)) if _plain_dtype(dtype) else NotImplemented


class KeyMaker(KeyWalker):
    """Computes the cache keys of one run's tasks (``task_keys``).

    ``encoder`` is the run's ``TaskEncoder``: functions pickled by value are hashed from
    the bytes it makes for them anyway. ``digests`` is a memo of code digests kept across
    runs (``code_digests``); file facts are looked up once per run.
    """

    def __init__(self, encoder: TaskEncoder, digests: dict[int, tuple[Any, Any, bytes]]) -> None:
        super().__init__(_SALT)
        self.encoder = encoder
        self.digests = digests
        self._files: dict[str, Any] = {}
        #: id -> (function or class, what it is written as), for this run
        self._globals: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        #: one pickler per depth: a key computed while another is pickled (a function
        #: holding a graph of its own, ``_repack_key``) gets its own
        self._picklers: list[_KeyPickler] = []
        self._depth = 0
        #: id -> (object, ``opaque`` digest), for this run: the same dtype, meta frame or
        #: NumPy function in many tasks is pickled once
        self._opaque_digests: dict[int, tuple[Any, bytes]] = {}

    def file_of(self, text: str) -> Any:
        """``(FILE, path, size, mtime)`` for a string naming a local file, else None."""
        facts = self._files.get(text, False)
        if facts is not False:
            return facts
        facts = None
        if 0 < len(text) <= MAX_PATH and "\0" not in text and "\n" not in text:
            try:
                info = os.stat(text)
            except (OSError, ValueError):
                pass
            else:
                if stat.S_ISREG(info.st_mode):  # (as bytes: a str would be looked up again)
                    path = os.fsencode(os.path.abspath(text))
                    facts = (FILE, path, info.st_size, info.st_mtime_ns)
        self._files[text] = facts
        return facts

    def key(self, node: Any) -> CacheKey | None:
        """The cache key of one node, its inputs' keys known; None: not cacheable."""
        kind = type(node)
        if kind is Chain:
            return self._chain_key(node)
        try:
            return self.node_key(node)
        except Exception:  # Uncacheable, or cannot be pickled: not cached (encoding will
            return None  # say if it matters), or nested past what the key pickler takes

    def opaque(self, obj: Any) -> bytes:
        """The digest of an object the walker does not know, pickled by ``_KeyPickler``;
        once per run, unless the object holds inputs (its digest then depends on the
        scope: a fused graph's inner names)."""
        known = self._opaque_digests.get(id(obj))
        if known is not None and known[0] is obj:
            return known[1]
        if self._depth == len(self._picklers):
            self._picklers.append(_KeyPickler(self))
        pickler = self._picklers[self._depth]
        out = pickler.out
        out.hash = hashlib.blake2b(digest_size=KEY_BYTES)
        pickler.memo = _SEEDED_MEMO
        pickler.read_inputs = False
        self._depth += 1
        try:
            pickler.dump(obj)
        finally:
            self._depth -= 1
        digest = out.hash.digest()
        if not pickler.read_inputs:
            self._opaque_digests[id(obj)] = (obj, digest)
        return digest

    def _chain_key(self, node: Chain) -> CacheKey | None:
        """A linear chain (``fusion``): its links keyed in order, each as the task it was
        (the one before it as its input), their names scoped to the chain. The chain's
        key is its last link's: the same whether the run fused it or not."""
        scope: dict[Key, CacheKey | None] = {}
        self._enter(scope)
        try:
            for name, link in node.links:
                scope[name] = self.key(link)
        finally:
            self._leave()
        return scope[node.key]

    def global_reduction(self, obj: Any) -> tuple[Any, ...]:
        """What a function or class is written as (``(CODE, digest)``, made once per
        run): its name and code digest when it is importable, the hash of its cloudpickle
        bytes otherwise."""
        known = self._globals.get(id(obj))
        if known is not None and known[0] is obj:
            return known[1]
        if is_uncached(obj):
            raise Uncacheable(f"{obj!r} is marked uncached")
        h = hashlib.blake2b(digest_size=16)
        if _importable(obj):
            h.update(f"{obj.__module__}:{obj.__qualname__}".encode())
            h.update(self.digest(obj))
        elif _is_repack(obj):
            h.update(self._repack_key(obj))
        else:
            h.update(self.encoder.function_id(obj))
            # What it names by reference (helpers in the user's modules) is not in its bytes.
            for named in _named_globals(obj):
                if _importable(named):
                    h.update(self.digest(named))
        reduction = (CODE, h.digest())
        self._globals[id(obj)] = (obj, reduction)
        return reduction

    def _repack_key(self, repack: Any) -> bytes:
        """``dask.base.unpack_collections``'s ``repack``: a graph closed over, named with
        fresh uuids each time (``dask.compute`` of nested outputs, hist.dask's fills);
        keyed as that graph, its input (the computed collections) one fixed name."""
        cells = dict(zip(repack.__code__.co_freevars, repack.__closure__ or (), strict=True))
        try:
            graph = cells["repack_dsk"].cell_contents
            token = cells["collections_token"].cell_contents
            out = cells["out"].cell_contents
        except (KeyError, ValueError):
            raise Uncacheable("an unknown repack") from None
        try:
            names = {*graph, token}  # (before Dask 2025.2, legacy tasks naming them)
            graph = {name: convert(name, task, names) for name, task in graph.items()}
            tree = self.graph_tree(graph, out, (token,), (DataNode(None, "collections"),))
        except Uncacheable:
            raise Uncacheable("a repack graph without a key") from None
        return self.tree_key(tree)

    def digest(self, obj: Any) -> bytes:
        """Code digest of an importable function or class, memoised while its code (and
        that of the class's functions) is the same objects (autoreload patches in place)."""
        stamp = _code_stamp(obj)
        entry = self.digests.get(id(obj))
        if entry is not None and entry[0] is obj and (entry[1] is stamp or entry[1] == stamp):
            return entry[2]
        digest = _digest(obj, set())
        if len(self.digests) >= 4096:
            self.digests.clear()
        self.digests[id(obj)] = (obj, stamp, digest)
        return digest


def task_keys(plan: Plan, maker: KeyMaker, off: Iterable[Key] = ()) -> dict[Key, CacheKey | None]:
    """Every task's cache key, in the plan's order (inputs first); None: not cacheable."""
    keys = maker.keys
    off = set(off)
    for key in plan.order:
        keys[key] = None if key in off else maker.key(plan.nodes[key])
    return keys


def _is_repack(obj: Any) -> bool:
    return (
        getattr(obj, "__module__", None) == "dask.base"
        and getattr(obj, "__qualname__", "") == "unpack_collections.<locals>.repack"
    )


def _importable(obj: Any) -> bool:
    """Whether cloudpickle writes ``obj`` by name (it is importable as itself)."""
    if getattr(obj, "__module__", None) == "__main__":
        return False
    try:
        return bool(_by_reference(obj)) if _by_reference is not None else False
    except Exception:
        return False


def _code_stamp(obj: Any) -> Any:
    if isinstance(obj, types.FunctionType):
        return obj.__code__
    return tuple(id(f.__code__) for f in _functions_of(obj))


def _functions_of(cls: Any) -> list[types.FunctionType]:
    found: list[types.FunctionType] = []
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            found.extend(f for f in (value.fget, value.fset) if type(f) is types.FunctionType)
            continue
        if type(value) is types.FunctionType:
            found.append(value)
    return found


def _digest(obj: Any, seen: set[int]) -> bytes:
    """Name, package version and code of ``obj`` (a function or class), with those of the
    functions and classes of its own module that it names."""
    h = hashlib.blake2b(digest_size=16)
    module = getattr(obj, "__module__", "") or ""
    h.update(f"{module}:{getattr(obj, '__qualname__', '')}".encode())
    top = module.partition(".")[0]
    if top in _STDLIB:
        return h.digest()  # the Python version is in the salt of every run's keys
    version = getattr(sys.modules.get(top), "__version__", None)
    h.update(repr(version).encode())
    if id(obj) in seen:
        return h.digest()
    seen.add(id(obj))
    functions = [obj] if isinstance(obj, types.FunctionType) else _functions_of(obj)
    for func in functions:
        h.update(_code_bytes(func.__code__))
        for extra in (func.__defaults__, func.__kwdefaults__):
            if extra:
                h.update(_plain_bytes(extra))
    for named in _named_globals(obj):
        if getattr(named, "__module__", None) == module and id(named) not in seen:
            h.update(_digest(named, seen))
    if isinstance(obj, type):
        for base in obj.__bases__:
            if getattr(base, "__module__", None) == module:
                h.update(_digest(base, seen))
    return h.digest()


def _named_globals(obj: Any) -> list[Any]:
    """Functions and classes the code of ``obj`` names among its globals."""
    functions = [obj] if isinstance(obj, types.FunctionType) else _functions_of(obj)
    found = []
    for func in functions:
        namespace = func.__globals__
        for name in _names(func.__code__):
            value = namespace.get(name)
            if isinstance(value, (types.FunctionType, type)) and value is not obj:
                found.append(value)
    return found


@functools.lru_cache(maxsize=4096)
def _names(code: types.CodeType) -> tuple[str, ...]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_names(const))
    return tuple(names)


@functools.lru_cache(maxsize=4096)
def _code_bytes(code: types.CodeType) -> bytes:
    """A code object without its file name and line numbers: moving a function within
    its file, or the file, does not change what it computes."""
    return marshal.dumps(_stripped(code))


def _stripped(code: types.CodeType) -> types.CodeType:
    consts = tuple(_stripped(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_filename="", co_firstlineno=1, co_linetable=b"")


def _plain_bytes(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        return repr(value).encode()


def code_digests() -> dict[int, tuple[Any, Any, bytes]]:
    """A fresh memo for ``KeyMaker`` (one per manager)."""
    return {}
