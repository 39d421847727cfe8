"""Inputs cached on workers by content (``daskvine_py.inputs``), against real servers.

The HTTP tests serve a temporary directory with the standard library's own server on
127.0.0.1, in a thread of the test, with hooks to count requests, hold a GET back, or send
fewer bytes than its ``Content-Length`` says. The ``root://`` tests start Debian's
``xrootd`` on a free port of 127.0.0.1 and read through the maintained clients (the
``xrootd`` bindings, fsspec-xrootd, uproot); they are skipped where those are missing.
Each test has its own cache directory and short retries (``RETRY_DELAYS``).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import daskvine_py
import xrootd
from daskvine_py import inputs
from daskvine_py.inputs import remote
from daskvine_py.inputs.store import Identity, Incomplete, InputCache
from xrootd import XRootDServer

NANOAOD = Path("/work/nanoaod/nano_dy.root")
SRC = str(Path(daskvine_py.__file__).resolve().parents[1])


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache for the test, short retries, and this process's state as new."""
    root = tmp_path / "cache"
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(root))
    monkeypatch.delenv("DASKVINE_PY_INPUT_CACHE_BYTES", raising=False)
    monkeypatch.setenv("DASKVINE_PY_WORKER_NAME", "worker-7")
    monkeypatch.setattr(inputs, "RETRY_DELAYS", (0.01, 0.02, 0.04))
    monkeypatch.setattr(inputs, "TIMEOUT", 5.0)
    monkeypatch.setattr(inputs, "_caches", {})
    yield root
    inputs.release()


def _entries(root: Path) -> list[Path]:
    """The complete entries' files in the cache ``root``."""
    found = []
    for place in sorted((root / "entries").glob("*")):
        if (place / ".complete").exists():
            found.extend(path for path in place.iterdir() if not path.name.startswith("."))
    return found


def _delta(before: dict[str, int]) -> dict[str, int]:
    after = inputs.counters()
    return {name: after[name] - before[name] for name in after}


# -- pure: the cache's parts, no server -------------------------------------------------


def test_identity_names_the_content():
    one = Identity("http://h/a/nano.root", 10, "last-modified=Mon")
    assert one.key != Identity("http://h/a/nano.root", 11, "last-modified=Mon").key
    assert one.key != Identity("http://h/a/nano.root", 10, "last-modified=Tue").key
    assert one.key != Identity("http://h/b/nano.root", 10, "last-modified=Mon").key
    assert one.key == Identity("http://h/a/nano.root", 10, "last-modified=Mon").key
    assert one.name == "nano.root"
    assert Identity("root://h//x/../../a b?c=1", 1, "").name == "a_b"
    assert Identity("http://h/", 1, "").name == "h"
    assert Identity("http://h/..", 1, "").name == "input"


def test_plain_paths_and_file_urls_are_returned_as_they_are(cache_dir):
    assert inputs.local_path("/data/nano.root") == "/data/nano.root"
    assert inputs.local_path("rel/nano.root:Events") == "rel/nano.root:Events"
    assert inputs.local_path("file:///data/a%20b.root") == "/data/a b.root"
    with pytest.raises(ValueError, match="another host"):
        inputs.local_path("file://elsewhere/data/x")
    with pytest.raises(ValueError, match="s3://bucket/x"):
        inputs.local_path("s3://bucket/x")
    assert not cache_dir.exists()  # nothing remote asked: no cache made


def test_input_unavailable_names_url_and_worker_and_pickles(monkeypatch):
    monkeypatch.setenv("DASKVINE_PY_WORKER_NAME", "w3")
    error = inputs.InputUnavailable("root://h//f.root", "the server went away")
    assert str(error) == "input root://h//f.root unavailable on worker w3: the server went away"
    assert isinstance(error, OSError)
    back = pickle.loads(pickle.dumps(error))
    assert (back.url, back.reason, back.worker, str(back)) == (
        error.url,
        error.reason,
        "w3",
        str(error),
    )
    monkeypatch.delenv("DASKVINE_PY_WORKER_NAME")
    assert socket.gethostname() in str(inputs.InputUnavailable("u", "r"))


def test_a_short_fetch_is_never_cached(tmp_path):
    identity = Identity("http://h/f.bin", 10, "etag=1")
    with InputCache(str(tmp_path), 10**6) as cache:

        def short(part: str) -> None:
            Path(part).write_bytes(b"12345")

        with pytest.raises(Incomplete, match="5 bytes arrived, the server reported 10"):
            cache.fill(identity, short, wait=1.0)
        assert cache.lookup(identity) is None
        assert list((tmp_path / "entries").iterdir()) == []

        path, fetched = cache.fill(identity, lambda part: Path(part).write_bytes(b"0" * 10), 1.0)
        assert fetched and Path(path).read_bytes() == b"0" * 10
        assert cache.fill(identity, short, 1.0) == (path, False)  # found, not fetched
        assert cache.holds() == [identity]


def test_a_leftover_of_a_dead_fetch_is_replaced(tmp_path):
    identity = Identity("http://h/f.bin", 3, "etag=1")
    with InputCache(str(tmp_path), 10**6) as cache:
        place = tmp_path / "entries" / identity.key
        place.mkdir(parents=True)
        (place / "f.bin.part").write_bytes(b"x")  # no marker: a process died fetching
        assert cache.lookup(identity) is None
        path, fetched = cache.fill(identity, lambda part: Path(part).write_bytes(b"abc"), 1.0)
        assert fetched and sorted(os.listdir(place)) == [".complete", "f.bin"]


def test_eviction_spares_what_another_process_uses(tmp_path):
    """Two ``InputCache`` objects hold their locks on separate descriptors, as two
    processes do: flock keeps one from evicting what the other uses."""
    made = [Identity(f"http://h/{name}", 100, "etag=1") for name in "abc"]
    with InputCache(str(tmp_path), 250) as mine, InputCache(str(tmp_path), 250) as other:
        for identity in made[:2]:
            mine.use(identity.key, 1.0)
            mine.fill(identity, lambda part: Path(part).write_bytes(b"x" * 100), 1.0)
            time.sleep(0.01)  # the first is the least recently used
        mine.release()
        other.use(made[0].key, 1.0)  # the oldest, in use elsewhere
        assert mine.evict(room=100) == [made[1].key]
        assert other.lookup(made[0]) is not None


# -- HTTP ------------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The standard file server, with the hooks the tests set on its server."""

    server: _Server

    def log_message(self, format, *args):
        pass

    def do_HEAD(self):
        self.server.log("HEAD", self.path)
        super().do_HEAD()

    def do_GET(self):
        self.server.log("GET", self.path)
        if self.server.hold_get is not None:
            self.server.hold_get(self.server)
        if self.server.short > 0:
            self.server.short -= 1
            source = self.send_head()  # the whole file's Content-Length
            if source is not None:
                with source:
                    self.wfile.write(source.read(10))
            self.close_connection = True
            return
        super().do_GET()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(_Handler, directory=str(directory))
        super().__init__(("127.0.0.1", 0), handler)
        self.directory = directory
        self.requests: list[tuple[str, str]] = []
        self.changed = threading.Condition()
        self.hold_get = None  # a callable each GET waits on
        self.short = 0  # how many more GETs send 10 bytes and close

    def log(self, method: str, path: str) -> None:
        with self.changed:
            self.requests.append((method, path))
            self.changed.notify_all()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_port}/{name}"

    def count(self, method: str) -> int:
        return sum(1 for request in self.requests if request[0] == method)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[_Server]:
    directory = tmp_path / "served"
    directory.mkdir()
    server = _Server(directory)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _write(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def test_http_fetched_once_then_from_the_cache(cache_dir, http_server):
    data = os.urandom(100_000)
    _write(http_server.directory / "nano.root", data, 1_700_000_000)
    url = http_server.url("nano.root")
    before = inputs.counters()

    path = inputs.local_path(url)
    assert Path(path).read_bytes() == data and path.endswith("/nano.root")
    assert path.startswith(str(cache_dir))
    assert _delta(before) == {
        "bytes_from_storage": 100_000,
        "bytes_from_cache": 0,
        "files_fetched": 1,
        "cache_hits": 0,
    }

    assert inputs.local_path(url) == path  # one HEAD, no GET
    with inputs.open(url) as file:
        assert file.read() == data
    assert _delta(before) == {
        "bytes_from_storage": 100_000,
        "bytes_from_cache": 200_000,
        "files_fetched": 1,
        "cache_hits": 2,
    }
    assert (http_server.count("HEAD"), http_server.count("GET")) == (3, 1)
    assert _entries(cache_dir) == [Path(path)]
    record = json.loads((Path(path).parent / ".complete").read_text())
    assert record["url"] == url and record["size"] == 100_000


def test_http_a_changed_copy_gets_a_new_name(cache_dir, http_server):
    served = http_server.directory / "calib.json"
    _write(served, b'{"v": 1}', 1_700_000_000)
    url = http_server.url("calib.json")
    first = inputs.local_path(url)

    _write(served, b'{"v": 2}', 1_700_000_100)  # the same size: only Last-Modified tells
    second = inputs.local_path(url)
    assert second != first
    assert Path(second).read_bytes() == b'{"v": 2}'
    assert Path(first).read_bytes() == b'{"v": 1}'  # the old one ages out, untouched
    with inputs.open(url, "r") as file:
        assert json.load(file) == {"v": 2}
    assert http_server.count("GET") == 2


def test_http_a_short_transfer_is_retried_then_unavailable(cache_dir, http_server):
    _write(http_server.directory / "big.bin", os.urandom(50_000), 1_700_000_000)
    url = http_server.url("big.bin")
    http_server.short = 100  # every GET: 10 bytes of 50,000, then the connection closes
    before = inputs.counters()
    with pytest.raises(inputs.InputUnavailable) as caught:
        inputs.local_path(url)
    message = str(caught.value)
    assert url in message and "worker-7" in message
    assert "4 attempts failed" in message and "10 bytes arrived" in message
    assert http_server.count("GET") == 4  # the first and three retries
    assert _entries(cache_dir) == []  # nothing cached
    assert list((cache_dir / "entries").iterdir()) == []  # nor left behind
    assert _delta(before)["bytes_from_storage"] == 40
    assert _delta(before)["files_fetched"] == 0


def test_http_a_short_transfer_cured_by_a_retry(cache_dir, http_server):
    data = os.urandom(50_000)
    _write(http_server.directory / "big.bin", data, 1_700_000_000)
    http_server.short = 1
    before = inputs.counters()
    path = inputs.local_path(http_server.url("big.bin"))
    assert Path(path).read_bytes() == data
    assert http_server.count("GET") == 2
    assert _delta(before)["bytes_from_storage"] == 50_010  # the broken attempt counts too


def test_http_server_down_is_unavailable_after_the_retries(cache_dir, http_server):
    _write(http_server.directory / "a.bin", b"abc", 1_700_000_000)
    url = http_server.url("a.bin")
    http_server.shutdown()
    http_server.server_close()
    with pytest.raises(inputs.InputUnavailable) as caught:
        inputs.local_path(url)
    assert caught.value.url == url and caught.value.worker == "worker-7"
    assert "Connection refused" in str(caught.value)


def test_http_missing_is_file_not_found_at_once(cache_dir, http_server):
    url = http_server.url("nowhere.root")
    with pytest.raises(FileNotFoundError) as caught:
        inputs.local_path(url)
    assert caught.value.filename == url and url in str(caught.value)
    assert http_server.count("HEAD") == 1  # no retries


_CHILD = textwrap.dedent(
    """
    import json, sys
    from daskvine_py import inputs
    path = inputs.local_path(sys.argv[1])
    print(json.dumps({"path": path, "counters": inputs.counters()}))
    """
)


@pytest.mark.integration
def test_two_processes_of_a_node_fetch_once(cache_dir, http_server):
    data = os.urandom(200_000)
    _write(http_server.directory / "shared.root", data, 1_700_000_000)
    url = http_server.url("shared.root")

    def hold_until_both_asked(server: _Server) -> None:
        # the first GET waits until the second process has asked too: it then waits on
        # the entry's lock while the first one's fetch is under way
        with server.changed:
            server.changed.wait_for(lambda: server.count("HEAD") >= 2, timeout=30)

    http_server.hold_get = hold_until_both_asked
    environ = {**os.environ, "PYTHONPATH": SRC}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, url], env=environ, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [json.loads(child.communicate(timeout=60)[0]) for child in children]
    assert all(child.returncode == 0 for child in children)

    assert http_server.count("GET") == 1
    assert outputs[0]["path"] == outputs[1]["path"]
    assert Path(outputs[0]["path"]).read_bytes() == data
    fetched = sorted(output["counters"]["files_fetched"] for output in outputs)
    hits = sorted(output["counters"]["cache_hits"] for output in outputs)
    assert fetched == [0, 1] and hits == [0, 1]


def test_lru_the_least_recently_used_not_in_use_goes(cache_dir, http_server, monkeypatch):
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE_BYTES", "250")
    for name in "abcd":
        _write(http_server.directory / name, name.encode() * 100, 1_700_000_000)
    path = {name: inputs.local_path(http_server.url(name)) for name in "ab"}
    inputs.release()
    path["a"] = inputs.local_path(http_server.url("a"))  # used again: now b is the oldest
    inputs.release()
    path["c"] = inputs.local_path(http_server.url("c"))
    assert sorted(p.name for p in _entries(cache_dir)) == ["a", "c"]

    # both in use here now (c since its fetch): neither goes, the cache exceeds its bound
    path["a"] = inputs.local_path(http_server.url("a"))
    path["d"] = inputs.local_path(http_server.url("d"))
    assert sorted(p.name for p in _entries(cache_dir)) == ["a", "c", "d"]
    assert all(Path(path[name]).read_bytes() == name.encode() * 100 for name in "acd")


# -- root:// against a real XRootD server -----------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Served:
    """The test server's directory, with URLs by file name."""

    def __init__(self, server: XRootDServer) -> None:
        self.server = server
        self.directory = server.directory

    def url(self, name: str) -> str:
        return self.server.url(self.directory / name)


@pytest.fixture(scope="module")
def xrootd_server() -> Iterator[_Served]:
    """Debian's xrootd serving a directory on 127.0.0.1 (``tests/xrootd.py``)."""
    why = xrootd.unavailable()
    if why is not None:
        pytest.skip(why)
    client = pytest.importorskip("XRootD.client")
    client.EnvPutInt("TimeoutResolution", 1)  # timeouts of seconds, not 15 s granules
    with XRootDServer() as server:
        os.chmod(server.directory, 0o777)  # (the tests write files there as root)
        yield _Served(server)


@pytest.mark.integration
def test_root_fetched_once_byte_exact_and_refetched_when_changed(
    cache_dir, xrootd_server, monkeypatch
):
    monkeypatch.setattr(remote, "CHUNK", 100_000)  # the file in four reads
    served = xrootd_server.directory / "nano_dy.root"
    shutil.copyfile(NANOAOD, served)
    url = xrootd_server.url("nano_dy.root")
    before = inputs.counters()

    path = inputs.local_path(url)
    assert Path(path).read_bytes() == NANOAOD.read_bytes()
    assert inputs.local_path(url) == path
    size = NANOAOD.stat().st_size
    assert _delta(before) == {
        "bytes_from_storage": size,
        "bytes_from_cache": size,
        "files_fetched": 1,
        "cache_hits": 1,
    }

    changed = os.urandom(1000)
    _write(served, changed, time.time() + 60)
    again = inputs.local_path(url)
    assert again != path and Path(again).read_bytes() == changed
    assert _delta(before)["files_fetched"] == 2


@pytest.mark.integration
def test_root_missing_is_file_not_found(cache_dir, xrootd_server):
    url = xrootd_server.url("no_such.root")
    with pytest.raises(FileNotFoundError) as caught:
        inputs.local_path(url)
    assert caught.value.filename == url


@pytest.mark.integration
def test_root_server_down_is_unavailable(cache_dir, xrootd_server, monkeypatch):
    monkeypatch.setattr(inputs, "TIMEOUT", 1.0)
    url = f"root://127.0.0.1:{_free_port()}//nano_dy.root"  # nothing listens there
    with pytest.raises(inputs.InputUnavailable) as caught:
        inputs.local_path(url)
    assert caught.value.url == url and "worker-7" in str(caught.value)
    assert "4 attempts failed" in str(caught.value)


@pytest.fixture
def installed(cache_dir) -> Iterator[None]:
    from daskvine_py.inputs import filesystem  # needs fsspec-xrootd

    inputs.install()
    filesystem.forget()
    yield
    inputs.uninstall()
    filesystem.forget()


@pytest.mark.integration
def test_uproot_reads_root_urls_through_the_cache(xrootd_server, installed):
    uproot = pytest.importorskip("uproot")
    ak = pytest.importorskip("awkward")
    shutil.copyfile(NANOAOD, xrootd_server.directory / "nano_dy.root")
    url = xrootd_server.url("nano_dy.root")
    branches = ["nMuon", "Muon_pt", "Muon_eta", "Electron_pt"]
    with uproot.open(NANOAOD) as local:
        expected = local["Events"].arrays(branches)
    size = NANOAOD.stat().st_size
    before = inputs.counters()

    with uproot.open(url) as file:
        first = file["Events"].arrays(branches)
    assert _delta(before) == {
        "bytes_from_storage": size,  # the whole file, once
        "bytes_from_cache": 0,
        "files_fetched": 1,
        "cache_hits": 0,
    }
    with uproot.open(url, timeout=60) as file:  # as coffea's processor path opens it
        second = file["Events"].arrays(branches)
    assert _delta(before) == {
        "bytes_from_storage": size,
        "bytes_from_cache": size,
        "files_fetched": 1,
        "cache_hits": 1,
    }
    assert ak.array_equal(first, expected) and ak.array_equal(second, expected)


@pytest.mark.integration
def test_uproot_dask_tasks_read_through_the_cache(xrootd_server, installed):
    """dask-awkward's ``from_uproot`` (coffea's Dask path): the graph's tasks open the
    file with uproot.open, here in this process (Dask's synchronous scheduler)."""
    uproot = pytest.importorskip("uproot")
    ak = pytest.importorskip("awkward")
    pytest.importorskip("dask_awkward")
    shutil.copyfile(NANOAOD, xrootd_server.directory / "nano_dy.root")
    url = xrootd_server.url("nano_dy.root")
    before = inputs.counters()
    lazy = uproot.dask({url: "Events"}, open_files=False, steps_per_file=4)
    computed = lazy[["nMuon", "Muon_pt"]].compute(scheduler="sync")
    with uproot.open(NANOAOD) as local:
        expected = local["Events"].arrays(["nMuon", "Muon_pt"])
    assert ak.array_equal(computed, expected)
    counted = _delta(before)
    assert counted["files_fetched"] == 1 and counted["cache_hits"] >= 1
    assert counted["bytes_from_storage"] == NANOAOD.stat().st_size


def test_install_is_undone(cache_dir):
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("fsspec_xrootd")
    original = fsspec.get_filesystem_class("root")
    inputs.install()
    inputs.install()  # idempotent
    try:
        assert fsspec.get_filesystem_class("root").__name__ == "CachedXRootDFileSystem"
    finally:
        inputs.uninstall()
    assert fsspec.get_filesystem_class("root") is original
