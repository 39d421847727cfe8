"""A worker's peer server answers a bounded share of what it is asked, per request and per
loop turn: a request for a million unknown ids gets a bounded answer, costs the worker no
memory that stays, and real graphs run right beside it."""

from __future__ import annotations

import logging
import operator
import time

import dask
import pytest
import zmq

from daskvine_py import Manager
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import serving
from daskvine_py.worker.peers import MAX_REQUEST_BYTES, PeerLinks
from daskvine_py.worker.store import Store
from sockets import dealer


def _unreadable(task_id, exc):
    raise AssertionError(f"result {task_id} could not be read back") from exc


def test_a_request_past_the_bound_keeps_its_first_ids_and_a_full_peer_gets_no_more():
    requests = serving.PeerRequests()
    assert requests.take(b"a", tuple(range(1_000_000))) == 1_000_000 - serving.REQUEST_IDS
    assert list(requests.waiting[b"a"]) == list(range(serving.REQUEST_IDS))
    assert requests.take(b"a", (7, 8)) == 2  # it has as many waiting as it may
    assert requests.take(b"b", (7, 8, 7)) == 0 and requests.take(b"b", (8, 9)) == 0
    assert list(requests.waiting[b"b"]) == [7, 8, 9]  # each answered once


def test_each_turn_answers_a_bounded_share_taking_peers_in_turn(monkeypatch):
    monkeypatch.setattr(serving, "TURN_IDS", 3)
    store = Store()
    store.put(1, dumps("one"))
    requests = serving.PeerRequests()
    requests.take(b"a", (1, 2, 3, 4))
    requests.take(b"b", (1,))
    first = requests.answers(store, None, _unreadable)
    assert [(ident, [d.task_id for d in data]) for ident, data in first] == [(b"a", [1, 2, 3])]
    assert loads(first[0][1][0].value) == "one" and first[0][1][1] == p.Data(2, None)
    second = requests.answers(store, None, _unreadable)  # "a" waited its turn: "b" first
    assert [(ident, [d.task_id for d in data]) for ident, data in second] == [
        (b"b", [1]),
        (b"a", [4]),
    ]
    assert not requests and requests.answers(store, None, _unreadable) == []


def test_large_values_go_in_several_messages_and_past_a_turns_bytes_to_the_next(monkeypatch):
    value = dumps(b"x" * 1000)
    monkeypatch.setattr(serving, "MESSAGE_BYTES", 2 * value.nbytes)
    monkeypatch.setattr(serving, "TURN_BYTES", 3 * value.nbytes)
    store = Store()
    for task_id in range(5):
        store.put(task_id, value)
    requests = serving.PeerRequests()
    requests.take(b"a", tuple(range(5)))
    first = requests.answers(store, None, _unreadable)
    assert [[d.task_id for d in data] for _, data in first] == [[0, 1], [2]]
    second = requests.answers(store, None, _unreadable)
    assert [[d.task_id for d in data] for _, data in second] == [[3, 4]]


@pytest.fixture
def server():
    """A real peer server (``PeerLinks``) holding result 3, and a DEALER to it."""
    context = zmq.Context()
    store = Store()
    store.put(3, dumps("three"))
    links = PeerLinks(
        context,
        zmq.Poller(),
        store,
        p.DropLog(logging.getLogger("daskvine_py.worker")),
        "w",
        "127.0.0.1",
    )
    try:
        yield links, dealer(context, links.address)
    finally:
        links.close()
        context.destroy(linger=0)


def _serve_until_quiet(links: PeerLinks, *socks: zmq.Socket) -> list[list[p.Data]]:
    """Serve while requests arrive; the answers each DEALER got, all its messages' records."""
    answers: list[list[p.Data]] = [[] for _ in socks]
    while links.server.poll(500) or links.requests:
        links.serve()
        for sock, got in zip(socks, answers, strict=True):
            while sock.poll(200):
                got += p.decode(sock.recv_multipart(), p.FROM_PEER)
    return answers


@pytest.mark.timeout(60)
def test_a_flooding_peer_gets_a_bounded_answer_and_one_warning_and_others_theirs(server, caplog):
    links, flooder = server
    honest = dealer(flooder.context, links.address)
    flood = p.encode([p.GetData(tuple(range(100, 1_000_100)))])
    with caplog.at_level(logging.WARNING, logger="daskvine_py.worker"):
        for _ in range(3):  # the first fills what it may have waiting: the others are dropped
            flooder.send_multipart(flood)
        honest.send_multipart(p.encode([p.GetData((3,))]))
        flooded, answered = _serve_until_quiet(links, flooder, honest)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "dropped 995904 of the 1000000 ids a peer at 127.0.0.1 asked for" in warnings[0]
    assert [d.task_id for d in flooded] == list(range(100, 100 + serving.REQUEST_IDS))
    assert all(d.value is None for d in flooded)
    (three,) = answered
    assert three.task_id == 3 and loads(three.value) == "three"
    flooder.send_multipart(flood)  # answered: it may ask again
    (flooded,) = _serve_until_quiet(links, flooder)
    assert len(flooded) == serving.REQUEST_IDS


@pytest.mark.timeout(60)
def test_a_request_past_the_size_bound_is_refused_unread(server):
    links, sock = server
    sock.send_multipart([p.MAGIC + b"x" * (MAX_REQUEST_BYTES + 1)])
    assert _serve_until_quiet(links, sock) == [[]] and not links.requests
    again = dealer(sock.context, links.address)  # that connection was closed: a new one
    again.send_multipart(p.encode([p.GetData((3,))]))
    ((three,),) = _serve_until_quiet(links, again)
    assert loads(three.value) == "three"


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _graph(seed: int) -> tuple[dict, list]:
    """Chains across partitions, so that workers fetch inputs from each other."""
    graph: dict = {}
    for i in range(20):
        graph[("a", seed, i)] = (operator.add, seed, i)
        graph[("b", seed, i)] = (operator.mul, ("a", seed, i), ("a", seed, (i + 1) % 20))
    graph[("total", seed)] = (sum, [("b", seed, i) for i in range(20)])
    return graph, [("total", seed)]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_million_unknown_ids_get_a_bounded_answer_beside_real_graphs():
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        graph, keys = _graph(0)
        assert manager.get(graph, keys) == dask.get(graph, keys)  # warmed up
        connection = security.read_connection_file(manager.connection_file)
        assert connection.keys is not None
        worker_keys = (connection.keys.worker_public, connection.keys.worker_secret)
        workers = list(manager.workers.values())
        before = {info["pid"]: _rss(info["pid"]) for info in workers}
        context = zmq.Context()
        try:
            socks = [
                dealer(context, info["peer_address"], None, worker_keys, worker_keys[0])
                for info in workers
            ]
            flood = p.encode([p.GetData(tuple(range(10**9, 10**9 + 1_000_000)))])
            for round_ in range(1, 6):
                for sock in socks:
                    sock.send_multipart(flood)
                graph, keys = _graph(round_)
                assert manager.get(graph, keys) == dask.get(graph, keys)
                for sock in socks:
                    answers = _answers(sock, serving.REQUEST_IDS)
                    assert len(answers) == serving.REQUEST_IDS
                    assert all(a.value is None for a in answers)
                    assert [a.task_id for a in answers] == list(
                        range(10**9, 10**9 + serving.REQUEST_IDS)
                    )
            for sock in socks:  # nothing more comes: the rest of each request was dropped
                assert not sock.poll(500)
        finally:
            context.destroy(linger=0)
        graph, keys = _graph(99)
        assert manager.get(graph, keys) == dask.get(graph, keys)
        for pid, rss in before.items():
            assert _rss(pid) - rss < 100 * 1024 * 1024, (pid, rss, _rss(pid))


def _answers(sock: zmq.Socket, n: int) -> list[p.Data]:
    """The next ``n`` answers on ``sock``, over however many messages they come in."""
    answers: list[p.Data] = []
    deadline = time.monotonic() + 60
    while len(answers) < n:
        assert sock.poll(max(1, int((deadline - time.monotonic()) * 1000))), len(answers)
        answers += p.decode(sock.recv_multipart(), p.FROM_PEER)
    return answers
