"""Software reaching workers that share no files with the caller, as users meet it.

Each worker here runs in a mount namespace where the caller's venv, this repository and
the directory of the user's modules are hidden under empty tmpfs mounts
(``nodes.start_node_worker``), from a small install holding daskvine_py and pyproject's
``worker`` extra only (no dask, no numpy). So every task result below was computed by
software the run shipped: the caller's environment (``environment="local"``, or an
archive's path), and the user's own module, which travels by content: editing it
between two runs changes the second run's results. Every result is compared with Dask's
synchronous scheduler in the caller.

The caller's own environment (this venv: hundreds of MB) is packed and unpacked on a
fresh node by the first test only; the others that ship an archive ship a small venv
(``small_local``: what libraries need), which packs and unpacks in seconds.

Needs root and ``unshare``: skipped without them, except under
``DASKVINE_PY_REQUIRE_NETNS=1`` (CI), where it must run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask
import pytest

import nodes
from daskvine_py import EnvironmentUnfit, Manager

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

_why = nodes.unavailable()
if _why is not None:
    if os.environ.get("DASKVINE_PY_REQUIRE_NETNS") == "1":
        raise RuntimeError(f"nodes sharing no files cannot be made here: {_why}")
    pytestmark.append(pytest.mark.skip(reason=_why))

ANALYSIS = """
OFFSET = {offset}


def score(x):
    return x * 3 + OFFSET


def total(values):
    return sum(values)
"""


@pytest.fixture(scope="module")
def small_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nodes.worker_only_install(tmp_path_factory.mktemp("worker-install"))


@pytest.fixture
def caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack_cache: Path) -> Path:
    """The user's working directory, holding ``analysis.py``, on ``sys.path``."""
    directory = tmp_path / "caller"
    directory.mkdir()
    (directory / "analysis.py").write_text(ANALYSIS.format(offset=1))
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.setenv("DASKVINE_PY_CACHE_DIR", str(pack_cache))
    yield directory
    sys.modules.pop("analysis", None)


def graph(n: int = 20):
    import analysis

    parts = [dask.delayed(analysis.score)(i) for i in range(n)]
    return dask.delayed(analysis.total)(parts)


def edit(path: Path, text: str) -> None:
    """Rewrite a module as an editor would: new content, a later mtime."""
    path.write_text(text)
    later = time.time() + 2
    os.utime(path, (later, later))


class Node:
    """Workers started on one "node" (one software cache), stopped at the end."""

    def __init__(
        self,
        root: Path,
        python: Path,
        manager: Manager,
        hide: list[str],
        cache: Path | None = None,
    ) -> None:
        self.cache = cache or root / "software"  # (a fresh node's, unless given)
        self.root = root
        self.python = python
        self.manager = manager
        self.hide = hide
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> subprocess.Popen[bytes]:
        proc = nodes.start_node_worker(
            self.python,
            self.manager.connection_file,
            self.hide,
            self.cache,
            name,
            self.root / f"{name}.log",
        )
        self.procs.append(proc)
        return proc

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        for proc in self.procs:
            nodes.stop(proc)


def wait_for_workers(manager: Manager, n: int, node: Node, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(manager.workers) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(manager.workers)} of {n} workers joined:\n{node.log()}")
        time.sleep(0.1)


def served(manager: Manager) -> int:
    server = manager._shipping.server
    return 0 if server is None else server.bytes_served


def test_a_node_sharing_no_files_runs_the_callers_code_with_its_local_environment(
    caller: Path, small_install: Path, tmp_path: Path
) -> None:
    """The first hour on a cluster that shares nothing: environment="local" (the caller's
    whole environment, numpy's C extensions among it), a module edited between two runs,
    two workers of one node, a worker restarted there."""

    def numpy_total(n: int) -> int:
        import numpy

        return int(numpy.arange(n).sum())

    with Manager(environment="local") as manager:
        node = Node(tmp_path / "node", small_install, manager, nodes.hidden_paths(caller))
        node.cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            node.start("n-0")
            node.start("n-1")  # same node: the archive is fetched and unpacked once
            wait_for_workers(manager, 2, node)
            (got,) = dask.compute(graph(), scheduler=manager.get)
            (want,) = dask.compute(graph(), scheduler="sync")
            assert got == want == sum(i * 3 + 1 for i in range(20))
            assert manager.get({"n": (numpy_total, 100)}, "n") == sum(range(100))
            software = manager.last_run_software
            archives = software.environment.size + software.code.size
            assert served(manager) == archives, node.log()  # once for the node, not twice
            unpacked = list((node.cache / "env").iterdir())
            assert [p.name for p in unpacked if not p.name.startswith(".")] == [
                software.environment.key
            ]

            edit(caller / "analysis.py", ANALYSIS.format(offset=100))
            importlib.reload(sys.modules["analysis"])
            (got,) = dask.compute(graph(), scheduler=manager.get)
            (want,) = dask.compute(graph(), scheduler="sync")
            assert got == want == sum(i * 3 + 100 for i in range(20))
            changed = manager.last_run_software
            assert changed.environment == software.environment  # only the code changed
            assert changed.code.key != software.code.key

            before = served(manager)
            nodes.stop(node.procs[0])
            nodes.stop(node.procs[1])
            node.start("n-2")  # restarted on the node: the unpacked copy is reused
            wait_for_workers(manager, 1, node)
            (got,) = dask.compute(graph(), scheduler=manager.get)
            assert got == sum(i * 3 + 100 for i in range(20))
            assert served(manager) == before, node.log()
        finally:
            node.close()


@pytest.mark.usefixtures("small_local")
def test_a_user_built_archive_runs_on_a_node_sharing_no_files(
    caller: Path, small_install: Path, tmp_path: Path, warm_software_cache: Path
) -> None:
    """An archive's path as the environment (here a small venv packed as "local" packs,
    linked where a user would keep the archive they built)."""
    from daskvine_py.software import pack

    env, path = pack.environment_of("local")
    assert path is not None
    archive = tmp_path / "analysis-env.tar.gz"
    archive.symlink_to(path)
    with Manager(environment=str(archive)) as manager:
        hide = nodes.hidden_paths(caller)
        node = Node(tmp_path / "node", small_install, manager, hide, warm_software_cache)
        (tmp_path / "node").mkdir()
        try:
            node.start("a-0")
            wait_for_workers(manager, 1, node)
            (got,) = dask.compute(graph(), scheduler=manager.get)
            (want,) = dask.compute(graph(), scheduler="sync")
            assert got == want
            assert manager.last_run_software.environment.key == env.key
        finally:
            node.close()


def test_a_small_install_refuses_a_run_that_ships_nothing_and_the_run_fails_at_once(
    caller: Path, small_install: Path, tmp_path: Path
) -> None:
    with Manager() as manager:
        node = Node(tmp_path / "node", small_install, manager, nodes.hidden_paths(caller))
        node.cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            proc = node.start("bare-0")
            wait_for_workers(manager, 1, node)
            with pytest.raises(EnvironmentUnfit) as raised:
                dask.compute(graph(), scheduler=manager.get)
            assert "no Python environment of its own" in str(raised.value)
            assert "bare-0" in str(raised.value)
            assert proc.wait(30) == 6  # EXIT_UNFIT
        finally:
            node.close()


def test_the_worker_process_of_the_small_install_imports_no_dask(small_install: Path) -> None:
    script = textwrap.dedent(
        """
        import importlib.util, sys
        import daskvine_py.worker.shell
        assert importlib.util.find_spec("dask") is None, "dask is installed"
        print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)))
        """
    )
    out = subprocess.run(
        [str(small_install), "-I", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    imported = {m for m in eval(out.stdout) if not m.startswith(("_cython", "cython_"))}
    assert imported - {"__main__", "__mp_main__"} <= {
        "daskvine_py",
        "cloudpickle",
        "msgpack",
        "zmq",
    }


def test_the_coffea_analysis_runs_bit_exact_on_a_node_sharing_no_files(
    caller: Path, small_install: Path, tmp_path: Path
) -> None:
    """The Coffea Dask path (dask-awkward, hist.dask) of ``benchmarks/`` with
    ``environment="local"``: the analysis module lives in this repository, hidden on the
    node, so it travels as code. On coffea's real NanoAOD samples when
    ``DASKVINE_PY_NANOAOD`` names their directory (CI), else on small written ones."""
    pytest.importorskip("coffea")
    sys.path[:0] = [str(nodes.REPO / "benchmarks"), str(nodes.REPO / "examples")]
    try:
        from coffea import processor

        from bench_coffea_dask import build, write_samples
        from coffea_analysis import SmallNanoAODSchema, same_output

        samples = os.environ.get("DASKVINE_PY_NANOAOD")
        schema = None
        if samples is None:
            samples = str(tmp_path / "samples")
            os.mkdir(samples)
            write_samples(samples)
            schema = SmallNanoAODSchema
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        graphs = build(samples, 2, 1000, str(scratch), schema)
        (reference,) = dask.compute(graphs, scheduler="sync")
        with Manager(environment="local") as manager:
            node = Node(tmp_path / "node", small_install, manager, nodes.hidden_paths(caller))
            node.cache.parent.mkdir(parents=True, exist_ok=True)
            try:
                node.start("c-0")
                wait_for_workers(manager, 1, node)
                (got,) = dask.compute(graphs, scheduler=manager.get)
            finally:
                node.close()
            software = manager.last_run_software
        assert software is not None and software.code is not None
        assert "coffea_analysis" in software.code.modules
        merged = processor.accumulate(got.values())
        assert same_output(merged, processor.accumulate(reference.values()))
    finally:
        del sys.path[:2]
        for name in ("bench_coffea_dask", "coffea_analysis"):
            sys.modules.pop(name, None)


def test_a_requirements_file_is_built_with_uv_on_a_node_sharing_no_files(
    caller: Path, small_install: Path, tmp_path: Path
) -> None:
    """The node builds the environment from the file with its own uv (from the package
    index), once: a second worker of the node finds it built."""
    versions = {name: importlib.metadata.version(name) for name in ("dask", "cloudpickle")}
    versions["msgpack"] = importlib.metadata.version("msgpack")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(f"{n}=={v}\n" for n, v in sorted(versions.items())))
    nodes.add_uv(small_install)
    with Manager(environment=str(requirements)) as manager:
        node = Node(tmp_path / "node", small_install, manager, nodes.hidden_paths(caller))
        node.cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            node.start("u-0")
            wait_for_workers(manager, 1, node)
            (got,) = dask.compute(graph(), scheduler=manager.get)
            (want,) = dask.compute(graph(), scheduler="sync")
            assert got == want
            software = manager.last_run_software
            built = node.cache / "env" / software.environment.key
            assert (built / "requirements.txt").read_text() == requirements.read_text()
            assert served(manager) == software.code.size  # the environment was not sent
            node.start("u-1")
            wait_for_workers(manager, 2, node)
            (got,) = dask.compute(graph(30), scheduler=manager.get)
            assert got == sum(i * 3 + 1 for i in range(30))
        finally:
            node.close()
