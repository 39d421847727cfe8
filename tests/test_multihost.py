"""Issue 13: a manager and two workers on three hosts of a private network, for real.

The hosts are network namespaces joined by a bridge (``netns.Hosts``), each with its own
address in 10.231.47.0/24, its own hostname and no route anywhere else; the manager runs
on one (``multihost_driver.py``), a worker on each of two others. Results cross between
the worker hosts peer to peer, the bytes the manager counts are checked against what the
bridge's ports saw, and workers on a fourth host without the run's keys are refused.
Needs root: it skips elsewhere, and fails instead of skipping when
``DASKVINE_PY_REQUIRE_NETNS=1`` (CI).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import daskvine_py
import netns
from daskvine_py.wire import security
from daskvine_py.wire.exits import EXIT_AUTH_FAILED
from daskvine_py.wire.protocol import split_address

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("multihost_driver.py")
WORKERS = ("alpha", "beta")


@pytest.fixture
def hosts():
    """Four hosts: the manager, two workers, and one more for a worker that is refused."""
    network = netns.Hosts(["manager", *WORKERS, "intruder"])
    try:
        network.create()
    except netns.Unavailable as exc:
        _cannot(str(exc))
    try:
        yield network
    finally:
        network.close()
    assert not network.leftovers(), network.leftovers()


def _cannot(reason: str) -> None:
    if os.environ.get("DASKVINE_PY_REQUIRE_NETNS") == "1":
        pytest.fail(f"network namespaces are required here: {reason}")
    pytest.skip(reason)


def _env() -> dict[str, str]:
    """Our own ``sys.path``, so every host imports this checkout's daskvine_py; no
    connection file from our environment, so a worker has only the keys it is given."""
    paths = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    env.pop(security.CONNECTION_FILE_ENV, None)
    return env


class Lines:
    """JSON lines from a process's stdout, read by a thread so waiting can time out."""

    def __init__(self, proc: subprocess.Popen, stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr
        self._lines: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, event: str, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(
                f"the driver said nothing ({event!r} expected; exit code "
                f"{self.proc.poll()}); its stderr:\n{self.stderr.read_text()[-4000:]}"
            )
        record = json.loads(line)
        assert record["event"] == event, record
        return record


def _start_worker(hosts: netns.Hosts, host: str, name: str, join: list[str], logs: Path):
    """``python -m daskvine_py.worker`` on ``host``, joining with ``join`` (an address, or
    a connection file); its stderr goes to ``logs/<name>.log``."""
    with (logs / f"{name}.log").open("w") as log:
        return hosts.popen(
            host,
            [
                sys.executable,
                "-m",
                "daskvine_py.worker",
                *join,
                "--cores",
                "1",
                "--name",
                name,
                "--workdir",
                str(logs / name),
                "--manager-timeout",
                "20",
            ],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def _intruders(hosts: netns.Hosts, address: str, connection_file: Path, logs: Path) -> dict:
    """Workers on the fourth host that must be refused: one without keys, one with a
    stale connection file (every key another manager's), one that knows the manager's
    public key but holds a worker key pair of its own."""
    real = security.read_connection_file(str(connection_file))
    assert real.keys is not None
    stale, own = logs / "keys" / "stale.json", logs / "keys" / "own.json"
    security.write_connection_file(str(stale), address, security.Keys.generate())
    mine = security.Keys.generate()
    own_keys = security.Keys(real.keys.manager_public, mine.worker_public, mine.worker_secret)
    security.write_connection_file(str(own), address, own_keys)
    joins = {
        "keyless": [address],
        "stale-keys": ["--connection-file", str(stale)],
        "own-keys": ["--connection-file", str(own)],
    }
    return {
        name: _start_worker(hosts, "intruder", name, join, logs) for name, join in joins.items()
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize("secure", [True, False], ids=["curve", "plain"])
def test_workers_on_two_hosts_fetch_each_others_results_directly(hosts, tmp_path, secure):
    """Secure (the default): workers join with the connection file and three workers
    without the run's keys are refused. Plain (``security=False``): workers join with
    the manager's address alone."""
    manager_ip = hosts.addresses["manager"]
    connection_file = tmp_path / "keys" / "manager.json"
    driver_log = tmp_path / "driver.log"
    with driver_log.open("w") as log:
        driver = hosts.popen(
            "manager",
            [
                sys.executable,
                str(DRIVER),
                "--host",
                manager_ip,
                "--connection-file",
                str(connection_file),
                *([] if secure else ["--insecure"]),
            ],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    lines = Lines(driver, driver_log)
    listening = lines.next("listening", timeout=30)
    address = listening["address"]
    assert address.startswith(f"tcp://{manager_ip}:")
    assert listening["hostname"] == "manager"
    assert listening["package"] == daskvine_py.__file__  # this checkout, on every host
    assert listening["connection_file"] == str(connection_file)
    assert security.read_connection_file(str(connection_file)).address == address

    join = ["--connection-file", str(connection_file)] if secure else [address]
    workers = [_start_worker(hosts, host, host, join, tmp_path) for host in WORKERS]
    intruders = _intruders(hosts, address, connection_file, tmp_path) if secure else {}
    ran = lines.next("ran", timeout=45)

    # The graph's results are Dask's.
    assert ran["results"] == ran["expected"]

    # Each worker joined from its own host and advertises its own host's address, which
    # the other reaches (the fetches below went to it; here a TCP connection says so).
    assert set(ran["workers"]) == set(WORKERS)
    for host, other in zip(WORKERS, reversed(WORKERS), strict=True):
        info = ran["workers"][host]
        assert info["hostname"] == host
        assert info["peer_address"].startswith(f"tcp://{hosts.addresses[host]}:"), info
        ip, port = split_address(info["peer_address"])
        reach = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=5).close()"
        assert hosts.run(other, [sys.executable, "-c", reach], timeout=20).returncode == 0

    # Results moved between the worker hosts, peer to peer, in at least one direction
    # at least one producer's array; only small values went through the manager. Every
    # peer address was known by its worker's name.
    transfers = {(src, dst): n for src, dst, n in ran["transfers"]}
    between = {pair: n for pair, n in transfers.items() if set(pair) == set(WORKERS)}
    assert max(between.values(), default=0) >= ran["producer_bytes"], transfers
    assert {name for pair in transfers for name in pair} <= {"manager", *WORKERS}, transfers
    assert ran["received_bytes"] < ran["producer_bytes"]

    # Without the run's keys, a worker is refused during the handshake and says so.
    for name, proc in intruders.items():
        code = proc.wait(timeout=30)
        log = (tmp_path / f"{name}.log").read_text()
        assert code == EXIT_AUTH_FAILED, (name, code, log)
        assert "could not authenticate" in log, (name, log)

    driver.stdin.write("done\n")
    driver.stdin.flush()
    closing = lines.next("closing", timeout=30)
    assert closing["joined"] == sorted(WORKERS)  # no intruder ever registered
    assert driver.wait(timeout=30) == 0
    for proc in workers:
        assert proc.wait(timeout=30) == 0
    # A manager without security on an address other hosts reach says what that exposes.
    assert ("without security" in driver_log.read_text()) is not secure

    # The bridge's ports agree. What the other hosts sent and the manager's host did not
    # receive went between them (the intruders sent to the manager only): at least what
    # the manager counted (payloads, without the TCP, ZeroMQ and CurveZMQ framing).
    counters = hosts.counters()
    sent = sum(counters[host]["sent"] for host in hosts.hosts if host != "manager")
    crossed = sent - counters["manager"]["received"]
    counted = sum(between.values())
    assert counted <= crossed < 2 * counted + 256 * 1024, (counters, transfers)
    # Results never went through the manager's host.
    assert counters["manager"]["received"] < ran["producer_bytes"], counters
    print(f"between worker hosts: the manager counted {counted} bytes, the bridge saw {crossed}")
