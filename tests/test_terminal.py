"""What a user at a terminal meets: Ctrl-C in a real pty, a manager killed outright."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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

#: A manager with one local worker that says its pid and waits to be killed.
DOOMED = textwrap.dedent(
    """
    import time
    from daskvine_py import Manager

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
        [sys.executable, str(script)], stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True, close_fds=True,
    )  # fmt: skip
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
    own, leave by themselves once it is silent past their ``--manager-timeout`` (30 s)."""
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
