"""A real XRootD server on 127.0.0.1 for the tests that read over ``root://``.

``XRootDServer`` starts Debian's ``xrootd`` (package xrootd-server) with
``scripts/xrootd-server.sh`` on a free port, serving a directory of its own (readable by
``nobody``, whom xrootd runs as when started by root), and stops it on leaving its
``with`` block::

    with XRootDServer() as server:
        url = server.put("samples/nano_dy.root")  # root://127.0.0.1:PORT//DIR/nano_dy.root

The server listens on 127.0.0.1 only (the script hands xrootd a socket bound there and
checks with ``ss``). ``unavailable()`` says why it cannot be started here.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "xrootd-server.sh"
#: the script's exit status when the port is taken
PORT_IN_USE = 3


def unavailable() -> str | None:
    """Why an XRootD server cannot be started here (None: it can)."""
    if shutil.which("xrootd") is None:
        return "xrootd is not installed (apt-get install xrootd-server)"
    for tool, package in (("python3", "python3"), ("ss", "iproute2"), ("bash", "bash")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("nobody")
        except KeyError:
            return "there is no user nobody for xrootd to run as (it refuses root)"
    return None


class XRootDServer:
    """One xrootd process serving ``directory`` (default: a fresh one, removed at the end)
    as ``root://127.0.0.1:PORT//ABSOLUTE/PATH``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, tries: int = 10) -> None:
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="daskvine-xrootd-"))
        self.directory = self.directory.resolve()
        self.tries = tries
        self.port: int | None = None
        self._state = Path(tempfile.mkdtemp(prefix="daskvine-xrootd-state-"))
        self.pidfile = self._state / "xrootd.pid"
        self.log = self._state / "xrootd.log"

    def start(self) -> XRootDServer:
        if self._own_directory:
            self.directory.chmod(0o755)  # xrootd runs as nobody under root
        failures = []
        for _ in range(self.tries):
            port = random.randint(20000, 32000)  # below the ephemeral ports
            done = subprocess.run(
                ["bash", str(SCRIPT), "start", str(self.directory), str(port)]
                + [str(self.pidfile), str(self.log)],
                capture_output=True,
                text=True,
                timeout=90,
            )
            if done.returncode == 0:
                self.port = port
                return self
            failures.append(f"port {port}: status {done.returncode}\n{done.stderr}")
            if done.returncode != PORT_IN_USE:
                break
        self.close()
        raise RuntimeError("xrootd did not start:\n" + "\n".join(failures))

    @property
    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text())
        except (OSError, ValueError):
            return None

    def url(self, path: str | os.PathLike[str]) -> str:
        """The ``root://`` URL of ``path``, an absolute path under ``directory``."""
        if self.port is None:
            raise RuntimeError("the server is not running")
        path = Path(path)
        if not path.is_absolute():
            raise ValueError(f"not an absolute path: {path}")
        return f"root://127.0.0.1:{self.port}/{path}"

    def put(self, source: str | os.PathLike[str], name: str | None = None) -> str:
        """Copy a file into the served directory (readable by all); return its URL."""
        target = self.directory / (name or Path(source).name)
        shutil.copyfile(source, target)
        target.chmod(0o644)
        return self.url(target)

    def close(self) -> None:
        """Stop the server (waiting until it is gone) and remove what it was given."""
        if self.pidfile.exists() or Path(f"{self.pidfile}.state").exists():
            subprocess.run(["bash", str(SCRIPT), "stop", str(self.pidfile)], check=True, timeout=60)
        self.port = None
        shutil.rmtree(self._state, ignore_errors=True)
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> XRootDServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
