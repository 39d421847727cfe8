"""The live view: ``Manager.live()`` during a run, ``Manager.metrics()`` after it, and
``python -m daskvine_py status`` against a live manager, a gone one and with wrong keys."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import dask
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

import procfs
from daskvine_py import Manager
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from sockets import dealer

TASKS = 2000


def wait_for_file(path: str) -> int:
    """Hold a core until ``path`` exists (the test's gate)."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 0


def inc(start: int, i: int) -> int:
    time.sleep(0.0005)
    return start + i + 1


def total(path: str, values: list[int]) -> int:
    wait_for_file(path)
    return sum(values)


def _graph(go: str, finish: str) -> dict:
    dsk: dict = {"start": (wait_for_file, go)}
    dsk.update({("inc", i): (inc, "start", i) for i in range(TASKS)})
    dsk["finish"] = (total, finish, [("inc", i) for i in range(TASKS)])
    return dsk


def _until(manager: Manager, ready, what: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = manager.live()
        if ready(snapshot):
            return snapshot
        time.sleep(0.1)
    raise AssertionError(f"no snapshot {what} within {timeout:g} s; the last: {snapshot}")


def _status(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "daskvine_py", "status", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_live_counts_rise_during_a_run_and_metrics_match_the_runs(tmp_path):
    go, finish = str(tmp_path / "go"), str(tmp_path / "finish")
    dsk = _graph(go, finish)
    with Manager(heartbeat_interval=0.2) as manager:
        manager.start_workers(2, cores=2)
        manager.wait_for_workers(2, timeout=60)
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = manager.get(dsk, "finish")
                outcome["info"] = manager.last_run
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        try:
            before = _until(manager, lambda snap: snap["runs"], "with the run in progress")
            assert before["runs"][0]["tasks"] == TASKS + 2
            assert before["runs"][0]["done"] == 0  # the gate holds every task
            assert before["runs"][0]["categories"] == {  # progress per category
                "start": {"planned": 1, "done": 0, "failed": 0},
                "inc": {"planned": TASKS, "done": 0, "failed": 0},
                "finish": {"planned": 1, "done": 0, "failed": 0},
            }
            assert before["totals"]["workers"] == 2 and before["totals"]["cores"] == 4
            # every task waits behind the gate, or is on a worker: the gate, and readers
            # sent ahead to wait for it there
            totals = before["totals"]
            assert totals["waiting"] + totals["processing"] == TASKS + 2, totals
            assert totals["ready"] == 0, totals
            assert {w["name"] for w in before["workers"]} == {"local-0", "local-1"}
            open(go, "w").close()
            during = _until(
                manager,
                lambda snap: snap["runs"] and snap["runs"][0]["done"] == TASKS + 1,
                "with every task but the last done",
            )
            assert during["totals"]["tasks_done"] == TASKS + 1 > before["totals"]["tasks_done"]
            assert during["categories"]["inc"]["tasks"] == TASKS
            assert during["runs"][0]["categories"]["inc"] == {
                "planned": TASKS,
                "done": TASKS,
                "failed": 0,
            }
            assert during["totals"]["running"] >= 1  # the last task, held by its gate
        finally:
            open(go, "a").close()
            open(finish, "w").close()
            thread.join(120)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["value"] == dask.get(dsk, "finish")
        small = {("x", i): (inc, 0, i) for i in range(10)}
        assert manager.get(small, list(small)) == dask.get(small, list(small))
        runs = [outcome["info"], manager.last_run]

        families = {f.name: f for f in text_string_to_metric_families(manager.metrics())}
        done = sum(c.tasks for info in runs for c in info.categories.values())
        assert done == TASKS + 2 + 10
        # a counter over the manager's life: every run so far
        assert families["daskvine_py_tasks_done"].samples[0].value == done
        assert families["daskvine_py_tasks_failed"].samples[0].value == 0
        assert families["daskvine_py_workers"].samples[0].value == 2
        assert families["daskvine_py_cores"].samples[0].value == 4
        states = {s.labels["state"]: s.value for s in families["daskvine_py_tasks"].samples}
        assert states == {"waiting": 0, "ready": 0, "processing": 0, "running": 0}
        assert families["daskvine_py_bytes_moved"].samples[0].value > 0
        assert families["daskvine_py_manager_cpu_seconds"].samples[0].value > 0
        snapshot = manager.live()
        assert snapshot["runs"] == [] and snapshot["totals"]["tasks_done"] == done
        assert json.loads(json.dumps(snapshot)) == snapshot  # plain data, as documented


def test_readers_of_results_recomputed_after_a_loss_show_as_waiting():
    """Issue 36: a worker lost, another joined, the reduction waits for inputs computed
    again; the run's remainder (tasks less reports done, less ready and processing) said
    "waiting 0", since the recomputed inputs reported done twice. The snapshot takes the
    count from the scheduler state instead, without a network."""
    from types import SimpleNamespace

    from daskvine_py.live.terminal import render
    from daskvine_py.manager.live import LiveView
    from daskvine_py.manager.watching import Run, Watching
    from daskvine_py.report.runinfo import RunInfo
    from daskvine_py.scheduler.liveness import Liveness
    from daskvine_py.scheduler.state import SchedulerState
    from test_state import reduction_after_a_loss

    state = SchedulerState(sibling_inputs=0)
    watching = Watching(state.load)
    run = watching.runs[1] = Run(1)
    run.info = RunInfo(1, tasks=5)
    view = LiveView(state, SimpleNamespace(workers={}), watching, Liveness(10.0, 1.0))
    reduction_after_a_loss(state)
    snapshot = view.snapshot()
    assert snapshot["runs"][0]["done"] == 4 and snapshot["totals"]["tasks_done"] == 4
    assert snapshot["totals"]["waiting"] == 1
    assert "tasks: waiting 1  ready" in render(snapshot), render(snapshot)


@pytest.mark.timeout(120)
def test_the_status_command_shows_the_workers_and_exits(manager):
    dsk = {("plus", i): (inc, 0, i) for i in range(20)}
    assert manager.get(dsk, list(dsk)) == dask.get(dsk, list(dsk))
    shown = _status("--connection-file", manager.connection_file)
    assert shown.returncode == 0, shown.stderr
    assert "workers 2" in shown.stdout and "done 20" in shown.stdout
    assert "local-0" in shown.stdout and "local-1" in shown.stdout
    assert "\nplus " in shown.stdout  # the category's line


@pytest.mark.timeout(120)
def test_status_watch_refreshes_until_ctrl_c(manager):
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daskvine_py",
            "status",
            "--connection-file",
            manager.connection_file,
            "--watch",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=procfs.sigint_default,
    )
    try:
        views = 0
        assert watch.stdout is not None
        for line in watch.stdout:
            views += line.startswith("busiest workers")
            if views == 2:
                break
        assert views == 2, watch.stderr.read() if watch.stderr else ""
        watch.send_signal(signal.SIGINT)
        assert watch.wait(30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_status_against_a_manager_that_is_gone_fails_within_its_timeout(tmp_path):
    gone = tmp_path / "gone.json"
    with Manager() as manager:
        connection = security.read_connection_file(manager.connection_file)
    security.write_connection_file(str(gone), connection.address, connection.keys)
    shown = _status("--connection-file", str(gone), "--timeout", "2")
    assert shown.returncode == 1
    assert "no answer from the manager" in shown.stderr and "within 2 s" in shown.stderr
    missing = _status("--connection-file", str(tmp_path / "missing.json"), "--timeout", "2")
    assert missing.returncode == 1 and "cannot use" in missing.stderr


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_status_refuses_a_stale_connection_file_at_once_naming_it(tmp_path):
    """Issue 36: the file of a manager whose process is gone got "no answer from the
    manager within 10 s" after ten seconds; the worker's check says so at once."""
    stale = tmp_path / "stale.json"
    with Manager(dashboard_address=None) as manager:
        address = manager.address
        keys = security.read_connection_file(manager.connection_file).keys
    security.write_connection_file(str(stale), address, keys, pid=_dead_pid())
    shown = _status("--connection-file", str(stale))  # the default --timeout, 10 s
    assert shown.returncode == 1, shown.stderr
    assert f"connection file {stale} is stale: the manager that wrote it" in shown.stderr
    assert "Start the manager again" in shown.stderr
    assert "no answer" not in shown.stderr and "Traceback" not in shown.stderr


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home directory of the test's own: where managers write their connection files."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(security.CONNECTION_DIR_ENV, raising=False)
    return tmp_path / ".daskvine_py" / "connections"


def _status_here(*args: str) -> tuple[int, str, str]:
    """``python -m daskvine_py status`` in this process (its environment: ``home``)."""
    from daskvine_py.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["status", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_status_without_a_file_asks_the_only_running_manager_of_the_default_directory(home):
    code, _, err = _status_here()
    assert code == 1 and "no manager of this user is running" in err, err
    assert str(home) in err and "--connection-file" in err
    with Manager(dashboard_address=None) as manager:
        assert os.path.dirname(manager.connection_file) == str(home)
        # a file of a manager that has exited is passed over
        security.write_connection_file(
            str(home / "old.json"), "tcp://127.0.0.1:1", None, pid=_dead_pid()
        )
        code, out, err = _status_here()
        assert code == 0, err
        assert f"manager {manager.address}" in out and "workers 0" in out
        with Manager(dashboard_address=None) as other:
            code, out, err = _status_here()
            assert code == 2 and out == ""
            assert "2 managers may be running" in err and "--connection-file PATH" in err
            for running in (manager, other):
                assert f"{running.connection_file}  {running.address}" in err, err
            assert "old.json" not in err
            code, out, _ = _status_here("--connection-file", other.connection_file)
            assert code == 0 and f"manager {other.address}" in out
    code, _, err = _status_here()  # both closed: their files went with them
    assert code == 1 and "no manager of this user is running" in err, err


@pytest.mark.timeout(120)
def test_a_live_request_with_wrong_keys_is_refused(manager, tmp_path):
    other = tmp_path / "other.json"
    security.write_connection_file(str(other), manager.address, security.Keys.generate())
    shown = _status("--connection-file", str(other), "--timeout", "30")
    assert shown.returncode == 1 and "key" in shown.stderr, shown.stderr
    keys = security.read_connection_file(manager.connection_file).keys
    assert keys is not None
    context = zmq.Context()
    try:
        # a client key that is not the run's: refused in the handshake, never answered
        stranger = dealer(
            context, manager.address, keys=zmq.curve_keypair(), server_key=keys.manager_public
        )
        stranger.send_multipart(p.encode([p.LiveRequest(1)]))
        assert stranger.poll(2000) == 0
        # the run's keys: answered
        client = dealer(
            context,
            manager.address,
            keys=(keys.worker_public, keys.worker_secret),
            server_key=keys.manager_public,
        )
        client.send_multipart(p.encode([p.LiveRequest(7)]))
        assert client.poll(30_000)
        (reply,) = p.decode(client.recv_multipart(), p.TO_CLIENT)
        assert type(reply) is p.LiveReply and reply.request_id == 7
        assert reply.snapshot["totals"]["workers"] == 2
    finally:
        context.destroy(linger=0)


def fails(x: int) -> int:
    raise ValueError(f"no {x}")


@pytest.mark.timeout(120)
def test_failed_tasks_count_in_the_snapshot_and_the_metrics(manager):
    dsk = {("ok", i): (inc, 0, i) for i in range(5)}
    dsk["bad"] = (fails, ("ok", 0))
    with pytest.raises(ValueError, match="no 1"):
        manager.get(dsk, list(dsk))
    failed = sum(c.failed for c in manager.last_run.categories.values())
    assert failed >= 1
    snapshot = manager.live()
    assert snapshot["totals"]["tasks_failed"] == failed
    assert snapshot["categories"]["bad"]["failed"] == failed
    families = {f.name: f for f in text_string_to_metric_families(manager.metrics())}
    assert families["daskvine_py_tasks_failed"].samples[0].value == failed


def _category(tasks: int, peak_mb: float, failed: int = 0) -> dict:
    return {
        "tasks": tasks,
        "failed": failed,
        "wall_s": 0.5,
        "cpu_s": 0.25,
        "peak_memory_mb": peak_mb,
        "allocated_memory_mb": 0.0,
        "exhausted": 0,
        "input_bytes": 0,
        "output_bytes": 0,
    }


def test_the_status_view_shows_a_peak_under_one_mib_as_such_not_as_zero():
    from daskvine_py.live.terminal import render

    snapshot = {
        "t": 1_000_000.0,
        "manager": {"cpu_s": 1.0, "uptime_s": 60.0},
        "totals": {
            "workers": 0,
            "cores": 0,
            "waiting": 0,
            "ready": 0,
            "processing": 0,
            "running": 0,
            "tasks_done": 13,
            "tasks_failed": 2,
            "bytes_moved": 0,
            "stored_bytes": 0,
            "spilled_bytes": 0,
        },
        "runs": [],
        "categories": {
            "inc": _category(10, 0.0),
            "add": _category(2, 0.004),
            "load": _category(1, 300.0),
            "sum": _category(3, 12.25),
            "bad": _category(0, 0.0, failed=2),
        },
        "workers": [],
    }
    lines = render(snapshot, "tcp://127.0.0.1:1").splitlines()
    head = next(line for line in lines if line.startswith("category"))
    assert head.split()[-1] == "peak"
    rows = {line.split()[0]: line for line in lines[lines.index(head) + 1 :] if line}
    assert rows["inc"].endswith(" < 1 MiB")  # a growth of none: under 1 MiB, not "0.0"
    assert rows["add"].endswith(" < 1 MiB")
    assert rows["load"].endswith(" 300 MiB") and rows["sum"].endswith(" 12.2 MiB")
    assert "MiB" not in rows["bad"]  # no task of it finished: nothing was measured
