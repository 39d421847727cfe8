"""The per-task records on the wire through msgspec, for ``bench_wire.py`` to measure
against the plain format (msgpack) and the pickled one: typed structs decoded and
validated in one step, then handed on as the records the rest of the package reads.

Each record is an ``array_like`` ``msgspec.Struct`` tagged with its plain code, so a batch
is a msgpack array of ``[code, field, field, ...]`` arrays, decoded in one call into a
union of the structs. Every field is required (a record with too few fields is refused,
as ``check_fields`` refuses it) and ``forbid_unknown_fields`` refuses one with too many.
What ``msgspec.Meta`` expresses is checked there (types, ``>= 0``, finite seconds, the
lengths of input-file names); the rest in Python as the records are built: a value's
extension and its buffers, input-file names and versions printable, a Dask key.

Worker to manager: ``TaskDone``, ``Started``, ``Status``. Manager to worker: ``Execute``
(today a pickle). The other records of each direction would join the unions the same
way; a union of more tags costs the decoder one lookup per record either way.

Not thread-safe: one ``MsgspecWire`` per sending thread (its encoder's hook gathers the
out-of-band buffers of the batch being encoded).
"""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from msgspec.msgpack import Ext

from daskvine_py.wire import protocol as p
from daskvine_py.wire.records import MAX_INPUT_URL, MAX_INPUT_VERSION
from daskvine_py.wire.serialize import Serialized
from daskvine_py.wire.validation import MAX_KEY_DEPTH, _key

#: How the first frame of a batch begins (neither ``p.MAGIC`` nor ``p.PLAIN_MAGIC``).
MAGIC = b"dvs"
_IN_BAND, _OUT_OF_BAND = 0, 1
_COUNT = struct.Struct("<I")

Id = int
Size = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
#: A finite number of seconds >= 0 (NaN fails ``ge``, infinity ``le``).
Seconds = Annotated[float, Meta(ge=0.0, le=sys.float_info.max)]
Url = Annotated[str, Meta(min_length=1, max_length=MAX_INPUT_URL)]
Version = Annotated[str, Meta(max_length=MAX_INPUT_VERSION)]
#: ``p.INPUT_FROM_STORAGE``, ``INPUT_FROM_CACHE``, ``INPUT_FROM_PEER``, ``INPUT_DROPPED``
Source = Literal[0, 1, 2, 3]
InputFile = tuple[Url, Size, Source, Version]
Lane = Annotated[int, Meta(ge=p.SPILL_LANE)]
Bar = tuple[Lane, str, Seconds, Seconds, Seconds, Size]


class _Record(Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    pass


class TaskDoneS(_Record, tag=2):
    task_id: Id
    nbytes: Size
    duration: Seconds
    value: Ext | None
    finished: Seconds
    serialization: Seconds
    cpu: Seconds
    peak_memory: Size
    inputs: Annotated[tuple[InputFile, ...], Meta(max_length=p.MAX_INPUT_FILES)]


class StartedS(_Record, tag=9):
    task_ids: tuple[Id, ...]


class StatusS(_Record, tag=12):
    stored_bytes: Size
    peak_memory: Size
    peak_library_memory: Size
    spilled_bytes: Size
    resident: Size
    activity: tuple[Bar, ...]


class DepLocationS(_Record):
    task_id: Id
    key: Any  #: arrays arrive as lists: made tuples and checked as ``_key`` does
    peers: tuple[str, ...] | None
    value: Ext | None


class ExecuteS(_Record, tag=30):
    task_id: Id
    key: Any
    payload: bytes
    deps: tuple[DepLocationS, ...]
    want_result: bool
    run_id: Id
    keep: bool | None
    cores: Positive
    memory: Size
    gpus: Size


ToManagerS = TaskDoneS | StartedS | StatusS
_CODES: dict[type, int] = {p.TaskDone: 2, p.Started: 9, p.Status: 12, p.Execute: 30}


def _printable_files(files: tuple[InputFile, ...]) -> None:
    for url, _, _, version in files:
        if not (url.isprintable() and version.isprintable()):
            raise p.ProtocolError(f"TaskDone.inputs: {url!r:.60} is not printable")


_ATOMS = frozenset((str, bytes, int, float))


def _as_key(value: object) -> object:
    """A key as Dask wrote it: msgpack arrays back to tuples, the atoms ``_key`` takes."""
    if type(value) is list:
        for part in value:
            if type(part) not in _ATOMS:
                break
        else:
            return tuple(value)  # ("name", i): the usual key of a collection's chunk
        return _nested_key(value, 0)
    if type(value) in _ATOMS:
        return value
    problem = _key(value)
    if problem is not None:
        raise p.ProtocolError(problem)
    return value


def _nested_key(value: object, depth: int) -> object:
    if type(value) is list:
        if depth >= MAX_KEY_DEPTH:
            raise p.ProtocolError(f"a key nested more than {MAX_KEY_DEPTH} deep")
        return tuple([_nested_key(part, depth + 1) for part in value])
    problem = _key(value)
    if problem is not None:
        raise p.ProtocolError(problem)
    return value


class _Buffers:
    """The out-of-band frames of one batch, taken in the order its values name them."""

    __slots__ = ("frames", "taken")

    def __init__(self, frames: Sequence[Any]) -> None:
        self.frames = frames
        self.taken = 0

    def value(self, ext: Ext) -> Serialized:
        code, data = ext.code, ext.data
        if code == _IN_BAND:
            return Serialized(data, [])
        if code != _OUT_OF_BAND or len(data) < _COUNT.size:
            raise p.ProtocolError(f"unknown extension {code} ({len(data)} bytes)")
        (count,) = _COUNT.unpack_from(data)
        end = self.taken + count
        if end > len(self.frames):
            raise p.ProtocolError(f"a value has {count} buffers, past the {len(self.frames)}")
        value = Serialized(data[_COUNT.size :], list(self.frames[self.taken : end]))
        self.taken = end
        return value


def _task_done(s: TaskDoneS, buffers: _Buffers) -> p.TaskDone:
    value = s.value
    if s.inputs:
        _printable_files(s.inputs)
    return tuple.__new__(
        p.TaskDone,
        (
            s.task_id,
            s.nbytes,
            s.duration,
            None if value is None else buffers.value(value),
            s.finished,
            s.serialization,
            s.cpu,
            s.peak_memory,
            s.inputs,
        ),
    )


def _started(s: StartedS, buffers: _Buffers) -> p.Started:
    return tuple.__new__(p.Started, (s.task_ids,))


def _status(s: StatusS, buffers: _Buffers) -> p.Status:
    return tuple.__new__(p.Status, msgspec.structs.astuple(s))


def _execute(s: ExecuteS, buffers: _Buffers) -> p.Execute:
    key = s.key
    if type(key) is not str:
        key = _as_key(key)
    as_key = _as_key
    deps = tuple(
        [
            tuple.__new__(
                p.DepLocation,
                (
                    d.task_id,
                    d.key if type(d.key) is str else as_key(d.key),
                    d.peers,
                    None if d.value is None else buffers.value(d.value),
                ),
            )
            for d in s.deps
        ]
    )
    return tuple.__new__(
        p.Execute,
        (
            s.task_id,
            key,
            s.payload,
            deps,
            s.want_result,
            s.run_id,
            s.keep,
            s.cores,
            s.memory,
            s.gpus,
        ),
    )


_BUILD: dict[type, Callable[[Any, _Buffers], Any]] = {
    TaskDoneS: _task_done,
    StartedS: _started,
    StatusS: _status,
    ExecuteS: _execute,
}


class MsgspecWire:
    """Encode and decode batches of the per-task records, checked on the way in."""

    def __init__(self) -> None:
        self._frames: list[Any] = []
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._extension)
        self.to_manager = msgspec.msgpack.Decoder(list[ToManagerS])
        self.to_worker = msgspec.msgpack.Decoder(list[ExecuteS])

    def _extension(self, value: object) -> Ext:
        if type(value) is not Serialized:
            raise TypeError(f"a {type(value).__name__} is not plain data")
        header = value.header if type(value.header) is bytes else bytes(value.header)
        if not value.buffers:
            return Ext(_IN_BAND, header)
        for buffer in value.buffers:
            view = buffer if type(buffer) is pickle.PickleBuffer else pickle.PickleBuffer(buffer)
            self._frames.append(view.raw())
        return Ext(_OUT_OF_BAND, _COUNT.pack(len(value.buffers)) + header)

    def encode(self, messages: Sequence[Any]) -> list[Any]:
        """The frames of a batch: each record as ``[code, *fields]``."""
        frames = self._frames = [b""]
        codes = _CODES
        body = self._encoder.encode([(codes[type(m)], *m) for m in messages])
        frames[0] = MAGIC + body
        return frames

    def decode(self, frames: Sequence[Any], decoder: msgspec.msgpack.Decoder[Any]) -> list[Any]:
        """The records of a batch, every field checked, or ``ProtocolError``."""
        first = memoryview(frames[0])
        if first[: len(MAGIC)] != MAGIC:
            raise p.ProtocolError("not a daskvine_py message")
        try:
            structs = decoder.decode(first[len(MAGIC) :])
        except msgspec.DecodeError as exc:  # ValidationError included
            raise p.ProtocolError(f"a bad batch: {exc}") from exc
        buffers = _Buffers(frames[1:])
        build = _BUILD
        records = [build[type(s)](s, buffers) for s in structs]
        if buffers.taken != len(buffers.frames):
            raise p.ProtocolError("frames that belong to no value")
        return records

    def decode_structs(
        self, frames: Sequence[Any], decoder: msgspec.msgpack.Decoder[Any]
    ) -> list[Any]:
        """The structs alone, checked by msgspec and not made records: what decoding would
        cost if the rest of the package read the structs themselves (a ceiling)."""
        return decoder.decode(memoryview(frames[0])[len(MAGIC) :])
