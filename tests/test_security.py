"""Issue 13: with default settings, nothing is trusted on the wire.

A process without the run's keys cannot register, receives no task or function, cannot
make the manager, the caller or a worker unpickle anything, and cannot fetch from a peer
port; a TCP relay between any two of them sees only ciphertext.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import stat
import subprocess
import threading
import time
import uuid

import pytest
import zmq
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from daskvine_py import Manager
from daskvine_py.manager.launch import spawn
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.exits import EXIT_AUTH_FAILED
from sockets import dealer

pytestmark = pytest.mark.integration


def slow_inc(x, seconds=0.05):
    time.sleep(seconds)
    return x + 1


class _Bomb:
    """Unpickled anywhere, it creates ``path``: the proof that someone unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _bomb_frames(path: str) -> list[bytes]:
    """A batch that looks like ours and runs code when unpickled."""
    return [p.MAGIC + pickle.dumps([_Bomb(path)], protocol=5)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Relay:
    """A TCP relay on 127.0.0.1 that forwards to ``target`` and keeps every byte."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.seen = bytearray()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for sock in self.sockets:
            sock.close()


# -- keys and files -------------------------------------------------------------------


def test_the_connection_file_is_private_and_holds_no_manager_secret():
    with Manager() as manager:
        path = manager.connection_file
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        with open(path) as file:
            data = json.load(file)
        assert data["address"] == manager.address and data["security"] is True
        assert "manager_secret_key" not in data
        connection = security.read_connection_file(path)
        assert connection.keys is not None and connection.keys.manager_secret is None
        assert zmq.curve_public(connection.keys.worker_secret) == connection.keys.worker_public
    assert not os.path.exists(path)  # removed with its manager


def test_a_key_file_carries_the_keys_across_a_manager_restart(tmp_path):
    """A worker holding the first manager's connection file joins the restarted one."""
    key_file, connection_file = str(tmp_path / "keys.json"), str(tmp_path / "conn.json")
    port = _free_port()
    with Manager(port=port, key_file=key_file, connection_file=connection_file):
        first = security.read_connection_file(connection_file)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    with Manager(port=port, key_file=key_file) as manager:
        assert security.read_connection_file(manager.connection_file).keys == first.keys
        proc = spawn(None, name="returning", connection_file=connection_file)
        manager._local_processes.append(proc)
        manager.wait_for_workers(1, timeout=30, processes=[proc])
        assert manager.get({"x": 1, "y": (slow_inc, "x", 0)}, "y") == 2


def test_unusable_key_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(security.SecurityError, match="bad.json"):
        Manager(key_file=str(bad))
    keys = security.Keys.generate()._replace(worker_secret=zmq.curve_keypair()[1])
    mismatched = tmp_path / "mismatched.json"
    security.write_key_file(str(mismatched), keys)
    with pytest.raises(security.SecurityError, match="do not match"):
        Manager(key_file=str(mismatched))
    with pytest.raises(ValueError, match="key_file needs security"):
        Manager(security=False, key_file=str(mismatched))


def test_no_secret_on_a_local_workers_command_line():
    with Manager() as manager:
        (proc,) = manager.start_workers(1)
        keys = security.read_connection_file(manager.connection_file).keys
        with open(f"/proc/{proc.pid}/cmdline", "rb") as file:
            argv = file.read()
        assert keys.worker_secret not in argv and keys.worker_public not in argv
        assert keys.manager_public not in argv


# -- what a process without the keys can do -------------------------------------------


def test_without_keys_nothing_registers_nothing_is_received_nothing_is_unpickled(tmp_path, caplog):
    """During a run: a plain socket and a CurveZMQ socket with its own keys both try to
    register and send a batch that runs code when unpickled; neither gets a byte back,
    nothing is unpickled, and the run's results are right."""
    marker = tmp_path / "unpickled"
    dsk = {f"x{i}": (slow_inc, i, 0.02) for i in range(16)}
    keys = list(dsk)
    with Manager() as manager, caplog.at_level(logging.WARNING, "daskvine_py.wire.security"):
        manager.start_workers(1)
        server_key = security.read_connection_file(manager.connection_file).keys.manager_public
        result = {}
        thread = threading.Thread(target=lambda: result.update(v=manager.get(dsk, keys)))
        thread.start()
        context = zmq.Context()
        try:
            plain = dealer(context, manager.address, identity=b"plain")
            forged = dealer(context, manager.address, b"forged", zmq.curve_keypair(), server_key)
            register = p.encode(
                [p.Register(p.PROTOCOL_VERSION, "intruder", 8, 0, "h", "tcp://127.0.0.1:1", 1)]
            )
            for sock in (plain, forged):
                sock.send_multipart(register)
                sock.send_multipart(_bomb_frames(str(marker)))
            assert not plain.poll(1500) and not forged.poll(500)  # no Welcome, no task
        finally:
            context.destroy(linger=0)
        thread.join(60)
        assert result["v"] == tuple(i + 1 for i in range(16))
        assert set(manager.workers) == {"local-0"}
        assert manager._gate.refused >= 1
    assert not marker.exists()
    refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # once, not per attempt


def test_a_worker_without_the_keys_exits_saying_authentication(tmp_path):
    other = str(tmp_path / "other-keys.json")
    security.write_key_file(other, security.Keys.generate())
    with Manager() as manager:
        for extra in ([], ["--key-file", other]):
            proc = spawn(
                manager.address,
                name="keyless",
                extra_args=["--manager-timeout", "20", *extra],
                stderr=subprocess.PIPE,
            )
            try:
                _, err = proc.communicate(timeout=30)
            finally:
                proc.kill()
            assert proc.returncode == EXIT_AUTH_FAILED, err.decode()
            assert "could not authenticate" in err.decode()
        assert not manager.workers


#: A ZMTP 3.0 greeting from a CurveZMQ server: what a keyless worker reads first when the
#: manager's greeting reaches it before the manager drops the connection.
_CURVE_GREETING = (
    b"\xff"
    + b"\x00" * 8
    + b"\x7f"
    + b"\x03\x00"
    + b"CURVE".ljust(20, b"\x00")
    + b"\x01"
    + b"\x00" * 31
)


@pytest.mark.timeout(60)
def test_a_keyless_worker_refused_once_for_its_mechanism_exits_and_never_hangs():
    """One EVENT_HANDSHAKE_FAILED_PROTOCOL is final: libzmq does not reconnect after a
    protocol error, so the worker must not wait for a second failure, nor block sending
    its registration on a connection that is gone. Across hosts (tests/test_multihost.py)
    a keyless worker sees this first, as the manager's greeting arrives before its close."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        proc = spawn(
            f"tcp://127.0.0.1:{port}",
            name="keyless",
            extra_args=["--manager-timeout", "60"],
            stderr=subprocess.PIPE,
        )
        try:
            listener.settimeout(20)
            conn, _ = listener.accept()
            with conn:
                conn.sendall(_CURVE_GREETING)  # and keep the connection open
                _, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_AUTH_FAILED, err.decode()
    assert "could not authenticate" in err.decode()
    assert "no keys" in err.decode()


def test_a_peer_port_serves_only_holders_of_the_keys(tmp_path):
    marker = tmp_path / "unpickled"
    with Manager() as manager:
        manager.start_workers(1)
        keys = security.read_connection_file(manager.connection_file).keys
        assert manager.get({"x": 1, "y": (slow_inc, "x", 0)}, ["y"]) == (2,)
        (worker,) = manager.workers.values()
        context = zmq.Context()
        try:
            plain = dealer(context, worker["peer_address"])
            forged = dealer(
                context,
                worker["peer_address"],
                keys=zmq.curve_keypair(),
                server_key=keys.worker_public,
            )
            for sock in (plain, forged):
                sock.send_multipart(p.encode([p.GetData((1, 2, 3))]))
                sock.send_multipart(_bomb_frames(str(marker)))
            assert not plain.poll(1000) and not forged.poll(500)
            # The same request with the keys is answered: the port itself works.
            holder = dealer(
                context,
                worker["peer_address"],
                keys=(keys.worker_public, keys.worker_secret),
                server_key=keys.worker_public,
            )
            holder.send_multipart(p.encode([p.GetData((1,))]))
            assert holder.poll(5000)
            assert [type(r) for r in p.decode(holder.recv_multipart(), p.FROM_PEER)] == [p.Data]
        finally:
            context.destroy(linger=0)
        assert manager.get({"x": 1, "y": (slow_inc, "x", 0)}, "y") == 2  # still serving
    assert not marker.exists()


# -- what a relay sees ----------------------------------------------------------------


def _through_relays(security_on: bool) -> tuple[list[Relay], bytes, object]:
    """Two workers that reach the manager and each other only through relays; a graph
    whose arguments, closure and results carry a marker. Returns the relays."""
    marker = f"MARKER-{uuid.uuid4().hex}"
    secret = f"closure-{marker}"

    def produce(i, tag):
        return (secret + tag + str(i)).encode() * 200  # ~10 KB: fetched from peers

    def combine(a, b):
        return len(a) + len(b)

    n = 8
    dsk = {f"p{i}": (produce, i, f"arg-{marker}") for i in range(n)}
    dsk.update({f"c{i}": (combine, f"p{i}", f"p{(i + 1) % n}") for i in range(n)})
    dsk["first"] = "p0"
    relays: list[Relay] = []
    with Manager(security=security_on) as manager:
        try:
            to_manager = Relay(p.split_address(manager.address)[1])
            relays.append(to_manager)
            procs = []
            for name in ("a", "b"):
                peer_port = _free_port()
                to_peer = Relay(peer_port)
                relays.append(to_peer)
                args = ["--peer-port", str(peer_port), "--contact-address", to_peer.address]
                procs.append(
                    spawn(
                        to_manager.address,
                        name=name,
                        extra_args=args,
                        connection_file=manager.connection_file,
                    )
                )
            manager._local_processes.extend(procs)
            manager.wait_for_workers(2, timeout=30, processes=procs)
            keys = [f"c{i}" for i in range(n)] + ["first"]
            # Producers pinned, even on a and odd on b: each c_i reads one from each, so
            # both peer ports serve, wherever the scheduler would have put them.
            result = manager.get(_pinned(dsk, n), keys)
            import dask

            assert result == dask.get(dsk, keys)
            moved = manager.last_run.transfers
            assert moved.get(("a", "b"), 0) + moved.get(("b", "a"), 0) >= 2000
        finally:
            manager.close()
            for relay in relays:
                relay.close()
    return relays, marker.encode(), moved


def _pinned(dsk: dict, n: int) -> HighLevelGraph:
    layers = {
        name: MaterializedLayer(
            {f"p{i}": dsk[f"p{i}"] for i in range(parity, n, 2)},
            annotations={"workers": [name]},
        )
        for parity, name in enumerate(("a", "b"))
    }
    layers["readers"] = MaterializedLayer({k: v for k, v in dsk.items() if k[0] != "p"})
    return HighLevelGraph(layers, {"a": set(), "b": set(), "readers": {"a", "b"}})


def test_a_relay_between_any_two_parties_never_sees_the_marker():
    relays, marker, _ = _through_relays(security_on=True)
    to_manager, *to_peers = relays
    assert len(to_manager.seen) > 10_000 and all(len(r.seen) > 2000 for r in to_peers)
    for relay in relays:
        assert marker not in relay.seen


def test_without_security_the_same_relay_reads_everything():
    """The check above can fail: without CurveZMQ the marker crosses in plaintext."""
    relays, marker, _ = _through_relays(security_on=False)
    to_manager, *to_peers = relays
    assert marker in to_manager.seen
    assert any(marker in relay.seen for relay in to_peers)
