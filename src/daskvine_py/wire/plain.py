"""The plain format: records as data only, for every direction in which the receiver must
not trust the sender with code (``PLAIN_KINDS``: workers to their manager, status clients
to the manager and back, peers to each other). Nothing in it is unpickled on arrival.

One batch::

    [PLAIN_MAGIC + msgpack([code, fields, code, fields, ...]), buffer_0, buffer_1, ...]

``code`` names the record's type (``CODES``, fixed by the protocol version) and ``fields``
is the record as a msgpack array. Records hold ints, floats, bools, None, str, bytes,
tuples of these and ``Serialized`` values; arrays come back as tuples (``use_list=False``),
so a record reads as it was sent. A ``Serialized`` (a result, an exception) travels as a
msgpack extension holding its pickle header as opaque bytes; its out-of-band buffers
follow the first frame, in the order the values appear. The receiver does not open that
pickle: the caller's thread unpickles the outputs it asked for, and values passed on to
workers (``Execute``, ``Relayed``) are unpickled there, by the tasks that read them.

Anything else is a ``ProtocolError``: garbage, an unknown code, a record of another
direction, an unknown extension, buffers that do not add up to the frames. A record with
too few or too many fields is built as it came and refused by ``check_fields``, which
still names the tasks it was about (``task_ids_named``).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import TypeVar, cast

import msgpack

from daskvine_py.errors import ProtocolError
from daskvine_py.wire.records import (
    FROM_CLIENT,
    FROM_PEER,
    TO_CLIENT,
    TO_MANAGER,
    TO_PEER,
    Data,
    DiskFull,
    FetchFailed,
    Frame,
    GetData,
    Goodbye,
    InputsDropped,
    InputServer,
    LiveReply,
    LiveRequest,
    Lost,
    Record,
    Register,
    Rejected,
    Relay,
    Replicas,
    RetireWorker,
    Started,
    Status,
    StatusReply,
    StatusRequest,
    TaskCrashed,
    TaskDone,
    TaskErred,
    TaskExhausted,
    Transfers,
    Uploaded,
    Withdrawn,
)
from daskvine_py.wire.serialize import Serialized
from daskvine_py.wire.validation import shown

#: How the first frame of a plain batch begins (a pickled batch begins with ``protocol.MAGIC``).
PLAIN_MAGIC = b"dvm"

#: Every record that travels as plain data, by its code on the wire.
KINDS: dict[int, type] = {
    1: Register,
    2: TaskDone,
    3: TaskErred,
    4: TaskCrashed,
    5: FetchFailed,
    6: Replicas,
    7: Lost,
    8: Withdrawn,
    9: Started,
    10: Transfers,
    11: DiskFull,
    12: Status,
    13: Goodbye,
    14: Relay,
    15: Uploaded,
    22: TaskExhausted,
    16: StatusRequest,
    17: RetireWorker,
    18: StatusReply,
    19: Rejected,
    20: GetData,
    21: Data,
    23: LiveRequest,
    24: LiveReply,
    25: InputServer,
    26: InputsDropped,
}
CODES: dict[type, int] = {kind: code for code, kind in KINDS.items()}
PLAIN_KINDS: frozenset[type] = frozenset(CODES)
assert PLAIN_KINDS == TO_MANAGER | FROM_CLIENT | TO_CLIENT | TO_PEER | FROM_PEER

#: The extensions a plain batch may hold: a ``Serialized`` with every byte in its header,
#: and one with out-of-band buffers (their count, then the header).
_IN_BAND = 0
_OUT_OF_BAND = 1
_COUNT = struct.Struct("<I")
#: Text may hold lone surrogates (a file name decoded with ``surrogateescape``, in a
#: traceback): they travel as they would in a pickle, rather than fail the whole batch.
_TEXT_ERRORS = "surrogatepass"
_BUFFER_TYPES = (bytes, bytearray, memoryview)
#: The records a receiver reads: those of the direction it passes.
R = TypeVar("R", bound=Record)


def only_plain(messages: Sequence[Record]) -> bool:
    """Whether every record of a batch travels as plain data."""
    kinds = PLAIN_KINDS
    return all(type(message) in kinds for message in messages)


def encode(messages: Sequence[Record]) -> list[Frame]:
    """The frames of a batch of plain records; ``ValueError`` for a field that is not
    plain data (an object, an int beyond 64 bits, a ``Serialized`` that is not one)."""
    frames: list[Frame] = [b""]

    def extension(value: object) -> msgpack.ExtType:
        if type(value) is Serialized:
            return _extension(value, frames)
        raise TypeError(f"a {type(value).__name__} is not plain data")

    flat: list[object] = []
    codes = CODES
    for message in messages:
        flat.append(codes[type(message)])
        flat.append(message)
    try:
        body = msgpack.packb(flat, default=extension, unicode_errors=_TEXT_ERRORS)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"a record that cannot travel as plain data: {exc}") from exc
    frames[0] = PLAIN_MAGIC + body
    return frames


def _extension(value: Serialized, frames: list[Frame]) -> msgpack.ExtType:
    header: object = value.header
    buffers: object = value.buffers
    if not isinstance(header, _BUFFER_TYPES) or not isinstance(buffers, (list, tuple)):
        raise TypeError("a Serialized whose header or buffers are not bytes")
    data = header if type(header) is bytes else bytes(header)
    if not buffers:
        return msgpack.ExtType(_IN_BAND, data)
    for buffer in buffers:
        # As a pickle would send it: one flat byte view (TypeError for what is no buffer)
        view = buffer if type(buffer) is pickle.PickleBuffer else pickle.PickleBuffer(buffer)
        frames.append(view.raw())
    return msgpack.ExtType(_OUT_OF_BAND, _COUNT.pack(len(buffers)) + data)


def decode(frames: Sequence[Frame], allowed: frozenset[type[R]]) -> list[R]:
    """The records of a plain batch (its first frame begins with ``PLAIN_MAGIC``), their
    fields not checked yet, or ``ProtocolError``."""
    body = memoryview(frames[0])[len(PLAIN_MAGIC) :]
    buffers = frames[1:]
    taken = 0

    def extension(code: int, data: bytes) -> Serialized:
        nonlocal taken
        if code == _IN_BAND:
            return Serialized(data, [])
        if code != _OUT_OF_BAND or len(data) < _COUNT.size:
            raise ProtocolError(f"unknown extension {code} ({len(data)} bytes)")
        (count,) = _COUNT.unpack_from(data)
        end = taken + count
        if end > len(buffers):
            raise ProtocolError(f"a value has {count} buffers, past the {len(buffers)} frames")
        value = Serialized(data[_COUNT.size :], list(buffers[taken:end]))
        taken = end
        return value

    try:
        flat = msgpack.unpackb(
            body, use_list=False, raw=False, ext_hook=extension, unicode_errors=_TEXT_ERRORS
        )
    except ProtocolError:
        raise
    except Exception as exc:  # garbage: msgpack's ValueErrors, bad UTF-8, too deep
        raise ProtocolError(f"undecodable plain batch: {type(exc).__name__}: {exc}") from exc
    if type(flat) is not tuple or len(flat) % 2:
        raise ProtocolError(f"a plain batch is a {type(flat).__name__}, not codes and records")
    if taken != len(buffers):
        raise ProtocolError(f"{len(buffers) - taken} of {len(buffers)} frames belong to no value")
    records: list[object] = []
    kinds = KINDS
    for i in range(0, len(flat), 2):
        code, fields = flat[i], flat[i + 1]
        kind = kinds.get(code) if type(code) is int else None
        if kind is None or kind not in allowed:
            what = "unknown" if kind is None else kind.__name__
            raise ProtocolError(f"unexpected record {what} (code {shown(code)}) in message")
        if type(fields) is not tuple:
            raise ProtocolError(f"a {kind.__name__} is a {type(fields).__name__}, not fields")
        # As it came, whatever its length: ``check_fields`` refuses a wrong one.
        records.append(tuple.__new__(kind, fields))
    return cast("list[R]", records)  # (each of a kind ``allowed``: checked above)
