"""Limits a swarm reaches (issue 28, "the manager made to hold it"), each met for real:

- a worker connected to a manager too busy to answer its registration in time waits on
  (warned once) and joins when the answer comes; one that cannot connect at all still
  gives up after ``--manager-timeout``, saying so; one whose registration was lost with
  its connection sends it again on the next;
- a manager whose open files run short refuses the workers past what it can hold, with a
  reason naming the limit, and computes right with the others; one whose files were used
  up otherwise says once that it cannot accept connections;
- a worker holds at most ``peers.MAX_PEER_LINKS`` sockets to peers however many it
  fetches from, and every fetch completes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
import zmq

from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.transport import send_batch
from test_command_lines import _env, _worker

pytestmark = pytest.mark.integration


def _receive(router: zmq.Socket, kind: type) -> tuple[bytes, object]:
    """The next record of ``kind`` the ROUTER receives, and who sent it."""
    while True:
        assert router.poll(60_000), f"no {kind.__name__} came"
        ident, *frames = router.recv_multipart()
        for message in p.unpack(frames, p.TO_MANAGER):
            if type(message) is kind:
                return ident, message


# -- 1. registration: a busy manager is not a dead one ---------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_a_connected_worker_waits_past_its_timeout_for_a_late_welcome(tmp_path, secure):
    """The test holds the manager's ROUTER (with keys, a CurveZMQ server behind a gate)
    and answers the registration only once the worker has said that it waits on."""
    context = zmq.Context()
    gate = None
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    args = ["--manager-timeout", "2", "--cores", "1"]
    if secure:
        keys = security.Keys.generate()
        gate = security.Gate(context, keys.worker_public, "test manager")
        gate.start()
        assert keys.manager_secret is not None
        security.serve(router, keys.manager_public, keys.manager_secret)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    if secure:
        path = str(tmp_path / "connection.json")
        security.write_connection_file(path, address, keys)
        args += ["--connection-file", path]
    else:
        args.insert(0, address)
    worker = _worker(tmp_path, *args)
    try:
        ident, register = _receive(router, p.Register)
        worker.wait_for("the connection is up, so the manager is busy: it waits on")
        assert worker.proc.poll() is None
        send_batch(router, p.encode([p.Welcome(register.name, 0.1)]), ident)
        worker.wait_for("worker joined")
        _receive(router, p.Status)  # its heartbeats: it serves this manager now
        assert worker.proc.poll() is None, worker.log
        send_batch(router, p.encode([p.Shutdown("the test is over")]), ident)
        assert worker.proc.wait(60) == 0, worker.log
        log = worker.log
        assert log.count("WARNING") == 1 and "Traceback" not in log, log
    finally:
        worker.stop()
        router.close()
        if gate is not None:
            gate.stop()
        context.term()


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_connect_gives_up_after_its_timeout_saying_so(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = _worker(tmp_path, f"tcp://127.0.0.1:{port}", "--manager-timeout", "0.5")
    try:
        assert worker.proc.wait(60) == 3, worker.log
        log = worker.log
        assert "the manager has not answered its registration, sent" in log, log
        assert "no connection to it is up; is a manager listening there?" in log, log
        assert "waits on" not in log and "Traceback" not in log, log
    finally:
        worker.stop()


@pytest.mark.timeout(120)
def test_a_registration_lost_with_its_connection_is_sent_again_on_the_next(tmp_path):
    """The manager that took the registration is gone before it answered, and another
    listens at the address: the worker registers with it when it reconnects."""
    context = zmq.Context()
    first = context.socket(zmq.ROUTER)
    first.setsockopt(zmq.LINGER, 0)
    port = first.bind_to_random_port("tcp://127.0.0.1")
    worker = _worker(tmp_path, f"tcp://127.0.0.1:{port}", "--manager-timeout", "5")
    second = None
    try:
        _receive(first, p.Register)
        first.close()
        second = context.socket(zmq.ROUTER)
        second.setsockopt(zmq.LINGER, 0)
        while True:  # the first one's listener closes in libzmq's own time
            try:
                second.bind(f"tcp://127.0.0.1:{port}")
                break
            except zmq.ZMQError:
                time.sleep(0.05)
        ident, register = _receive(second, p.Register)
        send_batch(second, p.encode([p.Welcome(register.name, 0.1)]), ident)
        worker.wait_for("worker joined")
        send_batch(second, p.encode([p.Shutdown("the test is over")]), ident)
        assert worker.proc.wait(60) == 0, worker.log
    finally:
        worker.stop()
        if second is not None:
            second.close()
        context.term()


# -- 2. open files: refused with a reason past the limit -----------------------------------

_LIMITED_MANAGER = """
import json, operator, sys, time
from dask.local import get_sync
from daskvine_py import Manager
from daskvine_py.wire.exits import EXIT_REJECTED

with Manager(host="127.0.0.1", port=0) as manager:
    capacity = manager._io.registry.open_files.capacity
    assert capacity >= 1, capacity
    procs = manager.start_workers(capacity + 2, cores=1, wait=False)
    deadline = time.monotonic() + 100
    while sum(proc.poll() == EXIT_REJECTED for proc in procs) < 2:
        assert time.monotonic() < deadline, [proc.poll() for proc in procs]
        time.sleep(0.1)
    manager.wait_for_workers(capacity, timeout=100)
    dsk = {f"x{i}": (operator.add, i, 1) for i in range(40)}
    dsk["total"] = (sum, [f"x{i}" for i in range(40)])
    got = manager.get(dsk, "total")
    print(json.dumps({"capacity": capacity, "workers": len(manager.workers),
                      "exits": [proc.poll() for proc in procs],
                      "right": got == get_sync(dsk, "total")}), flush=True)
"""


#: The open files a limited manager may have: its own, its reserve, and a few workers.
FEW_FILES = 94


def _run_with_few_files(tmp_path, script_text: str, timeout: float) -> subprocess.CompletedProcess:
    """``script_text`` run as a manager's script whose soft and hard limits of open files
    are both ``FEW_FILES``."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FEW_FILES, FEW_FILES))

    script = tmp_path / "manager.py"
    script.write_text(script_text)
    return subprocess.run(
        [sys.executable, str(script)],
        env=_env(),
        preexec_fn=low_limit,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(300)
def test_a_manager_out_of_open_files_refuses_the_extra_workers_saying_why(tmp_path):
    """The manager's soft and hard limits are both low, so it cannot raise them: the
    workers past what they allow are refused with the limit named, the others compute."""
    done = _run_with_few_files(tmp_path, _LIMITED_MANAGER, timeout=280)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["right"] and report["workers"] == report["capacity"], report
    exits = report["exits"]  # two refused (EXIT_REJECTED), the others still running
    assert exits.count(2) == 2 and exits.count(None) == report["capacity"], report
    said = f"its limit of open files (RLIMIT_NOFILE {FEW_FILES}, hard limit {FEW_FILES})"
    log = done.stderr
    assert log.count("refused worker") == 1 and said in log, log  # one warning
    assert log.count("the manager rejected it: the manager cannot take more workers") == 2
    assert "ulimit -n" in log and "Too many open files" not in log, log


_EXHAUSTED_MANAGER = """
import subprocess, sys, time
from daskvine_py import Manager

CLIENT = (
    "import sys, time, zmq\\n"
    "time.sleep(1.0)\\n"  # until the manager has used up its files
    "context = zmq.Context()\\n"
    "dealer = context.socket(zmq.DEALER)\\n"
    "dealer.connect(sys.argv[1])\\n"
    "time.sleep(2.0)\\n"
    "dealer.close(0)\\n"
    "context.term()\\n"
)
with Manager(host="127.0.0.1", port=0, security=False) as manager:
    client = subprocess.Popen([sys.executable, "-c", CLIENT, manager.address])
    held = []
    try:
        while True:
            held.append(open(sys.executable, "rb"))
    except OSError:
        pass
    client.wait()
    for f in held:
        f.close()
    print("held", len(held), flush=True)
"""


@pytest.mark.timeout(120)
def test_a_manager_whose_files_ran_out_otherwise_says_so_once(tmp_path):
    """Files opened behind the registry's back use up the limit: a connection that
    libzmq cannot accept is said once, with the limit, never as a bare error."""
    done = _run_with_few_files(tmp_path, _EXHAUSTED_MANAGER, timeout=100)
    assert done.returncode == 0 and done.stdout.startswith("held"), done.stderr
    log = done.stderr
    said = "the manager cannot accept more connections: it is out of open files"
    assert log.count(said) == 1 and "RLIMIT_NOFILE 94, hard limit 94" in log, log
    assert "ulimit -n" in log and "Traceback" not in log, log


# -- 3. a bounded number of sockets to peers --------------------------------------------


@pytest.mark.timeout(120)
def test_a_worker_holds_at_most_its_bound_of_peer_sockets_and_every_fetch_completes():
    """Six real peer servers, thirty results, a bound of two sockets: a new peer takes the
    place of an idle one, and a fetch whose peer finds both busy waits its turn."""
    import logging

    from daskvine_py.wire.serialize import dumps, loads
    from daskvine_py.worker.fetching import MAX_PEER_LINKS
    from daskvine_py.worker.messages import AskPeer, ClosePeer
    from daskvine_py.worker.peers import PeerLinks
    from daskvine_py.worker.state import WorkerState
    from daskvine_py.worker.store import Store

    assert MAX_PEER_LINKS < 100  # the default: a few dozen, never one per peer of a swarm
    bound = 2
    context = zmq.Context()
    poller = zmq.Poller()
    drops = p.DropLog(logging.getLogger("daskvine_py.tests"))
    holders: dict[zmq.Socket, PeerLinks] = {}
    stores = [Store(None) for _ in range(7)]
    links: list[PeerLinks] = []
    try:
        wanted = {}
        for k, store in enumerate(stores[1:]):
            peer = PeerLinks(context, poller, store, drops, f"peer-{k}", "127.0.0.1")
            links.append(peer)
            holders[peer.server] = peer
            for j in range(5):
                task_id = 100 * k + j
                store.put(task_id, dumps(("result", k, j)))
                wanted[task_id] = peer.address
        mine = stores[0]
        state = WorkerState(mine, "fetcher", now=time.monotonic(), peer_links=bound)
        me = PeerLinks(context, poller, mine, drops, "fetcher", "127.0.0.1")
        links.append(me)
        events: list = [p.Replicate(task_id, (address,)) for task_id, address in wanted.items()]
        most = 0
        copied: set[int] = set()
        while True:  # a shell of one worker: events in, its instructions carried out
            batch, events = events, []
            for instruction in state.handle(batch, time.monotonic()):
                if type(instruction) is AskPeer:
                    me.ask(instruction, events)
                elif type(instruction) is ClosePeer:  # (before any new one opens)
                    me.reset(instruction.address)
                elif type(instruction) is p.Replicas:
                    copied.update(instruction.task_ids)
            most = max(most, len(me.clients))
            if all(task_id in mine for task_id in wanted):
                break
            for sock, _ in poller.poll(10_000):
                if sock in holders:
                    holders[sock].serve()
                elif sock is not me.server:
                    me.drain(sock, events)
        assert most == bound, most
        for task_id in wanted:
            value = mine.get(task_id)
            assert value is not None and loads(value) == ("result", task_id // 100, task_id % 100)
        assert copied == set(wanted)
        assert not list(state.fetcher.leaks())
    finally:
        for peer in links:
            peer.close()
        for store in stores:
            store.close()
        context.term()
