"""Serialization of tasks, results and exceptions.

Results: pickle protocol 5, falling back to cloudpickle for what plain pickle cannot do.
Large buffers (numpy arrays, bytes) stay out of band in ``Serialized.buffers``, so they
travel as their own ZeroMQ frames and are never copied into a message header.

Tasks: ``TaskEncoder`` pickles a run's tasks with every Python function (and partial, and
bound method) taken out into a function table, named by the hash of its cloudpickle bytes.
A task's payload then holds only references (``resident(fid)``), so each function, with
whatever it closes over, travels once per worker and is deserialized once per library
process (``TaskDecoder``), however many tasks call it.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import inspect
import io
import os
import pickle
import sys
import traceback
import types
from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cloudpickle

from daskvine_py.errors import FULL_TRACEBACK_MARK

#: Buffers smaller than this ride inside the pickle stream: a separate frame costs more
#: than copying a few kilobytes.
OUT_OF_BAND_MIN_BYTES = 64 * 1024

FunctionId = bytes


class Serialized:
    """A pickled object: the pickle stream and its out-of-band buffers."""

    __slots__ = ("header", "buffers")

    def __init__(self, header: bytes, buffers: list[Any]) -> None:
        self.header = header
        self.buffers = buffers

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(memoryview(b).nbytes for b in self.buffers)

    def __reduce__(self) -> tuple[type[Serialized], tuple[bytes, list[pickle.PickleBuffer]]]:
        return (Serialized, (self.header, [pickle.PickleBuffer(b) for b in self.buffers]))

    def __repr__(self) -> str:
        return f"Serialized({self.nbytes} bytes, {len(self.buffers)} buffers)"


def dumps(obj: Any) -> Serialized:
    """Serialize ``obj``; raises what cloudpickle raises for an unpicklable object."""
    buffers: list[Any] = []

    def keep_large_out_of_band(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # serialize in band
        buffers.append(raw)
        return False

    try:  # the C pickler is several times faster for plain data
        header = pickle.dumps(obj, protocol=5, buffer_callback=keep_large_out_of_band)
    except Exception:
        buffers.clear()
        header = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep_large_out_of_band)
    return Serialized(header, buffers)


def loads(ser: Serialized) -> Any:
    return pickle.loads(ser.header, buffers=ser.buffers)


def type_name(exc: BaseException) -> str:
    """The qualified name of ``exc``'s type (``builtins.ZeroDivisionError``,
    ``mypackage.errors.Bad``): what names it where its pickle is not opened."""
    kind = type(exc)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def dumps_exception(exc: BaseException) -> tuple[Serialized | None, str]:
    """The exception, if it pickles and unpickles, and its formatted traceback: the
    frames the user wrote, then ``FULL_TRACEBACK_MARK`` and every frame, when that
    differs (see ``errors.RemoteTraceback``)."""
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _hide_internal_frames(shown, set())
    text = "".join(shown.format())
    if text != full:
        text += FULL_TRACEBACK_MARK + full
    try:
        ser = dumps(exc)
        loads(ser)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        return None, text
    return ser, text


#: Where the frames of a task's traceback that are not the user's come from: this
#: package (a task's library, its chain, its legacy tuple, coffea's wrappers) and dask's
#: own task objects. They are left out of what the user sees, kept in the full text.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_INTERNAL_FILES = (
    os.sep + os.path.join("dask", "_task_spec.py"),
    os.sep + os.path.join("dask", "core.py"),
)


def _is_internal(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR) or filename.endswith(_INTERNAL_FILES)


def _hide_internal_frames(shown: traceback.TracebackException, seen: set[int]) -> None:
    """Leave the internal frames out of ``shown`` and of the exceptions chained to it."""
    if id(shown) in seen:
        return
    seen.add(id(shown))
    # Every frame may be internal: a function that is not Python (``abs``, a C
    # extension's) leaves none of its own, and is still the user's error, not the
    # machinery's. Its text is then the exception alone; the full one keeps every frame.
    frames = [frame for frame in shown.stack if not _is_internal(frame.filename)]
    shown.stack = traceback.StackSummary.from_list(frames)
    grouped = getattr(shown, "exceptions", None) or ()  # an ExceptionGroup's
    for chained in (shown.__cause__, shown.__context__, *grouped):
        if chained is not None:
            _hide_internal_frames(chained, seen)


#: Callables that go into the function table: functions, and partials and bound methods,
#: which often carry large bound arguments (a Coffea processor, a model) every task shares.
_CALLABLES_BY_TABLE = (types.FunctionType, functools.partial, types.MethodType)


def resident(fid: FunctionId) -> Any:
    """Stands in, in a payload, for the function ``fid`` of the table: a ``TaskDecoder``
    resolves it (``find_class``); unpickled anywhere else, it fails clearly."""
    raise pickle.UnpicklingError(f"function {fid.hex()} outside a task decoder")


#: The module payloads name ``resident`` and ``LegacyCall`` by: the package itself, which
#: gives both lazily, rather than their own modules' longer names.
PAYLOAD_MODULE = "daskvine_py"
resident.__module__ = PAYLOAD_MODULE


def _into_table(
    encoder: TaskEncoder, obj: Any
) -> tuple[Callable[[FunctionId], Any], tuple[FunctionId]] | None:
    """``resident(fid)`` for what goes into the function table: functions, partials and
    bound methods, classes of ``__main__`` (which cloudpickle writes by value), and
    callable objects (see ``_tabled_type``)."""
    kind = type(obj)
    if (kind in _CALLABLES_BY_TABLE and obj is not resident) or (
        kind is type and obj.__module__ == "__main__"
    ):
        return resident, (encoder.function_id(obj),)
    tabled = _TABLED_TYPES.get(kind)
    if tabled is None:
        if len(_TABLED_TYPES) >= _TABLED_TYPES_LIMIT:
            _TABLED_TYPES.clear()
        tabled = _TABLED_TYPES[kind] = _tabled_type(kind)
    return (resident, (encoder.function_id(obj),)) if tabled else None


#: type -> whether its objects go into the function table (``_tabled_type``), for the
#: process's life: a ``get`` of one task met three types and paid ``getattr_static`` on
#: each (some 10 µs) when this was the encoder's own. A class does not gain or lose its
#: ``__call__`` in practice; bounded for graphs that make classes on the fly.
_TABLED_TYPES: dict[type, bool] = {}
_TABLED_TYPES_LIMIT = 4096


#: Packages whose callable objects are tasks themselves, not what tasks call.
_TASK_PACKAGES = ("dask._task_spec", "daskvine_py")


def _tabled_type(kind: type) -> bool:
    """Whether objects of ``kind`` go into the function table: instances of classes
    with ``__call__`` (an I/O function object, a model), which tasks share by identity
    and which can be large (a class defined in Python; C callables such as ``itemgetter``
    are small and often made per task). Every task holding the same one carries its id,
    and a library unpickles it once, as it does a function: the tasks of a library share
    it, as they would in one process under Dask's own schedulers. Dask's task objects
    and this package's are callable too, but are what is being pickled."""
    call = inspect.getattr_static(kind, "__call__", None)  # (once per type)
    if not isinstance(call, types.FunctionType):
        return False  # not callable, or C callables (itemgetter, ufuncs): small, often per task
    module = getattr(kind, "__module__", "") or ""
    ours = any(module == name or module.startswith(name + ".") for name in _TASK_PACKAGES)
    return not ours and not issubclass(kind, type)


class _FastPickler(pickle.Pickler):
    """The C pickler with the function table: tasks are mostly tuples, keys and numbers,
    which it writes several times faster than cloudpickle's pickler.

    The table is filled from ``reducer_override``, which the C pickler calls only for
    objects that are not numbers, strings or plain containers (a ``persistent_id`` hook
    would be called for every object of every payload). Anything else it cannot write
    makes the encoder retry with ``_FunctionExtractingPickler``.
    """

    def __init__(self, file: io.BytesIO, encoder: TaskEncoder) -> None:
        super().__init__(file, protocol=5)
        self.encoder = encoder

    def reducer_override(self, obj: Any) -> Any:
        reduction = _into_table(self.encoder, obj)
        return NotImplemented if reduction is None else reduction


def _code_keeping_file(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    """cloudpickle's reduction of a code object, with its file name kept: cloudpickle
    writes ``<dynamic-code>``, so a task's traceback would show neither the file of a
    function of ``__main__`` (or a notebook, or a closure) nor its lines."""
    rebuild, args = _cloudpickle_code(code)
    return _code_in_file, (rebuild, args, code.co_filename)


def _code_in_file(
    rebuild: Callable[..., types.CodeType], args: tuple[Any, ...], filename: str
) -> types.CodeType:
    return rebuild(*args).replace(co_filename=filename)


_cloudpickle_code = cloudpickle.Pickler.dispatch_table[types.CodeType]
#: cloudpickle's reducers, with code objects keeping their file name
_DISPATCH = ChainMap({types.CodeType: _code_keeping_file}, cloudpickle.Pickler.dispatch_table)


class _SourcePickler(cloudpickle.Pickler):
    """cloudpickle, keeping the file names of the code it writes by value."""

    dispatch_table = _DISPATCH


def _dumps_function(func: Any) -> bytes:
    buffer = io.BytesIO()
    _SourcePickler(buffer, protocol=5).dump(func)
    return buffer.getvalue()


class _FunctionExtractingPickler(cloudpickle.Pickler):
    """cloudpickle (local classes, modules, ...) with the same function table."""

    dispatch_table = _DISPATCH

    def __init__(self, file: io.BytesIO, encoder: TaskEncoder) -> None:
        super().__init__(file, protocol=5)
        self.encoder = encoder

    def reducer_override(self, obj: Any) -> Any:
        reduction = _into_table(self.encoder, obj)
        return super().reducer_override(obj) if reduction is None else reduction


class TaskEncoder:
    """Pickles the tasks of one run; ``functions`` collects each function's bytes once."""

    def __init__(self) -> None:
        #: function id -> the function pickled by cloudpickle, with what it closes over
        self.functions: dict[FunctionId, bytes] = {}
        # id(function) -> (function, id): the function is kept so its id() stays unique
        self._known: dict[int, tuple[Any, FunctionId]] = {}
        self._used: dict[FunctionId, None] = {}
        #: third-party top-level modules the functions come from or use (hoisting candidates)
        self.modules: set[str] = set()
        self._buffer = io.BytesIO()
        self._fast = _FastPickler(self._buffer, self)
        self._pickler: _FunctionExtractingPickler | None = None  # made when first needed

    def encode(self, obj: Any) -> tuple[bytes, tuple[FunctionId, ...]]:
        """The payload of ``obj`` and the ids of the functions it references."""
        try:
            return self._dump(self._fast, obj)
        except Exception:  # a local class, a module, ...: cloudpickle writes those
            if self._pickler is None:
                self._pickler = _FunctionExtractingPickler(self._buffer, self)
            return self._dump(self._pickler, obj)

    def _dump(self, pickler: pickle.Pickler, obj: Any) -> tuple[bytes, tuple[FunctionId, ...]]:
        buffer = self._buffer
        buffer.seek(0)
        buffer.truncate()
        self._used = {}
        pickler.clear_memo()
        pickler.dump(obj)
        return buffer.getvalue(), tuple(self._used)

    def function_id(self, func: Any) -> FunctionId:
        entry = self._known.get(id(func))
        if entry is None:
            code, fid, modules = _pickled_function(func)
            self.functions.setdefault(fid, code)
            self.modules.update(modules)
            entry = self._known[id(func)] = (func, fid)
        self._used[entry[1]] = None
        return entry[1]


#: module-level function -> (its cloudpickle bytes, their id, its modules). Such a function
#: is pickled as its module and name, so its bytes never change: every ``get`` after the
#: first skips cloudpickle and the hash (some 40 µs per function on a one-task graph).
_BY_REFERENCE: dict[types.FunctionType, tuple[bytes, FunctionId, frozenset[str]]] = {}
_BY_REFERENCE_LIMIT = 4096
_pickled_by_reference = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)


def _pickled_function(func: Any) -> tuple[bytes, FunctionId, frozenset[str]]:
    # None: not a plain function (or a cloudpickle without the check): never cached
    by_reference = _pickled_by_reference if type(func) is types.FunctionType else None
    if by_reference is not None:
        entry = _BY_REFERENCE.get(func)
        # (a module registered with cloudpickle.register_pickle_by_value since then
        # makes its functions travel by value from now on)
        if entry is not None and by_reference(func):
            return entry
    code = _dumps_function(func)
    entry = (code, hashlib.blake2b(code, digest_size=16).digest(), frozenset(modules_of(func)))
    if by_reference is not None and by_reference(func):
        if len(_BY_REFERENCE) >= _BY_REFERENCE_LIMIT:
            _BY_REFERENCE.clear()
        _BY_REFERENCE[func] = entry
    return entry


#: Modules never worth hoisting: always there, or not a module users import.
_NOT_CANDIDATES = frozenset(sys.stdlib_module_names) | {"__main__", "builtins", "daskvine_py"}


def modules_of(func: Any) -> set[str]:
    """Third-party top-level modules ``func`` is defined in, imports or names.

    Cheap (once per function): the function's ``__module__``, the modules its body
    imports, and the module objects among the globals its code names.
    """
    while isinstance(func, (functools.partial, types.MethodType)):
        func = func.func if isinstance(func, functools.partial) else func.__func__
    found = set()
    module = getattr(func, "__module__", None)
    if isinstance(module, str):
        found.add(module.partition(".")[0])
    code = getattr(func, "__code__", None)
    namespace = getattr(func, "__globals__", None)
    if code is not None:  # ``import numpy`` inside the body: hoisting pays off most there
        found.update(_imported_by(code))
    if code is not None and namespace is not None:
        for name in code.co_names:
            value = namespace.get(name)
            if isinstance(value, types.ModuleType):
                found.add(value.__name__.partition(".")[0])
            elif callable(value):  # a function or class imported by name
                owner = getattr(value, "__module__", None)
                if isinstance(owner, str):
                    found.add(owner.partition(".")[0])
    return found - _NOT_CANDIDATES


@functools.lru_cache(maxsize=4096)
def _imported_by(code: types.CodeType) -> frozenset[str]:
    """Top-level modules a code object's own body imports (cached: ``dis`` is slow, and
    the same functions come back in every ``get``)."""
    return frozenset(
        instruction.argval.partition(".")[0]
        for instruction in dis.get_instructions(code)
        if instruction.opname == "IMPORT_NAME" and instruction.argval
    )


#: The URL schemes ``urls_in`` finds: those the input cache fetches (``daskvine_py.inputs``).
URL_SCHEMES = (b"root://", b"http://", b"https://")
_SHORT_BINUNICODE, _BINUNICODE = 0x8C, 0x58  # pickle's opcodes for str (1- and 4-byte lengths)


def urls_in(payload: bytes, schemes: tuple[bytes, ...] = URL_SCHEMES) -> tuple[str, ...]:
    """The URLs a task's payload holds as strings of their own (an argument, an item of a
    tuple or dict argument: how uproot's and coffea's chunk tasks name their file), each
    once, in order; what a task reads is placed by them (``cache_inputs``).

    Reads the pickle's string opcodes at each scheme found, without unpickling anything:
    one scan of the payload in C when it names none (``find``), which is the usual case.
    A URL inside a longer string, or in the function's own bytes (the function table),
    is not found."""
    if payload.find(b"://") < 0:
        return ()
    found: dict[str, None] = {}
    for scheme in schemes:
        start = payload.find(scheme)
        while start >= 0:
            url = _string_at(payload, start)
            if url is not None and len(url) > len(scheme) and len(url.split()) == 1:
                found[url] = None  # (not a text that begins with a scheme)
            start = payload.find(scheme, start + len(scheme))
    return tuple(found)


def _string_at(payload: bytes, start: int) -> str | None:
    """The pickled ``str`` that begins at ``start``, if one does."""
    if start >= 2 and payload[start - 2] == _SHORT_BINUNICODE:
        length = payload[start - 1]
    elif start >= 5 and payload[start - 5] == _BINUNICODE:
        length = int.from_bytes(payload[start - 4 : start], "little")
    else:
        return None
    if start + length > len(payload):
        return None
    try:
        return payload[start : start + length].decode("utf-8")
    except UnicodeDecodeError:
        return None


class TaskDecoder:
    """Unpickles task payloads against resident functions, each deserialized once."""

    def __init__(self, lookup: Callable[[FunctionId], bytes | None] | None = None) -> None:
        self._code: dict[FunctionId, bytes] = {}
        self._loaded: dict[FunctionId, Any] = {}
        #: where to find a function not added: a fresh task process reads them from files
        self._lookup = lookup

    def add_functions(
        self, functions: Mapping[FunctionId, bytes] | Iterable[tuple[FunctionId, bytes]]
    ) -> None:
        self._code.update(functions)

    def function(self, fid: FunctionId) -> Any:
        func = self._loaded.get(fid)
        if func is None:
            code = self._code.get(fid)
            if code is None and self._lookup is not None:
                code = self._lookup(fid)
            if code is None:
                raise pickle.UnpicklingError(f"unknown function {fid.hex()}")
            func = self._loaded[fid] = pickle.loads(code)
        return func

    def decode(self, payload: bytes) -> Any:
        unpickler = _TaskUnpickler(io.BytesIO(payload))
        unpickler.decoder = self
        return unpickler.load()


class _TaskUnpickler(pickle.Unpickler):
    """Resolves ``resident(fid)`` in payloads to the decoder's functions."""

    decoder: TaskDecoder

    def find_class(self, module: str, name: str) -> Any:
        if name == "resident" and module == PAYLOAD_MODULE:
            return self.decoder.function
        return super().find_class(module, name)
