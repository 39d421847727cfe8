"""Thread pools sized to a library's cores (``worker/threads.py``), on real workers:
OpenMP/BLAS/numexpr variables and the BLAS pools numpy loaded, per library allocation;
a variable the worker's environment sets is kept. Computed results are compared with
Dask's synchronous scheduler."""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import numpy as np
import pytest

from daskvine_py import Manager
from daskvine_py.worker import threads

pytestmark = pytest.mark.timeout(120)
threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    """Workers inherit this process's environment: start from none of the variables set."""
    for name in threads.VARIABLES:
        monkeypatch.delenv(name, raising=False)


def pools(_: int) -> tuple[dict[str, str | None], list[int]]:
    """In a library: the pool variables and the threads of each BLAS pool loaded."""
    import numpy  # noqa: F401  (loads its BLAS here)
    from threadpoolctl import threadpool_info

    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return {name: os.environ.get(name) for name in threads.VARIABLES}, blas


def matmul_threads(seed: int) -> tuple[float, int]:
    """A BLAS-heavy task: its result, and the threads of the process that ran it."""
    rng = np.random.default_rng(seed)
    a = rng.random((300, 300))
    for _ in range(5):
        a = a @ a
        a /= np.abs(a).max()
    with open("/proc/self/status") as status:
        count = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return float(a.sum()), count


@pytest.mark.integration
def test_one_core_libraries_run_one_thread_pools():
    with Manager() as manager:
        manager.start_workers(1, cores=2)
        env, blas = manager.get({"x": (pools, 1)}, "x")
        assert set(env.values()) == {"1"}
        assert blas and set(blas) == {1}


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_matmul_tasks_start_no_thread_per_core():
    dsk = {f"m{i}": (matmul_threads, i) for i in range(4)}
    expected = dask.get(dsk, list(dsk))
    with Manager() as manager:
        manager.start_workers(1, cores=2)
        got = manager.get(dsk, list(dsk))
    assert [value for value, _ in got] == pytest.approx([value for value, _ in expected])
    # the library's own threads (reading requests, exports) and no BLAS pool beyond one
    assert all(count <= 3 for _, count in got), got


@pytest.mark.integration
def test_task_processes_run_one_thread_pools_too():
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        env, blas = manager.get({"x": (pools, 1)}, "x", task_mode="tasks")
        assert set(env.values()) == {"1"}
        assert set(blas) == {1}


@pytest.mark.integration
def test_a_library_of_two_cores_sizes_its_pools_to_two():
    with Manager() as manager:
        manager.start_workers(1, cores=2, lib_resources={"cores": 2, "slots": 1})
        env, blas = manager.get({"x": (pools, 1)}, "x")
        assert set(env.values()) == {"2"}
        assert blas and set(blas) == {2}


@pytest.mark.integration
def test_a_variable_the_worker_inherits_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        env, blas = manager.get({"x": (pools, 1)}, "x")
    assert env.pop("OMP_NUM_THREADS") == "3"
    assert set(env.values()) == {"1"}
    assert set(blas) == {1}


@pytest.mark.integration
def test_pools_loaded_before_the_variables_are_limited():
    """spawn re-imports a worker script that imported numpy: its pools are already up."""
    code = (
        "import os, numpy, threadpoolctl\n"
        "from daskvine_py.worker import threads\n"
        "for name in threads.VARIABLES: os.environ.pop(name, None)\n"
        "threads.limit_loaded(1, threads.set_thread_env(1, os.environ))\n"
        "print(sorted({p['num_threads'] for p in threadpoolctl.threadpool_info()"
        " if p['user_api'] == 'blas'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in threads.VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[1]"


def test_set_thread_env_keeps_what_is_set():
    environ = {"MKL_NUM_THREADS": "4"}
    added = threads.set_thread_env(2, environ)
    assert "MKL_NUM_THREADS" not in added and environ["MKL_NUM_THREADS"] == "4"
    assert {environ[name] for name in added} == {"2"}
    assert threads.task_cores(4, 2) == 2 and threads.task_cores(1, 3) == 1
