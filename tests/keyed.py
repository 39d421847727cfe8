"""A worker the test speaks for, holding the connection file's keys: it registers with the
real protocol over CurveZMQ and then plays whatever faulty or lying worker a test needs
(takes tasks and never answers, answers wrong, reports what it was never sent)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import zmq

from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from sockets import dealer


class KeyedWorker:
    """Registered at ``manager`` (a ``Manager``, secure or not) under ``name``."""

    def __init__(
        self,
        manager: Any,
        name: str = "liar",
        cores: int = 2,
        peer_address: str = "tcp://127.0.0.1:1",
        register: bool = True,
    ) -> None:
        self.name = name
        self.context = zmq.Context()
        connection = security.read_connection_file(manager.connection_file)
        keys = None
        server_key = None
        if connection.keys is not None:
            keys = (connection.keys.worker_public, connection.keys.worker_secret)
            server_key = connection.keys.manager_public
        identity = f"{name}-{time.monotonic_ns()}".encode()
        self.sock = dealer(self.context, connection.address, identity, keys, server_key)
        self.welcome: p.Welcome | None = None
        if register:
            self.send(p.Register(p.PROTOCOL_VERSION, name, cores, 0, "h", peer_address, 1))
            self.welcome = self.receive(p.Welcome, 1)[0]

    def send(self, *records: Any) -> None:
        self.sock.send_multipart(p.encode(list(records)))

    def receive(self, kind: type, n: int, timeout: float = 20.0) -> list[Any]:
        """The next ``n`` records of ``kind`` (others are read and dropped)."""
        found: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(found) < n:
            left = deadline - time.monotonic()
            assert left > 0 and self.sock.poll(max(1, int(left * 1000))), found
            records = p.decode(self.sock.recv_multipart(), p.TO_WORKER)
            found += [r for r in records if type(r) is kind]
        return found

    def drain(self, timeout: float = 0.2) -> list[Any]:
        """Every record that arrives within ``timeout`` seconds of silence."""
        records: list[Any] = []
        while self.sock.poll(int(timeout * 1000)):
            records += p.decode(self.sock.recv_multipart(), p.TO_WORKER)
        return records

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.send(p.Goodbye("done"))
        self.context.destroy(linger=100)

    def __enter__(self) -> KeyedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
