"""A manager's work, asked over its port: what a worker pool running elsewhere sizes on.

``python -m daskvine_py.factory`` runs a ``pool.WorkerPool`` on a login node for a manager
running elsewhere. In the manager's process a pool asks ``Manager.demand()`` and calls
``Manager.retire``; the factory's pool asks a ``StatusClient`` the same questions, which
carries them to the manager as records of the protocol::

    factory (login node)                                  manager
    StatusClient ── DEALER, CurveZMQ ──────────────► ROUTER (the port workers dial)
        StatusRequest ─────────────────────────────► its I/O thread computes the demand
        ◄──────────────────────────────── StatusReply (cores needed; each worker's
                                                       cores and idle seconds)
        RetireWorker ──────────────────────────────► Shutdown to that worker
        LiveRequest ───────────────────────────────► its live snapshot (manager/live.py)
        ◄──────────────────────────────── LiveReply (``python -m daskvine_py status``)

The client shows the workers' keys from the connection file, as a worker does: the
manager's gate refuses any other key during the handshake, so an unauthenticated request
is never read, let alone answered. It never registers: the manager keeps no record of it,
and it never counts as a worker.

A manager that has certainly exited is known without the network, as a worker knows it:
its connection file was removed (a manager removes the one it made when it closes), or
names a process of this host that is gone (``security.read_live_connection_file``). The
client refuses such a file when it is made, and every request raises ``ManagerGone`` at
once rather than wait ``timeout`` seconds for an answer that never comes.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import zmq

from daskvine_py.batch.planner import Demand
from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security


class ManagerUnreachable(ConnectionError):
    """The manager did not answer in time: not running (yet), not reachable, or stuck."""


class ManagerGone(ManagerUnreachable):
    """The manager has certainly exited: its connection file was removed (a manager
    removes the one it made when it closes), or names a process of this host that is
    gone. Nothing will answer: asking again will not help."""


class ManagerRefused(ConnectionError):
    """The manager refused this client (wrong keys, another protocol version): asking
    again will not help."""


class StatusClient:
    """Asks the manager of a connection file how much work is waiting; see the module
    docstring. Thread-safe; one request at a time. ``close`` from another thread wakes a
    request waiting for its answer (``ManagerUnreachable`` at once), as a factory told to
    stop needs.

    Parameters
    ----------
    connection_file
        The manager's connection file (``manager.connection_file``): its address and the
        keys to authenticate with. ``security.SecurityError`` if it cannot be used.
    name
        This client's name in the manager's log.
    timeout
        Seconds to wait for an answer before ``demand`` raises ``ManagerUnreachable``.
    """

    def __init__(self, connection_file: str, name: str = "factory", timeout: float = 10.0) -> None:
        connection = security.read_live_connection_file(connection_file)
        #: what the pool's workers join with (the jobs must see this path)
        self.connection_file = os.path.abspath(connection_file)
        self.address = connection.address
        self.keys = connection.keys
        self.name = name
        self.timeout = timeout
        #: when the manager last answered (``time.monotonic``); None: never yet
        self.answered_at: float | None = None
        #: why the manager refused this client, once it did
        self.refused: str | None = None
        #: replies dropped because they could not be read
        self.dropped = 0
        self._context = zmq.Context()
        self._lock = threading.Lock()
        #: set by ``close``, which wakes a request waiting for its answer through this
        #: pipe: the request holds the lock, and would otherwise hold ``close`` for as
        #: long as ``timeout``
        self._closing = False
        self._wake_read, self._wake_write = os.pipe()
        self._sock: zmq.Socket[bytes] | None = None
        self._watch: security.HandshakeWatch | None = None
        #: the last ``LiveRequest``'s id
        self._asked = 0

    def __enter__(self) -> StatusClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def demand(self) -> Demand:
        """The cores the manager's work could use now, and each worker's cores and idle
        seconds (``ManagerUnreachable`` after ``timeout`` seconds without an answer, at
        once if the client is closed; ``ManagerGone`` at once if the manager has exited;
        ``ManagerRefused`` if the manager will never answer this client)."""
        with self._lock:
            self._check()
            sock = self._socket()
            self._send(sock, p.StatusRequest(p.PROTOCOL_VERSION, self.name))
            reply = self._receive(sock)
            while type(reply) is not p.StatusReply:
                reply = self._receive(sock)  # a live view's late answer
        self.answered_at = time.monotonic()
        workers = {name: (cores, idle) for name, cores, idle in reply.workers}
        return Demand(reply.cores_needed, workers)

    def live(self) -> dict[str, Any]:
        """The manager's live snapshot (docs/live.md), the same errors as ``demand``."""
        with self._lock:
            self._check()
            sock = self._socket()
            self._asked += 1
            self._send(sock, p.LiveRequest(self._asked))
            reply = self._receive(sock)
            while type(reply) is not p.LiveReply or reply.request_id != self._asked:
                reply = self._receive(sock)  # an earlier question's late answer
        self.answered_at = time.monotonic()
        return reply.snapshot

    def retire(self, name: str, reason: str = "retired") -> None:
        """Ask the manager to tell the worker ``name`` to leave (no answer comes back)."""
        with self._lock:
            self._send(self._socket(), p.RetireWorker(name, reason))

    def manager_gone(self) -> str | None:
        """Why the manager has certainly exited, or None while it may be running: its
        connection file was removed, or names a process of this host that is gone (read
        again: a manager started again that wrote the same file is running). Cheap: a
        file read, no network."""
        try:
            security.read_live_connection_file(self.connection_file)
        except security.StaleConnectionFile as exc:
            return str(exc)
        except security.SecurityError:
            if not os.path.lexists(self.connection_file):
                return (
                    f"the manager at {self.address} is gone: its connection file "
                    f"{self.connection_file} was removed (as a manager does when it closes)"
                )
        return None  # (unreadable for a moment, or another host's: its silence tells)

    def close(self) -> None:
        """Close the socket; a request waiting for its answer in another thread gives up
        at once (``ManagerUnreachable``), and so does any later one."""
        if self._closing:
            return
        self._closing = True
        os.write(self._wake_write, b"x")
        with self._lock:
            self._reset()
            self._context.term()
            os.close(self._wake_read)
            os.close(self._wake_write)

    # -- the socket -------------------------------------------------------------------

    def _check(self) -> None:
        """Raise at once what waiting for an answer would end in."""
        if self._closing:
            raise ManagerUnreachable("the status client was closed")
        if self.refused is not None:
            raise ManagerRefused(self.refused)
        gone = self.manager_gone()
        if gone is not None:
            self._reset()
            raise ManagerGone(gone)

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if self.keys is not None:
                security.connect_as_worker(sock, self.keys.manager_public, self.keys)
            self._watch = security.HandshakeWatch(sock, self.keys is not None, "status client")
            sock.connect(self.address)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        """Forget the socket: a reply still on its way is never taken for the next one."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def _send(self, sock: zmq.Socket[bytes], record: p.FromClient) -> None:
        try:
            sock.send_multipart(p.encode([record]), zmq.NOBLOCK)
        except zmq.Again:
            self._reset()
            raise ManagerUnreachable(
                f"cannot send to the manager at {self.address}: its queue is full"
            ) from None

    def _receive(self, sock: zmq.Socket[bytes]) -> p.ToClient:
        assert self._watch is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._watch.events, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._reset()
                raise ManagerUnreachable(
                    f"no answer from the manager at {self.address} within {self.timeout:g} s"
                )
            ready = dict(poller.poll(math.ceil(remaining * 1000)))
            if self._wake_read in ready:
                raise ManagerUnreachable("the status client was closed")
            if self._watch.events in ready:
                refusal = self._watch.refusal()
                if refusal is not None:
                    self._refuse(f"{refusal} ({self.address})")
            if sock not in ready:
                continue
            try:
                records = p.decode(sock.recv_multipart(), p.TO_CLIENT)
            except ProtocolError:
                self.dropped += 1  # not an answer: wait on for one
                continue
            for record in records:
                if type(record) is p.Rejected:
                    self._refuse(f"the manager at {self.address} rejected it: {record.reason}")
                return record

    def _refuse(self, why: str) -> None:
        self.refused = why
        self._reset()
        raise ManagerRefused(why)
