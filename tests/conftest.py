"""Fixtures: managers with real local worker processes on 127.0.0.1.

A test that starts worker processes is marked ``integration``: by its module's
``pytestmark``, by its own mark, or here, for a test that takes one of the fixtures below
that start them. ``pytest -m "not integration"`` is the quick check (README)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from daskvine_py import Manager


def _worker_pids() -> set[int]:
    """Worker processes this test process started (its children), not anyone else's."""
    out = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "daskvine_py.worker"],
        capture_output=True,
        text=True,
    )
    return {int(pid) for pid in out.stdout.split()}


#: The fixtures below that start worker processes.
WORKER_FIXTURES = frozenset({"shared_manager", "manager", "insecure_manager"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if WORKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pack_cache(tmp_path_factory):
    """The caller's cache of packed environments (``environment="local"``) for the whole
    session: the caller's environment is packed once, and nothing lands in ~/.cache."""
    return tmp_path_factory.mktemp("packs")


@pytest.fixture(scope="session")
def warm_software_cache(tmp_path_factory):
    """A node's software cache (``--software-cache``) shared by the tests that need a
    node that has the shipped environment (``small_local``'s), not a fresh one: it is
    unpacked once."""
    return tmp_path_factory.mktemp("node-software")


@pytest.fixture(scope="session")
def small_environment(tmp_path_factory):
    """A venv holding only what libraries need (cloudpickle, dask, msgpack and what they
    require), made once per session: its prefix and site-packages directory."""
    import nodes

    return nodes.small_environment(tmp_path_factory.mktemp("small-environment"))


@pytest.fixture
def small_local(monkeypatch, small_environment, pack_cache):
    """``environment="local"`` packs ``small_environment``, as if the caller ran from it
    (into ``pack_cache``, once per session). The caller's own environment (hundreds of MB
    with the test tools) is packed, shipped and unpacked by one test only
    (``test_software_nodes``'s first); the others ship this one, in seconds."""
    from daskvine_py.software import pack

    prefix, site_dir = small_environment

    def local_environment(cache_dir=None):
        return pack.pack_environment(str(prefix), sys.base_prefix, [str(site_dir)], cache_dir)

    monkeypatch.setattr(pack, "local_environment", local_environment)
    monkeypatch.setenv("DASKVINE_PY_CACHE_DIR", str(pack_cache))
    return prefix


@pytest.fixture(scope="session")
def shared_manager():
    """One manager with two one-core workers, shared by tests that do not break it."""
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        yield manager


@pytest.fixture
def manager():
    """A fresh manager with two one-core workers, for tests that kill or flood things."""
    with Manager(heartbeat_interval=0.2, worker_timeout=3.0) as manager:
        manager.start_workers(2, cores=1)
        yield manager


@pytest.fixture
def insecure_manager():
    """A manager without CurveZMQ, for tests that speak raw bytes to its port."""
    with Manager(heartbeat_interval=0.2, worker_timeout=3.0, security=False) as manager:
        manager.start_workers(2, cores=1)
        yield manager


@pytest.fixture(scope="session", autouse=True)
def no_leftover_workers():
    """Every test run must leave no worker process behind."""
    yield
    left = _worker_pids()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes left behind: {sorted(left)}"
