"""The wire protocol between manager, workers, peers and status clients: its version and
its framing; and the one name under which the rest of the package is used
(``from daskvine_py.wire import protocol as p``: ``p.Execute``, ``p.check_fields``,
``p.DropLog``), re-exported from ``records`` (the messages), ``validation`` (their fields)
and ``drops`` (what a receiver logs of what it drops).

Every ZeroMQ message is one batch, in one of two formats told apart by their first bytes::

    [PLAIN_MAGIC + msgpack of the records, buffer_0, buffer_1, ...]   (``plain``)
    [MAGIC + pickle of the records, buffer_0, buffer_1, ...]

Large buffers inside the records (the out-of-band buffers of a ``Serialized``) travel as
the following frames, never copied into the first. A small batch is one frame: every
frame costs a send call on each side. A batch carries as many operations as accumulated
during one loop iteration.

What a receiver must not trust with code travels as plain data: workers to their manager,
status clients to the manager and back, peers to each other (``plain.PLAIN_KINDS``;
``encode`` picks the format). Nothing in those is unpickled on arrival, and ``unpack``
refuses a pickled batch in those directions unread, so a holder of the run's keys cannot
make the manager's I/O thread run code. What the manager sends its workers (``TO_WORKER``:
tasks, functions) is a pickle: a worker runs what its manager sends anyway. Only holders
of the run's keys reach a decoder at all (``security``); with ``security=False`` a port
must only be reachable from a trusted network, as with ``dask.distributed`` without TLS.

What arrives is still checked, in every direction (``TO_MANAGER``, ``TO_WORKER``,
``TO_PEER``, ``FROM_PEER``; ``FROM_CLIENT`` and ``TO_CLIENT`` between the manager and a
status client): a batch that is not ours (wrong magic, garbage, records of another
direction, a pickle where only plain data is read) raises ``ProtocolError`` in ``unpack``,
and so does a record with a field of the wrong type, inside containers too, in
``check_fields`` (``validation``). ``decode`` does both. The receiver drops what fails,
with a rate-limited warning (``DropLog``), and keeps the good records beside it.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import TypeVar

from daskvine_py.errors import ProtocolError
from daskvine_py.wire import plain
from daskvine_py.wire.drops import DropLog
from daskvine_py.wire.plain import PLAIN_KINDS, PLAIN_MAGIC
from daskvine_py.wire.records import (
    FETCH_LANE,
    FROM_CLIENT,
    FROM_PEER,
    INLINE_BYTES,
    INPUT_DROPPED,
    INPUT_FROM_CACHE,
    INPUT_FROM_PEER,
    INPUT_FROM_STORAGE,
    MAX_INPUT_FILES,
    SPILL_LANE,
    TO_CLIENT,
    TO_MANAGER,
    TO_PEER,
    TO_WORKER,
    Abort,
    Bar,
    Cancel,
    Data,
    DepLocation,
    DiskFull,
    Execute,
    FetchFailed,
    FetchInputs,
    Frame,
    FromClient,
    FromManager,
    FromPeer,
    Function,
    GetData,
    Goodbye,
    Heartbeat,
    InputsDropped,
    InputServer,
    LiveReply,
    LiveRequest,
    Lost,
    Record,
    Register,
    Rejected,
    Relay,
    Relayed,
    Release,
    Replicas,
    Replicate,
    RetireWorker,
    RunConfig,
    RunEnded,
    Shutdown,
    Started,
    Status,
    StatusReply,
    StatusRequest,
    TaskCrashed,
    TaskDone,
    TaskErred,
    TaskExhausted,
    TaskId,
    ToClient,
    ToManager,
    ToPeer,
    ToWorker,
    Transfers,
    Upload,
    Uploaded,
    Welcome,
    Withdraw,
    Withdrawn,
    inlinable,
)
from daskvine_py.wire.serialize import Serialized
from daskvine_py.wire.software import Code, Environment, Software
from daskvine_py.wire.validation import (
    MAX_KEY_DEPTH,
    check_fields,
    connectable,
    split_address,
    task_ids_named,
)

#: Every name other modules use as ``p.NAME``: the records, their checks, the drop log.
__all__ = [
    "DropLog",
    "Abort",
    "Bar",
    "Cancel",
    "FETCH_LANE",
    "INPUT_DROPPED",
    "INPUT_FROM_CACHE",
    "INPUT_FROM_PEER",
    "INPUT_FROM_STORAGE",
    "MAX_INPUT_FILES",
    "SPILL_LANE",
    "Data",
    "DepLocation",
    "DiskFull",
    "Execute",
    "FetchFailed",
    "FetchInputs",
    "Frame",
    "FROM_CLIENT",
    "FROM_PEER",
    "FromClient",
    "FromManager",
    "FromPeer",
    "Function",
    "GetData",
    "Goodbye",
    "Heartbeat",
    "InputServer",
    "InputsDropped",
    "inlinable",
    "INLINE_BYTES",
    "LiveReply",
    "LiveRequest",
    "Lost",
    "Record",
    "Register",
    "Rejected",
    "Relay",
    "Relayed",
    "Release",
    "Replicas",
    "Replicate",
    "RetireWorker",
    "RunConfig",
    "RunEnded",
    "Software",
    "Environment",
    "Code",
    "Shutdown",
    "Started",
    "Status",
    "StatusReply",
    "StatusRequest",
    "TaskCrashed",
    "TaskDone",
    "TaskErred",
    "TaskExhausted",
    "TaskId",
    "TO_CLIENT",
    "TO_MANAGER",
    "TO_PEER",
    "TO_WORKER",
    "ToClient",
    "ToManager",
    "ToPeer",
    "ToWorker",
    "Transfers",
    "Upload",
    "Uploaded",
    "Welcome",
    "Withdraw",
    "Withdrawn",
    "Serialized",
    "MAX_KEY_DEPTH",
    "check_fields",
    "connectable",
    "split_address",
    "task_ids_named",
    "MAGIC",
    "PLAIN_KINDS",
    "PLAIN_MAGIC",
    "PROTOCOL_VERSION",
    "decode",
    "encode",
    "encode_pickled",
    "unpack",
    "zero_copy",
]

#: Bumped on any incompatible change; checked when a worker registers.
PROTOCOL_VERSION = 15
#: How the first frame of a pickled batch begins (a plain one: ``PLAIN_MAGIC``).
MAGIC = b"dvp"

#: The records a receiver reads: those of the direction it passes (``TO_MANAGER``: a
#: list of ``ToManager``).
R = TypeVar("R", bound=Record)


def encode(messages: Sequence[Record]) -> list[Frame]:
    """Frames of one batch; out-of-band buffers become frames of their own. Plain data
    when every record may travel so (``plain``), else a pickle."""
    if plain.only_plain(messages):
        return plain.encode(messages)
    return encode_pickled(messages)


def coalesce_releases(messages: list[FromManager]) -> list[FromManager]:
    """``messages`` with each run of adjacent ``Release`` records made one, in order.

    A tree's results are released one by one as their readers finish: one record per
    task, which the worker turns into one pipe write to its library each (measured on
    a 50,000-leaf tree: 16,925 ``Release`` records for as many tasks on one worker, each
    write waking the library). Only adjacent ones are merged: a ``Release`` moved past
    an ``Execute`` of the same task (released and made anew in one batch) would drop
    the new result.
    """
    out: list[FromManager] = []
    ids: list[int] | None = None
    for message in messages:
        if type(message) is Release:
            if ids is None:
                ids = list(message.task_ids)
            else:
                ids.extend(message.task_ids)
            continue
        if ids is not None:
            out.append(Release(tuple(ids)))
            ids = None
        out.append(message)
    if ids is not None:
        out.append(Release(tuple(ids)))
    return out


def encode_pickled(messages: Sequence[Record]) -> list[Frame]:
    """Frames of one batch as a pickle, whatever its records (``encode`` picks)."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(list(messages), protocol=5, buffer_callback=buffers.append)
    return [MAGIC + header, *(b.raw() for b in buffers)]


def zero_copy(frames: Sequence[Frame]) -> bool:
    """Whether to send ``frames`` without copying: only when they hold out-of-band buffers.

    ZeroMQ's zero-copy sends cost bookkeeping (measured here: 20 µs per small message,
    against 13 µs copied); a batch of records alone is small, so it is copied.
    """
    return len(frames) > 1


#: Directions (sets of records) read as plain data only: a pickle there is refused unread.
_PLAIN_ONLY: dict[frozenset[type], bool] = {}


def unpack(frames: Sequence[Frame], allowed: frozenset[type[R]]) -> list[R]:
    """The records of one batch, their fields not checked yet (``check_fields``), or
    ``ProtocolError`` if it is not a batch of ours, of records ``allowed`` here.

    A pickled batch is refused, unopened, where every record ``allowed`` travels as plain
    data. For receivers that keep the good records of a batch beside a bad one;
    ``decode`` checks them all.
    """
    first = memoryview(frames[0]) if frames else memoryview(b"")
    magic = first[: len(MAGIC)]
    if magic == PLAIN_MAGIC:
        return plain.decode(frames, allowed)
    if magic != MAGIC:
        raise ProtocolError(f"not a daskvine_py message ({len(frames)} frames)")
    plain_only = _PLAIN_ONLY.get(allowed)
    if plain_only is None:
        plain_only = _PLAIN_ONLY[allowed] = allowed <= PLAIN_KINDS
    if plain_only:
        raise ProtocolError(
            "a pickled batch where only plain data is read: dropped unopened (a sender of "
            "protocol 6 or older, or not ours)"
        )
    try:
        messages = pickle.loads(first[len(MAGIC) :], buffers=frames[1:])
    except Exception as exc:
        raise ProtocolError(f"undecodable message header: {exc!r}") from exc
    if type(messages) is not list:
        raise ProtocolError(f"message header is a {type(messages).__name__}, not a list")
    for message in messages:
        if type(message) not in allowed:
            raise ProtocolError(f"unexpected record {type(message).__name__} in message")
    return messages


def decode(frames: Sequence[Frame], allowed: frozenset[type[R]]) -> list[R]:
    """The records of one batch, every field checked, or ``ProtocolError``."""
    messages = unpack(frames, allowed)
    for message in messages:
        check_fields(message)
    return messages
