"""Archives served and fetched: from the manager's host, or from the nodes that hold them.

Both sides run an ``ArchiveServer``: a thread with its own ZeroMQ context and a ROUTER.
The manager's serves the run's archives and decides, with its ``FanOut``, where each
node fetches them from; a worker's serves the archives its node holds, to the peers the
manager sends to it. ``fetch`` is a node's side: it asks the manager, follows it to a
peer or waits, pulls the archive in chunks with a window of requests in flight, checks
it against its key (its sha256), and tells the manager how it went.

Requests, multipart frames with the verb first (numbers in decimal ASCII), and answers::

    want KEY [REQUESTER]            -> redirect ADDRESS | serve SIZE | wait SECONDS | missing
    get KEY OFFSET LENGTH           -> part OFFSET BYTES | missing
    done KEY SOURCE OK [REQUESTER]  -> ok                  (OK: 1 whole, 0 failed)
    have KEY ADDRESS                -> ok
    anything else                   -> error WHY

A worker's server answers ``want`` with ``serve`` when it holds the key, else
``missing``, and takes ``done`` and ``have`` without a word (``ok``): only the manager's
keeps the books. ``REQUESTER`` names the asking node to the manager's ``FanOut``: the
address of its own archive server, or any name unique to it.

With keys, the manager's server is a CurveZMQ server with the manager's key pair and a
worker's with the workers' (as its peer server is, ``worker/peers.py``); both admit only
clients that hold the workers' key (``security.Gate``, one per context, started before
the bind).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType

import zmq

from daskvine_py.software.fanout import FanOut, FromManager, FromPeer
from daskvine_py.wire import security
from daskvine_py.wire.validation import connectable

logger = logging.getLogger("daskvine_py.software.transfer")

#: Largest piece asked for (and served) at once.
CHUNK = 4 * 1024 * 1024
#: ``get`` requests a fetch keeps in flight to its source: 32 MiB, more than a fast
#: link's bandwidth-delay product, so the source never waits for the next request.
WINDOW = 8
#: Seconds a fetch waits for any answer from a source before it counts it gone.
REPLY_TIMEOUT = 30.0
#: Seconds a fetch waits for the manager to take a ``done`` or ``have`` report.
REPORT_TIMEOUT = 5.0
#: Seconds between a pull's looks at its ``stop`` event while it waits for its peer.
STOP_POLL = 0.1
#: Longest wait a fetch takes from a ``wait`` answer before it asks again.
MAX_WAIT = 10.0
#: Largest request a server reads (requests are a verb, a key, numbers, an address).
REQUEST_BYTES = 4096
#: Connections the kernel holds until libzmq accepts them: a whole swarm asks at once.
BACKLOG = 4096
#: Answers queued per client: a well-behaved one has ``WINDOW`` in flight; past this
#: the ROUTER drops answers to it (its fetch times out), rather than hold gigabytes.
ANSWERS_QUEUED = 4 * WINDOW
#: Requests a server reads per turn before it looks at its stop socket again.
DRAIN = 100

WANT, GET, DONE, HAVE = b"want", b"get", b"done", b"have"
REDIRECT, SERVE, WAIT, MISSING, PART, OK, ERROR = (
    b"redirect",
    b"serve",
    b"wait",
    b"missing",
    b"part",
    b"ok",
    b"error",
)


class TransferError(OSError):
    """An archive could not be fetched; the message names the key's start and the source."""


class TransferTimeout(TransferError, TimeoutError):
    """An archive was not fetched in the time given."""


class ArchiveMissing(TransferError, FileNotFoundError):
    """The manager does not hold the archive asked for."""


# -- serving --------------------------------------------------------------------------


class ArchiveServer:
    """Serves archives by key from ``lookup`` (key -> the path of a complete file, or None).

    ``manager``: the manager's server, which serves with the manager's key pair and
    applies ``fanout`` (a new ``FanOut`` unless given); otherwise a worker's. ``address``
    is where clients reach it: ``contact_address``, else the address it bound.
    ``close`` stops it; it is also a context manager.
    """

    def __init__(
        self,
        lookup: Callable[[str], str | None],
        keys: security.Keys | None = None,
        *,
        manager: bool = False,
        fanout: FanOut | None = None,
        host: str = "127.0.0.1",
        contact_address: str | None = None,
        name: str | None = None,
    ) -> None:
        if manager and keys is not None and keys.manager_secret is None:
            raise ValueError("the manager's archive server needs the manager's secret key")
        self.lookup = lookup
        self.name = name or ("the manager's archive server" if manager else "archive server")
        #: the manager's policy (None: a worker's server, which only serves what it holds)
        self.fanout = fanout if fanout is not None else (FanOut() if manager else None)
        #: bytes of archives sent (read from any thread)
        self.bytes_served = 0
        #: requests answered
        self.requests = 0
        self._lock = threading.Lock()  # the fanout's: its thread's requests, ``gone``
        self._closed = False
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._gate: security.Gate | None = None
        sockets: list[zmq.Socket[bytes]] = []
        try:
            self._sock = self._context.socket(zmq.ROUTER)
            sockets.append(self._sock)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.BACKLOG, BACKLOG)
            self._sock.setsockopt(zmq.MAXMSGSIZE, REQUEST_BYTES)
            self._sock.setsockopt(zmq.SNDHWM, ANSWERS_QUEUED)
            if keys is not None:
                self._gate = security.Gate(self._context, keys.worker_public, self.name)
                self._gate.start()  # before the bind: a server with no ZAP handler admits anyone
                if manager:
                    assert keys.manager_secret is not None
                    security.serve(self._sock, keys.manager_public, keys.manager_secret)
                else:
                    security.serve(self._sock, keys.worker_public, keys.worker_secret)
            self._sock.bind(f"tcp://{host}:0")
            bound = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.address = contact_address or bound
            # The stop signal: a pair over inproc, so the thread sleeps in poll.
            wake = f"inproc://archive-server-{uuid.uuid4().hex}"
            self._stop_in = self._context.socket(zmq.PAIR)
            sockets.append(self._stop_in)
            self._stop_in.bind(wake)
            self._stop_out = self._context.socket(zmq.PAIR)
            sockets.append(self._stop_out)
            self._stop_out.connect(wake)
        except BaseException:
            for sock in sockets:
                sock.close(linger=0)
            if self._gate is not None:
                self._gate.stop()
            self._context.term()
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"daskvine_py {self.name} {self.address}", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> ArchiveServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread and close every socket; answers not yet sent are dropped."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stop_out.send(b"stop", zmq.NOBLOCK)
        except zmq.Again:  # the thread has stopped already
            pass
        self._thread.join()
        self._stop_out.close(linger=0)
        if self._gate is not None:
            self._gate.stop()
        self._context.term()

    def gone(self, address: str) -> None:
        """The node whose archive server is at ``address`` left (the manager's server):
        it serves nothing now. Any thread may call it."""
        if self.fanout is not None:
            with self._lock:
                self.fanout.gone(address)

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._stop_in, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_in in ready:
                    return
                for _ in range(DRAIN):
                    try:
                        ident, *frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    # copied: a zero-copy send would start pyzmq's process-wide garbage thread
                    self._sock.send_multipart([ident, *self._answer(frames)])
                    self.requests += 1
        except Exception:
            logger.exception("%s at %s stopped", self.name, self.address)
        finally:
            self._sock.close(linger=0)
            self._stop_in.close(linger=0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        try:
            verb, *args = frames
            words = [arg.decode("ascii") for arg in args]
            if verb == GET and len(words) == 3:
                return self._part(words[0], int(words[1]), int(words[2]))
            if verb == WANT and len(words) in (1, 2):
                return self._want(words[0], words[1] if len(words) == 2 else "")
            if verb == DONE and len(words) in (3, 4) and words[2] in ("0", "1"):
                if self.fanout is not None:
                    source = words[1] if words[1] != self.address else ""
                    requester = words[3] if len(words) == 4 else ""
                    with self._lock:
                        self.fanout.done(words[0], requester, source, words[2] == "1")
                return [OK]
            if verb == HAVE and len(words) == 2 and connectable(words[1]):
                if self.fanout is not None:
                    with self._lock:
                        self.fanout.have(words[0], words[1])
                return [OK]
        except ValueError as exc:  # not ASCII, not a number, no verb
            return [ERROR, f"malformed request: {exc}".encode()]
        return [ERROR, b"unknown request " + frames[0][:32] if frames else b"empty request"]

    def _path(self, key: str) -> str | None:
        try:
            return self.lookup(key)
        except Exception:
            logger.exception("%s could not look archive %s up", self.name, key[:12])
            return None

    def _want(self, key: str, requester: str) -> list[bytes]:
        path = self._path(key)
        if path is None:
            return [MISSING]
        try:
            size = os.stat(path).st_size
        except OSError:
            return [MISSING]
        if self.fanout is None:
            return [SERVE, b"%d" % size]
        with self._lock:
            decision = self.fanout.want(key, requester or "?", time.monotonic())
        if isinstance(decision, FromPeer):
            return [REDIRECT, decision.address.encode()]
        if isinstance(decision, FromManager):
            return [SERVE, b"%d" % size]
        return [WAIT, repr(decision.seconds).encode()]

    def _part(self, key: str, offset: int, length: int) -> list[bytes]:
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        path = self._path(key)
        if path is None:
            return [MISSING]
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return [MISSING]
        try:
            data = os.pread(fd, min(length, CHUNK), offset)
        except OSError as exc:
            logger.warning("%s could not read %s: %s", self.name, path, exc)
            return [MISSING]
        finally:
            os.close(fd)
        self.bytes_served += len(data)
        return [PART, b"%d" % offset, data]


# -- fetching -------------------------------------------------------------------------


def fetch(
    key: str,
    size: int,
    dest: str,
    sources: Sequence[str],
    keys: security.Keys | None,
    own_address: str | None,
    timeout: float = 600.0,
    *,
    reply_timeout: float = REPLY_TIMEOUT,
    window: int = WINDOW,
) -> None:
    """Fetch archive ``key`` (its sha256, hex) of ``size`` bytes into ``dest``.

    ``sources``: the manager's archive servers, asked in turn (the first until it stops
    answering); ``keys``: the run's (None: without security); ``own_address``: this
    node's archive server, announced as a holder once ``dest`` is there (None: this
    node serves no peers). ``dest`` appears complete and checked, or not at all: the
    archive is written beside it and renamed. A source that sends wrong bytes or stops
    answering for ``reply_timeout`` seconds is reported to the manager, and the fetch
    goes on from where the manager sends it next (from the start after wrong bytes).

    Raises ``TransferTimeout`` (a ``TimeoutError``) when not done in ``timeout`` seconds,
    ``ArchiveMissing`` (a ``FileNotFoundError``) when the manager does not hold it, and
    ``TransferError`` (an ``OSError``) for a manager whose own copy is not ``key``'s;
    each names the key's start and the source. Bound with ``functools.partial``
    (``sources``, ``keys``, ``own_address``) it is the node cache's ``fetch(key, size,
    dest)``.
    """
    if not sources:
        raise ValueError("fetch needs at least one source (the manager's archive server)")
    for source in sources:
        if not connectable(source):
            raise ValueError(f"archive {key[:12]}: {source!r} is not a tcp://HOST:PORT address")
    with _Fetch(key, size, dest, sources, keys, own_address, timeout, reply_timeout, window) as job:
        job.run()


def pull_file(
    address: str,
    key: str,
    size: int,
    dest: str,
    keys: security.Keys | None,
    *,
    reply_timeout: float = REPLY_TIMEOUT,
    window: int = WINDOW,
    stop: threading.Event | None = None,
) -> None:
    """Pull the file a peer's server holds as ``key`` (``size`` bytes) into ``dest``,
    chunk by chunk with ``window`` requests in flight: no manager, no check of the
    content beyond its size (an input's key names its URL and version, not its bytes).

    Raises ``TransferError`` naming the peer when it does not serve ``key`` at that size,
    stops answering for ``reply_timeout`` seconds, or sends what was not asked; and
    within ``STOP_POLL`` seconds of ``stop`` being set (its worker is closing)."""
    if not connectable(address):
        raise TransferError(f"{address!r} is not a tcp://HOST:PORT address")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = _dealer(context, address, None if keys is None else keys.worker_public, keys)
    try:
        with open(dest, "wb") as file:

            def answer() -> list[zmq.Frame]:
                deadline = time.monotonic() + reply_timeout
                while True:
                    if stop is not None and stop.is_set():
                        raise TransferError(f"pull from {address} stopped: its worker closes")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TransferError(f"{address} did not answer in {reply_timeout:g} s")
                    wait = left if stop is None else min(left, STOP_POLL)
                    if sock.poll(math.ceil(wait * 1000)):
                        return sock.recv_multipart(copy=False)

            sock.send_multipart([WANT, key.encode()])
            reply = [frame.bytes for frame in answer()]
            if reply[0] != SERVE or _number(reply) != size:
                raise TransferError(f"{address} answered {b' '.join(reply)[:80]!r} for {key[:12]}")
            wanted = list(range(0, size, CHUNK))
            wanted.reverse()
            asked: dict[int, int] = {}
            while wanted or asked:
                while wanted and len(asked) < max(1, window):
                    offset = wanted.pop()
                    length = min(CHUNK, size - offset)
                    sock.send_multipart([GET, key.encode(), b"%d" % offset, b"%d" % length])
                    asked[offset] = length
                frames = answer()
                verb = frames[0].bytes
                if verb != PART or len(frames) != 3:
                    raise TransferError(f"{address} answered {verb[:32]!r} for {key[:12]}")
                try:
                    offset = int(frames[1].bytes)
                except ValueError:
                    offset = -1
                data = frames[2].buffer
                if asked.pop(offset, -1) != len(data):
                    raise TransferError(
                        f"{address} sent {len(data)} bytes at {offset}, not what was asked"
                    )
                file.seek(offset)
                file.write(data)
    finally:
        sock.close(linger=0)
        context.term()


def _dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    address: str,
    server_public: bytes | None,
    keys: security.Keys | None,
) -> zmq.Socket[bytes]:
    """A DEALER to a server at ``address`` (one holding ``server_public``, with ``keys``)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, CHUNK + 1024)
    try:
        if keys is not None:
            assert server_public is not None
            security.connect_as_worker(sock, server_public, keys)
        sock.connect(address)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise TransferError(f"cannot connect to {address}: {exc}") from exc
    return sock


class _SourceFailed(Exception):
    """A source that cannot finish this transfer: it stopped answering, no longer holds
    the archive, or sent what was not asked for (``corrupt``: the bytes so far are
    suspect)."""

    def __init__(self, address: str, why: str, corrupt: bool = False) -> None:
        super().__init__(f"{address}: {why}")
        self.address = address
        self.why = why
        self.corrupt = corrupt


class _Fetch:
    """One fetch: its sockets, the file being written and how much of it is checked."""

    def __init__(
        self,
        key: str,
        size: int,
        dest: str,
        sources: Sequence[str],
        keys: security.Keys | None,
        own_address: str | None,
        timeout: float,
        reply_timeout: float,
        window: int,
    ) -> None:
        self.key = key
        self.size = size
        self.dest = dest
        self.sources = list(sources)
        self.keys = keys
        self.own_address = own_address
        self.timeout = timeout
        self.reply_timeout = reply_timeout
        self.window = max(1, window)
        self.deadline = time.monotonic() + timeout
        self.requester = own_address or f"fetch-{uuid.uuid4().hex}"
        #: which of ``sources`` is asked
        self.current = 0
        #: what the fetch waits on, for the message of a timeout
        self.waiting_on = self.sources[0]
        self.context: zmq.Context[zmq.Socket[bytes]] | None = None
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        self.fd = -1
        self.temporary = ""
        #: bytes from the start written and hashed (``hasher`` holds them)
        self.prefix = 0
        self.hasher = hashlib.sha256()
        #: offsets of chunks written past ``prefix``, hashed once it reaches them
        self.ahead: set[int] = set()
        #: the sources of the bytes written (since the last start from nothing)
        self.contributors: set[str] = set()

    def __enter__(self) -> _Fetch:
        directory = os.path.dirname(os.path.abspath(self.dest))
        self.fd, self.temporary = tempfile.mkstemp(
            prefix=f".{os.path.basename(self.dest)}.part-", dir=directory
        )
        try:
            self.context = zmq.Context()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
        if self.context is not None:
            self.context.term()
        if self.fd >= 0:
            os.close(self.fd)
        if self.temporary:
            try:
                os.unlink(self.temporary)
            except FileNotFoundError:
                pass

    @property
    def manager(self) -> str:
        return self.sources[self.current]

    def run(self) -> None:
        while True:
            source = self._find_source()
            try:
                self._pull(source)
            except _SourceFailed as failure:
                self._failed(source, failure.why, failure.corrupt)
                continue
            digest = self.hasher.hexdigest()
            if digest == self.key:
                break
            if self.contributors <= set(self.sources):  # the manager's own copy
                self._report(source, ok=False)
                raise TransferError(
                    f"archive {self.key[:12]}: the copy {source} serves is not the "
                    f"archive its key names (its sha256 is {digest[:12]})"
                )
            why = (
                f"the sha256 of bytes from {', '.join(sorted(self.contributors))} is {digest[:12]}"
            )
            self._failed(source, why, corrupt=True)
        os.replace(self.temporary, self.dest)
        self.temporary = ""
        if self.own_address:
            self._report_have()
        self._report(source, ok=True)

    def _failed(self, source: str, why: str, corrupt: bool) -> None:
        logger.warning(
            "archive %s: fetching from %s failed (%s); asking the manager again",
            self.key[:12],
            source,
            why,
        )
        self._reset(source)
        self._report(source, ok=False)
        if corrupt:
            self.prefix = 0
            self.hasher = hashlib.sha256()
            self.ahead.clear()
            self.contributors.clear()
            os.ftruncate(self.fd, 0)

    # -- asking ----------------------------------------------------------------------

    def _find_source(self) -> str:
        """The address of a server that said it serves the archive, at the right size."""
        while True:
            manager = self.manager
            try:
                reply = self._request(manager, [WANT, self.key.encode(), self.requester.encode()])
            except _SourceFailed as failure:
                logger.warning("archive %s: %s", self.key[:12], failure)
                self.current = (self.current + 1) % len(self.sources)
                continue
            verb = reply[0]
            if verb == SERVE:
                served = _number(reply)
                if served != self.size:
                    raise TransferError(
                        f"archive {self.key[:12]}: {manager} serves {served} bytes, "
                        f"not the {self.size} the run's software names"
                    )
                return manager
            if verb == REDIRECT and len(reply) == 2:
                peer = reply[1].decode("ascii", "replace")
                if self._peer_serves(peer):
                    return peer
                continue
            if verb == WAIT:
                seconds = _number(reply, float)
                self._sleep(seconds if 0 < seconds <= MAX_WAIT else MAX_WAIT)
                continue
            if verb == MISSING:
                raise ArchiveMissing(f"archive {self.key[:12]}: {manager} does not hold it")
            raise TransferError(
                f"archive {self.key[:12]}: {manager} answered {b' '.join(reply)[:80]!r}"
            )

    def _peer_serves(self, peer: str) -> bool:
        """Whether the peer the manager named serves the archive, at the right size; if
        not, the manager is told (it drops the peer as a holder)."""
        why = ""
        if not connectable(peer):
            why = "not an address to connect to"
        else:
            try:
                reply = self._request(peer, [WANT, self.key.encode(), self.requester.encode()])
            except _SourceFailed as failure:
                why = failure.why
            else:
                if reply[0] == SERVE and _number(reply) == self.size:
                    return True
                why = f"answered {b' '.join(reply)[:80]!r}"
        self._failed(peer, why, corrupt=False)
        return False

    def _socket(self, address: str) -> zmq.Socket[bytes]:
        sock = self.sockets.get(address)
        if sock is None:
            assert self.context is not None
            server = None
            if self.keys is not None:  # the manager's servers use its key pair, peers the workers'
                server = self.keys.manager_public
                if address not in self.sources:
                    server = self.keys.worker_public
            try:
                sock = _dealer(self.context, address, server, self.keys)
            except TransferError as exc:
                raise _SourceFailed(address, str(exc)) from exc
            self.sockets[address] = sock
        return sock

    def _reset(self, address: str) -> None:
        """Drop the socket to ``address``, and every answer still on its way."""
        sock = self.sockets.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def _wait(self, sock: zmq.Socket[bytes], address: str, wait: float, bounded: bool) -> None:
        """Until ``sock`` has an answer: ``_SourceFailed`` after ``wait`` seconds, or
        ``TransferTimeout`` at the fetch's deadline if that comes first (``bounded``)."""
        self.waiting_on = address
        if bounded:
            left = self.deadline - time.monotonic()
            if left < wait:
                if left > 0 and sock.poll(math.ceil(left * 1000)):
                    return
                self._reset(address)
                raise self._timeout()
        if not sock.poll(math.ceil(wait * 1000)):
            self._reset(address)
            raise _SourceFailed(address, f"no answer in {wait:g} s")

    def _request(
        self, address: str, frames: list[bytes], wait: float | None = None, bounded: bool = True
    ) -> list[bytes]:
        """Send one request to ``address`` and read its answer (see ``_wait``)."""
        sock = self._socket(address)
        sock.send_multipart(frames)
        while True:
            self._wait(sock, address, self.reply_timeout if wait is None else wait, bounded)
            reply = sock.recv_multipart()
            if reply and reply[0] != PART:  # a chunk of a transfer given up on
                return reply

    def _report(self, source: str, ok: bool) -> None:
        """Tell the manager how the transfer from ``source`` went (it frees the source's
        slot; a failed one from a peer drops that peer as a holder)."""
        self._tell([DONE, self.key.encode(), source.encode(), b"1" if ok else b"0"])

    def _report_have(self) -> None:
        assert self.own_address is not None
        self._tell([HAVE, self.key.encode(), self.own_address.encode()])

    def _tell(self, frames: list[bytes]) -> None:
        if frames[0] == DONE:
            frames.append(self.requester.encode())
        wait = min(self.reply_timeout, REPORT_TIMEOUT)
        try:
            self._request(self.manager, frames, wait, bounded=False)
        except _SourceFailed as failure:
            logger.warning(
                "archive %s: the manager did not take a report (%s)", self.key[:12], failure
            )

    def _sleep(self, seconds: float) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._timeout("every source kept busy")
        time.sleep(min(seconds * random.uniform(0.5, 1.5), left))

    def _timeout(self, why: str = "") -> TransferTimeout:
        if why:
            why = f"{why}: the manager at {self.manager} said wait"
        else:
            why = (
                f"no answer from {self.waiting_on} in time (is it running, and are this "
                "node's keys the run's?)"
            )
        return TransferTimeout(f"archive {self.key[:12]}: not fetched in {self.timeout:g} s: {why}")

    # -- pulling ---------------------------------------------------------------------

    def _pull(self, source: str) -> None:
        """Fetch from ``source`` every chunk not yet written, ``window`` at a time."""
        sock = self._socket(source)
        self.contributors.add(source)
        key = self.key.encode()
        wanted = [
            offset for offset in range(self.prefix, self.size, CHUNK) if offset not in self.ahead
        ]
        wanted.reverse()  # popped from the end: the lowest offset first
        asked: dict[int, int] = {}  # offset -> length
        while wanted or asked:
            while wanted and len(asked) < self.window:
                offset = wanted.pop()
                length = min(CHUNK, self.size - offset)
                sock.send_multipart([GET, key, b"%d" % offset, b"%d" % length])
                asked[offset] = length
            self._wait(sock, source, self.reply_timeout, bounded=True)
            reply = sock.recv_multipart(copy=False)
            verb = reply[0].bytes
            if verb == MISSING:
                raise _SourceFailed(source, "no longer holds the archive")
            if verb != PART or len(reply) != 3:
                raise _SourceFailed(source, f"answered {verb[:32]!r}", corrupt=True)
            try:
                offset = int(reply[1].bytes)
            except ValueError:
                offset = -1
            data = reply[2].buffer
            if asked.get(offset) != len(data):
                raise _SourceFailed(
                    source, f"sent {len(data)} bytes at {offset}, not what was asked", corrupt=True
                )
            del asked[offset]
            self._write(offset, data)

    def _write(self, offset: int, data: memoryview) -> None:
        try:
            written = os.pwrite(self.fd, data, offset)
            if written != len(data):
                raise OSError(f"wrote {written} of {len(data)} bytes")
        except OSError as exc:
            raise TransferError(
                f"archive {self.key[:12]}: cannot write {self.temporary}: {exc}"
            ) from exc
        if offset != self.prefix:
            self.ahead.add(offset)
            return
        self.hasher.update(data)
        self.prefix += len(data)
        while self.prefix in self.ahead:  # chunks that came early: hashed from the file
            self.ahead.discard(self.prefix)
            chunk = os.pread(self.fd, min(CHUNK, self.size - self.prefix), self.prefix)
            self.hasher.update(chunk)
            self.prefix += len(chunk)


def _number(reply: list[bytes], kind: type[float] | type[int] = int) -> float:
    """The number an answer carries (``serve SIZE``, ``wait SECONDS``); -1 if none."""
    try:
        return kind(reply[1]) if len(reply) == 2 else -1
    except ValueError:
        return -1
