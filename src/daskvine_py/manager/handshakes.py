"""The ROUTER's failed handshakes: workers that came without this manager's keys.

With security on, a worker holding another manager's connection file (or none) fails in
the CurveZMQ handshake, before the gate or the loop ever hears of it. The ROUTER's socket
monitor reports those failures; this counts them for the no-worker warning
(``vacancy.Vacancy.refused``). It is made, drained and closed by the I/O thread only, as
every socket of the loop is.
"""

from __future__ import annotations

import contextlib

import zmq
from zmq.utils.monitor import recv_monitor_message

from daskvine_py.manager.vacancy import Vacancy

#: Failed handshakes that tell of a worker without this manager's keys: the gate refused
#: its key (AUTH), or it holds another manager's (CRYPTOGRAPHIC), or none
#: (MECHANISM_MISMATCH: seen only when the manager notices before the worker hangs up,
#: which is a race).
REFUSAL_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class HandshakeMonitor:
    """The ROUTER's monitor socket, polled beside it; ``drain`` counts what it reports."""

    __slots__ = ("router", "socket", "vacancy", "limit")

    def __init__(self, router: zmq.Socket, vacancy: Vacancy, limit: int) -> None:
        self.router = router
        self.vacancy = vacancy
        #: events read per drain, as the loop's other drains are bounded
        self.limit = limit
        self.socket: zmq.Socket = router.get_monitor_socket(REFUSAL_EVENTS)

    def drain(self) -> None:
        for _ in range(self.limit):
            try:
                event = recv_monitor_message(self.socket, zmq.NOBLOCK)
            except zmq.Again:
                return
            self.vacancy.refused(event["event"], event["value"])

    def close(self) -> None:
        """Closed by the thread that used it: the context ends only once it is."""
        with contextlib.suppress(zmq.ZMQError):
            self.router.disable_monitor()
        self.socket.close(linger=0)
