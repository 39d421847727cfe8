"""The input cache's faults and credentials (``daskvine_py.inputs``), against a real XRootD.

Each test starts Debian's ``xrootd`` on 127.0.0.1 (``tests/xrootd.py``) and breaks it for
real: the server is killed (SIGKILL) while a file is being fetched, restarted on the same
port, or the served file is removed or truncated on its disk while a task reads it. The
GSI tests make a throwaway CA, host and user certificates and a proxy (``openssl``,
``xrdgsiproxy``) and serve with ``sec.protbind * only gsi``; their clients run in
processes of their own (the XRootD client reads its X.509 variables once per process),
as a worker's libraries do.

Skipped without xrootd or the XRootD bindings, except under
``DASKVINE_PY_REQUIRE_XROOTD=1`` (CI), where they must run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest

import daskvine_py
import xrootd
from daskvine_py import inputs
from daskvine_py.inputs import remote
from xrootd import GSI, XRootDServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REQUIRED = os.environ.get("DASKVINE_PY_REQUIRE_XROOTD") == "1"
SRC = str(Path(daskvine_py.__file__).resolve().parents[1])
_why = xrootd.unavailable()
if _why is None:
    try:
        import XRootD.client  # noqa: F401
    except ImportError:
        _why = "the XRootD Python bindings are not installed (pip install xrootd)"
if _why is not None:
    if REQUIRED:
        raise RuntimeError(f"the input cache's XRootD faults cannot be tested here: {_why}")
    pytestmark.append(pytest.mark.skip(reason=_why))

#: the large file's size: 64 reads of ``CHUNK`` (1 MiB here)
BIG = 64 * 2**20
CHUNK = 2**20


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache, short retries, small reads, a worker's name, this process's state new."""
    root = tmp_path / "cache"
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(root))
    monkeypatch.delenv("DASKVINE_PY_INPUT_CACHE_BYTES", raising=False)
    monkeypatch.setenv("DASKVINE_PY_WORKER_NAME", "worker-7")
    monkeypatch.setattr(inputs, "RETRY_DELAYS", (0.05, 0.1, 0.2))
    monkeypatch.setattr(inputs, "TIMEOUT", 5.0)
    monkeypatch.setattr(inputs, "_caches", {})
    monkeypatch.setattr(remote, "CHUNK", CHUNK)
    yield root
    inputs.release()


@pytest.fixture
def server() -> Iterator[XRootDServer]:
    """A server of this test's own (the tests kill it), its directory writable by the test."""
    with XRootDServer() as started:
        started.directory.chmod(0o777)
        yield started
        pid = started.pid
    assert pid is None or not _running(pid), f"xrootd (pid {pid}) is still running"


@pytest.fixture(scope="module")
def big_data() -> bytes:
    return os.urandom(BIG)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _serve(server: XRootDServer, name: str, data: bytes) -> tuple[Path, str]:
    path = server.directory / name
    path.write_bytes(data)
    path.chmod(0o644)
    return path, server.url(path)


def _left_in(root: Path) -> list[str]:
    """Everything under the cache's entries (complete or partial), as relative paths."""
    entries = root / "entries"
    return sorted(str(path.relative_to(entries)) for path in entries.rglob("*"))


def _on_first_piece(monkeypatch: pytest.MonkeyPatch, action) -> list[int]:
    """Call ``action()`` once the fetch has received its first piece, while the rest of
    the file is still to come (the counters' hook is called for each piece); the bytes
    received by then, in a list."""
    seen: list[int] = []
    add = inputs._add

    def hooked(name: str, amount: int) -> None:
        add(name, amount)
        if name == "bytes_from_storage" and not seen:
            seen.append(amount)
            action()

    monkeypatch.setattr(inputs, "_add", hooked)
    return seen


# -- the server goes away, or comes back --------------------------------------------------


def test_server_killed_mid_fetch_is_unavailable_quickly_and_nothing_is_cached(
    cache_dir, server, big_data, monkeypatch
):
    _, url = _serve(server, "big.root", big_data)
    pid = server.pid
    assert pid is not None
    seen = _on_first_piece(monkeypatch, lambda: os.kill(pid, signal.SIGKILL))
    started = time.monotonic()
    with pytest.raises(inputs.InputUnavailable) as caught:
        inputs.local_path(url)
    elapsed = time.monotonic() - started
    assert seen == [CHUNK]  # killed with 63 MiB still to come
    error = caught.value
    assert error.url == url and error.worker == "worker-7"
    assert url in str(error) and "worker-7" in str(error)
    assert "4 attempts failed" in str(error)
    # the retries' delays (0.35 s) and four failures of a dead server, each in well
    # under a second: neither the requests' TIMEOUT nor the client's own retries
    assert elapsed < 3.0, elapsed
    assert _left_in(cache_dir) == []  # no entry, no .part


def test_server_back_within_the_retries_serves_the_file_byte_exact(
    cache_dir, server, big_data, monkeypatch, caplog
):
    _, url = _serve(server, "big.root", big_data)
    port = server.port
    seen = _on_first_piece(monkeypatch, lambda: server.stop(kill=True))
    sleep = time.sleep
    restarts: list[int | None] = []

    def restart_while_waiting(seconds: float) -> None:  # the wait before the first retry
        if not restarts:
            server.start()  # the same port
            restarts.append(server.port)
        sleep(seconds)

    # inputs' own view of the time module: the process's stays as it is
    clock = types.SimpleNamespace(sleep=restart_while_waiting, monotonic=time.monotonic)
    monkeypatch.setattr(inputs, "time", clock)
    before = inputs.counters()
    with caplog.at_level(logging.WARNING, logger="daskvine_py.inputs"):
        path = inputs.local_path(url)
    assert seen == [CHUNK] and restarts == [port]
    assert Path(path).read_bytes() == big_data
    assert "again in" in caplog.text  # the first attempt failed
    after = inputs.counters()
    assert after["files_fetched"] - before["files_fetched"] == 1
    assert [name for name in _left_in(cache_dir) if name.endswith(".part")] == []


# -- the file goes away ---------------------------------------------------------------------


def test_a_file_removed_on_the_server_between_runs_is_file_not_found(cache_dir, server):
    served, url = _serve(server, "gone.root", b"x" * 1000)
    assert Path(inputs.local_path(url)).read_bytes() == b"x" * 1000
    served.unlink()
    started = time.monotonic()
    with pytest.raises(FileNotFoundError) as caught:
        inputs.local_path(url)  # a cached copy is not served: the server says it is gone
    assert caught.value.filename == url and url in str(caught.value)
    assert time.monotonic() - started < 1.0  # at once, no retries


def test_a_file_removed_between_stat_and_open_is_file_not_found(cache_dir, server, monkeypatch):
    served, url = _serve(server, "gone.root", b"y" * 1000)
    identify = remote.identify

    def stat_then_remove(*args, **kwargs):
        identity = identify(*args, **kwargs)
        served.unlink()
        return identity

    monkeypatch.setattr(remote, "identify", stat_then_remove)
    with pytest.raises(FileNotFoundError) as caught:
        inputs.local_path(url)
    assert caught.value.filename == url and url in str(caught.value)
    assert _left_in(cache_dir) == []


def test_a_file_truncated_mid_fetch_is_never_cached_and_the_retry_gets_the_new_copy(
    cache_dir, server, big_data, monkeypatch, caplog
):
    served, url = _serve(server, "big.root", big_data)
    short = big_data[: 3 * CHUNK + 5]

    def truncate() -> None:  # in place: the server's open file shrinks under its reads
        with open(served, "r+b") as file:
            file.truncate(len(short))
        os.utime(served, (time.time() + 60, time.time() + 60))

    seen = _on_first_piece(monkeypatch, truncate)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.inputs"):
        path = inputs.local_path(url)
    assert seen == [CHUNK]
    assert "bytes arrived, the server reported" in caplog.text  # the short copy refused
    assert Path(path).read_bytes() == short  # the copy the server has now, whole
    complete = [name for name in _left_in(cache_dir) if name.endswith("/.complete")]
    assert len(complete) == 1  # nothing of the truncated transfer, nothing of the old copy
    assert [name for name in _left_in(cache_dir) if name.endswith(".part")] == []


# -- through a Manager and its workers --------------------------------------------------------


def _read_root(url: str) -> str:
    """A task: the input's sha256, read through the node's cache."""
    from daskvine_py import inputs

    with inputs.open(url) as file:
        return hashlib.sha256(file.read()).hexdigest()


def _read_with_uproot(url: str) -> int:
    """A task: uproot opens a root:// URL (``cache_inputs=True``: through the cache)."""
    import uproot

    with uproot.open(url) as file:
        return len(file.keys())


def test_end_to_end_a_vanished_file_fails_its_task_naming_the_url(tmp_path, server, monkeypatch):
    from daskvine_py import Manager

    uproot = pytest.importorskip("uproot")
    del uproot
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "inputs"))
    served, url = _serve(server, "vanished.root", b"not read")
    served.unlink()
    dead = f"root://127.0.0.1:{_free_port()}//data/nano.root"  # nothing listens there
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        with pytest.raises(FileNotFoundError) as caught:
            dask.compute(
                dask.delayed(_read_with_uproot)(url), scheduler=manager.get, cache_inputs=True
            )
        assert url in str(caught.value)
        with pytest.raises(inputs.InputUnavailable) as unavailable:
            dask.compute(dask.delayed(_read_root)(dead), scheduler=manager.get, cache_inputs=True)
    error = unavailable.value
    assert error.url == dead and error.worker and f"on worker {error.worker}" in str(error)
    assert error.worker != "worker-7"  # the worker's own name, not this process's


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- X.509 (GSI) --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsi_server() -> Iterator[tuple[GSI, XRootDServer]]:
    """A server that accepts GSI clients only, with the CA, certificates and proxy."""
    why = xrootd.gsi_unavailable()
    if why is not None:
        if REQUIRED:
            raise RuntimeError(f"a GSI XRootD server cannot be made here: {why}")
        pytest.skip(why)
    with GSI() as gsi, XRootDServer(gsi=gsi) as started:
        started.directory.chmod(0o777)
        yield gsi, started


_CHILD = textwrap.dedent(
    """
    import hashlib, json, sys, time
    from daskvine_py import inputs
    inputs.RETRY_DELAYS = (0.05, 0.1, 0.2)
    inputs.TIMEOUT = 5.0
    started = time.monotonic()
    try:
        path = inputs.local_path(sys.argv[1])
    except Exception as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    else:
        out = {"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out))
    """
)


def _child(url: str, env: dict[str, str], cache: Path) -> dict:
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("X509_", "XrdSec"))
    }
    environ.update(env, PYTHONPATH=SRC, DASKVINE_PY_INPUT_CACHE=str(cache))
    environ["DASKVINE_PY_WORKER_NAME"] = "worker-9"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_gsi_a_proxy_reads_and_none_is_refused_at_once(gsi_server, tmp_path):
    gsi, started = gsi_server
    data = os.urandom(300_000)
    _, url = _serve(started, "secret.root", data)
    expected = hashlib.sha256(data).hexdigest()

    got = _child(url, gsi.client_env(), tmp_path / "with")
    assert got.get("sha256") == expected, got

    nowhere = {**gsi.client_env(proxy=False), "X509_USER_PROXY": str(tmp_path / "no-proxy")}
    refused = _child(url, nowhere, tmp_path / "without")
    assert refused["error"] == "PermissionError", refused
    assert url in refused["message"] and "X509_USER_PROXY" in refused["message"]
    assert refused["seconds"] < 5.0, refused  # neither a hang nor the retries
    assert not list((tmp_path / "without" / "entries").iterdir())


def test_gsi_end_to_end_the_proxy_travels_with_the_run(gsi_server, tmp_path, monkeypatch):
    from daskvine_py import Manager

    gsi, started = gsi_server
    data = os.urandom(200_000)
    _, url = _serve(started, "analysis.root", data)
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "inputs"))
    for name in ("X509_USER_PROXY", "X509_CERT_DIR", xrootd.SERVER_NAMES):
        monkeypatch.delenv(name, raising=False)  # the run's options carry them, nothing else
    proxy = tmp_path / "x509up_u1000"
    shutil.copyfile(gsi.proxy, proxy)
    env = gsi.client_env(proxy=False)  # the CAs and the server's name: plain variables
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        (digest,) = dask.compute(
            dask.delayed(_read_root)(url),
            scheduler=manager.get,
            cache_inputs=True,
            env_files={"X509_USER_PROXY": str(proxy)},
            env_vars=env,
        )
        # (while the worker lives: cache_inputs=True's files go with it)
        cached = [
            p.read_bytes() for p in (tmp_path / "inputs").rglob("analysis.root") if p.is_file()
        ]
    assert digest == hashlib.sha256(data).hexdigest()
    assert cached == [data]


def test_gsi_a_proxy_shipped_after_a_run_without_one(gsi_server, tmp_path, monkeypatch):
    """The XRootD client reads the X.509 variables once per process: a library that
    authenticated without a proxy would be refused for its life. A run that ships files
    (``env_files``) other than those the libraries started with has them replaced."""
    from daskvine_py import Manager

    gsi, started = gsi_server
    _, url = _serve(started, "later.root", b"later" * 100)
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "inputs"))
    for name in ("X509_USER_PROXY", "X509_CERT_DIR", xrootd.SERVER_NAMES):
        monkeypatch.delenv(name, raising=False)
    env = gsi.client_env(proxy=False)
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        task = dask.delayed(_read_root)(url)
        with pytest.raises(PermissionError):  # forgot the proxy
            dask.compute(task, scheduler=manager.get, cache_inputs=True, env_vars=env)
        (digest,) = dask.compute(
            task,
            scheduler=manager.get,
            cache_inputs=True,
            env_files={"X509_USER_PROXY": str(gsi.proxy)},
            env_vars=env,
        )
    assert digest == hashlib.sha256(b"later" * 100).hexdigest()
