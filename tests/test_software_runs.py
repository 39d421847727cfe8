"""Runs that ship software or files, on local workers: what fails says why, files reach
the tasks (mode 0600, renewed, gone with the worker), and a run that ships nothing pays
nothing for the feature.

The nodes that share no files with the caller are ``test_software_nodes``'s; here the
workers share them, which is enough for what is checked: a worker prepares a shipped
environment the same way wherever it runs. ``environment="local"`` ships a small venv
here (``small_local``: what libraries need, no more), as the caller's own would be.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time
from pathlib import Path

import dask
import pytest

from daskvine_py import EnvironmentUnfit, Manager
from daskvine_py.wire.exits import EXIT_UNFIT

pytestmark = pytest.mark.integration


def archive_with_interpreter(path: Path, script: str) -> Path:
    """A tar.gz holding ``bin/python3``: this shell ``script`` (an interpreter that does
    not run here, as one built for another machine would not)."""
    with tarfile.open(path, "w:gz") as tar:
        data = script.encode()
        info = tarfile.TarInfo("bin/python3")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("lib/python3.11/site-packages")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    return path


def wait_exited(manager: Manager, timeout: float = 30.0) -> list[int | None]:
    deadline = time.monotonic() + timeout
    procs = manager._local_processes
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p.poll() for p in procs]


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (
            "#!/bin/sh\necho 'cannot execute binary file: Exec format error' >&2\nexit 126\n",
            "Exec format error",
        ),
        ("#!/bin/sh\necho 3.9\n", "runs Python 3.9"),
    ],
    ids=["does-not-run", "old-python"],
)
def test_an_environment_no_worker_can_run_fails_the_run_at_once_with_each_nodes_reason(
    tmp_path: Path, script: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DASKVINE_PY_SOFTWARE_CACHE", str(tmp_path / "software"))
    archive = archive_with_interpreter(tmp_path / "env.tar.gz", script)
    with Manager(environment=str(archive)) as manager:
        manager.start_workers(2, cores=1)
        with pytest.raises(EnvironmentUnfit) as raised:
            dask.compute(dask.delayed(abs)(-1), scheduler=manager.get)
        message = str(raised.value)
        assert reason in message and "env.tar.gz" in message
        assert "local-0" in message or "local-1" in message  # the node's worker is named
        assert wait_exited(manager) == [EXIT_UNFIT, EXIT_UNFIT]


@pytest.mark.usefixtures("small_local")
def test_a_worker_that_cannot_run_the_software_leaves_and_the_others_run_the_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm_software_cache: Path
) -> None:
    """One node unfit (a worker whose cache directory cannot be made) and one fit, both
    given tasks: the unfit one leaves saying why, the other runs them all."""
    monkeypatch.setenv("DASKVINE_PY_SOFTWARE_CACHE", str(warm_software_cache))
    with Manager(environment="local") as manager:
        manager.start_workers(1, cores=1)
        blocked = tmp_path / "blocked"
        blocked.write_text("a file where the cache directory should be")
        monkeypatch.setenv("DASKVINE_PY_SOFTWARE_CACHE", str(blocked))
        manager.start_workers(1, cores=1)
        deadline = time.monotonic() + 60
        while len(manager.workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(manager.workers) == 2  # both are given tasks
        parts = [dask.delayed(abs)(-i) for i in range(40)]
        (got,) = dask.compute(dask.delayed(sum)(parts), scheduler=manager.get)
        assert got == sum(range(40))
        fit, unfit = manager._local_processes
        assert unfit.wait(30) == EXIT_UNFIT
        assert fit.poll() is None  # the fit worker stays


@pytest.mark.usefixtures("small_local")
def test_tasks_of_task_mode_tasks_run_with_the_shipped_interpreter(
    monkeypatch: pytest.MonkeyPatch, warm_software_cache: Path
) -> None:
    """A fresh interpreter per task (``task_mode="tasks"``) is the environment's too."""
    monkeypatch.setenv("DASKVINE_PY_SOFTWARE_CACHE", str(warm_software_cache))

    def where(_: int) -> str:
        import sys

        return sys.executable

    with Manager(environment="local") as manager:
        manager.start_workers(1, cores=1)
        library = manager.get({"w": (where, 1)}, "w")
        process = manager.get({"w": (where, 2)}, "w", task_mode="tasks")
    software = warm_software_cache / "env"
    assert library.startswith(str(software)) and process.startswith(str(software))


def test_files_reach_the_tasks_private_renewed_and_gone_with_the_worker(
    tmp_path: Path,
) -> None:
    proxy = tmp_path / "x509up_u1000"
    proxy.write_text("proxy one")

    def read_proxy(_: int) -> tuple[str, str, int]:
        path = os.environ["X509_USER_PROXY"]
        with open(path) as file:
            return path, file.read(), stat.S_IMODE(os.stat(path).st_mode)

    with Manager() as manager:
        manager.start_workers(1, cores=1)
        files = {"X509_USER_PROXY": str(proxy)}
        (path, content, mode) = manager.get({"p": (read_proxy, 1)}, "p", env_files=files)
        assert content == "proxy one" and mode == 0o600
        assert path != str(proxy)  # a copy in the worker's own directory
        proxy.write_text("proxy two: renewed")
        (path2, content, _) = manager.get({"p": (read_proxy, 2)}, "p", env_files=files)
        assert content == "proxy two: renewed" and path2 == path
        assert os.path.exists(path)
    assert not os.path.exists(path)  # the worker left: its directory is gone


def test_a_file_that_cannot_be_read_is_named_before_anything_runs(tmp_path: Path) -> None:
    with Manager() as manager:
        with pytest.raises(ValueError, match="X509_USER_PROXY.*nowhere"):
            manager.get({"x": 1}, "x", env_files={"X509_USER_PROXY": str(tmp_path / "nowhere")})
