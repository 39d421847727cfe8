"""What a user at a terminal meets: Ctrl-C in a real pty, a manager killed outright, runs
with no worker to run them."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zmq

import daskvine_py
import procfs
from daskvine_py import Manager, RunCancelled
from daskvine_py import __main__ as cli
from daskvine_py.errors import NoWorkersLeft
from daskvine_py.manager import loop, progress, vacancy
from daskvine_py.manager.commands import Submit
from daskvine_py.manager.launch import spawn
from daskvine_py.manager.watching import Run
from daskvine_py.options import ManagerOptions
from daskvine_py.report.runinfo import RunInfo
from daskvine_py.scheduler import state as s
from daskvine_py.wire import security
from daskvine_py.wire.exits import EXIT_AUTH_FAILED

pytestmark = pytest.mark.integration

#: The caller in a terminal: it takes the pty as its controlling terminal (its own
#: session, so the pty's foreground process group is its own), starts two local workers,
#: and waits on a long graph until the test types Ctrl-C; then a second graph must finish.
CALLER = textwrap.dedent(
    """
    import fcntl, sys, termios, time

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    import dask
    from dask.callbacks import Callback
    from daskvine_py import Manager

    def slow(i):
        time.sleep(0.2)
        return i

    def inc(i):
        return i + 1

    def say(*words):
        print(*words, flush=True)

    with Manager() as manager:
        procs = manager.start_workers(2)
        say("WORKERS", *(proc.pid for proc in procs))
        long = dask.delayed(sum)([dask.delayed(slow)(i) for i in range(300)])
        started = Callback(posttask=lambda *_: say("TASK-DONE"))
        try:
            with started:
                dask.compute(long, scheduler=manager.get, progress=False)
            say("NOT-INTERRUPTED")
        except KeyboardInterrupt:
            say("INTERRUPTED")
        again = dask.delayed(sum)([dask.delayed(inc)(i) for i in range(50)])
        (result,) = dask.compute(again, scheduler=manager.get, progress=False)
        (expected,) = dask.compute(again, scheduler="sync")
        say("RESULT", result, "EXPECTED", expected)
        say("ALIVE", *(proc.pid for proc in procs if proc.poll() is None))
    say("CLOSED")
    """
)

#: The workers' ``--manager-timeout`` in ``DOOMED`` (the default is 30 s): long enough
#: past the manager's heartbeat (1 s), short enough not to wait half a minute.
DOOMED_TIMEOUT = 3.0

#: A manager with one local worker that says its pid and waits to be killed.
DOOMED = textwrap.dedent(
    f"""
    import dataclasses, time
    from daskvine_py import Manager
    from daskvine_py.manager import launch

    made = launch.worker_command
    launch.worker_command = lambda *args: dataclasses.replace(
        made(*args), manager_timeout={DOOMED_TIMEOUT}
    )
    manager = Manager()
    procs = manager.start_workers(1)
    print("WORKERS", *(proc.pid for proc in procs), flush=True)
    time.sleep(600)
    """
)


class Output:
    """What a child wrote, read from a pipe or a pty's master side as it comes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def until(self, marker: str, timeout: float) -> str:
        """Read until ``marker`` appears (the text so far); fail with it after ``timeout``."""
        deadline = time.monotonic() + timeout
        while marker not in self.text:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {marker!r} after {timeout} s; the output:\n{self.text}")
            readable, _, _ = select.select([self.fd], [], [], left)
            if not readable:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the pty's other side closed
                chunk = b""
            if not chunk:
                pytest.fail(f"the output ended before {marker!r}:\n{self.text}")
            self.text += chunk.decode(errors="replace").replace("\r\n", "\n")
        return self.text

    def line(self, marker: str) -> list[str]:
        """The words after ``marker`` on its (first) line."""
        tail = self.text.split(marker, 1)[1]
        return tail.split("\n", 1)[0].split()


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped, in a container without an init, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux pty")
@pytest.mark.timeout(180)
def test_ctrl_c_in_a_terminal_cancels_the_run_and_spares_the_local_workers(tmp_path):
    """Ctrl-C typed at a terminal reaches the whole foreground process group: the caller's
    ``get`` raises ``KeyboardInterrupt``, the local workers (in sessions of their own) go
    on, and the next compute on the same manager finishes with the right result."""
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    master, slave = os.openpty()
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        close_fds=True,
        preexec_fn=procfs.sigint_default,
    )
    os.close(slave)
    output = Output(master)
    workers: list[int] = []
    try:
        output.until("WORKERS", 60)
        output.until("\n", 5)  # the whole line of pids
        workers = [int(pid) for pid in output.line("WORKERS")]
        output.until("TASK-DONE", 60)
        os.write(master, b"\x03")  # the terminal turns it into SIGINT for the foreground
        output.until("CLOSED", 120)
        assert child.wait(timeout=30) == 0, output.text
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        _kill_all(workers)
        os.close(master)
    text = output.text
    assert "INTERRUPTED" in text and "NOT-INTERRUPTED" not in text, text
    result = output.line("RESULT")
    assert result[0] == result[2] == str(sum(range(1, 51))), text
    assert sorted(output.line("ALIVE")) == sorted(map(str, workers)), text
    assert "SIGINT" not in text, text  # no worker left on the interrupt


@pytest.mark.timeout(120)
def test_local_workers_leave_a_manager_killed_outright(tmp_path):
    """A manager killed with SIGKILL tells nobody: its local workers, in sessions of their
    own, leave by themselves once it is silent past their ``--manager-timeout`` (30 s by
    default, ``DOOMED_TIMEOUT`` here), and not before: a live manager keeps them."""
    script = tmp_path / "doomed.py"
    script.write_text(DOOMED)
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert child.stdout is not None
    output = Output(child.stdout.fileno())
    workers: list[int] = []
    try:
        output.until("\n", 60)
        workers = [int(pid) for pid in output.line("WORKERS")]
        assert workers and all(map(_alive, workers))
        time.sleep(DOOMED_TIMEOUT + 1.0)  # past the timeout: the manager's heartbeats count
        assert all(map(_alive, workers)), "a worker left a manager that is alive"
        child.kill()
        child.wait()
        killed = time.monotonic()
        deadline = killed + 90
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(map(_alive, workers)), "a worker outlived its killed manager by 90 s"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        _kill_all(workers)
        child.stdout.close()


# -- runs with no worker -------------------------------------------------------------


def slow(x, seconds=0.2):
    time.sleep(seconds)
    return x


class InThread:
    """``get`` in a thread of its own, which may wait for a long time."""

    def __init__(self, manager: Manager, dsk: dict, keys: object) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(manager, dsk, keys), daemon=True)
        self.thread.start()

    def _run(self, manager: Manager, dsk: dict, keys: object) -> None:
        try:
            self.result = manager.get(dsk, keys, progress=False)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"get still waits after {timeout} s"


def _warnings_saying(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def _wait_for_warning(caplog: pytest.LogCaptureFixture, words: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not _warnings_saying(caplog, words):
        assert time.monotonic() < deadline, f"no warning saying {words!r} in {timeout} s"
        time.sleep(0.1)
    return _warnings_saying(caplog, words)[0]


@pytest.mark.timeout(60)
def test_a_run_with_no_worker_warns_once_how_to_add_workers(monkeypatch, caplog):
    monkeypatch.setattr(vacancy, "NO_WORKER_GRACE", 1.0)
    caplog.set_level(logging.WARNING, logger="daskvine_py.manager")
    with Manager() as manager:
        waiting = InThread(manager, {"x": (slow, 1, 0.0)}, "x")
        message = _wait_for_warning(caplog, "no worker connected", 30)
        assert "run 1 has waited" in message, message
        assert "manager.start_workers(n)" in message, message
        assert f"python -m daskvine_py.worker --connection-file {manager.connection_file}" in (
            message
        )
        assert "refused" not in message, message
        time.sleep(1.5)  # past another grace period: no second warning for the same wait
        assert len(_warnings_saying(caplog, "no worker connected")) == 1
        manager.start_workers(1)  # the run goes on once a worker joins
        waiting.join(60)
        assert waiting.error is None and waiting.result == 1


@pytest.mark.timeout(90)
def test_a_run_fails_when_every_local_worker_is_killed(monkeypatch, caplog):
    """Every local worker killed while a run waits: ``get`` raises ``NoWorkersLeft``
    naming them and how they ended, and the manager stays usable."""
    with Manager(heartbeat_interval=0.2, worker_timeout=3.0) as manager:
        procs = manager.start_workers(2)
        dsk = {f"s{i}": (slow, i) for i in range(200)}
        dsk["total"] = (sum, [f"s{i}" for i in range(200)])
        waiting = InThread(manager, dsk, "total")
        time.sleep(1.0)  # tasks under way
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        waiting.join(60)
        assert isinstance(waiting.error, NoWorkersLeft), repr(waiting.error)
        message = str(waiting.error)
        for proc in procs:
            assert f"(pid {proc.pid}) was killed by SIGKILL" in message, message
        assert "local-0" in message and "local-1" in message, message
        assert "manager.start_workers(n)" in message, message
        assert manager.last_run is not None and manager.last_run.outcome == "failed"
        manager.start_workers(1)
        assert manager.get({"y": (slow, 2, 0.0)}, "y", progress=False) == 2


def _keys_of_another_manager(ours: security.Keys) -> security.Keys:
    return security.Keys.generate().for_workers()


def _our_manager_key_but_other_worker_keys(ours: security.Keys) -> security.Keys:
    """Past the handshake's cryptography, refused by the manager's gate (ZAP)."""
    return security.Keys.generate()._replace(manager_public=ours.manager_public).for_workers()


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("keys", "said"),
    [
        (_keys_of_another_manager, "with wrong keys"),
        (_our_manager_key_but_other_worker_keys, "with wrong keys"),
    ],
)
def test_the_no_worker_warning_says_workers_were_refused_for_their_keys(
    keys, said, monkeypatch, caplog, tmp_path
):
    """A worker refused during the CurveZMQ handshake (another manager's connection file,
    keys the gate refuses) exits; the warning says what was refused. (A worker without
    keys is counted only when the manager sees the mismatch before the worker hangs up,
    which is a race: not tested.)"""
    monkeypatch.setattr(vacancy, "NO_WORKER_GRACE", 1.0)
    caplog.set_level(logging.WARNING, logger="daskvine_py.manager")
    with Manager() as manager:
        ours = security.read_connection_file(manager.connection_file).keys
        assert ours is not None
        other = str(tmp_path / "other-keys.json")
        security.write_key_file(other, keys(ours))
        stranger = spawn(
            manager.address,
            name="stranger",
            extra_args=["--key-file", other],
            stderr=subprocess.DEVNULL,
        )
        try:
            assert stranger.wait(timeout=60) == EXIT_AUTH_FAILED
        finally:
            if stranger.poll() is None:
                stranger.kill()
                stranger.wait()
        waiting = InThread(manager, {"x": (slow, 1, 0.0)}, "x")
        message = _wait_for_warning(caplog, "no worker connected", 30)
        assert f"this manager refused 1 handshake {said}" in message or (
            f"handshakes {said}" in message
        ), message
        assert "give those workers this manager's connection file" in message, message
        assert manager.connection_file in message, message
    waiting.join(30)
    assert isinstance(waiting.error, RunCancelled), repr(waiting.error)


# -- the decision, on the loop's timer, driven by hand ----------------------------------


class Exited:
    """A local worker process as the loop sees it: ``poll`` says it ended, and how."""

    def __init__(self, name: str, pid: int, returncode: int | None) -> None:
        self.args = [sys.executable, "-m", "daskvine_py.worker", "--name", name]
        self.pid = pid
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


@pytest.fixture
def bare_loop():
    """An I/O loop with no thread and no workers; its local processes are ``Exited``."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    io = loop.IOLoop(
        router,
        s.SchedulerState(),
        ManagerOptions(security=False),
        [],
        connection_file="/where/it/is.json",
    )
    try:
        yield io
    finally:
        io.close_pipe()
        router.close(linger=0)
        context.term()


def _submitted(io: loop.IOLoop, run_id: int = 1) -> Run:
    run = Run(run_id)
    run.info = RunInfo(run_id, tasks=1)
    event = s.SubmitRun(run_id, [s.NewTask("x", b"", (), (), 0)], ["x"], 0)
    io.command(Submit(run, event, False))
    io._drain_commands()
    io._apply_events()
    return run


def test_the_warning_comes_once_after_the_grace_period(bare_loop, caplog):
    caplog.set_level(logging.WARNING, logger="daskvine_py.manager")
    run = _submitted(bare_loop)
    grace = vacancy.NO_WORKER_GRACE
    for now in (0.0, grace / 2, grace + 0.1, grace + 1, 10 * grace):
        bare_loop._check_timers(now)
    warned = _warnings_saying(caplog, "no worker connected")
    assert len(warned) == 1, warned
    assert "run 1 has waited" in warned[0]
    assert "--connection-file /where/it/is.json" in warned[0]
    assert not run.done.is_set()  # it waits on: a worker may join


def test_no_warning_without_a_waiting_run(bare_loop, caplog):
    caplog.set_level(logging.WARNING, logger="daskvine_py.manager")
    for now in (0.0, 100.0, 200.0):
        bare_loop._check_timers(now)
    assert not _warnings_saying(caplog, "no worker connected")


def test_every_local_worker_ended_fails_the_waiting_runs_naming_them(bare_loop):
    bare_loop.local_processes.extend(
        [Exited("local-0", 11, -signal.SIGKILL), Exited("local-1", 12, EXIT_AUTH_FAILED)]
    )
    run = _submitted(bare_loop)
    bare_loop._check_timers(0.0)
    assert run.done.is_set() and isinstance(run.failure, NoWorkersLeft)
    message = str(run.failure)
    assert "local-0 (pid 11) was killed by SIGKILL" in message, message
    assert "local-1 (pid 12) exited with code 4 (it could not authenticate" in message, message
    assert "--connection-file /where/it/is.json" in message, message
    assert not bare_loop.watching.runs
    assert [type(e) for e in bare_loop.events] == [s.CancelRun]  # its tasks leave the state


def test_a_local_worker_still_running_keeps_the_run_waiting(bare_loop):
    bare_loop.local_processes.extend([Exited("local-0", 11, 0), Exited("local-1", 12, None)])
    run = _submitted(bare_loop)
    bare_loop._check_timers(0.0)
    assert not run.done.is_set()


def test_a_pool_sizing_workers_keeps_the_run_waiting_and_says_so(bare_loop, caplog):
    caplog.set_level(logging.WARNING, logger="daskvine_py.manager")
    bare_loop.local_processes.append(Exited("local-0", 11, -signal.SIGKILL))
    bare_loop.registry.wants_demand = True
    run = _submitted(bare_loop)
    for now in (0.0, vacancy.NO_WORKER_GRACE + 1):
        bare_loop._check_timers(now)
    assert not run.done.is_set()
    (warned,) = _warnings_saying(caplog, "no worker connected")
    assert "a worker pool is sizing workers to the work" in warned, warned


# -- the progress bar ----------------------------------------------------------------


class Stream(io.StringIO):
    """stderr as a terminal, or as a pipe."""

    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def _count_to(total: int, done: threading.Event) -> list[int]:
    """A counter a thread brings to ``total`` over about a second, then sets ``done``."""
    counted = [0]

    def count() -> None:
        for _ in range(total):
            time.sleep(1.0 / total)
            counted[0] += 1
        done.set()

    threading.Thread(target=count, daemon=True).start()
    return counted


@pytest.mark.timeout(30)
def test_progress_into_a_pipe_is_plain_lines(monkeypatch):
    monkeypatch.setattr(progress, "LINE_PERIOD", 0.3)
    err = Stream(terminal=False)
    monkeypatch.setattr(sys, "stderr", err)
    done = threading.Event()
    counted = _count_to(50, done)
    progress.wait_with_progress(done, lambda: counted[0], 50)
    text = err.getvalue()
    assert "\r" not in text and text.endswith("\n"), repr(text)
    lines = text.splitlines()
    assert len(lines) >= 3, lines  # the start, at least one on the way, the end
    assert all(line.startswith("daskvine_py: ") for line in lines), lines
    assert lines[0].startswith("daskvine_py: 0/50 tasks (0%)"), lines
    assert lines[-1].startswith("daskvine_py: 50/50 tasks (100%)"), lines


@pytest.mark.timeout(30)
def test_progress_in_a_terminal_redraws_one_bar(monkeypatch):
    err = Stream(terminal=True)
    monkeypatch.setattr(sys, "stderr", err)
    done = threading.Event()
    counted = _count_to(20, done)
    progress.wait_with_progress(done, lambda: counted[0], 20)
    text = err.getvalue()
    assert "\r" in text and "20/20" in text and text.endswith("\n"), repr(text)
    assert text.count("\n") == 1, repr(text)  # redrawn in place, finished once


@pytest.mark.timeout(30)
def test_progress_in_a_terminal_that_reports_no_size_draws_the_bar_80_wide(monkeypatch):
    """A pty nobody sized (no TIOCSWINSZ) reports 0 columns and 0 rows: the bar is still
    drawn, for a terminal of 80 columns, not as an empty line."""
    master, slave = os.openpty()
    try:
        assert os.get_terminal_size(slave) == (0, 0)
        err = open(slave, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        monkeypatch.setattr(sys, "stderr", err)
        done = threading.Event()
        counted = _count_to(20, done)
        progress.wait_with_progress(done, lambda: counted[0], 20)
        err.close()
        drawn = b""
        while select.select([master], [], [], 0)[0]:
            drawn += os.read(master, 1 << 16)
    finally:
        os.close(master)
        os.close(slave)
    text = drawn.decode()
    redraws = [line for line in text.split("\r") if line.strip()]
    assert redraws and "20/20" in redraws[-1] and "100%|" in redraws[-1], repr(text)
    assert all(line.startswith("daskvine_py:") for line in redraws), repr(text)
    assert max(len(line.rstrip("\n")) for line in redraws) == 79, repr(text)  # 80 columns


# -- python -m daskvine_py -----------------------------------------------------------


def test_the_command_line_says_what_it_is_and_points_to_the_others(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "Dask graphs" in out and "--version" in out
    for command in (
        "python -m daskvine_py.worker",
        "daskvine-py-worker",
        "python -m daskvine_py.factory",
        "daskvine-py-factory",
    ):
        assert command in out, out
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"daskvine_py {daskvine_py.__version__}"


def test_the_demo_without_dask_array_says_to_install_the_demo_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dask.array", None)  # import dask.array: ImportError
    with pytest.raises(SystemExit) as exited:
        cli.main(["demo"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "pip install -e '.[demo]'" in err and "daskvine-py[demo]" in err, err
