"""Signals from tasks on real workers to the test that runs them, over a loopback port.

A test that must act at a given moment of a run (interrupt it once a task is running, kill
a worker while a task waits) waits for a task to say so, instead of sleeping for a guessed
time or reading the manager's private state::

    with Beacon() as beacon:
        dsk = {"t": (ping, beacon.address, b"started")}
        ...
        assert beacon.wait() == [b"started"]

A task can also hold its connection open and wait until the test answers
(``ping(..., hold=True)``, ``Beacon.accept``): a gate the test opens.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

#: Seconds a task waits to connect, and a held task waits for its answer.
TASK_TIMEOUT = 120.0


def ping(address: tuple[str, int], message: bytes = b"", hold: bool = False) -> bytes:
    """Send ``message`` to the beacon at ``address``; with ``hold``, wait for its answer.

    Returns the answer (``b""`` when the test closed the connection without one).
    """
    with socket.create_connection(tuple(address), timeout=TASK_TIMEOUT) as conn:
        conn.sendall(message)
        conn.shutdown(socket.SHUT_WR)
        if not hold:
            return b""
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
        return answer


class Beacon:
    """A listening socket on 127.0.0.1 that counts and reads tasks' pings."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.address: tuple[str, int] = self._server.getsockname()[:2]

    def accept(self, timeout: float = 60.0) -> tuple[bytes, socket.socket]:
        """The next ping's message and its connection, still open (a held task waits on it)."""
        self._server.settimeout(timeout)
        try:
            conn, _ = self._server.accept()
        except TimeoutError:
            raise TimeoutError(f"no task pinged within {timeout} s") from None
        conn.settimeout(timeout)
        message = b""
        while chunk := conn.recv(4096):
            message += chunk
        return message, conn

    def wait(self, n: int = 1, timeout: float = 60.0) -> list[bytes]:
        """The messages of the next ``n`` pings, in arrival order."""
        deadline = time.monotonic() + timeout
        messages = []
        for _ in range(n):
            message, conn = self.accept(max(0.001, deadline - time.monotonic()))
            conn.close()
            messages.append(message)
        return messages

    def drain(self) -> list[bytes]:
        """The messages of pings already waiting, without waiting for more."""
        messages = []
        self._server.setblocking(False)
        try:
            while True:
                try:
                    conn, _ = self._server.accept()
                except BlockingIOError:
                    return messages
                with conn:
                    conn.settimeout(5.0)
                    message = b""
                    while chunk := conn.recv(4096):
                        message += chunk
                    messages.append(message)
        finally:
            self._server.setblocking(True)

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> Beacon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ping_then_sleep(i, address, seconds):
    ping(address)
    time.sleep(seconds)
    return i


def interrupt_once_a_task_runs(beacon: Beacon) -> threading.Thread:
    """Ctrl-C for this (the main) thread as soon as a task of the run has pinged ``beacon``."""
    main = threading.get_ident()

    def interrupt():
        beacon.wait(1)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    return thread
