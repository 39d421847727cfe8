"""The worker state's vocabulary: the events it takes and the instructions it emits.

``state.WorkerState.handle(events, now)`` turns a list of events into a list of
instructions, as ``scheduler.state.SchedulerState.handle`` does for the manager. The shell
(``shell.Worker``, with ``peers.PeerLinks``) turns what happens on its sockets, pipes and
processes into events and carries out the instructions; a simulator does the same with
no sockets and no processes. Plain ``NamedTuple`` records: cheap to build, compared by
value in tests.

Events (what happened), besides the wire's own records, which are events as they are:

- every record of ``p.TO_WORKER`` from the manager (``Execute``, ``Release``, ``Welcome``,
  ``Shutdown``...), each already checked (``protocol.check_fields``); one that is not
  valid comes as ``Unreadable``;
- ``p.Data``: a peer's answer to a ``GetData`` (``AskPeer``);
- the worker's own life: ``Boot`` (first), ``Tick`` (timers), ``Stop`` (a signal),
  ``ManagerConnection`` and ``RegistrationSent`` (the manager's socket);
- libraries: ``FromLibrary`` (anything one wrote), ``LibraryDied``, ``MemoryExceeded``;
- task processes (``task_mode="tasks"``): ``ProcessStarted``, ``ProcessFailed``,
  ``ProcessExited``;
- peers: ``PeerUnreachable`` (a request could not be sent), ``PeerAsked`` (a peer wants
  results that a library keeps live).

Instructions (what to do), in the order they are to be done:

- every record of ``p.TO_MANAGER`` (``TaskDone``, ``Started``, ``Register``...): send it
  to the manager, in order, batched as the shell likes; ``SendStatus``: a heartbeat, to
  complete with the processes' memory (``host.status``);
- ``StartLibrary``, ``ToLibrary`` (a request to write to its pipe), ``KillLibrary``;
- ``StartProcess``, ``KillProcess`` (task processes);
- ``AskPeer`` (one ``GetData``), ``ClosePeer`` (drop its socket), ``AnswerPeer`` (one
  ``Data`` for a peer that waited for an export);
- ``EndRunInputs``: a run's inputs leave the node's input cache;
- ``Leave``: the worker's life is over; ``EventFailed``: an event could not be handled
  (logged, and the worker goes on).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple, TypeAlias

from daskvine_py.wire import protocol as p
from daskvine_py.worker import pipe
from daskvine_py.worker.records import WorkerTask

# -- events ---------------------------------------------------------------------------


class Boot(NamedTuple):
    """The worker starts: ``libraries`` library processes of ``slots`` slots each to
    start; ``register`` goes to the manager once every one is ready (at once with none)."""

    register: p.Register
    libraries: int
    slots: int = 1
    #: libraries can start with the worker's own Python (dask is installed beside it);
    #: False for a worker of the small install, which runs only shipped software
    own_python: bool = True


class SoftwarePrepared(NamedTuple):
    """The software of a ``PrepareSoftware`` is on the node (``error`` None), or cannot run
    there (``error``: why, naming the node)."""

    key: str
    error: str | None = None


class FilesShipped(NamedTuple):
    """A run shipped files its tasks read (``RunConfig.files``: an X.509 proxy, a token),
    now written on the node; ``digest`` names their names and contents. Libraries started
    before them are replaced once idle: a client that reads its credentials once per
    process (the XRootD client) would not see a proxy given, or renewed, after that."""

    digest: str


class Tick(NamedTuple):
    """A loop pass's timers: the manager's silence, heartbeats, fetches past their
    deadline. ``wall``: the wall clock now (the heartbeat's bars are on it)."""

    wall: float


class Stop(NamedTuple):
    """The worker is asked to stop (SIGTERM, SIGINT): goodbye to the manager, then leave."""

    reason: str


class ManagerConnection(NamedTuple):
    """The connection to the manager went up or down; ``again``: a handshake succeeded
    after an earlier one (a registration that went out on the lost one is sent again)."""

    connected: bool
    again: bool = False


class RegistrationSent(NamedTuple):
    """A batch holding the ``Register`` went out: the manager's silence counts from now."""


class Unreadable(NamedTuple):
    """A record from the manager that is not valid (``why``): an ``Execute`` is reported
    crashed. ``message`` None: a whole batch that could not be decoded (the manager is not
    a busy one: it does not speak the protocol)."""

    message: object
    why: str


class FromLibrary(NamedTuple):
    """What a library wrote: ``Ready``, a task's reply, ``Replies`` (several), an
    ``Exported`` result. ``wall``: the wall clock when it was read (``TaskDone.finished``)."""

    library_id: int
    message: pipe.FromLibrary
    wall: float


class LibraryDied(NamedTuple):
    """A library process is gone (``how``: its exit), read, killed or failed to write to.
    ``running``: the tasks its slots ran (None: the first ones sent)."""

    library_id: int
    how: str
    running: Collection[int] | None = None


class MemoryExceeded(NamedTuple):
    """A task's library was killed for memory (``memory_watch``): ``kind`` "memory", the
    task went past its own allocation; "budget", the libraries together went past the
    worker's budget and this task, of no allocation, made room (its ``LibraryDied``
    follows)."""

    library_id: int
    task_id: int
    peak: int
    limit: int
    kind: str = "memory"


class ProcessStarted(NamedTuple):
    """The task process of a ``StartProcess`` runs."""

    task: WorkerTask


class ProcessFailed(NamedTuple):
    """The task process of a ``StartProcess`` could not be started (``why``)."""

    task: WorkerTask
    why: str


class ProcessExited(NamedTuple):
    """A task process exited, with its reply (``Crashed`` when it wrote none)."""

    task: WorkerTask
    reply: pipe.Reply
    wall: float


class PeerUnreachable(NamedTuple):
    """The request of an ``AskPeer`` could not be sent: its fetches try the next holder."""

    address: str
    task_ids: tuple[int, ...]


class PeerAsked(NamedTuple):
    """Peer ``ident`` asked for results held live only (not in the store): each is
    exported and answered (``AnswerPeer``), or answered "not here"."""

    ident: bytes
    task_ids: tuple[int, ...]


#: An event: one of the classes above, or a wire record (``p.TO_WORKER``, ``p.Data``).
Event: TypeAlias = (
    p.ToWorker
    | p.FromPeer
    | Boot
    | Tick
    | Stop
    | ManagerConnection
    | RegistrationSent
    | Unreadable
    | FromLibrary
    | LibraryDied
    | MemoryExceeded
    | ProcessStarted
    | ProcessFailed
    | ProcessExited
    | PeerUnreachable
    | PeerAsked
    | SoftwarePrepared
    | FilesShipped
)

# -- instructions ---------------------------------------------------------------------


class SendStatus(NamedTuple):
    """Send the manager a heartbeat (``p.Status``): bytes held (stored and live), bytes
    spilled, the bars of what ran since the last one; the shell adds its processes'
    memory."""

    held: int
    spilled: int
    bars: tuple[p.Bar, ...]


class StartLibrary(NamedTuple):
    """Start a library process of ``slots`` slots; ``gpus``: its ``CUDA_VISIBLE_DEVICES``
    (None: the worker's). It answers ``Ready`` (``FromLibrary``)."""

    library_id: int
    slots: int
    gpus: str | None = None
    #: the key of the software it starts with (``PrepareSoftware``); None: the worker's own
    software: str | None = None


class PrepareSoftware(NamedTuple):
    """Fetch and unpack (or build) ``software`` on the node, out of the loop; answered
    ``SoftwarePrepared``."""

    software: p.Software


class StopLibraries(NamedTuple):
    """Stop these idle libraries (their software is replaced): no death is reported."""

    library_ids: tuple[int, ...]


class ToLibrary(NamedTuple):
    """Write ``request`` to a library's pipe (failing: it died, ``LibraryDied``)."""

    library_id: int
    request: pipe.ToLibrary


class KillLibrary(NamedTuple):
    """Kill a library (an aborted task runs there, or it holds the wrong GPUs); its
    death comes back as ``LibraryDied``."""

    library_id: int


class StartProcess(NamedTuple):
    """Start a task process running ``call``; ``gpus``: its ``CUDA_VISIBLE_DEVICES``.
    Answered ``ProcessStarted`` or ``ProcessFailed``, then ``ProcessExited``."""

    task: WorkerTask
    call: pipe.Call
    gpus: str | None = None


class KillProcess(NamedTuple):
    """Kill the task process running ``task`` (aborted); its exit is still reported."""

    task: WorkerTask


class AskPeer(NamedTuple):
    """Send peer ``address`` one ``GetData`` for these results."""

    address: str
    task_ids: tuple[int, ...]


class ClosePeer(NamedTuple):
    """Close the socket to this peer (silent, or unlinked to make room), and what it queued."""

    address: str


class AnswerPeer(NamedTuple):
    """Send peer ``ident`` this answer (an export it waited for)."""

    ident: bytes
    data: p.Data


class Leave(NamedTuple):
    """The worker's life is over: stop the loop, exit with ``exit_code``, saying
    ``reason`` at ``level``. ``unreachable``: nothing more can reach the manager."""

    reason: str
    exit_code: int = 0
    level: int = 20  # logging.INFO
    unreachable: bool = False


class EndRunInputs(NamedTuple):
    """Run ``run_id`` ended (``RunEnded``): the inputs its tasks fetched here for it
    (``cache_inputs="run"``) go from the node's input cache, unless another claim keeps
    them (``daskvine_py.inputs``)."""

    run_id: int


class EventFailed(NamedTuple):
    """Handling ``event`` raised ``error``: logged (rate-limited); nothing else is lost."""

    event: object
    error: Exception


#: An instruction: one of the classes above, or a record for the manager (``p.ToManager``).
Instruction: TypeAlias = (
    p.ToManager
    | SendStatus
    | StartLibrary
    | PrepareSoftware
    | StopLibraries
    | ToLibrary
    | KillLibrary
    | StartProcess
    | KillProcess
    | AskPeer
    | ClosePeer
    | AnswerPeer
    | Leave
    | EndRunInputs
    | EventFailed
)
