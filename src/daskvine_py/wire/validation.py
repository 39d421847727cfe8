"""What a valid record holds: every record that arrives is checked field by field
(``check_fields``) before anything reads it; and the addresses of peers.

The receiver drops a record that fails, with a rate-limited warning (``drops.DropLog``),
and keeps the good records beside it.
"""

from __future__ import annotations

import numbers
import pickle
import re
import reprlib
from collections.abc import Callable
from typing import Any, NamedTuple

from daskvine_py.errors import ProtocolError
from daskvine_py.options import EXEC_MODES, INPUT_LIFETIMES, TASK_MODES
from daskvine_py.wire.records import (
    INPUT_DROPPED,
    INPUT_FROM_CACHE,
    INPUT_FROM_PEER,
    INPUT_FROM_STORAGE,
    MAX_INPUT_FILES,
    MAX_INPUT_URL,
    MAX_INPUT_VERSION,
    SPILL_LANE,
    Abort,
    Cancel,
    Data,
    DepLocation,
    DiskFull,
    Execute,
    FetchFailed,
    FetchInputs,
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
    Transfers,
    Upload,
    Uploaded,
    Welcome,
    Withdraw,
    Withdrawn,
)
from daskvine_py.wire.serialize import Serialized
from daskvine_py.wire.software import KINDS, Code, Environment, Software

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


#: Bounded reprs of what arrived, for error messages: a value may nest a thousand deep,
#: and the builtin ``repr`` of that raises ``RecursionError``.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def shown(value: object) -> str:
    """``value`` for a message: at most 60 characters, nested at most 3 deep."""
    return _REPR.repr(value)[:60]


def _serialized(value: object) -> str | None:
    if value is None:
        return None
    if type(value) is not Serialized:
        return f"a {type(value).__name__}, not a Serialized"
    if not isinstance(value.header, _HEADER_TYPES):
        return f"its header is a {type(value.header).__name__}"
    buffers: object = value.buffers  # a crafted pickle may make it anything
    if type(buffers) is not list and type(buffers) is not tuple:
        return f"its buffers are a {type(buffers).__name__}"
    for buffer in buffers:
        if not isinstance(buffer, _BUFFER_TYPES):
            return f"a buffer is a {type(buffer).__name__}"
    return None


def _ids(values: tuple[object, ...]) -> str | None:
    for value in values:
        if type(value) is not int:
            return f"a task id is a {type(value).__name__}"
    return None


def _texts(values: tuple[object, ...]) -> str | None:
    for value in values:
        if type(value) is not str:
            return f"holds a {type(value).__name__}, not a str"
    return None


def _input_url(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_INPUT_URL and value.isprintable()


def _input_version(value: object) -> bool:
    return type(value) is str and len(value) <= MAX_INPUT_VERSION and value.isprintable()


def _input_bytes(value: object) -> bool:
    return type(value) is int and value >= 0


def _input_source(value: object) -> bool:
    return type(value) is int and value in _INPUT_SOURCES


def _peer_addresses(value: object) -> bool:
    return type(value) is tuple and all(type(a) is str and connectable(a) for a in value)


def _file_records(what: str, *fields: Callable[[object], bool]) -> Callable[[Any], str | None]:
    """The check of a tuple of input-file records, at most ``MAX_INPUT_FILES``, each a
    tuple whose items pass ``fields`` in turn (``what`` names them in the error)."""

    def check(values: tuple[object, ...]) -> str | None:
        if len(values) > MAX_INPUT_FILES:
            return f"names {len(values)} files, more than {MAX_INPUT_FILES}"
        for value in values:
            if not (
                type(value) is tuple
                and len(value) == len(fields)
                and all(ok(item) for ok, item in zip(fields, value, strict=True))
            ):
                return f"holds {shown(value)}, not ({what})"
        return None

    return check


#: ``TaskDone.inputs``, ``InputServer.files``, ``InputsDropped.files``, ``FetchInputs.files``
_input_files = _file_records(
    "url, bytes, source, version", _input_url, _input_bytes, _input_source, _input_version
)
_held_files = _file_records("url, bytes, version", _input_url, _input_bytes, _input_version)
_dropped_files = _file_records("url, version", _input_url, _input_version)
_input_sources = _file_records(
    "url, bytes, version, peer addresses",
    _input_url,
    _input_bytes,
    _input_version,
    _peer_addresses,
)


def _no_address_or_one(value: str) -> str | None:
    return None if value == "" else _address(value)


_INPUT_SOURCES = frozenset((INPUT_FROM_STORAGE, INPUT_FROM_CACHE, INPUT_FROM_PEER, INPUT_DROPPED))


def _text_pairs(values: tuple[object, ...]) -> str | None:
    for value in values:
        if type(value) is not tuple or len(value) != 2 or _texts(value) is not None:
            return f"holds {shown(value)}, not a pair of str"
    return None


def _named_files(values: tuple[object, ...]) -> str | None:
    for value in values:
        if (
            type(value) is not tuple
            or len(value) != 2
            or type(value[0]) is not str
            or type(value[1]) is not bytes
        ):
            return f"holds {shown(value)}, not (variable name, bytes)"
    return None


def _software(value: object) -> str | None:
    """A ``Software`` whose parts are what they say (the manager's, so a bug, not an
    attack: but a worker must not start libraries from a malformed one)."""
    if value is None:
        return None
    assert type(value) is Software
    if len(value) != 4 or type(value.key) is not str or _texts(value.sources) is not None:
        return f"{shown(value)} is not a Software"
    env, code = value.environment, value.code
    if env is not None and (
        type(env) is not Environment
        or len(env) != len(Environment._fields)
        or any(type(part) is not str for i, part in enumerate(env) if i != 2)
        or type(env.size) is not int
        or env.kind not in KINDS
    ):
        return f"its environment {shown(env)} is not an Environment"
    if code is not None and (
        type(code) is not Code
        or type(code.key) is not str
        or type(code.size) is not int
        or type(code.modules) is not tuple
        or _texts(code.modules) is not None
    ):
        return f"its code {shown(code)} is not a Code"
    return None


def _transfer_counts(values: tuple[object, ...]) -> str | None:
    for value in values:
        if (
            type(value) is not tuple
            or len(value) != 2
            or type(value[0]) is not str
            or type(value[1]) is not int
            or value[1] < 0
        ):
            return f"holds {shown(value)}, not (peer address, bytes)"
    return None


def _worker_loads(values: tuple[object, ...]) -> str | None:
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
            return f"holds {shown(value)}, not (worker name, cores, idle seconds)"
    return None


def _activity(values: tuple[object, ...]) -> str | None:
    for value in values:
        if (
            type(value) is not tuple
            or len(value) != 6
            or type(value[0]) is not int
            or value[0] < SPILL_LANE
            or type(value[1]) is not str
            or any(type(t) not in _NUMBER_SET or _seconds(t) is not None for t in value[2:5])
            or type(value[5]) is not int
            or value[5] < 0
        ):
            return f"holds {shown(value)}, not (lane, prefix, start, end, seconds, tasks)"
    return None


def _key(key: object, depth: int = 0) -> str | None:
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


def _deps(deps: tuple[object, ...]) -> str | None:
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


def _printable(value: str) -> str | None:
    # A worker's name and host go into log lines, tables and ``Manager.workers``: a
    # newline in one would forge a line of its own.
    return None if value.isprintable() else f"{value!r:.60} holds control characters"


def _address(value: str) -> str | None:
    return None if connectable(value) else f"{value!r:.60} is not tcp://HOST:PORT"


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else f"{value!r:.40} is not one of {choices}"

    return check


_ID = _Field(int)
_IDS = _Field(tuple, _ids)
_TEXT = _Field(str)
_PRINTABLE = _Field(str, _printable)
_TEXTS = _Field(tuple, _texts)
_FLAG = _Field(bool)
_SIZE = _Field(int, _size)
_SECONDS = _Field(_NUMBER, _seconds)
_VALUE = _Field((Serialized, type(None)), _serialized)
_KEY = _Field((*_KEY_ATOMS, tuple), _key)

_FIELDS: dict[type, tuple[_Field, ...]] = {
    # worker -> manager
    Register: (
        _ID,
        _PRINTABLE,
        _Field(int, _positive),
        _SIZE,
        _PRINTABLE,
        _Field(str, _address),
        _ID,
        _SIZE,
    ),
    InputServer: (_Field(str, _no_address_or_one), _PRINTABLE, _Field(tuple, _held_files)),
    InputsDropped: (_Field(tuple, _dropped_files),),
    TaskDone: (
        _ID,
        _SIZE,
        _SECONDS,
        _VALUE,
        _SECONDS,
        _SECONDS,
        _SECONDS,
        _SIZE,
        _Field(tuple, _input_files),
    ),
    TaskErred: (_ID, _VALUE, _TEXT, _TEXT, _TEXT),
    TaskCrashed: (_ID, _TEXT),
    TaskExhausted: (_ID, _Field(str, _one_of(("memory", "budget"))), _SIZE, _SIZE),
    FetchFailed: (_ID, _ID, _TEXTS),
    Replicas: (_IDS,),
    Lost: (_IDS,),
    Relay: (_IDS,),
    Uploaded: (_ID, _VALUE),
    Withdrawn: (_IDS, _IDS),
    Started: (_IDS,),
    Transfers: (_Field(tuple, _transfer_counts),),
    DiskFull: (_FLAG,),
    Status: (_SIZE, _SIZE, _SIZE, _SIZE, _SIZE, _Field(tuple, _activity)),
    Goodbye: (_TEXT, _TEXT),
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
        _Field((Software, type(None)), _software),
        _Field(tuple, _named_files),
        _Field(str, _one_of(("", *INPUT_LIFETIMES))),
        _FLAG,
    ),
    RunEnded: (_ID,),
    FetchInputs: (_ID, _Field(str, _one_of(INPUT_LIFETIMES)), _Field(tuple, _input_sources)),
    Execute: (
        _ID,
        _KEY,
        _Field(bytes),
        _Field(tuple, _deps),
        _FLAG,
        _ID,
        _FLAG,
        _Field(int, _positive),
        _SIZE,
        _SIZE,
    ),
    Release: (_IDS,),
    Cancel: (_IDS,),
    Withdraw: (_IDS,),
    Abort: (_IDS, _TEXT),
    Replicate: (_ID, _TEXTS),
    Upload: (_IDS,),
    Relayed: (_ID, _VALUE),
    Heartbeat: (),
    Shutdown: (_TEXT,),
    # status client <-> manager
    StatusRequest: (_ID, _TEXT),
    RetireWorker: (_TEXT, _TEXT),
    StatusReply: (_SIZE, _Field(tuple, _worker_loads)),
    LiveRequest: (_ID,),
    LiveReply: (_ID, _Field(dict)),
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
    if len(m) != 9:
        return False
    task_id, nbytes, duration, value, finished, serialization, cpu, peak, files = m
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
        and type(cpu) is float
        and 0.0 <= cpu < _INF
        and type(peak) is int
        and peak >= 0
        and (value is None or _serialized(value) is None)
        and (files == () or (type(files) is tuple and _input_files(files) is None))
    )


def _execute_ok(m: Any) -> bool:
    if len(m) != 10:
        return False
    task_id, key, payload, deps, want_result, run_id, keep, cores, memory, gpus = m
    if not (
        type(task_id) is int
        and type(cores) is int
        and cores > 0
        and type(memory) is int
        and memory >= 0
        and type(gpus) is int
        and gpus >= 0
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


def _started_ok(m: Any) -> bool:
    if len(m) != 1 or type(m[0]) is not tuple:
        return False
    for task_id in m[0]:
        if type(task_id) is not int:
            return False
    return True


def _status_ok(m: Any) -> bool:
    """A heartbeat: five sizes and its bars of activity, seconds as floats."""
    if len(m) != 6:
        return False
    stored, peak, library_peak, spilled, resident, activity = m
    if not (
        type(stored) is int
        and stored >= 0
        and type(peak) is int
        and peak >= 0
        and type(library_peak) is int
        and library_peak >= 0
        and type(spilled) is int
        and spilled >= 0
        and type(resident) is int
        and resident >= 0
        and type(activity) is tuple
    ):
        return False
    for bar in activity:
        if type(bar) is not tuple or len(bar) != 6:
            return False
        lane, prefix, start, end, seconds, tasks = bar
        if not (
            type(lane) is int
            and lane >= SPILL_LANE
            and type(prefix) is str
            and type(start) is float
            and 0.0 <= start < _INF
            and type(end) is float
            and 0.0 <= end < _INF
            and type(seconds) is float
            and 0.0 <= seconds < _INF
            and type(tasks) is int
            and tasks >= 0
        ):
            return False
    return True


_FAST: dict[type, Callable[[Any], bool]] = {
    TaskDone: _task_done_ok,
    Execute: _execute_ok,
    Started: _started_ok,
    Status: _status_ok,
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


#: What ZeroMQ connects to without refusing it at once: a host name of letters, digits,
#: dots, dashes and underscores, an IPv4 address or an IPv6 one in brackets, and a port.
_CONNECTABLE = re.compile(r"tcp://(\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z._-]+):([0-9]{1,5})")


def connectable(address: str) -> bool:
    """Whether ``address`` is a ``tcp://HOST:PORT`` a peer socket can connect to: anything
    else (spaces, ``*``, a missing port) makes ``connect`` raise."""
    match = _CONNECTABLE.fullmatch(address)
    return match is not None and 0 < int(match.group(2)) < 65536


def check_fields(message: Record) -> None:
    """``ProtocolError`` unless ``message`` is a record of ours with valid fields.

    The most frequent records (``TaskDone``, ``Execute``, ``Started``, ``Status``) first
    go through a predicate written out by hand for speed; a record it does not accept,
    and every other kind, is checked rule by rule, which also says what is wrong.
    Measured with timeit on the development machine: 0.4 µs for a ``TaskDone``, 0.3 µs
    for an ``Execute`` with no inputs and 1 µs with three (unpickling them costs 0.35
    and 0.4 µs).
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


def _field_error(message: Record, types: tuple[type | tuple[type, ...], ...]) -> ProtocolError:
    kind = type(message)
    for name, value, expected in zip(kind._fields, message, types, strict=True):
        if not isinstance(value, expected):
            return ProtocolError(f"{kind.__name__}.{name} is a {type(value).__name__}")
    raise AssertionError("no field is wrong")


def task_ids_named(message: Record) -> tuple[int, ...]:
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
