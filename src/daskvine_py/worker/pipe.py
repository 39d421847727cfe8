"""The pipe between a worker and each of its library processes: the records either side
sends, and how they travel (``send``, ``receive``)::

    worker ──Run(functions=[(function_id, bytes), ...], config=RunConfig | None,
                 calls=[Call(task_id, key, payload, inputs, keep, send, cores), ...])──► library
    worker ──Export(task_ids, drop)── / ──Forget(task_ids)──────────────────────► library
    worker ◄──Done(task_id, Serialized | None, seconds, nbytes, live, serialization, ...)
    worker ◄──Exported(task_id, Serialized | None, seconds, error)──────────────────
    worker ◄──Erred(task_id, exception | None, traceback, message, type_name)────────
    worker ◄──Missing(task_id, dep_id)────── (a live input is not here: it did not run)
    worker ◄──Crashed(task_id, reason)──────────── (fork mode: the child died)
    worker ◄──Ready()───────────── (once, when started and its imports are done)
    worker ◄──Replies([Done | Erred | Crashed | Missing, ...])── (tiny tasks' replies held)

``library`` is the process that serves it.
Both ends are ours, of one version: nothing here is validated, and nothing is versioned.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, TypeAlias

from daskvine_py.wire import protocol as p
from daskvine_py.wire import sharedbuf
from daskvine_py.wire.serialize import Serialized

#: One input of a call: its Dask key, its task id, its value (None: live in the library).
#: A bare tuple: a call carries one per input, built and unpickled on the hot path.
Input: TypeAlias = tuple[Hashable, int, Serialized | None]
#: A function the library has not seen: its id and its cloudpickle bytes.
FunctionCode: TypeAlias = tuple[bytes, bytes]


class Call(NamedTuple):
    """One task to run. Its inputs come with it, by their Dask keys, as ``Serialized``
    values, or as None: live in this library (``Done.live``), by the input's task id."""

    task_id: int
    key: Hashable
    payload: bytes  #: the pickled ``GraphNode``
    inputs: list[Input]
    #: keep the result here, live, for later tasks (``Forget`` drops it); None as False
    #: (an output the cache keeps: the worker decides by its size)
    keep: bool | None = False
    #: serialize the result and send it with ``Done`` (an output, or no ``keep``)
    send: bool = True
    #: its cores: the library's thread pools fit them (``threads.fit``)
    cores: int = 1


class Run(NamedTuple):
    """Worker -> library: functions it has not seen, then tasks of one run configuration,
    run in order: a call may use, live, the result of a call before it."""

    functions: list[FunctionCode]
    config: p.RunConfig | None  #: None: the defaults
    calls: list[Call]


class Export(NamedTuple):
    """Worker -> library: serialize these live results and send them (``Exported``);
    with ``drop``, forget them here once sent (to spill them)."""

    task_ids: list[int]
    drop: bool


class Forget(NamedTuple):
    """Worker -> library: drop these live results (released, or kept elsewhere)."""

    task_ids: list[int]


class Ready(NamedTuple):
    """Library -> worker, once: started, and the warm imports are done."""


class Done(NamedTuple):
    task_id: int
    #: the result; None when it was not asked for (it is live here)
    value: Serialized | None
    duration: float  #: seconds the call took, serialization excluded
    #: bytes of the result: serialized, or ``dask.sizeof``'s estimate of the live object
    nbytes: int = 0
    #: the result is kept here, live (``Call.keep``, in a mode that can keep it)
    live: bool = False
    #: seconds spent unpickling the inputs and pickling the result
    serialization: float = 0.0
    #: CPU seconds of the call (its process's: ``getrusage``) and its own peak
    #: resident bytes: the process's peak while it ran less its size when it began
    cpu: float = 0.0
    peak_memory: int = 0
    #: the input files the call obtained through the node's input cache (``TaskDone.inputs``)
    inputs: tuple[tuple[str, int, int, str], ...] = ()


class Exported(NamedTuple):
    """A live result, serialized on demand (``Export``); ``value`` None with ``error``
    when it is not here or cannot be pickled."""

    task_id: int
    value: Serialized | None
    seconds: float
    error: str


class Missing(NamedTuple):
    """A call's live input is not here (its producer failed, or it was forgotten): the
    call did not run."""

    task_id: int
    dep_id: int


class Erred(NamedTuple):
    """The task's own code raised (or its function, inputs or result could not be
    (de)serialized): the fields of ``protocol.TaskErred``."""

    task_id: int
    exception: Serialized | None  #: None when it could not be pickled
    traceback: str
    message: str
    type_name: str = ""  #: the exception's type, qualified (``serialize.type_name``)


class Crashed(NamedTuple):
    """The process running the task died (fork mode's child, a task process)."""

    task_id: int
    reason: str


class Replies(NamedTuple):
    """Several of the replies above in one message: tiny tasks' replies held together."""

    replies: list[Reply]


#: What a call comes back as (a task process's reply too).
Reply: TypeAlias = Done | Erred | Crashed | Missing
#: What a worker sends its library, and what a library sends its worker.
ToLibrary: TypeAlias = Run | Export | Forget
FromLibrary: TypeAlias = Ready | Done | Erred | Crashed | Missing | Exported | Replies
#: Any record of the pipe, either way.
Record: TypeAlias = (
    Run | Call | Ready | Done | Erred | Crashed | Replies | Export | Forget | Exported | Missing
)


#: The pipe's records by tag. A record travels as ``(tag, fields)``: pickled as itself it
#: would carry its class's module and name, looked up again on every message (1.8 µs more
#: per record here, two records per task).
_RECORDS: tuple[type, ...] = (
    Run,
    Call,
    Ready,
    Done,
    Erred,
    Crashed,
    Replies,
    Export,
    Forget,
    Exported,
    Missing,
)
_TAGS = {record: tag for tag, record in enumerate(_RECORDS)}
_RUN = _TAGS[Run]
_REPLIES = _TAGS[Replies]


#: Whose segments this process writes (``sharedbuf``): the worker's pid, in the worker
#: and in its libraries (``library.main`` sets it there: ``own_segments``).
_segment_owner = os.getpid()
_PIPE = b"\0"
_SEGMENT = b"\1"


def own_segments(pid: int) -> None:
    """Segments this process writes from now on are ``pid``'s: removed if it dies."""
    global _segment_owner
    _segment_owner = pid


def send(conn: Connection, message: Record) -> None:
    """Send a record over the pipe with its large buffers as messages of their own.

    Inputs and results (``Serialized``) keep their buffers out of band, so a 100 MB array
    is written as it is rather than first copied into one big pickle; a buffer of at
    least ``sharedbuf.MIN_BYTES`` goes through shared memory, and only its segment's name
    through the pipe. The first message: the number of buffers, how each travels, the
    pickled record.
    """
    tag = _TAGS[type(message)]
    fields: tuple[Any, ...] = tuple(message)
    if tag == _RUN:  # its calls travel as plain tuples too
        functions, config, calls = fields
        fields = (functions, config, [tuple(call) for call in calls])
    elif tag == _REPLIES:
        fields = ([(_TAGS[type(reply)], tuple(reply)) for reply in fields[0]],)
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps((tag, fields), protocol=5, buffer_callback=buffers.append)
    if not buffers:
        conn.send_bytes(b"\0\0\0\0" + header)
        return
    raws = [buffer.raw() for buffer in buffers]
    ways = [
        _SEGMENT if sharedbuf.AVAILABLE and raw.nbytes >= sharedbuf.MIN_BYTES else _PIPE
        for raw in raws
    ]
    conn.send_bytes(len(raws).to_bytes(4, "little") + b"".join(ways) + header)
    for raw, way in zip(raws, ways, strict=True):
        if way is _SEGMENT:
            conn.send_bytes(sharedbuf.put(raw, _segment_owner).encode())
        else:
            conn.send_bytes(raw)


def _receive(conn: Connection) -> Any:
    """The record ``send`` sent; ``EOFError`` if the other side is gone."""
    first = conn.recv_bytes()
    count = int.from_bytes(first[:4], "little")
    buffers: list[Any] = [conn.recv_bytes() for _ in range(count)]
    for index in range(count):
        if first[4 + index] == _SEGMENT[0]:  # a segment's name: map it
            buffers[index] = sharedbuf.take(buffers[index].decode())
    tag, fields = pickle.loads(memoryview(first)[4 + count :], buffers=buffers)
    if tag == _RUN:
        functions, config, calls = fields
        fields = (functions, config, [tuple.__new__(Call, call) for call in calls])
    elif tag == _REPLIES:
        fields = ([tuple.__new__(_RECORDS[t], f) for t, f in fields[0]],)
    return tuple.__new__(_RECORDS[tag], fields)


# One function under three types (no call in between): a record either way, and what each
# end expects of the other.
receive: Callable[[Connection], Record] = _receive
receive_reply: Callable[[Connection], FromLibrary] = _receive  #: the worker's end
receive_request: Callable[[Connection], ToLibrary] = _receive  #: the library's end
