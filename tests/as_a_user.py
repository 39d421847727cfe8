"""Run a script as a reader of the docs would: ``python SCRIPT`` in a directory of its own.

Shared by the examples' and the docs' snippets' tests. The script sees this checkout's
package, a home and a temporary directory under the test's ``tmp_path`` (so connection
files, key files and ``~`` stay there), and a marker in its environment that its worker
processes inherit: a process still carrying it once the script ended is a leftover.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import daskvine_py
from daskvine_py.wire import security

#: this checkout's ``src``, first on the script's path
SRC = os.path.dirname(os.path.dirname(daskvine_py.__file__))

#: the environment variable that marks a script's processes, and its workers'
MARKER = "DASKVINE_PY_TEST_SCRIPT"


def run_script(
    script: Path, cwd: Path, tmp_path: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python script *args`` in ``cwd``; its output, whatever its status.

    On ``timeout`` it gets SIGTERM (a manager then closes and stops its workers), then
    SIGKILL, and ``subprocess.TimeoutExpired`` is raised. Processes it left behind are
    killed and reported as an ``AssertionError``.
    """
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    temp.mkdir(exist_ok=True)
    marker = uuid.uuid4().hex
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
        HOME=str(home),
        TMPDIR=str(temp),
        **{MARKER: marker},
    )
    for name in (security.CONNECTION_FILE_ENV, security.CONNECTION_DIR_ENV):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    finally:
        left = processes_marked(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"{script.name} left processes behind: {left}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def processes_marked(marker: str) -> list[int]:
    """This user's processes whose environment holds ``MARKER=marker`` (Linux's /proc)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                environ = file.read().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if needle in environ:
            found.append(int(entry))
    return found
