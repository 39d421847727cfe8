"""A worker's sockets to its peers: the ROUTER that serves its results, a DEALER per peer
it fetches from, at most ``fetching.MAX_PEER_LINKS`` of them: the state says which to
close (``ClosePeer``) before a new one opens.

``WorkerState`` decides what to fetch from whom (``AskPeer``, ``ClosePeer``) and takes
the answers (``p.Data`` events); this sends the requests, reads the answers and serves
other workers' requests from the store, feeding the state events (the answers,
``PeerUnreachable``, ``PeerAsked`` for results a library keeps live) and sending the
answers it gives back (``AnswerPeer``). Every request and reply is validated: a bad
request gets no answer (its sender asks another holder after its timeout), a bad reply
is dropped (its fetch times out), a peer that cannot be asked passes its fetches to
their next holders.
With keys, the server admits only workers of the run (``security.Gate``) and every client
proves it is one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.transport import send_batch
from daskvine_py.worker import serving
from daskvine_py.worker.live_results import LiveResults
from daskvine_py.worker.messages import AnswerPeer, AskPeer, Event, PeerUnreachable
from daskvine_py.worker.store import Store

#: Messages drained from one socket per loop iteration, so one busy peer cannot starve the rest.
DRAIN_LIMIT = 1000
#: Largest request a peer may send (a ``GetData`` of ``serving.REQUEST_IDS`` ids takes
#: some 40 kB): a larger one closes its connection before it is read or decoded.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Connections from peers the kernel holds until libzmq accepts them: a result every
#: worker of a swarm needs at once (a broadcast) brings that many at once, and past the
#: backlog (ZeroMQ's default is 100) the kernel drops them for a retry seconds later.
PEER_BACKLOG = 4096


class PeerLinks:
    """The peer server and the clients to peers; ``address`` is where peers reach us."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        poller: zmq.Poller,
        store: Store,
        drops: p.DropLog,
        name: str,
        host: str,
        port: int = 0,
        contact_address: str | None = None,
        keys: security.Keys | None = None,
    ) -> None:
        self.context = context
        self.poller = poller
        self.store = store
        self.drops = drops
        self.name = name
        self.keys = keys
        self.server = context.socket(zmq.ROUTER)
        self.server.setsockopt(zmq.LINGER, 0)
        self.server.setsockopt(zmq.BACKLOG, PEER_BACKLOG)
        self.server.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        #: ids peers asked for and not yet answered
        self.requests = serving.PeerRequests()
        #: the ZAP handler admitting peers to ``server`` (None without keys)
        self.gate: security.Gate | None = None
        if keys is not None:
            self.gate = security.Gate(context, keys.worker_public, f"worker {name}")
            self.gate.start()  # before the bind: a server with no ZAP handler admits anyone
            security.serve(self.server, keys.worker_public, keys.worker_secret)
        if port:
            self.server.bind(f"tcp://{host}:{port}")
        else:
            port = self.server.bind_to_random_port(f"tcp://{host}")
        #: where peers fetch our results: the bound address, or one that forwards to it
        self.address = contact_address or f"tcp://{host}:{port}"
        #: peer address -> the socket we ask it on
        self.clients: dict[str, zmq.Socket[bytes]] = {}
        #: identity -> the state's answers for that peer, sent at the next ``flush``
        self.answers: dict[bytes, list[p.Data]] = {}
        poller.register(self.server, zmq.POLLIN)

    def close(self) -> None:
        for sock in self.clients.values():
            sock.close(linger=0)
        self.server.close(linger=0)
        if self.gate is not None:
            self.gate.stop()

    # -- fetching from peers ----------------------------------------------------------

    def ask(self, ask: AskPeer, events: list[Event]) -> None:
        """Send one ``GetData`` (in requests of ``serving.REQUEST_IDS`` ids at most); a
        peer that cannot be asked becomes a ``PeerUnreachable`` event."""
        address, ids = ask
        if address not in self.clients and not p.connectable(address):
            self._unreachable(events, address, ids, "not an address to connect to")
            return
        step = serving.REQUEST_IDS  # (a fetch asks for a handful: one request)
        requests = [p.GetData(ids[i : i + step]) for i in range(0, len(ids), step)]
        try:
            send_batch(self._client(address), p.encode(requests))
        except zmq.ZMQError as exc:
            self._unreachable(events, address, ids, str(exc))

    def _unreachable(
        self, events: list[Event], address: str, ids: tuple[int, ...], why: str
    ) -> None:
        self.drops.warn(
            ("unreachable", address),
            time.monotonic(),
            "worker %s cannot ask peer %r for results: %s",
            self.name,
            address,
            why,
        )
        events.append(PeerUnreachable(address, ids))

    def answer_later(self, answer: AnswerPeer) -> None:
        """An answer the state gives (an export a peer waited for): sent with the others
        to that peer at the next ``flush``, in one message."""
        self.answers.setdefault(answer.ident, []).append(answer.data)

    def flush(self, live: LiveResults | None, events: list[Event]) -> None:
        """Answer this turn's share of the requests, and the state's answers."""
        self.answer_waiting(live, events)
        if self.answers:
            answers, self.answers = self.answers, {}
            for ident, records in answers.items():
                self._answer(ident, records)

    def _client(self, address: str) -> zmq.Socket[bytes]:
        sock = self.clients.get(address)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                if self.keys is not None:  # every peer serves with the workers' key pair
                    security.connect_as_worker(sock, self.keys.worker_public, self.keys)
                sock.connect(address)
            except zmq.ZMQError:
                sock.close(linger=0)  # an open socket would hang the context's term
                raise
            self.clients[address] = sock
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def reset(self, address: str | None) -> None:
        """Drop the socket to a silent peer, and the requests queued on it."""
        sock = self.clients.pop(address, None) if address else None
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(linger=0)

    def drain(self, sock: zmq.Socket[bytes], events: list[Event]) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.on_frames([f.buffer for f in frames], events)

    def on_frames(self, frames: Sequence[p.Frame], events: list[Event]) -> None:
        """A peer's replies, each a ``p.Data`` event for the state; a malformed one is
        dropped, and its fetch times out."""
        try:
            replies = p.decode(frames, p.FROM_PEER)
        except ProtocolError as exc:
            self.drops.warn(
                ("reply from a peer",),
                time.monotonic(),
                "worker %s dropped a malformed reply from a peer: %s",
                self.name,
                exc,
            )
            return
        events += replies

    # -- serving peers ----------------------------------------------------------------

    def serve(self, live: LiveResults | None = None, events: list[Event] | None = None) -> None:
        """Take the requests that arrived; they are answered by ``answer_waiting``, a
        bounded number per loop turn (``serving``); the ids of results ``live`` only go
        to ``events`` (``PeerAsked``)."""
        for _ in range(DRAIN_LIMIT):
            try:
                ident, *frames = self.server.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.take(ident.bytes, [f.buffer for f in frames], _address(ident))
        self.answer_waiting(live, events)

    def take(self, ident: bytes, frames: Sequence[p.Frame], address: str = "unknown") -> bool:
        """Queue one request from a peer (at host ``address``); False for one that is not
        valid. Ids past ``serving.REQUEST_IDS`` waiting from it are dropped, with a
        warning a minute per host at most."""
        requests = self._read(ident, frames)
        if requests is None:
            return False
        for request in requests:
            dropped = self.requests.take(ident, request.task_ids)
            if dropped:
                self.drops.warn(
                    ("too many ids", address),
                    time.monotonic(),
                    "worker %s dropped %d of the "
                    "%d ids a peer at %s asked for: a peer may have %d waiting",
                    self.name,
                    dropped,
                    len(request.task_ids),
                    address,
                    serving.REQUEST_IDS,
                )
        return True

    def replies(
        self, ident: bytes, frames: Sequence[p.Frame], live: LiveResults | None = None
    ) -> list[p.Data] | None:
        """The answer to one request at once (``serve`` spreads them over loop turns),
        its first ``serving.REQUEST_IDS`` ids, those held live left out; None for a
        request that is not valid."""
        requests = self._read(ident, frames)
        if requests is None:
            return None
        ids = [task_id for request in requests for task_id in request.task_ids]
        answers = (
            serving.answer(self.store, live, task_id, self._unreadable)
            for task_id in ids[: serving.REQUEST_IDS]
        )
        return [data for data in answers if data is not None]

    def _read(self, ident: bytes, frames: Sequence[p.Frame]) -> list[p.GetData] | None:
        try:
            return p.decode(frames, p.TO_PEER)
        except ProtocolError as exc:
            self.drops.warn(
                ("request",),
                time.monotonic(),
                "worker %s dropped a malformed request from peer %r: %s",
                self.name,
                ident[:32],
                exc,
            )
            return None

    def answer_waiting(self, live: LiveResults | None, events: list[Event] | None) -> None:
        """Answer this turn's share of the ids peers asked for."""
        if self.requests:
            answers = self.requests.answers(self.store, live, self._unreadable, events)
            for ident, records in answers:
                self._answer(ident, records)

    def _unreadable(self, task_id: int, exc: Exception) -> None:
        self.drops.warn(
            ("store",),
            time.monotonic(),
            "worker %s cannot serve result %d: %r",
            self.name,
            task_id,
            exc,
        )

    def _answer(self, ident: bytes, replies: list[p.Data]) -> None:
        try:
            send_batch(self.server, p.encode(replies), ident)
        except Exception as exc:  # the peer asks another holder after its timeout
            self.drops.warn(
                ("reply",),
                time.monotonic(),
                "worker %s could not answer a peer: %r",
                self.name,
                exc,
                exc_info=exc,
            )


def _address(frame: zmq.Frame) -> str:
    """The host a peer's message came from, for warnings about it."""
    try:
        return str(frame.get("Peer-Address"))
    except zmq.ZMQError:
        return "unknown"
