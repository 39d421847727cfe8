"""The manager's registered workers and the status clients it answers; no sockets.

``Registry`` admits a worker from its ``Register`` or rejects it (another protocol
version, a malformed registration, no open file left for it: ``openfiles``), each
refusal logged through the loop's ``DropLog`` (a flood is a line a minute), keeps what
each worker said of itself (``WorkerInfo``), publishes a snapshot of them to caller
threads under ``changed``, computes the work's ``Demand`` for worker pools and answers
status clients. What it sends goes through ``post`` into the I/O loop's outboxes; the
loop (``loop.py``) tells the scheduler state, the liveness watch and the watched runs of
workers joining and leaving.
None of this is on the loop's per-message path: a registered worker's batches are the
loop's alone.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

from daskvine_py.batch.planner import Demand
from daskvine_py.errors import ProtocolError, VersionMismatch
from daskvine_py.manager.openfiles import OpenFiles
from daskvine_py.wire import protocol as p

logger = logging.getLogger("daskvine_py.manager")

#: This host's name, as local workers give it.
_HOSTNAME = socket.gethostname()
#: Identities that registered as workers, remembered (past it, the oldest are forgotten):
#: a status client's ``RetireWorker`` is refused from them.
REMEMBERED_WORKERS = 100_000
#: What an identity that has not registered may send: a worker's registration (and
#: whatever a worker sends), or a status client's records.
Stranger = p.ToManager | p.FromClient


def printable(text: str) -> str:
    """``text`` as a log line may show it: control characters (a name with a newline would
    forge a line of its own) escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


class WorkerInfo:
    """What a worker said of itself when it registered, and in its last ``Status``."""

    __slots__ = (
        "name",
        "hostname",
        "cores",
        "memory",
        "gpus",
        "pid",
        "peer_address",
        "status",
        "quarantined",
    )

    def __init__(self, reg: p.Register) -> None:
        self.name = reg.name
        self.hostname = reg.hostname
        self.cores = reg.cores
        self.memory = reg.memory
        self.gpus = reg.gpus
        self.pid = reg.pid
        self.peer_address = reg.peer_address
        self.status = p.Status(0, 0, 0)
        #: why the scheduler gives it no new tasks (docs/faults.md); None: it gives them
        self.quarantined: str | None = None

    def public(self) -> dict[str, Any]:
        status = self.status._asdict()
        del status["activity"]  # (its bars are a dashboard's: ``watching.beats``)
        return {
            "name": self.name,
            "hostname": self.hostname,
            "cores": self.cores,
            "memory": self.memory,
            "gpus": self.gpus,
            "pid": self.pid,
            "peer_address": self.peer_address,
            **status,
            "quarantined": self.quarantined,
        }


class Registry:
    """The registered workers by identity, and what other threads see of them.

    Parameters
    ----------
    post
        Queue a message for an identity (the loop's outbox, flushed once per iteration).
    drops
        The loop's rate-limited warnings about what it drops.
    heartbeat_interval
        What a ``Welcome`` tells a worker.
    load, worker_loads
        The scheduler state's ``load`` and ``worker_loads``, for the demand.
    local_processes
        The workers this manager started (``Manager.start_workers``): no status client
        retires them.
    """

    def __init__(
        self,
        post: Callable[[bytes, p.FromManager], None],
        drops: p.DropLog,
        heartbeat_interval: float,
        load: Callable[[], tuple[int, int, int]],
        worker_loads: Callable[[], dict[bytes, tuple[int, int]]],
        local_processes: Sequence[subprocess.Popen[bytes]] = (),
    ) -> None:
        self._post = post
        self._drops = drops
        self._heartbeat_interval = heartbeat_interval
        self._load = load
        self._worker_loads = worker_loads
        self._local_processes = local_processes
        #: identities that ever registered (an ordered set), and status clients' names
        self._registered: dict[bytes, None] = {}
        self._client_names: dict[bytes, str] = {}
        #: registered workers by identity (the loop reads it for every batch: never replaced)
        self.workers: dict[bytes, WorkerInfo] = {}
        #: guards ``snapshot``; notified when a worker joins or leaves, or the loop dies
        self.changed = threading.Condition()
        #: the registered workers' ``WorkerInfo.public()`` by identity (under ``changed``)
        self.snapshot: dict[bytes, dict[str, Any]] = {}
        #: the latest ``Demand`` (replaced whole, so other threads read it without a lock),
        #: computed only once someone asked for it (a pool): it walks every worker
        self.demand = Demand(0, {})
        self.wants_demand = False
        #: the manager's live snapshot (``live.LiveView.snapshot``), for ``LiveRequest``
        self.live: Callable[[], dict[str, Any]] = dict
        #: when each worker last held a task (the loop's clock)
        self._busy_at: dict[bytes, float] = {}
        #: workers told to leave by a pool: their leaving is no news
        self._retiring: set[bytes] = set()
        #: the name of the last worker lost (not retired), and why: for the no-worker warning
        self.last_lost: tuple[str, str] | None = None
        #: the connected workers' names: a second worker under a taken name gets a suffix
        self._names: dict[str, bytes] = {}
        #: the workers this process's open files allow (its soft limit raised first)
        self.open_files = OpenFiles()

    def publish(self, ident: bytes, info: WorkerInfo | None) -> None:
        """Update the callers' snapshot of one worker (None: it left)."""
        with self.changed:
            if info is None:
                self.snapshot.pop(ident, None)
                self.changed.notify_all()
            else:
                joined = ident not in self.snapshot
                self.snapshot[ident] = info.public()
                if joined:
                    self.changed.notify_all()

    # -- joining and leaving ----------------------------------------------------------

    def unreadable(
        self, ident: bytes, first: p.Frame, exc: ProtocolError, now: float
    ) -> list[p.Frame] | None:
        """A stranger's batch that cannot be read: warned about (rate-limited). A pickled
        one, which is all that workers and status clients of protocol 6 and older send,
        is answered with a pickled ``Rejected`` they can read (else they would wait out
        their timeout in silence); its content is never opened. The frames to send."""
        self._drops.warn(
            ("malformed", "unregistered peers"),
            now,
            "dropped a malformed message from unregistered peers (%r): %s",
            ident[:32],
            exc,
        )
        if bytes(memoryview(first)[: len(p.MAGIC)]) != p.MAGIC:
            return None
        return p.encode_pickled(
            [
                p.Rejected(
                    f"this manager speaks protocol version {p.PROTOCOL_VERSION}, which reads no "
                    "pickles from workers: install the same daskvine-py on both"
                )
            ]
        )

    def stranger(self, ident: bytes, messages: list[Stranger], now: float) -> WorkerInfo | None:
        """Messages from an identity that has not registered: only ``Register`` counts,
        unless they are a status client's (``client``). The worker admitted, if any.

        Its version is read first, before its other fields are checked: another version
        may mean other fields, and deserves a clear mismatch rather than a malformed one.
        """
        if any(type(m) in p.FROM_CLIENT for m in messages):
            self.client(ident, messages, now)
            return None
        reg = next((m for m in messages if type(m) is p.Register), None)
        if reg is None:
            self._drops.warn(
                ("unregistered",),
                now,
                "dropped %d record(s) from unregistered peer %r",
                len(messages),
                ident[:32],
            )
            return None
        version = reg[0] if len(reg) else None
        if type(version) is int and version != p.PROTOCOL_VERSION:
            name = reg.name if len(reg) > 1 and type(reg.name) is str else repr(ident[:32])
            name = printable(name)
            error = VersionMismatch(p.PROTOCOL_VERSION, version, name)
            self._drops.warn(  # one line per version a minute, however many ask
                ("version", version), now, "rejected worker %s: %s", name, error
            )
            self._post(ident, p.Rejected(str(error)))
            return None
        try:
            p.check_fields(reg)
        except ProtocolError as exc:
            self._drops.warn(
                ("unregistered",),
                now,
                "rejected a malformed registration from %r: %s",
                ident[:32],
                exc,
            )
            self._post(ident, p.Rejected(f"malformed registration: {exc}"))
            return None
        if self.open_files.full(len(self.workers)):
            self._refuse_past_open_files(ident, reg.name, now)
            return None
        name = self._unique(reg.name)
        if name != reg.name:
            self._drops.warn(  # a pool started under one name would give a line each
                ("name taken",),
                now,
                "worker %s: a connected worker has that name already; it joins as %s",
                reg.name,
                name,
            )
            reg = reg._replace(name=name)
        info = WorkerInfo(reg)
        self.workers[ident] = info
        self._registered[ident] = None
        if len(self._registered) > REMEMBERED_WORKERS:
            del self._registered[next(iter(self._registered))]
        self._names[name] = ident
        self.publish(ident, info)
        logger.info(
            "worker %s joined from %s with %d core%s",
            printable(reg.name),
            printable(reg.hostname),
            reg.cores,
            "" if reg.cores == 1 else "s",
        )
        self._post(ident, p.Welcome(reg.name, self._heartbeat_interval))
        return info

    def _unique(self, name: str) -> str:
        """``name``, or ``name~2``, ``name~3``...: the first no connected worker has. Two
        workers under one name would be one in ``Manager.workers``, in reports, and to
        ``RetireWorker``."""
        if name not in self._names:
            return name
        number = 2
        while f"{name}~{number}" in self._names:
            number += 1
        return f"{name}~{number}"

    def _refuse_past_open_files(self, ident: bytes, name: str, now: float) -> None:
        """Refuse a worker the open files cannot hold: said to it, logged rate-limited."""
        reason = self.open_files.reason()
        self._drops.warn(
            ("open files",),
            now,
            "refused worker %s, and will refuse every further one while %d are connected: %s",
            name,
            len(self.workers),
            reason,
        )
        self._post(ident, p.Rejected(reason))

    def retire(self, name: str, reason: str) -> None:
        """Tell the worker of this name to leave; its leaving will be no news."""
        for ident, info in self.workers.items():
            if info.name == name:
                logger.info("retiring worker %s: %s", info.name, reason)
                self._retiring.add(ident)
                self._post(ident, p.Shutdown(reason))
                return

    def remove(self, ident: bytes, reason: str) -> WorkerInfo | None:
        """A worker left or was lost: forgotten and unpublished (None if unknown)."""
        info = self.workers.pop(ident, None)
        if info is None:
            return None
        if self._names.get(info.name) == ident:
            del self._names[info.name]
        if ident in self._retiring:
            self._retiring.discard(ident)
            logger.info("worker %s left: %s", printable(info.name), reason)
        else:
            logger.warning("worker %s lost: %s", printable(info.name), reason)
            self.last_lost = (info.name, reason)
        self.publish(ident, None)
        return info

    # -- status clients and pools -----------------------------------------------------

    def client(self, ident: bytes, messages: list[Stranger], now: float) -> None:
        """A status client's batch (a factory's pool): each ``StatusRequest`` is answered
        with the work's demand, each ``LiveRequest`` with the live snapshot, each
        ``RetireWorker`` retires an idle worker of a pool (``_retire_for``). The client
        never registers; a record of another kind in its batch is dropped."""
        for message in messages:
            kind = type(message)
            if type(message) is p.StatusRequest and len(message) and type(message[0]) is int:
                if message[0] != p.PROTOCOL_VERSION:
                    error = (
                        f"a status client speaks protocol version {message[0]}, but the "
                        f"manager speaks version {p.PROTOCOL_VERSION}: install the same "
                        "daskvine-py on both"
                    )
                    self._drops.warn(("client version",), now, "rejected %s", error)
                    self._post(ident, p.Rejected(error))
                    continue
            try:
                if kind not in p.FROM_CLIENT:
                    raise ProtocolError(f"a {kind.__name__} in a status client's batch")
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    ("malformed", "status clients"),
                    now,
                    "dropped a malformed record from status client %r: %s",
                    ident[:32],
                    exc,
                )
                continue
            # (``type(message) is``: the test mypy narrows the union of records by)
            if type(message) is p.RetireWorker:
                self._retire_for(ident, message, now)
            elif type(message) is p.LiveRequest:
                self._post(ident, p.LiveReply(message.request_id, self.live()))
            elif type(message) is p.StatusRequest:
                self._answer_status(ident, message, now)

    def _answer_status(self, ident: bytes, message: p.StatusRequest, now: float) -> None:
        """A status client's ``StatusRequest``: answered with the work's demand."""
        logger.debug("status request from %s", message.name)
        if ident not in self._client_names and len(self._client_names) < 1024:
            self._client_names[ident] = message.name
        self.wants_demand = True  # from now on, idle times are sampled every check
        self.publish_demand(now)
        demand = self.demand
        loads = tuple((name, cores, idle) for name, (cores, idle) in demand.workers.items())
        self._post(ident, p.StatusReply(demand.cores_needed, loads))

    def _retire_for(self, ident: bytes, message: p.RetireWorker, now: float) -> None:
        """A status client's ``RetireWorker``. Any holder of the keys can send one, and the
        protocol cannot tell a pool from it, so a request may only do what a pool does:
        retire an idle worker the manager did not start, from an identity that never
        registered as a worker. Others are refused, with a warning a minute at most."""
        target = next((i for i, info in self.workers.items() if info.name == message.name), None)
        if target is None:
            return  # gone already (a pool may ask twice)
        info = self.workers[target]
        if ident in self._registered:
            why = "that client's identity registered as a worker"
        elif self._started_here(info):
            why = "the manager started that worker itself (start_workers)"
        elif self._worker_loads().get(target, (0, 0))[1]:
            why = "that worker has tasks"
        else:
            self.retire(message.name, message.reason)
            return
        client = self._client_names.get(ident)
        self._drops.warn(
            ("refused retire",),
            now,
            "refused to retire worker %s for status client %s: %s",
            printable(info.name),
            repr(ident[:32]) if client is None else printable(client),
            why,
        )

    def _started_here(self, info: WorkerInfo) -> bool:
        return info.hostname == _HOSTNAME and any(
            proc.pid == info.pid for proc in self._local_processes
        )

    def publish_demand(self, now: float) -> None:
        """The work's demand and each worker's idle time, for worker pools."""
        ready, processing, _ = self._load()
        loads = self._worker_loads()
        busy_at = self._busy_at
        workers = {}
        for ident, (cores, held) in loads.items():
            info = self.workers.get(ident)
            if info is None:
                continue
            if held or ident not in busy_at:
                busy_at[ident] = now  # holding work now, or just joined
            workers[info.name] = (cores, now - busy_at[ident])
        for ident in [ident for ident in busy_at if ident not in loads]:
            del busy_at[ident]
        self.demand = Demand(ready + processing, workers)
