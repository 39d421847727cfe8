"""The worker's and the factory's command lines (issue 27, "every run ends, in a terminal
too"), driven as a user drives them: real ``python -m daskvine_py.worker`` and
``python -m daskvine_py.factory`` processes, their messages asserted by content.

- one INFO line per lifecycle event by default (joined, lost the manager, left and why);
- a stale connection file (its manager exited) or a FIFO is refused at once;
- the worker's deadline counts from its registration, not from its start;
- every input checked where it enters: a usage error naming it, never a traceback;
- a factory without its batch system's commands exits at once; one stopped by a signal
  cleans up what it made;
- hypothesis feeds both command lines random values: a clear error or a working start,
  never a traceback, never a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py import Manager
from daskvine_py.wire import security

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env(**extra: str) -> dict[str, str]:
    """This checkout first on the path; no connection file from the environment."""
    import daskvine_py

    src = os.path.dirname(os.path.dirname(daskvine_py.__file__))
    paths = [src, HERE, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in paths if path))
    env.pop(security.CONNECTION_FILE_ENV, None)
    env.update(extra)
    return env


class Command:
    """A command line in a process of its own, its stderr in a file; killed at the end."""

    def __init__(self, tmp_path, module: str, *args: str, env=None, name="log") -> None:
        self.log_path = tmp_path / f"{name}.txt"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                env=env or _env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} (exit {self.proc.poll()}): {self.log}")
            time.sleep(0.05)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _worker(tmp_path, *args: str, **kwargs) -> Command:
    return Command(tmp_path, "daskvine_py.worker", *args, **kwargs)


def _run(module: str, *args: str, env=None, timeout: float = 60.0):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env or _env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _connection_file(tmp_path, address="tcp://127.0.0.1:1", pid=None) -> str:
    path = tmp_path / "connections" / f"run-{pid}.json"
    security.write_connection_file(str(path), address, security.Keys.generate(), pid=pid)
    return str(path)


# -- 1. one line per lifecycle event, by default ---------------------------------------------


@pytest.mark.timeout(120)
def test_a_worker_says_when_it_joins_and_when_it_leaves_and_why(tmp_path):
    with Manager() as manager:
        worker = _worker(
            tmp_path,
            "--connection-file",
            manager.connection_file,
            "--cores",
            "1",
            "--name",
            "cli-1",
        )
        try:
            worker.wait_for("worker joined")
            dsk = {f"x{i}": (_inc, i) for i in range(50)}
            assert list(manager.get(dsk, list(dsk))) == [i + 1 for i in range(50)]
        except BaseException:
            worker.stop()
            raise
    try:
        assert worker.wait(60) == 0
    finally:
        worker.stop()
    log = worker.log
    assert f"INFO worker joined {manager.address} as cli-1 with 1 core (1 library," in log, log
    assert f"INFO worker cli-1 left {manager.address}: the manager asked it to" in log, log
    assert "(exit status 0)" in log and "Traceback" not in log, log
    assert len(log.splitlines()) <= 3, log  # one line each, nothing per task


def _inc(x):
    return x + 1


_MANAGER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from daskvine_py import Manager
    manager = Manager(connection_file=sys.argv[1], heartbeat_interval=0.2)
    print(manager.address, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.timeout(120)
def test_a_worker_that_loses_its_manager_says_so_and_its_file_is_then_stale(tmp_path):
    path = str(tmp_path / "connections" / "run.json")
    manager = subprocess.Popen(
        [sys.executable, "-c", _MANAGER_SCRIPT, path], env=_env(), stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        address = manager.stdout.readline().strip()
        worker = _worker(
            tmp_path,
            "--connection-file",
            path,
            "--cores",
            "1",
            "--manager-timeout",
            "2",
            "--name",
            "cli-2",
        )
        worker.wait_for("worker joined")
        manager.kill()  # no goodbye: the worker hears nothing more
        manager.wait()
        assert worker.wait(60) == 0
        log = worker.log
        assert (
            f"WARNING worker cli-2 lost the manager at {address}: nothing heard from it "
            "for 2 s (--manager-timeout 2)"
        ) in log, log
        assert f"worker cli-2 left {address}: the manager was lost (exit status 0)" in log, log
        # The file is still there; a worker given it now learns at once that it is stale.
        begun = time.monotonic()
        done = _run("daskvine_py.worker", "--connection-file", path, timeout=30)
        assert time.monotonic() - begun < 15
        assert done.returncode == 2, done.stderr
        assert f"connection file {path} is stale: the manager that wrote it" in done.stderr
        assert "Start the manager again" in done.stderr and "Traceback" not in done.stderr
    finally:
        manager.kill()
        manager.wait()
        if worker is not None:
            worker.stop()


# -- 2. stale connection files, FIFOs --------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_connection_file_or_a_fifo_is_refused_at_once(tmp_path):
    stale = _connection_file(tmp_path, pid=_dead_pid())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for module, extra in (
        ("daskvine_py.worker", ()),
        ("daskvine_py.factory", ("--batch", "local")),
    ):
        done = _run(module, *extra, "--connection-file", stale, timeout=30)
        assert done.returncode == 2, done.stderr
        assert f"connection file {stale} is stale" in done.stderr, done.stderr
        # a FIFO is never opened for a blocking read: the run would wait for a writer
        done = _run(module, *extra, "--connection-file", str(fifo), timeout=30)
        assert done.returncode == 2, done.stderr
        assert f"{fifo} is not a regular file (a FIFO)" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    done = _run("daskvine_py.worker", "--connection-file", str(tmp_path), timeout=30)
    assert done.returncode == 2 and "(a directory)" in done.stderr, done.stderr


def test_old_connection_files_without_host_or_pid_are_still_read(tmp_path):
    import json

    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": 1, "address": "tcp://127.0.0.1:5", "security": False}))
    path.chmod(0o600)
    connection = security.read_connection_file(str(path))
    assert connection.address == "tcp://127.0.0.1:5" and connection.pid is None
    assert not connection.manager_gone()  # not known: the manager's silence will tell
    # a file of another host is never judged from here
    other = security.Connection("tcp://x:1", None, "another-host", _dead_pid())
    assert not other.manager_gone()


# -- 3. the deadline counts from the registration --------------------------------------------


def test_the_managers_silence_counts_from_the_registration_not_the_start():
    from daskvine_py.worker.messages import RegistrationSent
    from daskvine_py.worker.state import WorkerState
    from daskvine_py.worker.store import Store

    state = WorkerState(Store(None), manager_timeout=5.0, now=0.0)
    # libraries still starting at 100 s: nothing was asked of the manager yet
    assert not state.manager_silent(100.0) and state.poll_timeout(100.0) == 5.0
    assert state.handle([RegistrationSent()], 100.0) == []
    assert not state.manager_silent(104.0) and state.manager_silent(105.5)
    assert state.poll_timeout(101.0) == pytest.approx(4.0)


@pytest.mark.timeout(120)
def test_a_worker_whose_registration_is_never_answered_while_connected_gives_up_in_the_end(
    tmp_path,
):
    """Connected to something that never answers: it waits past ``--manager-timeout``
    (warned once: a busy manager is not a dead one), then gives up, saying so.
    ``test_scale_limits`` has the manager that answers late, and the one not there."""
    import zmq

    from daskvine_py.worker.state import REGISTRATION_PATIENCE

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    worker = None
    try:
        worker = _worker(
            tmp_path, f"tcp://127.0.0.1:{port}", "--cores", "2", "--manager-timeout", "0.25"
        )
        assert router.poll(60_000), worker.log  # the registration, once the libraries started
        assert worker.wait(60) == 3
        log = worker.log
        assert "the connection is up, so the manager is busy: it waits on" in log, log
        assert "the manager has not answered its registration, sent" in log, log
        assert f"though connected ({REGISTRATION_PATIENCE} x --manager-timeout 0.25)" in log
        assert "(exit status 3)" in log and "Traceback" not in log, log
    finally:
        if worker is not None:
            worker.stop()
        router.close()
        context.term()


def test_a_worker_whose_libraries_cannot_start_leaves_instead_of_waiting_forever():
    """The deadline starts with the registration: a worker whose libraries keep dying
    before it registers gives up after a few, saying why."""
    from daskvine_py.worker.messages import Boot
    from daskvine_py.worker.shell import Worker
    from daskvine_py.worker.state import MAX_START_FAILURES

    worker = Worker("tcp://127.0.0.1:1", manager_timeout=30.0)
    try:
        worker.events.append(Boot(worker._registration(), libraries=1))
        worker._handle(time.monotonic())
        for _ in range(MAX_START_FAILURES):
            assert worker.running
            (lib,) = list(worker.library_by_fd.values())  # the one started, or its successor
            lib.process.kill()
            lib.process.join(10)
            worker._library_died(lib)
            worker._handle(time.monotonic())
        assert not worker.running and worker.exit_code == 5
        assert "its library processes could not start" in worker.leave_reason
        assert "killed by signal SIGKILL" in worker.leave_reason
    finally:
        worker.manager_gone = True
        worker._close()


# -- 4. every input checked where it enters --------------------------------------------------

_WORKER_USAGE_ERRORS = {
    ("--manager-timeout", "nan"): "argument --manager-timeout: must be > 0",
    ("--manager-timeout", "inf"): "argument --manager-timeout: must be > 0",
    ("--manager-timeout", "0"): "argument --manager-timeout: must be > 0",
    ("--manager-timeout", "-1"): "argument --manager-timeout: must be > 0",
    ("--fetch-timeout", "soon"): "argument --fetch-timeout: expected a number of seconds",
    ("--cores", "0"): "argument --cores: must be 1 to 4096, not 0",
    ("--cores", "-1"): "argument --cores: must be 1 to 4096, not -1",
    ("--lib-slots", "100000"): "argument --lib-slots: must be 1 to 1024, not 100000",
    ("--memory", "-5"): "argument --memory: must be 1 to",
    ("--disk", "-1"): "argument --disk: must be 0 to",
    ("--peer-port", "70000"): "argument --peer-port: must be 0 to 65535",
    ("--host", "no such host"): "--host 'no such host' is not a host name or IP address",
    ("--host", "192.0.2.1"): "--host '192.0.2.1': cannot serve peers there",
    ("--log-level", "LOUD"): "argument --log-level: invalid choice: 'LOUD'",
}


def test_each_bad_worker_argument_is_a_usage_error_naming_it(capsys):
    from daskvine_py.worker.args import parse_args

    for (flag, value), message in _WORKER_USAGE_ERRORS.items():
        with pytest.raises(SystemExit) as raised:
            parse_args(["tcp://127.0.0.1:5", flag, value])
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert message in err, (flag, value, err)


def test_the_command_launchers_write_is_the_one_the_worker_parses(tmp_path, monkeypatch):
    """``WorkerCommand`` (the local launcher's and the pools' argv, below both) names
    each option as ``worker/args.py`` reads it."""
    import dataclasses

    from daskvine_py.command_line import WorkerCommand
    from daskvine_py.worker.args import parse_args

    monkeypatch.delenv(security.CONNECTION_FILE_ENV, raising=False)
    command = WorkerCommand(
        address="tcp://127.0.0.1:5",
        cores=4,
        memory=100,
        disk=200,
        workdir=str(tmp_path),
        lib_cores=2,
        lib_slots=3,
        fetch_timeout=1.5,
        manager_timeout=2.5,
        log_level="DEBUG",
        name="w1",
    )
    argv = command.argv()
    assert argv[:3] == [sys.executable, "-m", "daskvine_py.worker"]
    parsed = parse_args(argv[3:])
    for field in dataclasses.fields(command):
        if field.name not in ("python", "connection_file"):  # a file: read, not kept
            assert getattr(parsed, field.name) == getattr(command, field.name), field.name
    assert WorkerCommand("py").argv() == ["py", "-m", "daskvine_py.worker"]  # the defaults
    path = str(tmp_path / "file")
    assert WorkerCommand("py", connection_file=path).argv()[3:] == ["--connection-file", path]


def test_a_bad_worker_argument_is_a_usage_error_from_the_real_command():
    done = _run("daskvine_py.worker", "tcp://127.0.0.1:5", "--manager-timeout", "nan")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argument --manager-timeout: must be > 0 and <= 1e+06 s, not nan" in done.stderr


def test_help_shows_the_defaults_and_the_installed_names():
    from daskvine_py.batch import factory
    from daskvine_py.worker import args

    for module, parser_text in (
        ("worker", _help(args.parse_args)),
        ("factory", _help(factory.parse_args)),
    ):
        assert f"daskvine-py-{module}" in parser_text, parser_text
        assert "(default INFO)" in parser_text, parser_text
    assert "(default 30)" in _help(args.parse_args)


def test_the_installed_commands_are_the_same_command_lines():
    bin_dir = os.path.dirname(sys.executable)
    for script, args, message in (
        ("daskvine-py-worker", ["tcp://127.0.0.1:5", "--cores", "0"], "--cores: must be 1 to"),
        ("daskvine-py-factory", ["--batch", "local"], "connection file is needed"),
    ):
        path = os.path.join(bin_dir, script)
        if not os.path.exists(path):
            pytest.skip(f"{script} is not installed next to {sys.executable}")
        done = subprocess.run([path, *args], env=_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"{script}: error:" in done.stderr and message in done.stderr, done.stderr


def _help(parse) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse(["--help"])
    return " ".join(out.getvalue().split())


def test_each_bad_factory_argument_is_a_usage_error_naming_it(tmp_path, capsys):
    from daskvine_py.batch.factory import parse_args

    path = _connection_file(tmp_path, pid=os.getpid())
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = {
        ("--idle-timeout", "nan"): "argument --idle-timeout: must be > 0",
        ("--poll-interval", "inf"): "argument --poll-interval: must be > 0",
        ("--poll-interval", "0"): "argument --poll-interval: must be > 0",
        ("--cores", "0"): "argument --cores: must be 1 to 4096",
        ("--max-workers", "0"): "argument --max-workers: must be 1 to",
        ("--min-workers", "-1"): "argument --min-workers: must be 0 to",
        ("--min-workers", "3"): "--min-workers 3 is more than --max-workers 1",
        ("--memory", "-1"): "argument --memory: must be 1 to",
        ("--disk", "x"): "argument --disk: expected a whole number, not 'x'",
        ("--walltime", "1h"): "argument --walltime: expected [D-]HH:MM:SS, not '1h'",
        ("--script-dir", str(afile)): f"--script-dir {afile}: not a directory",
    }
    for (flag, value), message in cases.items():
        with pytest.raises(SystemExit) as raised:
            parse_args(["--batch", "local", "--connection-file", path, flag, value])
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert message in err, (flag, value, err)


# -- 5. the factory: missing commands, clean-up on a signal ----------------------------------


@pytest.mark.timeout(60)
def test_a_factory_without_its_batch_systems_commands_exits_at_once_naming_them(tmp_path):
    path = _connection_file(tmp_path, pid=os.getpid())
    empty = tmp_path / "bin"
    empty.mkdir()
    begun = time.monotonic()
    done = _run(
        "daskvine_py.factory",
        "--batch",
        "slurm",
        "--connection-file",
        path,
        env=_env(PATH=str(empty), HOME=str(tmp_path)),
        timeout=30,
    )
    assert time.monotonic() - begun < 20
    assert done.returncode == 3, done.stderr
    assert "factory cannot submit slurm jobs: sbatch, squeue, scancel not found on PATH" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / ".daskvine_py" / "jobs").exists() or not list(
        (tmp_path / ".daskvine_py" / "jobs").iterdir()
    )


def test_a_pool_whose_batch_commands_are_missing_is_refused_when_made(tmp_path, monkeypatch):
    parsl_providers = pytest.importorskip("parsl.providers")
    from daskvine_py.batch.pool import BatchSystemMissing, WorkerPool

    monkeypatch.setenv("PATH", str(tmp_path))

    class Source:
        connection_file = "/shared/run.json"

    with pytest.raises(BatchSystemMissing, match="sbatch, squeue, scancel not found on PATH"):
        WorkerPool(Source(), parsl_providers.SlurmProvider())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_factory_stopped_by_a_signal_removes_the_directory_it_made(tmp_path, signum):
    with Manager() as manager:
        factory = Command(
            tmp_path,
            "daskvine_py.factory",
            "--batch",
            "local",
            "--connection-file",
            manager.connection_file,
            "--poll-interval",
            "0.2",
            env=_env(HOME=str(tmp_path)),
        )
        try:
            factory.wait_for("factory started")
            jobs = tmp_path / ".daskvine_py" / "jobs"
            (made,) = list(jobs.iterdir())
            assert made.name.startswith("factory-") and made.is_dir()
            factory.proc.send_signal(signum)
            assert factory.wait(60) == 0
        finally:
            factory.stop()
    log = factory.log
    assert f"factory stopped ({signal.Signals(signum).name})" in log, log
    assert f"removed {made}" in log and not made.exists(), log
    assert "Traceback" not in log
    assert len(log.splitlines()) <= 3, log  # started, stopped: nothing per poll


@pytest.mark.timeout(60)
def test_the_slurm_example_without_slurm_says_so_in_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "slurm_pool.py")],
        env=_env(PATH=str(empty)),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "slurm_pool.py needs Slurm: sbatch" in done.stderr, done.stderr


# -- 6. random values: a clear error or a working start --------------------------------------

#: values of every kind a user might type
_GARBAGE = st.sampled_from(
    [
        "nan",
        "inf",
        "-inf",
        "0",
        "-1",
        "1e309",
        "",
        " ",
        "abc",
        "--",
        "0x10",
        "1.5",
        "٣",
        "99999999999999999999",
        "tcp://",
        "\x7f",
    ]
)


def _numbers(small: int):
    """Integers and floats as text; valid counts stay at most ``small`` (a valid
    ``--cores 4000`` would start 4000 processes on a shared machine)."""
    return st.one_of(
        st.integers(-(10**12), 10**12).filter(lambda n: n <= small or n > 10**6).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )


def _values(small: int = 2):
    return st.one_of(_GARBAGE, _numbers(small))


_WORKER_OPTIONS = [
    "--cores",
    "--memory",
    "--disk",
    "--lib-cores",
    "--lib-slots",
    "--gpus",
    "--peer-port",
    "--manager-timeout",
    "--fetch-timeout",
    "--host",
    "--workdir",
    "--log-level",
    "--connection-file",
    "--key-file",
    "--name",
]
_FACTORY_OPTIONS = [
    "--min-workers",
    "--max-workers",
    "--cores",
    "--memory",
    "--disk",
    "--idle-timeout",
    "--poll-interval",
    "--walltime",
    "--script-dir",
    "--log-level",
    "--connection-file",
]


def _arguments(options: list[str], paths: tuple[str, str]):
    """1 to 3 options, each with a random value, a FIFO or a path that does not exist."""
    pair = st.tuples(st.sampled_from(options), st.one_of(_values(), st.sampled_from(paths)))
    return st.lists(pair, min_size=1, max_size=3)


def _check_outcome(rc: int | None, err: str, given: list[tuple[str, str]], ok: tuple[int, ...]):
    assert "Traceback" not in err, (given, err)
    assert rc in ok, (given, rc, err)
    if rc == 2:  # a usage error names what was wrong: an option, its value, the file
        named = [flag for flag, value in given if flag in err or (value.strip() and value in err)]
        named += [word for word in ("connection file", "ulimit") if word in err]
        assert named, (given, err)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> tuple[str, str]:
    """A FIFO, and a path that does not exist (in a directory of the test's own)."""
    directory = tmp_path_factory.mktemp("paths")
    os.mkfifo(directory / "fifo")
    return str(directory / "fifo"), str(directory / "missing" / "path")


@pytest.mark.timeout(300)
def test_random_worker_arguments_parsed_in_process_give_a_usage_error_or_a_namespace(paths):
    from daskvine_py.worker.args import parse_args

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_arguments(_WORKER_OPTIONS, paths))
    def check(given_args):
        argv = ["tcp://127.0.0.1:1"] + [part for pair in given_args for part in pair]
        try:
            args = parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2, (given_args, exc.code)
            return
        # accepted: every value is one the worker can start with
        assert 1 <= args.cores <= 4096 and 1 <= args.lib_slots <= 1024
        assert 0 < args.manager_timeout <= 1e6 and 0 < args.fetch_timeout <= 1e6
        assert args.memory is None or args.memory >= 1
        assert args.disk is None or args.disk >= 0

    check()


def _run_briefly(command: list[str], env, settle: float, cwd) -> tuple[int | None, str]:
    """Run ``command``; once it has run ``settle`` seconds without exiting (a working
    start), stop it with SIGTERM. Its exit status and stderr."""
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        try:
            _, err = proc.communicate(timeout=settle)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)  # never a hang: it ends when told to
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(600)
def test_random_values_on_the_real_worker_command_line(tmp_path_factory, paths):
    cwd = tmp_path_factory.mktemp("cwd")  # where a relative --workdir lands

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_arguments(_WORKER_OPTIONS, paths))
    def check(given_args):
        # one core and a short deadline unless the draw says otherwise: a valid start is
        # brief (nothing listens on port 1: no answer to its registration, status 3)
        argv = ["tcp://127.0.0.1:1", "--cores", "1", "--manager-timeout", "2"]
        argv += [part for pair in given_args for part in pair]
        rc, err = _run_briefly(
            [sys.executable, "-m", "daskvine_py.worker", *argv], _env(), settle=8.0, cwd=cwd
        )
        _check_outcome(rc, err, given_args, ok=(0, 2, 3))
        if rc in (0, 3):
            assert " left tcp://127.0.0.1:1: " in err, (given_args, err)

    check()


@pytest.mark.timeout(600)
def test_random_values_on_the_real_factory_command_line(tmp_path_factory, paths):
    home = tmp_path_factory.mktemp("home")
    with Manager() as manager:

        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
        @given(_arguments(_FACTORY_OPTIONS, paths))
        def check(given_args):
            argv = [
                "--batch",
                "local",
                "--connection-file",
                manager.connection_file,
                "--poll-interval",
                "0.5",
            ]
            argv += [part for pair in given_args for part in pair]
            rc, err = _run_briefly(
                [sys.executable, "-m", "daskvine_py.factory", *argv],
                _env(HOME=str(home)),
                settle=3.0,
                cwd=home,
            )
            _check_outcome(rc, err, given_args, ok=(0, 2))
            if rc == 0:
                assert "factory stopped (SIGTERM)" in err, (given_args, err)

        check()


def test_an_empty_workdir_is_refused_naming_the_option():
    from daskvine_py.worker.args import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["tcp://127.0.0.1:1", "--workdir", ""])
    assert exit_info.value.code == 2
