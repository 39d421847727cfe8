"""The wire protocol between manager, workers, peers and status clients: message kinds
and framing.

Every ZeroMQ message is one batch::

    [MAGIC + header, buffer_0, buffer_1, ...]

``header`` is a pickled list of the records below; large buffers inside them (the
out-of-band buffers of a ``Serialized``) travel as the following frames, never copied into
the header. A small batch is one frame: every frame costs a send call on each side. A
batch carries as many operations as accumulated during one loop iteration.

Messages are pickles: only holders of the run's keys reach a decoder (``security``); with
``security=False`` a port must only be reachable from a trusted network, as with
``dask.distributed`` without TLS. What arrives is still checked, in every direction
(``TO_MANAGER``, ``TO_WORKER``, ``TO_PEER``, ``FROM_PEER``; ``FROM_CLIENT`` and
``TO_CLIENT`` between the manager and a status client): a batch that is not ours (wrong
magic, garbage, records of another direction) raises ``ProtocolError`` in ``unpack``, and
so does a record with a field of the wrong type, inside containers too, in
``check_fields`` (see "validation" below). ``decode`` does both. The receiver drops what
fails, with a rate-limited warning (``DropLog``), and keeps the good records beside it.
"""

from __future__ import annotations

import numbers
import pickle
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

from daskvine_py.errors import ProtocolError
from daskvine_py.options import EXEC_MODES, TASK_MODES
from daskvine_py.wire.serialize import Serialized

#: Bumped on any incompatible change; checked when a worker registers.
PROTOCOL_VERSION = 6
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
    #: seconds its library spent unpickling its inputs and pickling its result (not in
    #: ``duration``); 0 for inputs and a result that stayed live
    serialization: float = 0.0


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


class Relay(NamedTuple):
    """No holder of these inputs answered this worker (peers it cannot reach): the
    manager fetches them from a holder (``Upload``) and forwards them (``Relayed``)."""

    task_ids: tuple[TaskId, ...]


class Uploaded(NamedTuple):
    """A result the manager asked for (``Upload``); None: not held here."""

    task_id: TaskId
    value: Serialized | None


class Lost(NamedTuple):
    """Results this worker reported done that it no longer holds: the library process
    that kept them live died. The manager recomputes those still needed (lineage)."""

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
    #: manager then sends no ``Release`` for it); None for such an output the cache
    #: keeps: kept only when too large to travel inline (``inlinable``), else the
    #: manager holds the value it received
    keep: bool | None = True


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


class Upload(NamedTuple):
    """Send these results to the manager (``Uploaded``): a worker that cannot reach this
    one needs them."""

    task_ids: tuple[TaskId, ...]


class Relayed(NamedTuple):
    """An input asked for with ``Relay``, from its holder through the manager; None: no
    holder could give it."""

    task_id: TaskId
    value: Serialized | None


class Replicate(NamedTuple):
    """Copy this result from one of these peers and keep it (``replicas=k``)."""

    task_id: TaskId
    peers: tuple[str, ...]


class Shutdown(NamedTuple):
    reason: str


# -- status client <-> manager ----------------------------------------------------------
#
# A status client (``python -m daskvine_py.factory``, through ``status.StatusClient``) holds
# the run's keys, as workers do, but never registers: it asks how much work is waiting
# and may tell an idle worker of its pool to leave. The manager answers a request from
# any authenticated identity that has not registered as a worker.


class StatusRequest(NamedTuple):
    """How much work is waiting, and how idle is each worker? (answer: ``StatusReply``;
    ``Rejected`` for another protocol version)."""

    version: int
    name: str  #: the client's name, for the manager's log


class RetireWorker(NamedTuple):
    """Tell the worker of this name to leave (a pool retiring an idle worker of its own)."""

    name: str
    reason: str


class StatusReply(NamedTuple):
    """What ``manager_loop.Demand`` holds, as it was when the request arrived."""

    #: tasks queued at the manager and tasks on workers: the cores the work could use now
    cores_needed: int
    #: (worker name, cores, seconds since it last held a task) for each connected worker
    workers: tuple[tuple[str, int, float], ...]


# -- worker <-> worker ----------------------------------------------------------------


class GetData(NamedTuple):
    task_ids: tuple[TaskId, ...]


class Data(NamedTuple):
    task_id: TaskId
    value: Serialized | None  #: None: this worker does not hold it


TO_MANAGER = frozenset(
    {Register, TaskDone, TaskErred, TaskCrashed, FetchFailed, Replicas, Lost, Withdrawn,
     Transfers, DiskFull, Status, Goodbye, Relay, Uploaded}
)  # fmt: skip
TO_WORKER = frozenset(
    {Welcome, Rejected, Function, RunConfig, Execute, Release, Cancel, Withdraw, Replicate,
     Heartbeat, Shutdown, Upload, Relayed}
)  # fmt: skip
TO_PEER = frozenset({GetData})
FROM_PEER = frozenset({Data})
FROM_CLIENT = frozenset({StatusRequest, RetireWorker})
TO_CLIENT = frozenset({StatusReply, Rejected})


# -- validation -------------------------------------------------------------------------
#
# Every record that arrives is checked field by field before anything reads it: its
# length, the type of each field, the types inside containers (task ids, peer addresses,
# the parts of a ``Serialized``, the inputs of an ``Execute``), and the few values that
# would break a loop later (a NaN duration poisons the duration estimates, a NaN
# heartbeat interval the worker's poll timeout). A field's rule is a type (or tuple of
# types) for ``isinstance`` and, for containers and values, a function saying what is
# wrong with it (None: nothing). This is on the hot path: see ``check_fields``.


class _Field(NamedTuple):
    types: type | tuple[type, ...]
    problem: Callable[[Any], str | None] | None = None


class _Rule(NamedTuple):
    types: tuple[type | tuple[type, ...], ...]  #: one per field, for ``isinstance``
    deep: tuple[tuple[int, Callable[[Any], str | None]], ...]  #: (field index, check)


#: What out-of-band decoding yields for a buffer: the frame objects the receiver passed
#: (memoryviews of ZeroMQ frames, or bytes), ``bytes``/``bytearray`` when it travelled in
#: band, a ``PickleBuffer`` in a record made locally.
_BUFFER_TYPES = (bytes, bytearray, memoryview, pickle.PickleBuffer)
#: A header is pickled in band, so it arrives as bytes. Not a memoryview: the manager
#: passes small values on inside ``Execute``, and a memoryview cannot be pickled again.
_HEADER_TYPES = (bytes, bytearray)
_NUMBER = (int, float)
_NUMBER_SET = frozenset(_NUMBER)
#: Dask's keys: these, and tuples of them (``dask.core.iskey``), nested this deep at most.
_KEY_ATOMS = (str, bytes, int, float)
_KEY_ATOM_SET = frozenset(_KEY_ATOMS)
MAX_KEY_DEPTH = 16
_INF = float("inf")


def _serialized(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is not Serialized:
        return f"a {type(value).__name__}, not a Serialized"
    if not isinstance(value.header, _HEADER_TYPES):
        return f"its header is a {type(value.header).__name__}"
    buffers = value.buffers
    if type(buffers) is not list and type(buffers) is not tuple:
        return f"its buffers are a {type(buffers).__name__}"
    for buffer in buffers:
        if not isinstance(buffer, _BUFFER_TYPES):
            return f"a buffer is a {type(buffer).__name__}"
    return None


def _ids(values: tuple) -> str | None:
    for value in values:
        if type(value) is not int:
            return f"a task id is a {type(value).__name__}"
    return None


def _texts(values: tuple) -> str | None:
    for value in values:
        if type(value) is not str:
            return f"holds a {type(value).__name__}, not a str"
    return None


def _text_pairs(values: tuple) -> str | None:
    for value in values:
        if type(value) is not tuple or len(value) != 2 or _texts(value) is not None:
            return f"holds {value!r:.60}, not a pair of str"
    return None


def _transfer_counts(values: tuple) -> str | None:
    for value in values:
        if (
            type(value) is not tuple
            or len(value) != 2
            or type(value[0]) is not str
            or type(value[1]) is not int
            or value[1] < 0
        ):
            return f"holds {value!r:.60}, not (peer address, bytes)"
    return None


def _worker_loads(values: tuple) -> str | None:
    for value in values:
        if (
            type(value) is not tuple
            or len(value) != 3
            or type(value[0]) is not str
            or type(value[1]) is not int
            or value[1] < 1
            or type(value[2]) not in _NUMBER_SET
            or _seconds(value[2]) is not None
        ):
            return f"holds {value!r:.60}, not (worker name, cores, idle seconds)"
    return None


def _key(key: Any, depth: int = 0) -> str | None:
    if type(key) is tuple:
        if depth >= MAX_KEY_DEPTH:
            return f"a key nested more than {MAX_KEY_DEPTH} deep"
        for part in key:
            if type(part) not in _KEY_ATOM_SET:
                problem = _key(part, depth + 1)
                if problem is not None:
                    return problem
        return None
    if isinstance(key, _KEY_ATOMS):
        return None
    if isinstance(key, numbers.Real):
        return None  # numpy integers, which Dask itself does not accept everywhere
    return f"a key cannot hold a {type(key).__name__}"


def _deps(deps: tuple) -> str | None:
    for dep in deps:
        if type(dep) is not DepLocation or len(dep) != 4:
            return f"an input is a {type(dep).__name__}, not a DepLocation"
        task_id, key, peers, value = dep
        if type(task_id) is not int:
            return f"an input's task id is a {type(task_id).__name__}"
        problem = _key(key)
        if problem is None and peers is not None:
            problem = _texts(peers) if type(peers) is tuple else "its peers are not a tuple"
        if problem is None:
            problem = _serialized(value)
        if problem is not None:
            return f"input {task_id}: {problem}"
    return None


def _size(value: int) -> str | None:
    return None if value >= 0 else "negative"


def _positive(value: int) -> str | None:
    return None if value >= 1 else "below 1"


def _seconds(value: float) -> str | None:
    # NaN fails both comparisons.
    return None if 0.0 <= value < _INF else f"{value!r} is not a finite number >= 0"


def _interval(value: float) -> str | None:
    return None if 0.0 < value < _INF else f"{value!r} is not a finite number > 0"


def _address(value: str) -> str | None:
    return None if connectable(value) else f"{value!r:.60} is not tcp://HOST:PORT"


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else f"{value!r:.40} is not one of {choices}"

    return check


_ID = _Field(int)
_IDS = _Field(tuple, _ids)
_TEXT = _Field(str)
_TEXTS = _Field(tuple, _texts)
_FLAG = _Field(bool)
_SIZE = _Field(int, _size)
_SECONDS = _Field(_NUMBER, _seconds)
_VALUE = _Field((Serialized, type(None)), _serialized)
_KEY = _Field((*_KEY_ATOMS, tuple), _key)

_FIELDS: dict[type, tuple[_Field, ...]] = {
    # worker -> manager
    Register: (_ID, _TEXT, _Field(int, _positive), _SIZE, _TEXT, _Field(str, _address), _ID),
    TaskDone: (_ID, _SIZE, _SECONDS, _VALUE, _SECONDS, _SECONDS),
    TaskErred: (_ID, _VALUE, _TEXT, _TEXT),
    TaskCrashed: (_ID, _TEXT),
    FetchFailed: (_ID, _ID, _TEXTS),
    Replicas: (_IDS,),
    Lost: (_IDS,),
    Relay: (_IDS,),
    Uploaded: (_ID, _VALUE),
    Withdrawn: (_IDS,),
    Transfers: (_Field(tuple, _transfer_counts),),
    DiskFull: (_FLAG,),
    Status: (_SIZE, _SIZE, _SIZE, _SIZE),
    Goodbye: (_TEXT,),
    # manager -> worker
    Welcome: (_TEXT, _Field(_NUMBER, _interval)),
    Rejected: (_TEXT,),
    Function: (_Field(bytes), _Field(_BUFFER_TYPES)),
    RunConfig: (
        _ID,
        _Field(str, _one_of(TASK_MODES)),
        _Field(str, _one_of(EXEC_MODES)),
        _TEXTS,
        _Field(tuple, _text_pairs),
        _FLAG,
    ),
    Execute: (_ID, _KEY, _Field(bytes), _Field(tuple, _deps), _FLAG, _ID, _FLAG),
    Release: (_IDS,),
    Cancel: (_IDS,),
    Withdraw: (_IDS,),
    Replicate: (_ID, _TEXTS),
    Upload: (_IDS,),
    Relayed: (_ID, _VALUE),
    Heartbeat: (),
    Shutdown: (_TEXT,),
    # status client <-> manager
    StatusRequest: (_ID, _TEXT),
    RetireWorker: (_TEXT, _TEXT),
    StatusReply: (_SIZE, _Field(tuple, _worker_loads)),
    # worker <-> worker
    GetData: (_IDS,),
    Data: (_ID, _VALUE),
}

_RULES: dict[type, _Rule] = {
    kind: _Rule(
        tuple(field.types for field in fields),
        tuple((i, field.problem) for i, field in enumerate(fields) if field.problem),
    )
    for kind, fields in _FIELDS.items()
}


# Predicates for the hot records, stricter than the rules (exact types only): what they
# do not accept goes through the rules, which accept or explain.


def _task_done_ok(m: Any) -> bool:
    if len(m) != 6:
        return False
    task_id, nbytes, duration, value, finished, serialization = m
    return (
        type(task_id) is int
        and type(nbytes) is int
        and nbytes >= 0
        and type(duration) is float
        and 0.0 <= duration < _INF
        and type(finished) is float
        and 0.0 <= finished < _INF
        and type(serialization) is float
        and 0.0 <= serialization < _INF
        and (value is None or _serialized(value) is None)
    )


def _execute_ok(m: Any) -> bool:
    if len(m) != 7:
        return False
    task_id, key, payload, deps, want_result, run_id, keep = m
    if not (
        type(task_id) is int
        and type(payload) is bytes
        and type(deps) is tuple
        and type(want_result) is bool
        and type(run_id) is int
        and (keep is None or type(keep) is bool)
        and (type(key) is str or _key(key) is None)
    ):
        return False
    atoms = _KEY_ATOM_SET
    for dep in deps:
        if type(dep) is not DepLocation or len(dep) != 4:
            return False
        dep_id, dep_key, peers, value = dep
        if type(dep_id) is not int:
            return False
        if type(dep_key) is tuple:  # ("name", i): the usual key of a collection's chunk
            for part in dep_key:
                if type(part) not in atoms and _key(part, 1) is not None:
                    return False
        elif type(dep_key) not in atoms and _key(dep_key) is not None:
            return False
        if peers is not None:
            if type(peers) is not tuple:
                return False
            for peer in peers:
                if type(peer) is not str:
                    return False
        if value is not None and (
            type(value) is not Serialized or type(value.header) is not bytes or value.buffers
        ):
            if _serialized(value) is not None:  # the usual small inline value passed above
                return False
    return True


_FAST: dict[type, Callable[[Any], bool]] = {TaskDone: _task_done_ok, Execute: _execute_ok}


def split_address(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` (or ``HOST:PORT``, ``tcp://[IPv6]:PORT``) as ``(host, port)``."""
    rest = address[len("tcp://") :] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535 or "/" in rest:
        raise ValueError(f"expected an address like tcp://HOST:PORT, not {address!r}")
    return host, int(port)


#: What ZeroMQ connects to without refusing it at once: a host name of letters, digits,
#: dots, dashes and underscores, an IPv4 address or an IPv6 one in brackets, and a port.
_CONNECTABLE = re.compile(r"tcp://(\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z._-]+):([0-9]{1,5})")


def connectable(address: str) -> bool:
    """Whether ``address`` is a ``tcp://HOST:PORT`` a peer socket can connect to: anything
    else (spaces, ``*``, a missing port) makes ``connect`` raise."""
    match = _CONNECTABLE.fullmatch(address)
    return match is not None and 0 < int(match.group(2)) < 65536


def inlinable(value: Serialized) -> bool:
    """Whether a result is small enough to travel inside ``TaskDone`` and ``Execute``."""
    return not value.buffers and len(value.header) <= INLINE_BYTES


def check_fields(message: Any) -> None:
    """``ProtocolError`` unless ``message`` is a record of ours with valid fields.

    The most frequent records (``TaskDone``, ``Execute``) first go through a predicate
    written out by hand for speed; a record it does not accept, and every other kind, is
    checked rule by rule, which also says what is wrong. Measured with timeit on the
    development machine: 0.4 µs for a ``TaskDone``, 0.3 µs for an ``Execute`` with no
    inputs and 1 µs with three (unpickling them costs 0.35 and 0.4 µs).
    """
    fast = _FAST.get(type(message))
    if fast is not None and fast(message):
        return
    kind = type(message)
    rule = _RULES.get(kind)
    if rule is None:
        raise ProtocolError(f"unexpected record {kind.__name__}")
    types, deep = rule
    if len(message) != len(types):
        raise ProtocolError(f"{kind.__name__} has {len(message)} fields, not {len(types)}")
    for value, expected in zip(message, types, strict=True):
        if not isinstance(value, expected):
            raise _field_error(message, types)
    try:
        for index, problem_of in deep:
            problem = problem_of(message[index])
            if problem is not None:
                raise ProtocolError(f"{kind.__name__}.{kind._fields[index]}: {problem}")
    except (AttributeError, TypeError, ValueError) as exc:  # an object built by a crafted pickle
        raise ProtocolError(f"{kind.__name__}: unreadable field ({exc!r})") from exc


def _field_error(message: Any, types: tuple) -> ProtocolError:
    kind = type(message)
    for name, value, expected in zip(kind._fields, message, types, strict=True):
        if not isinstance(value, expected):
            return ProtocolError(f"{kind.__name__}.{name} is a {type(value).__name__}")
    raise AssertionError("no field is wrong")


def task_ids_named(message: Any) -> tuple[int, ...]:
    """The task ids a record names (``task_id``, ``task_ids``), as far as they are ints:
    for a record that fails ``check_fields``, what its sender was talking about."""
    named = []
    fields = getattr(type(message), "_fields", ())
    for name, value in zip(fields, message, strict=False):  # a crafted one may be short
        if name == "task_id" and type(value) is int:
            named.append(value)
        elif name == "task_ids" and type(value) is tuple:
            named.extend(v for v in value if type(v) is int)
    return tuple(named)


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


def unpack(frames: Sequence[Any], allowed: frozenset[type]) -> list[Any]:
    """The records of one batch, their fields not checked yet (``check_fields``), or
    ``ProtocolError`` if it is not a batch of ours, of records ``allowed`` here.

    For receivers that keep the good records of a batch beside a bad one; ``decode``
    checks them all.
    """
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


def decode(frames: Sequence[Any], allowed: frozenset[type]) -> list[Any]:
    """The records of one batch, every field checked, or ``ProtocolError``."""
    messages = unpack(frames, allowed)
    for message in messages:
        check_fields(message)
    return messages


class DropLog:
    """Warnings about what a loop drops, at most one per kind per ``interval`` seconds.

    The first drop of a kind (say, malformed messages from one worker) is logged at once;
    later ones within ``interval`` are only counted, and the next warning of that kind
    says how many there were. A flood of garbage costs a few lines a minute, never one
    per message. ``now`` is the caller's monotonic clock.
    """

    __slots__ = ("logger", "interval", "max_kinds", "_last")

    def __init__(self, logger: Any, interval: float = 60.0, max_kinds: int = 1024) -> None:
        self.logger = logger
        self.interval = interval
        #: kinds remembered at most (sources come and go): past it, all are forgotten
        self.max_kinds = max_kinds
        #: kind -> [when its last warning was logged, drops since then not logged]
        self._last: dict[Hashable, list] = {}

    def warn(self, kind: Hashable, now: float, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log ``msg % args`` unless a warning of ``kind`` was logged in the last
        ``interval`` seconds (then count it); whether it was logged."""
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.interval:
            last[1] += 1
            self.logger.debug(msg, *args)
            return False
        if last is None and len(self._last) >= self.max_kinds:
            self._last.clear()
        if last is not None and last[1]:
            msg += " (and %d more like it in the last %.0f s)"
            args += (last[1], now - last[0])
        self._last[kind] = [now, 0]
        self.logger.warning(msg, *args, exc_info=exc_info)
        return True
