"""``python -m daskvine_py.factory`` (issue 16, part 2): a worker pool run as a command of
its own, for a manager elsewhere, sized through authenticated status requests on the
manager's port (``protocol.StatusRequest``, ``status.StatusClient``).

The factory runs as a subprocess with ``LocalProvider`` everywhere, and with
``SlurmProvider`` where a Slurm runs (``scripts/slurm-single-node.sh start``, as CI does).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import dask
import dask.bag as db
import pytest
import zmq

from daskvine_py import Manager, RunCancelled
from daskvine_py.batch.planner import Demand
from daskvine_py.batch.status import ManagerRefused, ManagerUnreachable, StatusClient
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from keyed import KeyedWorker
from sockets import dealer
from test_pool import _slurm_available, _wait

pytest.importorskip("parsl.providers")

# One Slurm node: its jobs of two tests at once would wait for each other's cores.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]

HERE = os.path.dirname(os.path.abspath(__file__))


def slow_inc(x, seconds=0.02):
    time.sleep(seconds)
    return x + 1


def _slurm_or_skip() -> None:
    why = _slurm_available()
    if why is not None:
        if os.environ.get("DASKVINE_PY_REQUIRE_SLURM") == "1":
            pytest.fail(f"Slurm is required here: {why}")
        pytest.skip(why)


def _env() -> dict[str, str]:
    """The factory and the jobs it starts import this checkout, and this module's tasks."""
    import daskvine_py

    src = os.path.dirname(os.path.dirname(daskvine_py.__file__))
    paths = [src, HERE, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in paths if path))
    env.pop(security.CONNECTION_FILE_ENV, None)
    return env


class Factory:
    """``python -m daskvine_py.factory`` in a process of its own; its log in a file."""

    def __init__(self, tmp_path, *args, env=None):
        self.log_path = tmp_path / "factory.log"
        self.script_dir = tmp_path / "jobs"
        command = [
            sys.executable,
            "-m",
            "daskvine_py.factory",
            "--script-dir",
            str(self.script_dir),
            "--log-level",
            "INFO",
            *args,
        ]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                command, env=env or _env(), stderr=log, stdout=subprocess.DEVNULL
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self, timeout=60):
        """SIGTERM; its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _processes_with(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (a pool's jobs: their connection file)."""
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split() if int(pid) != os.getpid()]


def _kill_all(text: str) -> None:
    for pid in _processes_with(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _local_jobs_live(script_dir) -> list[str]:
    """LocalProvider's jobs whose exit code is not written yet ("-")."""
    return [path.name for path in script_dir.glob("*.ec") if path.read_text().strip() in ("", "-")]


def _slurm_jobs_live(factory_pid: int) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    return [name for name in out.split() if f"-{factory_pid}-" in name]


def _factory_args(kind: str, manager: Manager, *extra: str) -> list[str]:
    args = [
        "--batch",
        kind,
        "--connection-file",
        manager.connection_file,
        "--max-workers",
        "2",
        "--idle-timeout",
        "2",
        "--poll-interval",
        "0.2",
        *extra,
    ]
    if kind == "slurm":
        # one core and a little memory per job, so that two jobs fit on a 2-core node
        args += [
            "--cores",
            "1",
            "--memory",
            "1000",
            "--walltime",
            "00:10:00",
            "--scheduler-options",
            "#SBATCH --partition=debug",
        ]
    return args


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_the_factory_grows_a_pool_to_the_work_and_back_to_nothing(kind, tmp_path):
    if kind == "slurm":
        _slurm_or_skip()
    with Manager(heartbeat_interval=0.2, worker_timeout=10.0) as manager:
        factory = Factory(tmp_path, *_factory_args(kind, manager))
        try:
            total = db.from_sequence(range(60), npartitions=30).map(slow_inc).sum()
            (got,) = dask.compute(total, scheduler=manager.get, event_log=tmp_path / "run.jsonl")
            assert got == dask.compute(total, scheduler="sync")[0]
            records = list(manager.last_run.events.records())
            ran_on = {r["worker"] for r in records if r["event"] == "done"}
            # the factory's workers ran it: named after its pool, two at most
            assert ran_on and all(f"-{factory.proc.pid}-" in name for name in ran_on), ran_on
            joined = {r["worker"] for r in records if r["event"] == "worker"}
            assert len(joined | set(manager.workers)) <= 2
            # Idle: the workers are retired, their jobs end by themselves, none is left.
            _wait(lambda: not manager.workers, 60, f"workers still there: {manager.workers}")
            if kind == "local":
                _wait(lambda: not _local_jobs_live(factory.script_dir), 30, "jobs still live")
                codes = {path.read_text().strip() for path in factory.script_dir.glob("*.ec")}
                assert codes == {"0"}, codes  # each worker left when told to, and exited 0
            else:
                _wait(lambda: not _slurm_jobs_live(factory.proc.pid), 60, "jobs in squeue")
            assert factory.proc.poll() is None  # still there for the next run
            assert factory.terminate() == 0
            assert "Traceback" not in factory.log, factory.log
            assert "failed" not in factory.log, factory.log
            assert _processes_with(manager.connection_file) == []
        finally:
            factory.kill()
            _kill_all(manager.connection_file)


@pytest.mark.timeout(120)
def test_sigterm_cancels_the_running_jobs_and_the_factory_exits(tmp_path):
    manager = Manager(heartbeat_interval=0.2, worker_timeout=10.0)
    factory = None
    try:
        factory = Factory(tmp_path, *_factory_args("local", manager))
        dsk = {f"x{i}": (slow_inc, i, 0.5) for i in range(40)}
        outcome = []
        thread = threading.Thread(target=_run_into, args=(manager, dsk, outcome), daemon=True)
        thread.start()
        _wait(lambda: len(manager.workers) == 2, 60, f"workers: {manager.workers}")
        pids = _processes_with(manager.connection_file)
        assert pids  # the jobs' workers (and their library processes)
        assert factory.terminate() == 0
        # Every job was cancelled: its processes end (they may take a moment to exit).
        _wait(
            lambda: not _processes_with(manager.connection_file),
            30,
            f"left behind: {_processes_with(manager.connection_file)}",
        )
        _wait(lambda: not manager.workers, 30, f"workers still there: {manager.workers}")
        assert "SIGTERM" in factory.log and "Traceback" not in factory.log, factory.log
    finally:
        manager.close()
        if factory is not None:
            factory.kill()
        _kill_all(manager.connection_file)
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], RunCancelled)  # its workers gone, it ended with the manager


def _run_into(manager, dsk, outcome):
    try:
        outcome.append(manager.get(dsk, list(dsk)))
    except Exception as exc:
        outcome.append(exc)


# -- the status requests --------------------------------------------------------------------


def _keys(manager):
    connection = security.read_connection_file(manager.connection_file)
    return connection.keys


def test_a_status_client_sees_the_demand_and_retires_an_idle_worker(manager):
    with StatusClient(manager.connection_file, name="test") as client:
        demand = client.demand()
        assert demand == Demand(0, {name: (1, demand.workers[name][1]) for name in manager.workers})
        assert all(idle >= 0 for _, idle in demand.workers.values())
        assert client.answered_at is not None
        # while a run goes on, its tasks are the demand
        with Background(
            manager.get,
            {f"x{i}": (slow_inc, i, 0.5) for i in range(8)},
            [f"x{i}" for i in range(8)],
        ) as run:
            _wait(lambda: client.demand().cores_needed > 0, 30, "no demand seen")
        assert run.result == tuple(range(1, 9))
        # a status client never counts as a worker
        assert sorted(manager.workers) == ["local-0", "local-1"]
        # It retires an idle worker of a pool, not one the manager started (test_claims.py).
        with KeyedWorker(manager, "pool-0", cores=1) as pooled:
            _wait(lambda: "pool-0" in client.demand().workers, 30, "pool-0 not seen")
            client.retire("pool-0", "a test")
            (shutdown,) = pooled.receive(p.Shutdown, 1)
            assert shutdown.reason == "a test"
        _wait(lambda: "pool-0" not in manager.workers, 30, "pool-0 still there")
        assert sorted(client.demand().workers) == ["local-0", "local-1"]
    total = db.from_sequence(range(10), npartitions=5).map(slow_inc).sum()
    assert dask.compute(total, scheduler=manager.get) == dask.compute(total, scheduler="sync")


class Background:
    """``func(*args)`` in a thread; ``result`` once the with block ends."""

    def __init__(self, func, *args):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(func, args), daemon=True)

    def _run(self, func, args):
        self.result = func(*args)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_a_status_request_with_wrong_keys_gets_no_answer(manager, tmp_path):
    keys = _keys(manager)
    context = zmq.Context()
    try:
        # a client key that is not the run's: refused during the handshake, never read
        stranger = dealer(
            context, manager.address, keys=zmq.curve_keypair(), server_key=keys.manager_public
        )
        stranger.send_multipart(p.encode([p.StatusRequest(p.PROTOCOL_VERSION, "stranger")]))
        assert stranger.poll(2000) == 0
        # no keys at all
        plain = dealer(context, manager.address)
        plain.send_multipart(p.encode([p.StatusRequest(p.PROTOCOL_VERSION, "plain")]))
        assert plain.poll(1000) == 0
    finally:
        context.destroy(linger=0)
    assert manager._gate.refused >= 1
    # A client holding another run's keys is told why it gets no answer.
    other = tmp_path / "other.json"
    security.write_connection_file(str(other), manager.address, security.Keys.generate())
    with StatusClient(str(other), timeout=30) as client:
        with pytest.raises(ManagerRefused, match="key"):
            client.demand()
        with pytest.raises(ManagerRefused):  # and asking again will not help
            client.demand()
    # The manager goes on as before.
    assert sorted(manager.workers) == ["local-0", "local-1"]
    total = db.from_sequence(range(10), npartitions=5).map(slow_inc).sum()
    assert dask.compute(total, scheduler=manager.get) == dask.compute(total, scheduler="sync")


def test_malformed_status_records_are_dropped(manager, caplog):
    keys = _keys(manager)
    context = zmq.Context()
    sock = dealer(
        context,
        manager.address,
        keys=(keys.worker_public, keys.worker_secret),
        server_key=keys.manager_public,
    )

    def reply(timeout=20_000):
        assert sock.poll(timeout), "no answer"
        return p.decode(sock.recv_multipart(), p.TO_CLIENT)

    bad = [
        p.StatusRequest("4", "wrong type"),
        tuple.__new__(p.StatusRequest, (p.PROTOCOL_VERSION,)),  # a field short
        p.RetireWorker(b"local-0", "not a str"),
        p.RetireWorker("local-0", None),
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
            for record in bad:
                sock.send_multipart(p.encode([record]))
            sock.send_multipart([b"garbage", b"more"])
            sock.send_multipart([p.MAGIC + pickle.dumps({"not": "a list"})])
            # a pickle is not opened; its sender (of protocol 6 or older) is told so in a
            # pickle, which it reads
            assert sock.poll(20_000)
            frames = sock.recv_multipart()
            (refusal,) = pickle.loads(frames[0][len(p.MAGIC) :])
            assert type(refusal) is p.Rejected and "reads no pickles" in refusal.reason
            # a good request beside a bad one is answered
            sock.send_multipart(p.encode([bad[0], p.StatusRequest(p.PROTOCOL_VERSION, "ok")]))
            (answer,) = reply()
            assert type(answer) is p.StatusReply
            assert {name for name, _, _ in answer.workers} == {"local-0", "local-1"}
            assert all(cores == 1 for _, cores, _ in answer.workers)
            assert sock.poll(500) == 0  # nothing for the bad ones
            # another protocol version: told so
            sock.send_multipart(p.encode([p.StatusRequest(p.PROTOCOL_VERSION + 1, "future")]))
            (rejected,) = reply()
            assert type(rejected) is p.Rejected and "protocol version" in rejected.reason
    finally:
        context.destroy(linger=0)
    assert "malformed record from status client" in caplog.text
    assert sorted(manager.workers) == ["local-0", "local-1"]  # nobody was retired
    total = db.from_sequence(range(10), npartitions=5).map(slow_inc).sum()
    assert dask.compute(total, scheduler=manager.get) == dask.compute(total, scheduler="sync")


def test_a_status_client_of_an_absent_manager_times_out(tmp_path):
    path = tmp_path / "gone.json"
    with Manager() as manager:
        address, keys = manager.address, _keys(manager)
    security.write_connection_file(str(path), address, keys)
    with StatusClient(str(path), timeout=0.5) as client:
        with pytest.raises(ManagerUnreachable, match="no answer"):
            client.demand()
        assert client.refused is None and client.answered_at is None


# -- the command line ------------------------------------------------------------------------


def _run_factory(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "daskvine_py.factory", *args],
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_or_absent_connection_file_is_a_clear_error(tmp_path):
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    garbled.chmod(0o600)
    keyless = tmp_path / "keyless.json"
    keyless.write_text(json.dumps({"address": "tcp://127.0.0.1:9", "security": True}))
    keyless.chmod(0o600)
    cases = {
        (): "connection file is needed",
        ("--connection-file", str(tmp_path / "missing.json")): "cannot read",
        ("--connection-file", str(garbled)): "not a daskvine_py key or connection file",
        ("--connection-file", str(keyless)): "no valid manager_public_key",
    }
    for args, message in cases.items():
        done = _run_factory("--batch", "local", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    # the environment variable names it as for the worker
    env = dict(_env(), **{security.CONNECTION_FILE_ENV: str(garbled)})
    done = _run_factory("--batch", "local", env=env)
    assert done.returncode == 2 and "not a daskvine_py key" in done.stderr, done.stderr
    done = _run_factory("--batch", "nqs", "--connection-file", str(garbled))
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.timeout(60)
def test_a_factory_the_manager_refuses_exits_saying_why(tmp_path):
    with Manager() as manager:
        other = tmp_path / "other-run.json"
        security.write_connection_file(str(other), manager.address, security.Keys.generate())
        done = _run_factory(
            "--batch",
            "local",
            "--connection-file",
            str(other),
            "--script-dir",
            str(tmp_path / "jobs"),
        )
        assert manager.workers == {}
    assert done.returncode == 4, done.stderr
    assert "the manager will not answer" in done.stderr, done.stderr
    assert "key is not the one this status client has" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "jobs").glob("*.ec"))  # no job was started


def test_each_batch_system_gets_its_provider_asking_for_the_workers_resources(tmp_path):
    from daskvine_py.batch import factory

    path = tmp_path / "run.json"
    security.write_connection_file(str(path), "tcp://127.0.0.1:9", security.Keys.generate())
    expected = {
        "slurm": ("SlurmProvider", {"cores_per_node": 4, "mem_per_node": 3, "exclusive": False}),
        "condor": ("CondorProvider", {"cores_per_slot": 4, "mem_per_slot": 3}),
        "pbs": ("PBSProProvider", {"cpus_per_node": 4, "select_options": "mem=2500mb"}),
        "lsf": ("LSFProvider", {"cores_per_block": 4, "cores_per_node": 4}),
        "sge": ("GridEngineProvider", {}),
        "local": ("LocalProvider", {}),
    }
    for batch, (name, attributes) in expected.items():
        args = factory.parse_args(
            [
                "--batch",
                batch,
                "--connection-file",
                str(path),
                "--cores",
                "4",
                "--memory",
                "2500",
                "--max-workers",
                "7",
                "--worker-init",
                "source /venv/bin/activate",
                "--scheduler-options",
                "#X --queue=short",
                "--scheduler-options",
                "#X --account=cms",
            ]
        )
        provider = factory.make_provider(args)
        assert type(provider).__name__ == name
        for attribute, value in attributes.items():
            assert getattr(provider, attribute) == value, (batch, attribute)
        assert provider.worker_init.startswith("source /venv/bin/activate")
        assert provider.init_blocks == 0 and provider.max_blocks == 7
        if batch != "local":
            # one line each, whatever the provider appends after them
            assert "#X --queue=short\n#X --account=cms\n" in provider.scheduler_options
            assert provider.walltime == "01:00:00"


# -- the pool's work source is pluggable -------------------------------------------------------


class FakeProvider:
    """Records what the pool submits and cancels; every job runs until cancelled."""

    def __init__(self):
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self.script_dir = None

    def submit(self, command, tasks_per_node, job_name=""):
        self.submitted.append(command)
        return str(len(self.submitted))

    def status(self, job_ids):
        from parsl.jobs.states import JobState, JobStatus

        return [
            JobStatus(JobState.CANCELLED if j in self.cancelled else JobState.RUNNING)
            for j in job_ids
        ]

    def cancel(self, job_ids):
        self.cancelled.extend(job_ids)
        return [True] * len(job_ids)


class FakeSource:
    """A manager elsewhere that does not answer at first."""

    connection_file = "/shared/run.json"

    def __init__(self):
        self.answers = threading.Event()
        self.asked = threading.Semaphore(0)
        self.retired: list[str] = []

    def demand(self):
        self.asked.release()
        if not self.answers.is_set():
            raise ManagerUnreachable("no answer from the manager at tcp://elsewhere:1")
        return Demand(3, {})

    def retire(self, name, reason):
        self.retired.append(name)


def test_a_pool_sized_by_a_source_that_does_not_answer_submits_nothing(tmp_path, caplog):
    from daskvine_py.batch.pool import WorkerPool

    source, provider = FakeSource(), FakeProvider()
    provider.script_dir = str(tmp_path)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.batch.pool"):
        pool = WorkerPool(source, provider, max_workers=2, poll_interval=0.05)
        try:
            for _ in range(3):  # three looks at a manager that does not answer
                assert source.asked.acquire(timeout=30)
            assert provider.submitted == []
            source.answers.set()
            _wait(lambda: len(provider.submitted) == 2, 30, "nothing submitted")
        finally:
            pool.close()
    assert sorted(provider.cancelled) == ["1", "2"]  # close cancels the jobs it started
    assert all("--connection-file /shared/run.json" in c for c in provider.submitted)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("no answer from the manager" in w for w in warnings) == 1, warnings  # once
    assert any("answers again" in w for w in warnings), warnings


# -- a factory whose manager is gone, or that is told to stop (issue 36) ----------------------

_MANAGER_SCRIPT = """
import sys, threading, time
from daskvine_py import Manager
# "-": the default connection file, under $HOME, removed when the manager closes
path = None if sys.argv[1] == "-" else sys.argv[1]
manager = Manager(connection_file=path, heartbeat_interval=0.2, dashboard_address=None)
dsk = {f"x{i}": (time.sleep, 600) for i in range(2)}  # work enough for two workers
threading.Thread(target=manager.get, args=(dsk, list(dsk)), daemon=True).start()
print(manager.connection_file, flush=True)
time.sleep(600)
"""


def _workers_of(path: str) -> list[int]:
    """Worker processes joined with the connection file ``path`` (not the factory, which
    names it too, nor the manager)."""
    return _processes_with(f"daskvine_py.worker --connection-file {path}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ending", ["killed", "closed"])
def test_a_factory_whose_manager_is_gone_says_so_and_cancels_its_jobs(ending, tmp_path):
    """Killed: its file stays, stale (the process is gone), as a worker checks. Closed:
    the manager removes the file it made. Either way the factory used to go on with "no
    answer ... submitting nothing until it answers" and its jobs' workers connected."""
    import re

    env = dict(_env(), HOME=str(tmp_path))
    env.pop(security.CONNECTION_DIR_ENV, None)
    chosen = str(tmp_path / "run.json") if ending == "killed" else "-"
    manager = subprocess.Popen(
        [sys.executable, "-c", _MANAGER_SCRIPT, chosen], env=env, stdout=subprocess.PIPE, text=True
    )
    factory, path = None, None
    try:
        assert manager.stdout is not None
        path = manager.stdout.readline().strip()
        factory = Factory(
            tmp_path,
            "--batch",
            "local",
            "--connection-file",
            path,
            "--max-workers",
            "2",
            "--poll-interval",
            "0.2",
            env=env,
        )
        _wait(lambda: _workers_of(path), 60, f"no worker job started: {factory.log}")
        if ending == "killed":
            manager.kill()
        else:
            manager.send_signal(signal.SIGTERM)  # closes it, as close() does
        manager.wait(60)
        assert os.path.exists(path) == (ending == "killed")
        assert factory.proc.wait(60) == 5, factory.log
        log = factory.log
        gone = "is stale: the manager that wrote it" if ending == "killed" else "was removed"
        assert gone in log and path in log, log
        assert "factory stopped (its manager is gone)" in log and "Traceback" not in log, log
        # its jobs were cancelled (killed: their workers would wait 60 s for the manager)
        (cancelled,) = re.findall(r"(\d+) cancelled now", log)
        assert ending == "closed" or int(cancelled) >= 1, log
        _wait(lambda: not _workers_of(path), 60, f"left behind: {_workers_of(path)}")
    finally:
        manager.kill()
        manager.wait()
        if factory is not None:
            factory.kill()
        if path:
            for pid in _workers_of(path):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_sigint_stops_a_factory_waiting_for_its_managers_answer_at_once(tmp_path):
    """Its pool's thread waits for an answer that does not come (a manager of this host
    still running, its port not answering); Ctrl-C used to wait for that request's timeout,
    which the pool then reported ("no answer from the manager ...") as it stopped."""
    with Manager(dashboard_address=None) as manager:
        address, keys = manager.address, _keys(manager)
    silent = tmp_path / "silent.json"  # this process wrote it, and still runs
    security.write_connection_file(str(silent), address, keys)
    factory = Factory(
        tmp_path, "--batch", "local", "--connection-file", str(silent), "--poll-interval", "0.2"
    )
    try:
        _wait(lambda: "factory started" in factory.log, 60, factory.log)
        factory.proc.send_signal(signal.SIGINT)  # the first request waits 10 s for nothing
        assert factory.proc.wait(60) == 0
    finally:
        factory.kill()
    log = factory.log
    assert "factory stopped (SIGINT)" in log and "Traceback" not in log, log
    assert "no answer" not in log, log  # the request was woken, not waited out
    assert not factory.script_dir.exists() or not list(factory.script_dir.glob("*.ec"))


@pytest.mark.timeout(60)
def test_closing_a_status_client_wakes_the_request_waiting_in_a_pool(tmp_path):
    """What SIGINT does in the factory: the pool stops, its client closes and the pool's
    thread, waiting up to ten minutes for an answer, gives up at once."""
    from daskvine_py.batch.pool import WorkerPool

    with Manager(dashboard_address=None) as manager:
        address, keys = manager.address, _keys(manager)
    silent = tmp_path / "silent.json"
    security.write_connection_file(str(silent), address, keys)
    client = StatusClient(str(silent), timeout=600)

    class Asked:
        """The client, saying when the pool asks it."""

        connection_file = client.connection_file

        def __init__(self):
            self.asked = threading.Event()
            self.raised: list[BaseException] = []

        def demand(self):
            self.asked.set()
            try:
                return client.demand()
            except BaseException as exc:
                self.raised.append(exc)
                raise

        def retire(self, name, reason):
            client.retire(name, reason)

    source, provider = Asked(), FakeProvider()
    provider.script_dir = str(tmp_path)
    pool = WorkerPool(source, provider, max_workers=2, poll_interval=0.05)
    assert source.asked.wait(30)
    pool.stop()
    client.close()
    pool.close()
    assert not pool._thread.is_alive()
    assert [type(e) for e in source.raised] == [ManagerUnreachable], source.raised
    assert "closed" in str(source.raised[0])
    with pytest.raises(ManagerUnreachable, match="closed"):
        client.demand()  # and any later request, at once
    assert provider.submitted == []
