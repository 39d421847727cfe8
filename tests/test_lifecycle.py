"""A manager's own end: signals close it as ``close`` does; stale connection files go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import procfs
from daskvine_py import Manager
from daskvine_py.wire import security

SRC = str(Path(__file__).resolve().parent.parent / "src")

#: A program holding a manager with two local workers, killed in the middle of a run.
HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from daskvine_py import Manager

    def nap(x):
        time.sleep(60)
        return x

    manager = Manager()
    workers = manager.start_workers(2, cores=1)
    assert manager.get({"warm": (sum, [1, 2])}, "warm") == 3  # the libraries are up
    print(json.dumps({"workers": [p.pid for p in workers],
                      "file": manager.connection_file}), flush=True)
    manager.get({"a": (nap, 1), "b": (nap, 2)}, ["a", "b"])
    """
)


@pytest.fixture
def connection_dir(tmp_path, monkeypatch):
    directory = tmp_path / "connections"
    monkeypatch.setenv(security.CONNECTION_DIR_ENV, str(directory))
    return directory


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_closes_the_manager_its_workers_and_its_file(signum, connection_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, security.CONNECTION_DIR_ENV: str(connection_dir)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes: set[int] = set()
    try:
        line = holder.stdout.readline()
        assert line, holder.stderr.read()
        started = json.loads(line)
        assert os.path.exists(started["file"])
        processes = set(started["workers"])
        libraries = set().union(*(set(procfs.children(pid)) for pid in processes))
        assert libraries, "the workers run library processes"
        processes |= libraries
        time.sleep(0.5)  # inside the second get, waiting on its tasks
        signalled = time.monotonic()
        holder.send_signal(signum)
        while any(map(procfs.alive, processes)) and time.monotonic() < signalled + 2.0:
            time.sleep(0.05)
        assert not [pid for pid in processes if procfs.alive(pid)], "left after 2 s"
        assert list(connection_dir.glob("manager-*.json")) == []
        assert holder.wait(10) == -signum  # ended as the signal's default action would
        assert f"{signum.name} received: closing 1 manager(s)" in holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for pid in processes:
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def _in_a_fresh_process(code: str, connection_dir: Path) -> None:
    """Run ``code`` (asserts) in an interpreter of its own: in this one, managers other
    tests keep open (module fixtures) hold the handlers already."""
    env = {**os.environ, "PYTHONPATH": SRC, security.CONNECTION_DIR_ENV: str(connection_dir)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_the_handlers_are_installed_over_the_default_and_restored_on_close(connection_dir):
    _in_a_fresh_process(
        """
        import signal
        from daskvine_py import Manager
        from daskvine_py.manager import lifecycle

        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        with Manager() as first, Manager() as second:
            assert signal.getsignal(signal.SIGTERM) is lifecycle._on_signal
            assert signal.getsignal(signal.SIGHUP) is lifecycle._on_signal
            first.close()
            assert signal.getsignal(signal.SIGTERM) is lifecycle._on_signal  # second is open
            del second
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        """,
        connection_dir,
    )


def test_an_application_handler_or_ignored_signal_is_left_alone(connection_dir):
    def application(signum, frame):
        pass

    term = signal.signal(signal.SIGTERM, application)
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Manager():
            assert signal.getsignal(signal.SIGTERM) is application
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is application
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGHUP, hup)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_manager_made_in_another_thread_installs_nothing(connection_dir):
    _in_a_fresh_process(
        """
        import signal, threading
        from daskvine_py import Manager

        made = []
        thread = threading.Thread(target=lambda: made.append(Manager()))
        thread.start()
        thread.join()
        try:
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        finally:
            made[0].close()
        """,
        connection_dir,
    )


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


@pytest.mark.integration
def test_files_of_managers_gone_from_this_host_are_removed_by_the_next(connection_dir):
    from daskvine_py.manager.connection import HOSTNAME

    connection_dir.mkdir(mode=0o700)
    dead, live = _dead_pid(), os.getpid()
    files = {
        "dead": (f"manager-{HOSTNAME}-{dead}-1.json", HOSTNAME, dead),
        "live": (f"manager-{HOSTNAME}-{live}-2.json", HOSTNAME, live),
        "elsewhere": (f"manager-{HOSTNAME}-{dead}-3.json", "another-host", dead),
        "other host's name": (f"manager-another-host-{dead}-4.json", "another-host", dead),
    }
    for name, host, pid in files.values():
        security.write_connection_file(
            str(connection_dir / name), "tcp://127.0.0.1:1", None, host=host, pid=pid
        )
    with Manager() as manager:
        left = {path.name for path in connection_dir.glob("manager-*.json")}
        assert os.path.basename(manager.connection_file) in left
    assert files["dead"][0] not in left
    assert {files[k][0] for k in ("live", "elsewhere", "other host's name")} <= left


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_file_of_a_killed_manager_is_removed_by_the_next(connection_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, security.CONNECTION_DIR_ENV: str(connection_dir)}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, daskvine_py as d; m = d.Manager(); "
            "print(m.connection_file, flush=True); sys.stdin.read()",
        ],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        killed = holder.stdout.readline().strip()
        assert os.path.exists(killed)
    finally:
        holder.kill()
        holder.wait()
    assert os.path.exists(killed)  # SIGKILL: nothing ran
    with Manager():
        assert not os.path.exists(killed)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_under_timeout_the_run_ends_with_its_status_and_nothing_left(connection_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, security.CONNECTION_DIR_ENV: str(connection_dir)}
    done = subprocess.run(
        ["timeout", "8", sys.executable, "-c", HOLDER],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 124, done.stderr  # timeout's own status: it timed out
    workers = json.loads(done.stdout.splitlines()[0])["workers"]
    left = [pid for pid in workers if procfs.alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left
    assert list(connection_dir.glob("manager-*.json")) == [], done.stderr
    # timeout signals the process, then its whole group: one close, not cut short
    assert done.stderr.count("SIGTERM received: closing 1 manager(s)") == 1, done.stderr


def test_a_forked_child_signalled_leaves_its_parents_manager_alone(connection_dir):
    with Manager() as manager:
        pid = os.fork()
        if pid == 0:  # the child (as multiprocessing's fork start method makes it)
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if ended[0] == 0:  # stuck closing its copy of the manager
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not end on SIGTERM")
        assert os.waitstatus_to_exitcode(ended[1]) == -signal.SIGTERM
        assert os.path.exists(manager.connection_file)
        assert not manager._closed
