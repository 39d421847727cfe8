"""Archives from the manager's host to the nodes, and from node to node (issue 39).

``FanOut``'s policy is tested with literals; the servers and ``fetch`` with real sockets
on 127.0.0.1, in threads of this process, with and without CurveZMQ.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from daskvine_py.software import transfer
from daskvine_py.software.fanout import MANAGER, STALE, WAIT, FanOut
from daskvine_py.software.transfer import (
    ArchiveMissing,
    ArchiveServer,
    TransferError,
    TransferTimeout,
    fetch,
)
from daskvine_py.wire import security

MB = 1024 * 1024
A, B, C, D, E = (f"tcp://10.0.0.{n}:9000" for n in range(1, 6))


# -- the policy ------------------------------------------------------------------------


def test_the_manager_serves_two_then_the_third_waits_then_goes_to_a_holder() -> None:
    fanout = FanOut()
    assert fanout.want("k", A, now=0.0) == ("self",)
    assert fanout.want("k", B, now=0.0) == ("self",)
    assert fanout.want("k", C, now=0.1) == ("wait", WAIT)
    fanout.have("k", A)
    fanout.done("k", A, MANAGER, ok=True)
    assert fanout.want("k", C, now=0.2) == ("peer", A)
    assert fanout.want("k", D, now=0.2) == ("peer", A)
    # A serves two: the manager (one of two in flight) takes the next
    assert fanout.want("k", E, now=0.3) == ("self",)
    assert fanout.finished == {"self": 1, "peer": 0}
    assert fanout.load == {A: 2}
    assert fanout.manager_load == {"k": 2}


def test_the_least_loaded_holder_first_never_the_requester() -> None:
    fanout = FanOut()
    fanout.have("k", A)
    fanout.have("k", B)
    assert fanout.want("k", C, now=0.0) == ("peer", A)
    assert fanout.want("k", D, now=0.0) == ("peer", B)
    # A asks (it lost its copy): it holds it no longer, and is never sent to itself
    assert fanout.want("k", A, now=0.0) == ("peer", B)
    assert list(fanout.holders["k"]) == [B]
    # the load of a peer counts every key
    assert fanout.want("other", E, now=0.0) == ("self",)
    fanout.have("other", B)
    assert fanout.want("other", D, now=0.0) == ("self",)


def test_a_failed_transfer_from_a_peer_drops_that_holder() -> None:
    fanout = FanOut()
    fanout.have("k", A)
    fanout.have("k", B)
    assert fanout.want("k", C, now=0.0) == ("peer", A)
    fanout.done("k", C, A, ok=False)
    assert list(fanout.holders["k"]) == [B]
    assert fanout.load == {}
    assert fanout.failed == {"self": 0, "peer": 1}
    assert fanout.want("k", C, now=0.0) == ("peer", B)
    # a failed transfer from the manager drops no one, and is not counted a copy
    assert fanout.want("k", D, now=0.0) == ("peer", B)
    assert fanout.want("k", E, now=0.0) == ("self",)
    fanout.done("k", E, MANAGER, ok=False)
    assert fanout.copies == {"k": 0}
    assert list(fanout.holders["k"]) == [B]


def test_stale_transfers_free_their_slots() -> None:
    fanout = FanOut()
    assert fanout.want("k", A, now=0.0) == ("self",)
    assert fanout.want("k", B, now=1.0) == ("self",)
    assert fanout.want("k", C, now=STALE) == ("wait", WAIT)
    # A's transfer is older than STALE, B's is not
    assert fanout.want("k", C, now=STALE + 0.5) == ("self",)
    assert fanout.expired == 1
    assert fanout.in_flight("k") == 2
    fanout.expire(now=3 * STALE)
    assert fanout.in_flight("k") == 0
    assert fanout.transfers == {}
    # a report that comes after its transfer expired frees nothing more
    fanout.done("k", A, MANAGER, ok=True)
    assert fanout.manager_load == {}


def test_asking_again_ends_the_transfer_in_flight() -> None:
    fanout = FanOut()
    assert fanout.want("k", A, now=0.0) == ("self",)
    assert fanout.want("k", A, now=1.0) == ("self",)
    assert fanout.in_flight("k") == 1


def test_the_manager_sends_a_few_copies_unless_none_is_left() -> None:
    fanout = FanOut(manager_copies=2)
    assert fanout.want("k", A, now=0.0) == ("self",)
    assert fanout.want("k", B, now=0.0) == ("self",)
    for requester in (A, B):
        fanout.have("k", requester)
        fanout.done("k", requester, MANAGER, ok=True)
    for requester in (C, C + "1", D, D + "1"):
        assert fanout.want("k", requester, now=0.0)[0] == "peer"
    # both holders busy, two copies sent: E waits for a peer, though the manager is idle
    assert fanout.want("k", E, now=0.0) == ("wait", WAIT)
    # every copy gone (the holders left, and their transfers with them): the manager again
    fanout.gone(A)
    fanout.gone(B)
    assert fanout.load == {}
    assert fanout.holders["k"] == {}
    assert fanout.want("k", E, now=0.0) == ("self",)


# -- sockets ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """Every server and fetch ends its threads (and the Gate's)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
        if not left:
            return
        time.sleep(0.05)
    raise AssertionError(f"threads left behind: {left}")


def _archive(directory: str, size: int, name: str = "archive") -> tuple[str, str, bytes]:
    data = os.urandom(size)
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(data)
    return path, hashlib.sha256(data).hexdigest(), data


def _holding(key: str, path: str) -> Callable[[str], str | None]:
    """A lookup that finds ``key`` at ``path`` once the file is there."""
    return lambda asked: path if asked == key and os.path.exists(path) else None


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_one_fetch_from_the_manager_with_keys(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 20 * MB)
    keys = security.Keys.generate()
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(_holding(key, path), keys, manager=True) as manager:
        get: Callable[[str, int, str], None] = functools.partial(
            fetch, sources=[manager.address], keys=keys.for_workers(), own_address=None
        )
        get(key, len(data), dest)
        assert manager.bytes_served == len(data)
        assert manager.fanout is not None
        assert manager.fanout.finished == {"self": 1, "peer": 0}
        assert manager.fanout.transfers == {}
    assert _read(dest) == data
    assert hashlib.sha256(_read(dest)).hexdigest() == key
    assert sorted(os.listdir(directory)) == ["archive", "fetched"]  # no part file left


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_corrupt_peer_is_reported_and_the_fetch_ends_from_the_manager(
    tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 9 * MB)
    damaged, _, _ = _archive(directory, 9 * MB, "damaged")
    keys = security.Keys.generate()
    workers = keys.for_workers()
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(lambda k: damaged, workers) as peer:
        fanout = FanOut()
        fanout.have(key, peer.address)
        with ArchiveServer(_holding(key, path), keys, manager=True, fanout=fanout) as manager:
            fetch(key, len(data), dest, [manager.address], workers, None, timeout=30)
            assert fanout.failed == {"self": 0, "peer": 1}
            assert fanout.finished == {"self": 1, "peer": 0}
            assert fanout.holders[key] == {}
            assert manager.bytes_served == len(data)
        assert peer.bytes_served == len(data)
    assert _read(dest) == data
    assert peer.address in caplog.text and "sha256" in caplog.text


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_peer_that_stopped_answering_is_reported(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 3 * MB)
    peer = ArchiveServer(_holding(key, path))
    peer.close()  # gone: nothing answers at its address
    fanout = FanOut()
    fanout.have(key, peer.address)
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(_holding(key, path), manager=True, fanout=fanout) as manager:
        fetch(key, len(data), dest, [manager.address], None, None, timeout=30, reply_timeout=0.5)
    assert _read(dest) == data
    assert fanout.failed == {"self": 0, "peer": 1}
    assert fanout.holders[key] == {}


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("damaged", [False, True])
def test_a_peer_that_loses_the_archive_midway(tmp_path: os.PathLike[str], damaged: bool) -> None:
    """The fetch goes on from the manager where the peer left off; if the peer's first
    chunk was wrong, the sum at the end says so, and it starts over from the manager."""
    directory = str(tmp_path)
    path, key, data = _archive(directory, 9 * MB)  # three chunks
    other, _, _ = _archive(directory, 9 * MB, "damaged")
    served = [path, path] if not damaged else [other, other]

    def losing(asked: str) -> str | None:  # holds it for ``want`` and the first ``get``
        return served.pop(0) if served else None

    fanout = FanOut()
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(losing) as peer:
        fanout.have(key, peer.address)
        with ArchiveServer(_holding(key, path), manager=True, fanout=fanout) as manager:
            fetch(key, len(data), dest, [manager.address], None, None, timeout=30, window=1)
    assert _read(dest) == data
    assert peer.bytes_served == transfer.CHUNK
    rest = len(data) - transfer.CHUNK
    assert manager.bytes_served == (rest + len(data) if damaged else rest)
    # the sum is wrong at the end of the manager's transfer: that one is reported failed
    assert fanout.failed == {"self": int(damaged), "peer": 1}
    assert fanout.finished == {"self": 1, "peer": 0}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_twenty_nodes_at_once_the_manager_sends_a_few_copies(
    tmp_path: os.PathLike[str],
) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 16 * MB)
    keys = security.Keys.generate()
    workers = keys.for_workers()
    nodes = 20
    dests = [os.path.join(directory, f"node{n}") for n in range(nodes)]
    servers: list[ArchiveServer] = []
    errors: list[BaseException] = []
    fanout = FanOut(wait=0.1)
    with ArchiveServer(_holding(key, path), keys, manager=True, fanout=fanout) as manager:
        try:
            for dest in dests:
                servers.append(ArchiveServer(_holding(key, dest), workers))

            def node(dest: str, server: ArchiveServer) -> None:
                try:
                    fetch(key, len(data), dest, [manager.address], workers, server.address, 90)
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=node, args=pair)
                for pair in zip(dests, servers, strict=True)
            ]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            took = time.monotonic() - started
        finally:
            for server in servers:
                server.close()
    assert not errors, errors
    for dest in dests:
        assert _read(dest) == data
    ratio = manager.bytes_served / len(data)
    peers = sum(server.bytes_served for server in servers) / len(data)
    print(
        f"{nodes} nodes, 16 MB: the manager sent {ratio:.1f} copies, peers {peers:.1f}, "
        f"in {took:.1f} s; finished {fanout.finished}, waits {fanout.waits}"
    )
    assert ratio <= 4
    assert fanout.finished["self"] + fanout.finished["peer"] == nodes
    assert len(fanout.holders[key]) == nodes
    assert fanout.transfers == {}


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_without_keys(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 5 * MB + 17)
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(_holding(key, path), manager=True) as manager:
        fetch(key, len(data), dest, [manager.address], None, None, timeout=30, window=2)
        with pytest.raises(ArchiveMissing, match=manager.address):
            fetch("0" * 64, 10, dest + "2", [manager.address], None, None, timeout=30)
        with pytest.raises(TransferError, match=r"serves 5242897 bytes, not the 5"):
            fetch(key, 5, dest + "3", [manager.address], None, None, timeout=30)
    assert _read(dest) == data
    assert sorted(os.listdir(directory)) == ["archive", "fetched"]


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_client_with_other_keys_or_none_cannot_fetch(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, MB)
    keys = security.Keys.generate()
    strangers = security.Keys.generate().for_workers()
    stranger = strangers._replace(manager_public=keys.manager_public)  # knows the server
    dest = os.path.join(directory, "fetched")
    with ArchiveServer(_holding(key, path), keys, manager=True) as manager:
        for client_keys in (strangers, stranger, None):
            started = time.monotonic()
            with pytest.raises(TransferTimeout, match=manager.address) as raised:
                fetch(key, len(data), dest, [manager.address], client_keys, None, timeout=0.5)
            assert time.monotonic() - started < 3.0
            assert key[:12] in str(raised.value)
            assert isinstance(raised.value, TimeoutError)
        assert manager.bytes_served == 0
    assert sorted(os.listdir(directory)) == ["archive"]


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_garbage_gets_an_error_and_the_server_goes_on(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    path, key, data = _archive(directory, 1000)
    with ArchiveServer(_holding(key, path), manager=True) as manager:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.connect(manager.address)
        try:
            for request in (
                [b""],
                [b"nonsense", b"x"],
                [transfer.GET, key.encode(), b"ten", b"1"],
                [transfer.GET, key.encode(), b"-1", b"1"],
                [transfer.WANT, b"\xff\xfe"],
                [transfer.HAVE, key.encode(), b"not an address"],
                [transfer.DONE, key.encode(), b"x", b"2"],
            ):
                sock.send_multipart(request)
                assert sock.recv_multipart()[0] == transfer.ERROR
            # an oversized request closes its connection unread
            sock.send_multipart([transfer.WANT, b"k" * 10_000])
            sock.close(linger=0)
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.connect(manager.address)
            sock.send_multipart([transfer.GET, key.encode(), b"990", b"100"])
            assert sock.recv_multipart() == [transfer.PART, b"990", data[990:]]
        finally:
            sock.close(linger=0)
            context.term()
