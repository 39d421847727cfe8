"""The wire protocol between manager, workers and peers: message kinds and framing.

Every ZeroMQ message is one batch::

    [MAGIC + header, buffer_0, buffer_1, ...]

``header`` is a pickled list of the records below; large buffers inside them (the
out-of-band buffers of a ``Serialized``) travel as the following frames, never copied into
the header. A small batch is one frame: every frame costs a send call on each side. A
batch carries as many operations as accumulated during one loop iteration.

Messages are pickles: a port must only be reachable from a trusted network, as with
``dask.distributed`` without TLS. What arrives is still checked: a batch that is not ours
(wrong magic, garbage, unknown record types) raises ``ProtocolError`` and the caller logs
and drops it.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from .errors import ProtocolError
from .serialize import Serialized

#: Bumped on any incompatible change; checked when a worker registers.
PROTOCOL_VERSION = 4
#: Results this small (pickled, nothing out of band) ride along with ``TaskDone`` to the
#: manager, which hands them to the tasks that read them inside ``Execute``: a tree of
#: small partial results moves no data between peers (a fetch costs two messages and two
#: wake-ups on each side), for a few hundred bytes through the manager per result.
INLINE_BYTES = 1024
#: How the first frame of every message of ours begins.
MAGIC = b"dvp"

TaskId = int


class DepLocation(NamedTuple):
    """Where an input of a task lives: its id, its Dask key, the peers that hold it.

    ``peers`` is ``()`` when the worker holds the input, and ``None`` when the worker is
    computing it (the task was sent ahead, to start as soon as the input is ready).
    ``value`` is the input itself when it is small (see ``INLINE_BYTES``) and the worker
    does not hold it: no fetch from a peer, and the worker keeps no copy.
    """

    task_id: TaskId
    key: Hashable
    peers: tuple[str, ...] | None
    value: Serialized | None = None


# -- worker -> manager ----------------------------------------------------------------


class Register(NamedTuple):
    version: int
    name: str
    cores: int
    memory: int  #: bytes of memory the worker may use for results
    hostname: str
    peer_address: str  #: where peers fetch this worker's results
    pid: int


class TaskDone(NamedTuple):
    task_id: TaskId
    nbytes: int
    duration: float
    #: the result itself: when the manager asked for it (outputs) or when it is small
    value: Serialized | None
    #: the worker's ``time.time()`` when the result arrived from the library (0: unknown),
    #: for the per-worker timeline of the performance report
    finished: float = 0.0


class TaskErred(NamedTuple):
    """The task's own code raised: never retried."""

    task_id: TaskId
    exception: Serialized | None  #: None when the exception could not be pickled
    traceback: str
    message: str  #: ``repr`` of the exception, for when it cannot travel


class TaskCrashed(NamedTuple):
    """The process running the task died; the manager may retry it elsewhere."""

    task_id: TaskId
    reason: str


class FetchFailed(NamedTuple):
    """No listed peer could serve an input of a task; the task waits for the manager."""

    task_id: TaskId
    dep_id: TaskId
    peers: tuple[str, ...]


class Replicas(NamedTuple):
    """Inputs this worker copied from peers and keeps until told to release them."""

    task_ids: tuple[TaskId, ...]


class Withdrawn(NamedTuple):
    """Tasks the worker dropped unstarted when asked to (``Withdraw``): the manager may
    now run them elsewhere. Tasks already started are not listed; they report as usual."""

    task_ids: tuple[TaskId, ...]


class Transfers(NamedTuple):
    """Bytes this worker received from each peer (by peer address) since its last report."""

    received: tuple[tuple[str, int], ...]


class DiskFull(NamedTuple):
    """The store is over its memory limit with no disk left to spill to (or no longer)."""

    full: bool


class Heartbeat(NamedTuple):
    pass


class Status(NamedTuple):
    """A worker's heartbeat: what it holds and the most memory its processes have used."""

    stored_bytes: int
    peak_memory: int  #: peak resident set of the worker process, bytes
    peak_library_memory: int  #: the largest peak resident set among its library processes
    spilled_bytes: int = 0  #: of ``stored_bytes``, in spill files on disk


class Goodbye(NamedTuple):
    reason: str


# -- manager -> worker ----------------------------------------------------------------


class Welcome(NamedTuple):
    name: str
    heartbeat_interval: float  #: how often the worker should speak when it has nothing to say


class Rejected(NamedTuple):
    reason: str


class Execute(NamedTuple):
    task_id: TaskId
    key: Hashable
    payload: bytes  #: the pickled ``GraphNode``
    deps: tuple[DepLocation, ...]
    want_result: bool  #: send the value back with ``TaskDone`` (outputs only)
    run_id: int = 0  #: its run, when the run has a ``RunConfig``; 0: the defaults
    #: keep the result for later tasks; False for an output nothing else reads (the
    #: manager then sends no ``Release`` for it)
    keep: bool = True


class RunConfig(NamedTuple):
    """How the tasks of one run execute: sent once per worker, before the run's first
    ``Execute`` there, and only for a run that does not use the defaults."""

    run_id: int
    task_mode: str  #: "function-calls" or "tasks"
    exec_mode: str  #: "direct" or "fork"
    import_modules: tuple[str, ...]  #: imported once per library before the run's tasks
    env_vars: tuple[tuple[str, str], ...]
    sandbox: bool  #: own cwd and TMPDIR per task (always, in fork and tasks modes)


class Function(NamedTuple):
    """A function tasks will reference by id: sent once, before the first such task."""

    function_id: bytes
    code: Any  #: cloudpickle bytes (a buffer when large: it travels as its own frame)


class Release(NamedTuple):
    """Forget these results: nothing needs them any more."""

    task_ids: tuple[TaskId, ...]


class Cancel(NamedTuple):
    """Do not run these tasks; their run is over or their inputs were lost."""

    task_ids: tuple[TaskId, ...]


class Withdraw(NamedTuple):
    """Give these tasks back if they have not started (answer: ``Withdrawn``).

    Taking work back for an idle worker must never run a task twice: a task may have
    side effects (Dask's disk shuffle appends to files), so the manager moves it only
    once its first worker has confirmed that it dropped it unstarted.
    """

    task_ids: tuple[TaskId, ...]


class Replicate(NamedTuple):
    """Copy this result from one of these peers and keep it (``replicas=k``)."""

    task_id: TaskId
    peers: tuple[str, ...]


class Shutdown(NamedTuple):
    reason: str


# -- worker <-> worker ----------------------------------------------------------------


class GetData(NamedTuple):
    task_ids: tuple[TaskId, ...]


class Data(NamedTuple):
    task_id: TaskId
    value: Serialized | None  #: None: this worker does not hold it


TO_MANAGER = frozenset(
    {Register, TaskDone, TaskErred, TaskCrashed, FetchFailed, Replicas, Withdrawn, Transfers,
     DiskFull, Status, Goodbye}
)  # fmt: skip
TO_WORKER = frozenset(
    {Welcome, Rejected, Function, RunConfig, Execute, Release, Cancel, Withdraw, Replicate,
     Heartbeat, Shutdown}
)  # fmt: skip
TO_PEER = frozenset({GetData})
FROM_PEER = frozenset({Data})


#: Field types of what workers send, checked before the scheduler sees it.
_FIELD_TYPES: dict[type, tuple[Any, ...]] = {
    Register: (int, str, int, int, str, str, int),
    TaskDone: (int, int, (float, int), (Serialized, type(None)), (float, int)),
    TaskErred: (int, (Serialized, type(None)), str, str),
    TaskCrashed: (int, str),
    FetchFailed: (int, int, tuple),
    Replicas: (tuple,),
    Withdrawn: (tuple,),
    Transfers: (tuple,),
    DiskFull: (bool,),
    Status: (int, int, int, int),
    Goodbye: (str,),
}


def split_address(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` (or ``HOST:PORT``, ``tcp://[IPv6]:PORT``) as ``(host, port)``."""
    rest = address[len("tcp://") :] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535 or "/" in rest:
        raise ValueError(f"expected an address like tcp://HOST:PORT, not {address!r}")
    return host, int(port)


def inlinable(value: Serialized) -> bool:
    """Whether a result is small enough to travel inside ``TaskDone`` and ``Execute``."""
    return not value.buffers and len(value.header) <= INLINE_BYTES


def check_fields(message: Any) -> None:
    """``ProtocolError`` if a record from a worker has fields of the wrong types."""
    types = _FIELD_TYPES.get(type(message))
    if types is None:
        return
    for name, value, expected in zip(message._fields, message, types, strict=True):
        if not isinstance(value, expected):
            raise ProtocolError(f"{type(message).__name__}.{name} is a {type(value).__name__}")


def encode(messages: Sequence[Any]) -> list[Any]:
    """Frames of one batch; out-of-band buffers become frames of their own."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(list(messages), protocol=5, buffer_callback=buffers.append)
    return [MAGIC + header, *(b.raw() for b in buffers)]


def zero_copy(frames: Sequence[Any]) -> bool:
    """Whether to send ``frames`` without copying: only when they hold out-of-band buffers.

    ZeroMQ's zero-copy sends cost bookkeeping (measured here: 20 µs per small message,
    against 13 µs copied); a batch of records alone is small, so it is copied.
    """
    return len(frames) > 1


def decode(frames: Sequence[Any], allowed: frozenset[type]) -> list[Any]:
    """The records of one batch, or ``ProtocolError`` if it is not a valid batch."""
    first = memoryview(frames[0]) if frames else memoryview(b"")
    if first[: len(MAGIC)] != MAGIC:
        raise ProtocolError(f"not a daskvine_py message ({len(frames)} frames)")
    header, buffers = first[len(MAGIC) :], frames[1:]
    if not header and len(frames) > 1:
        # Protocol 3 and older sent the magic as a frame of its own: reading that layout
        # lets an old worker's registration be rejected with a clear version mismatch.
        header, buffers = frames[1], frames[2:]
    try:
        messages = pickle.loads(header, buffers=buffers)
    except Exception as exc:
        raise ProtocolError(f"undecodable message header: {exc!r}") from exc
    if type(messages) is not list:
        raise ProtocolError(f"message header is a {type(messages).__name__}, not a list")
    for message in messages:
        if type(message) not in allowed:
            raise ProtocolError(f"unexpected record {type(message).__name__} in message")
    return messages
