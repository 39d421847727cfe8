"""Reading over ``root://`` from a real XRootD server (Debian's xrootd, on 127.0.0.1).

The server (``tests/xrootd.py``, ``scripts/xrootd-server.sh``) serves files byte-exact to
the maintained clients: the ``xrdcp`` command, the ``xrootd`` Python bindings and
``fsspec-xrootd``, which uproot uses for ``root://``. Then both Coffea paths read their
NanoAOD over ``root://`` inside tasks on real workers, and their histograms are compared
bit for bit with the same analysis over the same files read locally. On coffea's real
NanoAOD samples when ``DASKVINE_PY_NANOAOD`` names their directory (CI), else on small
written ones.

Skipped without xrootd, the Python clients or coffea, except under
``DASKVINE_PY_REQUIRE_XROOTD=1`` (CI's coffea step), where they must run.
"""

from __future__ import annotations

import filecmp
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import cloudpickle
import dask
import pytest

import xrootd
from xrootd import XRootDServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REQUIRED = os.environ.get("DASKVINE_PY_REQUIRE_XROOTD") == "1"
_why = xrootd.unavailable()
if _why is not None:
    if REQUIRED:
        raise RuntimeError(f"an XRootD server cannot be started here: {_why}")
    pytestmark.append(pytest.mark.skip(reason=_why))

#: the samples' datasets, each served as two files (as the benchmark links two copies)
DATASETS = ("nano_dy", "nano_dimuon")
COPIES = 2


def need(module: str) -> ModuleType:
    """``module``, or a skip, but an error where everything must run."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def server():
    with XRootDServer() as server:
        yield server
        pid = server.pid
    assert pid is not None and not _running(pid), f"xrootd (pid {pid}) is still running"


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    """``benchmarks/bench_coffea_dask.py`` and ``examples/coffea_analysis.py``, the samples'
    directory and the schema for them."""
    need("coffea")
    need("dask_awkward")
    repo = xrootd.REPO
    sys.path[:0] = [str(repo / "benchmarks"), str(repo / "examples")]
    by_value = None
    try:
        import bench_coffea_dask
        import coffea_analysis

        # Its classes (the processor, the small files' schema) travel with the tasks: the
        # workers cannot import examples/.
        cloudpickle.register_pickle_by_value(coffea_analysis)
        by_value = coffea_analysis
        samples = os.environ.get("DASKVINE_PY_NANOAOD")
        schema = None
        if samples is None:
            samples = str(tmp_path_factory.mktemp("samples"))
            bench_coffea_dask.write_samples(samples, 40)
            schema = coffea_analysis.SmallNanoAODSchema
        yield bench_coffea_dask, coffea_analysis, samples, schema
    finally:
        if by_value is not None:
            cloudpickle.unregister_pickle_by_value(by_value)
        del sys.path[:2]
        for name in ("bench_coffea_dask", "coffea_analysis"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def filesets(server, analysis):
    """The same files as ``{dataset: [root:// URL, ...]}`` and ``{dataset: [path, ...]}``."""
    samples = analysis[2]
    remote: dict[str, list[str]] = {}
    local: dict[str, list[str]] = {}
    for name in DATASETS:
        for i in range(COPIES):
            url = server.put(os.path.join(samples, f"{name}.root"), f"{name}_{i}.root")
            remote.setdefault(name, []).append(url)
            local.setdefault(name, []).append(str(server.directory / f"{name}_{i}.root"))
    return remote, local


def sample_file(server: XRootDServer) -> tuple[Path, bytes]:
    """A served file of 320 kB of pseudo-random bytes, and its bytes."""
    path = server.directory / "random.bin"
    data = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(10_000))
    if not path.exists():
        path.write_bytes(data)
        path.chmod(0o644)  # readable by nobody
    return path, data


# -- the server -------------------------------------------------------------------------


def test_the_server_listens_on_loopback_only_and_not_as_root(server):
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    mine = [line.split()[3] for line in out.splitlines() if f"pid={server.pid}," in line]
    assert mine == [f"127.0.0.1:{server.port}"], out
    status = Path(f"/proc/{server.pid}/status").read_text()
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.MULTILINE)
    assert uids is not None
    if os.geteuid() == 0:
        assert int(uids.group(2)) != 0  # effective uid: nobody


def test_xrdcp_copies_a_file_byte_exact(server, tmp_path):
    if shutil.which("xrdcp") is None:
        if REQUIRED:
            raise RuntimeError("xrdcp is not installed (apt-get install xrootd-client)")
        pytest.skip("xrdcp is not installed (apt-get install xrootd-client)")
    path, _ = sample_file(server)
    subprocess.run(
        ["xrdcp", "--nopbar", server.url(path), str(tmp_path / "copy")], check=True, timeout=60
    )
    assert filecmp.cmp(path, tmp_path / "copy", shallow=False)
    outside = subprocess.run(
        ["xrdcp", "--nopbar", f"root://127.0.0.1:{server.port}//etc/hostname", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert outside.returncode != 0 and "disallowed" in outside.stderr  # only its directory


def test_the_xrootd_bindings_read_byte_exact(server):
    client = need("XRootD.client")
    path, data = sample_file(server)
    with client.File() as file:
        status, _ = file.open(server.url(path))
        assert status.ok, status
        status, info = file.stat()
        assert status.ok and info.size == len(data)
        status, got = file.read()
        assert status.ok and got == data
        status, got = file.read(offset=12345, size=6789)
        assert status.ok and got == data[12345 : 12345 + 6789]
        ranges = [(0, 100), (70_000, 4096), (len(data) - 10, 10)]
        status, vector = file.vector_read(ranges)  # as uproot's XRootDSource reads
        assert status.ok, status
        assert [chunk.buffer for chunk in vector.chunks] == [data[o : o + n] for o, n in ranges]

    missing = server.directory / "missing.root"
    status, _ = client.File().open(server.url(missing))
    assert not status.ok and status.errno == 3011  # kXR_NotFound
    assert str(missing) in status.message and "no such file" in status.message


def test_fsspec_xrootd_reads_byte_exact(server):
    fsspec = need("fsspec")
    need("fsspec_xrootd")
    path, data = sample_file(server)
    with fsspec.open(server.url(path), "rb") as file:
        assert file.read() == data
        file.seek(200_001)
        assert file.read(999) == data[200_001:201_000]
    fs, _, (remote,) = fsspec.get_fs_token_paths(server.url(path))
    assert fs.info(remote)["size"] == len(data)

    missing = server.directory / "missing.root"
    with pytest.raises(OSError, match=r"\[3011\].*no such file") as raised:
        with fsspec.open(server.url(missing), "rb") as file:
            file.read()
    assert str(missing) in str(raised.value)


# -- Coffea over root:// ----------------------------------------------------------------


def _opened(server: XRootDServer, since: int = 0) -> dict[str, set[int]]:
    """The served files opened after byte ``since`` of the server's log, and by which
    processes (``ofs.trace open`` logs ``user.PID:fd@host ofs_open: ... fn=PATH``)."""
    text = server.log.read_bytes()[since:].decode(errors="replace")
    opened: dict[str, set[int]] = {}
    for pid, path in re.findall(r"\S+?\.(\d+):\d+@\S+ ofs_open: \S+ fn=(\S+)", text):
        opened.setdefault(path, set()).add(int(pid))
    return opened


def _log_size(server: XRootDServer) -> int:
    return server.log.stat().st_size


def _worker_processes(manager) -> set[int]:
    """The workers' processes and their descendants (the library processes that run tasks)."""
    psutil = pytest.importorskip("psutil")
    pids = set()
    for info in manager.workers.values():
        proc = psutil.Process(info["pid"])
        pids |= {proc.pid, *(child.pid for child in proc.children(recursive=True))}
    return pids


def test_the_coffea_dask_path_over_root_is_bit_exact(server, analysis, filesets, shared_manager):
    """``bench_coffea_dask.build`` over root:// URLs, computed on two workers, against the
    same graphs over the local paths with Dask's sync scheduler."""
    bench, example, _, schema = analysis
    from coffea import processor

    remote, local = filesets
    graphs = bench.build(remote, COPIES, 10, "", schema)  # preprocess reads here, sync
    since = _log_size(server)
    (got,) = dask.compute(graphs, scheduler=shared_manager.get)
    opened = _opened(server, since)
    (want,) = dask.compute(bench.build(local, COPIES, 10, "", schema), scheduler="sync")
    got, want = processor.accumulate(got.values()), processor.accumulate(want.values())
    assert set(got["events"]) == set(DATASETS)
    assert all(n > 0 for n in want["selected"].values())
    assert example.same_output(got, want)
    assert shared_manager.last_run.tasks > 2 * COPIES  # chunks of 10 events
    # The tasks read every file over root:// themselves, on the workers.
    assert set(opened) == {path for paths in local.values() for path in paths}, opened
    assert set().union(*opened.values()) <= _worker_processes(shared_manager), opened


def test_the_coffea_processor_path_over_root_is_bit_exact(
    server, analysis, filesets, shared_manager
):
    """``processor.Runner`` with ``DaskVinePyExecutor`` over root:// URLs (preprocessing
    included), against the same Runner over the local paths."""
    from daskvine_py.coffea import DaskVinePyExecutor

    _, example, _, _ = analysis
    remote, local = filesets
    executor = DaskVinePyExecutor(manager=shared_manager, status=False)
    try:
        since = _log_size(server)
        got = example.run_processor(remote, executor, 10)
        opened = _opened(server, since)  # by the tasks of both phases, on the workers
        want = example.run_processor(local, executor, 10)
    finally:
        executor.close()
    assert set(opened) == {path for paths in local.values() for path in paths}, opened
    assert set().union(*opened.values()) <= _worker_processes(shared_manager), opened
    assert set(got["events"]) == set(DATASETS)
    assert all(n > 0 for n in want["selected"].values())
    assert example.same_output(got, want)


def test_with_cache_inputs_each_file_is_read_once_per_node_and_a_second_run_reads_none(
    server, analysis, filesets, tmp_path, monkeypatch
):
    """``cache_inputs=True``: the Dask path's tasks read root:// files through the node's
    input cache (two workers of one node share it): each file is fetched whole, once,
    and a second run on the same workers opens nothing on the server. Bit-exact against
    local files. The files go as the workers exit (True is "worker")."""
    from coffea import processor

    from daskvine_py import Manager

    bench, example, _, schema = analysis
    remote, local = filesets
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "inputs"))
    (want,) = dask.compute(bench.build(local, COPIES, 10, "", schema), scheduler="sync")
    want = processor.accumulate(want.values())
    files = {path for paths in local.values() for path in paths}
    with Manager() as manager:
        manager.start_workers(2, cores=1)  # (they and their libraries take the variable)
        for run in ("first", "second"):
            graphs = bench.build(remote, COPIES, 10, "", schema)
            since = _log_size(server)
            (got,) = dask.compute(graphs, scheduler=manager.get, cache_inputs=True)
            opened = _opened(server, since)
            assert example.same_output(processor.accumulate(got.values()), want), run
            if run == "first":  # every file, each opened by one process of the node
                assert set(opened) == files, opened
                assert all(len(pids) == 1 for pids in opened.values()), opened
            else:
                assert opened == {}, opened
        cached = [p for p in (tmp_path / "inputs").rglob("*.root") if p.is_file()]
        assert sorted(p.stat().st_size for p in cached) == sorted(os.path.getsize(f) for f in files)
    # True is "worker": what they fetched went with them (``test_inputs_lifetime``)
    assert not [p for p in (tmp_path / "inputs").rglob("*.root") if p.is_file()]
