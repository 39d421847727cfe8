"""The ROUTER's failed handshakes and accepts: workers that came without this manager's
keys, and connections it could not take for want of open files.

With security on, a worker holding another manager's connection file (or none) fails in
the CurveZMQ handshake, before the gate or the loop ever hears of it. The ROUTER's socket
monitor reports those failures; this counts them for the no-worker warning
(``vacancy.Vacancy.refused``). It also reports a connection libzmq could not accept
because the process is out of file descriptors: the registry refuses workers before
that (``openfiles``), but other files may have used them up, and libzmq only retries,
so this says it once, as a WARNING naming the limit. It is made, drained and closed by
the I/O thread only, as every socket of the loop is.
"""

from __future__ import annotations

import contextlib
import errno
import logging

import zmq
from zmq.utils.monitor import recv_monitor_message

from daskvine_py.manager.vacancy import Vacancy
from daskvine_py.wire.limits import raise_open_files

logger = logging.getLogger("daskvine_py.manager")

#: Failed handshakes that tell of a worker without this manager's keys: the gate refused
#: its key (AUTH), or it holds another manager's (CRYPTOGRAPHIC), or none
#: (MECHANISM_MISMATCH: seen only when the manager notices before the worker hangs up,
#: which is a race).
REFUSAL_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
#: Every event watched: refusals, and accepts that failed.
EVENTS = REFUSAL_EVENTS | zmq.EVENT_ACCEPT_FAILED


class HandshakeMonitor:
    """The ROUTER's monitor socket, polled beside it; ``drain`` counts what it reports."""

    __slots__ = ("router", "socket", "vacancy", "limit", "warned")

    def __init__(self, router: zmq.Socket[bytes], vacancy: Vacancy, limit: int) -> None:
        self.router = router
        self.vacancy = vacancy
        #: events read per drain, as the loop's other drains are bounded
        self.limit = limit
        self.socket: zmq.Socket[bytes] = router.get_monitor_socket(EVENTS)
        #: the one warning about open files has been given
        self.warned = False

    def drain(self) -> None:
        for _ in range(self.limit):
            try:
                event = recv_monitor_message(self.socket, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_ACCEPT_FAILED:
                self._accept_failed(event["value"])
            else:
                self.vacancy.refused(event["event"], event["value"])

    def _accept_failed(self, error: int) -> None:
        if self.warned or error not in (errno.EMFILE, errno.ENFILE):
            return  # (a connection reset before it was accepted: nothing to say)
        self.warned = True
        soft, hard = raise_open_files()
        logger.warning(
            "the manager cannot accept more connections: it is out of open files (%s; "
            "RLIMIT_NOFILE %s, hard limit %s). Workers trying to connect wait, then give "
            "up. Raise the limit in the shell that starts the manager (ulimit -n N, up to "
            "the hard limit), or open fewer files in its process",
            "the whole system's" if error == errno.ENFILE else "this process's",
            soft or "unlimited",
            hard or "unlimited",
        )

    def close(self) -> None:
        """Closed by the thread that used it: the context ends only once it is."""
        with contextlib.suppress(zmq.ZMQError):
            self.router.disable_monitor()
        self.socket.close(linger=0)
