"""The wire's records: every message the manager, workers, peers and status clients send
each other, by direction (``TO_MANAGER``, ``TO_WORKER``, ``TO_PEER``, ``FROM_PEER``,
``FROM_CLIENT``, ``TO_CLIENT``: the sets a receiver checks at run time), and the same as
types for annotations (``ToManager``, ``ToWorker``, ``ToPeer``, ``FromPeer``,
``FromClient``, ``ToClient``: unions of those records).

Each is a ``NamedTuple``: cheap to build, to pickle and to read on the hot path. How they
travel is ``protocol`` (framing); what a valid one holds is ``validation``.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable
from typing import Any, NamedTuple, TypeAlias

from daskvine_py.wire.serialize import Serialized
from daskvine_py.wire.software import Software

#: Results this small (pickled, nothing out of band) ride along with ``TaskDone`` to the
#: manager, which hands them to the tasks that read them inside ``Execute``: a tree of
#: small partial results moves no data between peers (a fetch costs two messages and two
#: wake-ups on each side), for a few hundred bytes through the manager per result.
INLINE_BYTES = 1024

TaskId = int
#: One frame of a batch: bytes, or a view (of a ZeroMQ frame received, of an out-of-band
#: buffer sent).
Frame: TypeAlias = bytes | memoryview


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
    gpus: int = 0  #: GPUs it offers to tasks (``--gpus``)


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
    #: CPU seconds of the call, and the task's own peak resident bytes: the process's
    #: high-water mark while it ran, less its resident size when it began; 0: not measured
    cpu: float = 0.0
    peak_memory: int = 0
    #: the input files it obtained through the node's input cache (``daskvine_py.inputs``):
    #: ``(url, bytes, source, version)``, source one of ``INPUT_FROM_STORAGE``,
    #: ``INPUT_FROM_CACHE``, ``INPUT_FROM_PEER``, version what its server reported of the
    #: copy (``inputs.store.Identity``). The worker's node holds each of them now: the
    #: manager places the next readers of those files here (``scheduler.locality``), and
    #: may send peers to fetch them from here (``FetchInputs``)
    inputs: tuple[tuple[str, int, int, str], ...] = ()


#: ``TaskDone.inputs``: where a file came from: fetched from its server by this task, found
#: in the node's cache (fetched before, or by another process of the node), from a peer.
INPUT_FROM_STORAGE, INPUT_FROM_CACHE, INPUT_FROM_PEER = 0, 1, 2
#: ``TaskDone.inputs``: the node's cache let this file go (least recently used, to make
#: room): no longer held there, whatever was said before (its bytes: 0).
INPUT_DROPPED = 3
#: The most files one ``TaskDone`` names (more are dropped by the worker, not sent).
MAX_INPUT_FILES = 1024
#: The longest URL of an input file the wire takes, and the longest version.
MAX_INPUT_URL = 4096
MAX_INPUT_VERSION = 1024


class InputServer(NamedTuple):
    """This worker's node's input cache: sent as its first run with ``cache_inputs``
    arrives (and again once it serves it, should a later run let peers in)."""

    #: where it serves the cache to peers (``FetchInputs``); "": it does not
    address: str
    #: which cache it is (its host and directory): workers that share one fetch nothing
    #: from each other
    cache: str
    #: what the cache holds already (earlier runs, other workers of the node, a worker
    #: before a restart): ``(url, bytes, version)``, at most ``MAX_INPUT_FILES``
    files: tuple[tuple[str, int, str], ...] = ()


class TaskErred(NamedTuple):
    """The task's own code raised: never retried. The exception travels as data (its
    type's name, its message, the traceback's text) and, when it pickles, as a pickle
    that only the caller's thread may open (``Manager(unpickle_remote_exceptions=...)``)."""

    task_id: TaskId
    exception: Serialized | None  #: None when the exception could not be pickled
    traceback: str
    message: str  #: ``Type: text`` of the exception, for when it is not unpickled
    type_name: str = ""  #: its type, qualified: ``module.QualName`` (``serialize.type_name``)


class TaskCrashed(NamedTuple):
    """The process running the task died; the manager may retry it elsewhere."""

    task_id: TaskId
    reason: str


class TaskExhausted(NamedTuple):
    """The task's library was stopped for memory (its live results are lost with it):
    ``resource`` "memory", the task went past its allocation (its own use); "budget", the
    worker's libraries together went past its budget and this task, of no allocation,
    made room (no fault of its own). ``peak`` is what it was seen to use, in bytes, and
    ``limit`` what it was allowed. The manager may retry it with more."""

    task_id: TaskId
    resource: str
    peak: int
    limit: int


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
    """The answer to every ``Withdraw``, each id in one of two lists: the tasks the
    worker dropped unstarted (the manager may now run them elsewhere), and those it did
    not give back (``kept``: running, committed to a library behind a running task, or
    not there any more; they report as usual). An answer
    the manager waits for however slow the link: one that never comes while later
    work is reported is a worker ignoring ``Withdraw``."""

    task_ids: tuple[TaskId, ...]
    kept: tuple[TaskId, ...] = ()


class Started(NamedTuple):
    """Tasks that began running here (their inputs were all in, a library took them):
    the manager times stragglers from this, and a lost worker counts against the
    retries only of tasks that had started there."""

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
    """A worker's heartbeat, once per heartbeat interval, busy or not: what it holds and
    the memory its processes use."""

    stored_bytes: int
    peak_memory: int  #: peak resident set of the worker process, bytes
    peak_library_memory: int  #: the largest peak resident set among its library processes
    spilled_bytes: int = 0  #: of ``stored_bytes``, in spill files on disk
    #: resident bytes of the worker process and its libraries now (their sum)
    resident: int = 0
    #: what it did since its last heartbeat, for the live task stream (docs/live.md): bars
    #: (lane, prefix, start, end, serialization seconds, tasks), times its ``time.time()``;
    #: lane >= 0 a library's, ``FETCH_LANE`` fetching inputs, ``SPILL_LANE`` spilling
    activity: tuple[Bar, ...] = ()


#: A bar of a worker's activity (``Status.activity``): tasks of one key prefix a lane ran
#: back to back, merged.
Bar = tuple[int, str, float, float, float, int]
#: ``Status.activity``'s lanes of inputs fetched from peers and results written to disk.
FETCH_LANE = -1
SPILL_LANE = -2


class Goodbye(NamedTuple):
    reason: str
    #: the key of the software (``RunConfig.software``) the worker cannot run, which is
    #: why it leaves ("" : another reason); ``reason`` then names its node and what failed
    unfit: str = ""


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
    #: its allocation: cores (thread pools are sized to them), memory in bytes (its
    #: library is stopped past it; 0: whatever of the worker's budget other tasks' do not
    #: take) and GPUs (its library sees only devices of its own)
    cores: int = 1
    memory: int = 0
    gpus: int = 0


class RunConfig(NamedTuple):
    """How the tasks of one run execute: sent once per worker, before the run's first
    ``Execute`` there, and only for a run that does not use the defaults."""

    run_id: int
    task_mode: str  #: "function-calls" or "tasks"
    exec_mode: str  #: "direct" or "fork"
    import_modules: tuple[str, ...]  #: imported once per library before the run's tasks
    env_vars: tuple[tuple[str, str], ...]
    sandbox: bool  #: own cwd and TMPDIR per task (always, in fork and tasks modes)
    #: what its libraries start with (``software.spec``); None: the worker's own Python.
    #: A worker whose libraries run other software replaces them before the run's tasks
    software: Software | None = None
    #: files its tasks read on the node, by the environment variable that names them
    #: (``X509_USER_PROXY``): written with mode 0600 in the worker's directory, removed
    #: when it leaves; a later run's renewed content replaces them
    files: tuple[tuple[str, bytes], ...] = ()
    #: its tasks read ``root://`` inputs through the node's input cache
    #: (``daskvine_py.inputs``: whole files, fetched once per node), and how long what
    #: they fetch stays: "run" (the worker hears ``RunEnded``), "worker" or "forever";
    #: "": they do not
    inputs: str = ""
    #: a worker lacking an input file another worker's node holds may fetch it from
    #: there (``FetchInputs``), not from its storage; False: always from storage (sites
    #: that forbid traffic between nodes)
    input_peers: bool = True


class InputsDropped(NamedTuple):
    """Files the node's input cache no longer holds: removed as their lifetimes ended
    (``cache_inputs="run"``), ``(url, version)`` each. The manager stops placing their
    readers on this worker."""

    files: tuple[tuple[str, str], ...]


class FetchInputs(NamedTuple):
    """Fetch these input files from peers into the node's input cache, for tasks of run
    ``run_id`` that read them (sent before their ``Execute``): each ``(url, bytes,
    version, sources)``, ``sources`` the ``InputServer`` addresses of workers whose node
    holds that copy. The worker pulls them beside its work; the task then finds the file
    in the cache, or, if the pull failed or the server's copy changed since, fetches it
    from storage as it would have."""

    run_id: int
    lifetime: str  #: the run's ``RunConfig.inputs``: what the copies are claimed for
    files: tuple[tuple[str, int, str, tuple[str, ...]], ...]


class RunEnded(NamedTuple):
    """The run is over: sent to each worker that was sent its ``RunConfig``, when that
    asks for something as the run ends (``inputs == "run"``: the inputs its tasks
    fetched on the worker go)."""

    run_id: int


class Function(NamedTuple):
    """A function tasks will reference by id: sent once, before the first such task."""

    function_id: bytes
    #: cloudpickle bytes (a buffer when large: it travels as its own frame)
    code: bytes | bytearray | memoryview | pickle.PickleBuffer


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


class Abort(NamedTuple):
    """Stop these tasks, even those running (the process running one is killed): the
    manager has given them to another worker (a straggler, a quarantined worker). The
    worker answers nothing for them; results of a killed library are reported ``Lost``."""

    task_ids: tuple[TaskId, ...]
    reason: str


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


class LiveRequest(NamedTuple):
    """What is the manager doing now? (answer: ``LiveReply``; ``manager/live.py``)."""

    request_id: int  #: the client's, echoed in the reply


class LiveReply(NamedTuple):
    """The manager's live snapshot (``manager/live.py``) as plain data: maps, lists,
    text and numbers."""

    request_id: int
    snapshot: dict[str, Any]


class StatusReply(NamedTuple):
    """What ``batch.planner.Demand`` holds, as it was when the request arrived."""

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


# -- directions: each as a type (a union of records, for annotations) and as the set of
# its records (what a receiver checks at run time); tests/test_protocol.py holds them equal.

#: A record a worker sends its manager.
ToManager: TypeAlias = (
    Register
    | TaskDone
    | TaskErred
    | TaskCrashed
    | FetchFailed
    | Replicas
    | Lost
    | Withdrawn
    | Started
    | Transfers
    | DiskFull
    | Status
    | Goodbye
    | Relay
    | Uploaded
    | TaskExhausted
    | InputServer
    | InputsDropped
)
TO_MANAGER: frozenset[type[ToManager]] = frozenset(
    {
        Register,
        TaskDone,
        TaskErred,
        TaskCrashed,
        FetchFailed,
        Replicas,
        Lost,
        Withdrawn,
        Started,
        Transfers,
        DiskFull,
        Status,
        Goodbye,
        Relay,
        Uploaded,
        TaskExhausted,
        InputServer,
        InputsDropped,
    }
)
#: A record a manager sends its workers.
ToWorker: TypeAlias = (
    Welcome
    | Rejected
    | Function
    | RunConfig
    | RunEnded
    | FetchInputs
    | Execute
    | Release
    | Cancel
    | Withdraw
    | Abort
    | Replicate
    | Heartbeat
    | Shutdown
    | Upload
    | Relayed
)
TO_WORKER: frozenset[type[ToWorker]] = frozenset(
    {
        Welcome,
        Rejected,
        Function,
        RunConfig,
        RunEnded,
        FetchInputs,
        Execute,
        Release,
        Cancel,
        Withdraw,
        Abort,
        Replicate,
        Heartbeat,
        Shutdown,
        Upload,
        Relayed,
    }
)
#: What a worker asks a peer.
ToPeer: TypeAlias = GetData
TO_PEER: frozenset[type[ToPeer]] = frozenset({GetData})
#: What a peer answers.
FromPeer: TypeAlias = Data
FROM_PEER: frozenset[type[FromPeer]] = frozenset({Data})
#: A record a status client sends the manager.
FromClient: TypeAlias = StatusRequest | RetireWorker | LiveRequest
FROM_CLIENT: frozenset[type[FromClient]] = frozenset({StatusRequest, RetireWorker, LiveRequest})
#: A record the manager sends a status client.
ToClient: TypeAlias = StatusReply | Rejected | LiveReply
TO_CLIENT: frozenset[type[ToClient]] = frozenset({StatusReply, Rejected, LiveReply})
#: A record the manager sends through its ROUTER: to a worker or to a status client.
FromManager: TypeAlias = ToWorker | ToClient
#: A record of any direction (what ``validation.check_fields`` and ``plain`` take).
Record: TypeAlias = ToManager | ToWorker | ToPeer | FromPeer | FromClient | ToClient


def inlinable(value: Serialized) -> bool:
    """Whether a result is small enough to travel inside ``TaskDone`` and ``Execute``."""
    return not value.buffers and len(value.header) <= INLINE_BYTES
