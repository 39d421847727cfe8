"""Worker pools through Parsl's providers (issue 16): LocalProvider everywhere, and a real
single-node Slurm where one runs (``scripts/slurm-single-node.sh start``, as CI does)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
import time

import pytest

from daskvine_py import Manager

parsl_providers = pytest.importorskip("parsl.providers")
from parsl.launchers import SimpleLauncher  # noqa: E402

# One Slurm node: its jobs of two tests at once would wait for each other's cores.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]


def slow_inc(x, seconds=0.02):
    time.sleep(seconds)
    return x + 1


@functools.cache
def _slurm_available() -> str | None:
    """Why Slurm cannot be used here, or None (asked once per session: without a
    controller, ``sinfo`` takes seconds to give up)."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        return "no Slurm commands (scripts/slurm-single-node.sh start installs and starts one)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if out.returncode != 0 or not any(s in out.stdout for s in ("idle", "mixed", "alloc")):
        return f"no Slurm node up (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


def _provider(kind: str, tmp_path, worker_init: str = ""):
    if kind == "local":
        provider = parsl_providers.LocalProvider(
            init_blocks=0, min_blocks=0, max_blocks=4, worker_init=worker_init
        )
    else:
        why = _slurm_available()
        if why is not None:
            if os.environ.get("DASKVINE_PY_REQUIRE_SLURM") == "1":
                pytest.fail(f"Slurm is required here: {why}")
            pytest.skip(why)
        provider = parsl_providers.SlurmProvider(
            partition="debug",
            nodes_per_block=1,
            init_blocks=0,
            min_blocks=0,
            max_blocks=4,
            walltime="00:10:00",
            launcher=SimpleLauncher(),
            worker_init=worker_init,
            exclusive=False,
            # one core per job, so two jobs fit on a 2-core node
            scheduler_options="#SBATCH --cpus-per-task=1 --mem=1000",
        )
    provider.script_dir = str(tmp_path / "jobs")
    os.makedirs(provider.script_dir)
    return provider


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def _env_for_jobs(monkeypatch):
    """Jobs start from the batch system, not from us: they must import this checkout."""
    import daskvine_py

    src = os.path.dirname(os.path.dirname(daskvine_py.__file__))
    here = os.path.dirname(os.path.abspath(__file__))  # this module's tasks, by reference
    paths = [src, here, os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_a_pool_grows_to_the_work_and_shrinks_to_nothing_when_idle(kind, tmp_path, monkeypatch):
    import dask

    _env_for_jobs(monkeypatch)
    provider = _provider(kind, tmp_path)
    with Manager(heartbeat_interval=0.2, worker_timeout=10.0) as manager:
        pool = manager.scale(
            provider,
            max_workers=2,
            cores=1,
            idle_timeout=1.0,
            poll_interval=0.2,
            manager_timeout=20,
        )
        assert pool.status()["jobs"] == {}  # no work, no jobs
        dsk = {f"x{i}": (slow_inc, i) for i in range(60)}
        dsk["total"] = (sum, [f"x{i}" for i in range(60)])
        started = time.monotonic()
        assert manager.get(dsk, "total") == dask.get(dsk, "total")
        took = time.monotonic() - started
        status = pool.status()
        assert sum(status["jobs"].values()) == 2, status  # grew to its maximum, no more
        assert len(manager.last_run.transfers) >= 0
        # Idle: both workers are retired and their jobs end; no job is left.
        _wait(lambda: not manager.workers, 60, f"workers still connected: {manager.workers}")
        _wait(
            lambda: set(pool.status()["jobs"]) <= {"done", "cancelled"},
            60,
            f"jobs still live: {pool.status()}",
        )
        assert pool.status()["failures"] == []
        print(f"{kind}: the run took {took:.1f} s from submission with no worker")
    if kind == "slurm":
        queue = subprocess.run(
            ["squeue", "-h", "-n", "daskvine-" + pool.name + "-0"], capture_output=True, text=True
        ).stdout
        assert queue.strip() == ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_a_job_whose_worker_init_fails_is_reported_with_its_output(kind, tmp_path, monkeypatch):
    _env_for_jobs(monkeypatch)
    provider = _provider(kind, tmp_path, worker_init="echo no-such-module-xyz >&2; exit 3")
    with Manager() as manager:
        pool = manager.scale(provider, max_workers=1, poll_interval=0.2)
        thread = threading.Thread(
            target=_ignore, args=(manager.get, {"x": (slow_inc, 1)}, "x"), daemon=True
        )
        thread.start()
        _wait(lambda: pool.status()["failures"], 60, f"no failure reported: {pool.status()}")
        failure = pool.status()["failures"][0]
        assert "no-such-module-xyz" in failure or "exit code 3" in failure, failure
        # The pool backs off instead of resubmitting in a loop.
        assert sum(pool.status()["jobs"].values()) == 1
        pool.close()
    thread.join(10)
    assert not thread.is_alive()  # the run ended with the manager


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_closing_the_manager_mid_run_ends_the_jobs(kind, tmp_path, monkeypatch):
    _env_for_jobs(monkeypatch)
    provider = _provider(kind, tmp_path)
    manager = Manager(heartbeat_interval=0.2, worker_timeout=10.0)
    try:
        pool = manager.scale(provider, max_workers=2, poll_interval=0.2)
        dsk = {f"x{i}": (slow_inc, i, 0.5) for i in range(40)}
        thread = threading.Thread(target=lambda: _ignore(manager.get, dsk, list(dsk)), daemon=True)
        thread.start()
        _wait(lambda: manager.workers, 60, "no worker joined")
    finally:
        manager.close()
    thread.join(10)
    assert not thread.is_alive()
    status = pool.status()
    assert set(status["jobs"]) <= {"done", "cancelled"}, status
    if kind == "slurm":
        job_ids = list(pool.jobs)
        _wait(
            lambda: (
                not subprocess.run(
                    ["squeue", "-h", "-j", ",".join(job_ids)], capture_output=True, text=True
                ).stdout.strip()
            ),
            30,
            "jobs still in the queue",
        )


def _ignore(get, *args):
    try:
        get(*args)
    except Exception:
        pass


def test_the_htcondor_submit_description_has_what_condor_submit_needs(tmp_path, monkeypatch):
    """HTCondor cannot run here: ``condor_submit`` is a script that keeps what it is given
    and answers as the real one does, so the description CondorProvider writes for our
    worker jobs can be checked."""
    from parsl.launchers import SimpleLauncher

    bin_dir, captured = tmp_path / "bin", tmp_path / "captured"
    bin_dir.mkdir()
    captured.mkdir()
    tools = {
        "condor_submit": f'cp "$1" {captured}/\n'
        f'cp "${{1%.submit}}.script" {captured}/ 2>/dev/null\n'
        'echo "Submitting job(s)."\necho "1 job(s) submitted to cluster 42."\n',
        "condor_q": "exit 0\n",
        "condor_rm": "exit 0\n",
    }
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    provider = parsl_providers.CondorProvider(
        init_blocks=0,
        cores_per_slot=4,
        mem_per_slot=8,
        requirements='OpSysAndVer == "AlmaLinux9"',
        scheduler_options='+JobFlavour = "workday"\n',
        worker_init="source /shared/venv/bin/activate",
        launcher=SimpleLauncher(),
    )
    provider.script_dir = str(tmp_path / "jobs")
    os.makedirs(provider.script_dir)
    with Manager() as manager:
        pool = manager.scale(provider, max_workers=1, cores=4, poll_interval=0.2)
        thread = threading.Thread(
            target=_ignore, args=(manager.get, {"x": (slow_inc, 1)}, "x"), daemon=True
        )
        thread.start()
        _wait(lambda: any(captured.glob("*.submit")), 30, "nothing was submitted")
        pool.close()
        keys = open(manager.connection_file).read()
    (description,) = [p.read_text() for p in captured.glob("*.submit")]
    for needed in (
        "executable",
        "RequestCpus = 4",
        "RequestMemory = 8192",
        'OpSysAndVer == "AlmaLinux9"',
        '+JobFlavour = "workday"',
        "queue",
    ):
        assert needed in description, (needed, description)
    scripts = [p.read_text() for p in captured.glob("*.script")]
    job = "\n".join(scripts) + description
    assert "source /shared/venv/bin/activate" in job
    assert "-m daskvine_py.worker --connection-file" in job and "--cores 4" in job
    import json

    secret = json.loads(keys)["worker_secret_key"]
    assert secret not in job  # the keys stay in the file
    thread.join(10)
