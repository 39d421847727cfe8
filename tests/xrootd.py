"""A real XRootD server on 127.0.0.1 for the tests that read over ``root://``.

``XRootDServer`` starts Debian's ``xrootd`` (package xrootd-server) with
``scripts/xrootd-server.sh`` on a free port, serving a directory of its own (readable by
``nobody``, whom xrootd runs as when started by root), and stops it on leaving its
``with`` block::

    with XRootDServer() as server:
        url = server.put("samples/nano_dy.root")  # root://127.0.0.1:PORT//DIR/nano_dy.root

The server listens on 127.0.0.1 only (the script hands xrootd a socket bound there and
checks with ``ss``). ``unavailable()`` says why it cannot be started here.

``stop()`` (or ``stop(kill=True)``: SIGKILL, as a crash) ends the server and keeps its
directory and port; ``start()`` again serves them on the same port (a restart).

``GSI`` makes a throwaway certificate authority, a host certificate for the server and a
user certificate with a proxy of it (``openssl``, ``xrdgsiproxy``); a server given
``XRootDServer(gsi=...)`` accepts only GSI (X.509) clients. ``gsi_unavailable()`` says
why that cannot be done here.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
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

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        tries: int = 10,
        gsi: GSI | None = None,
    ) -> None:
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="daskvine-xrootd-"))
        self.directory = self.directory.resolve()
        self.tries = tries
        self.gsi = gsi
        self.port: int | None = None
        #: the port of the last start, taken again by the next (a restart)
        self._last_port: int | None = None
        self._state = Path(tempfile.mkdtemp(prefix="daskvine-xrootd-state-"))
        self.pidfile = self._state / "xrootd.pid"
        self.log = self._state / "xrootd.log"

    def start(self) -> XRootDServer:
        if self._own_directory:
            self.directory.chmod(0o755)  # xrootd runs as nobody under root
        extra: list[str] = []
        environment = dict(os.environ)
        if self.gsi is not None:
            extra = [str(self.gsi.server_config)]
            environment.update(self.gsi.client_env())  # for the script's readiness check
        failures = []
        for _ in range(self.tries):
            # below the ephemeral ports; a restart takes its port again
            port = self._last_port or random.randint(20000, 32000)
            done = subprocess.run(
                ["bash", str(SCRIPT), "start", str(self.directory), str(port)]
                + [str(self.pidfile), str(self.log), *extra],
                capture_output=True,
                text=True,
                timeout=90,
                env=environment,
            )
            if done.returncode == 0:
                self.port = self._last_port = port
                return self
            failures.append(f"port {port}: status {done.returncode}\n{done.stderr}")
            if done.returncode != PORT_IN_USE:
                break
            if self._last_port is not None:
                # a restart: the killed server's last threads may still hold the port
                time.sleep(0.2)
        self.close()
        raise RuntimeError("xrootd did not start:\n" + "\n".join(failures))

    def stop(self, kill: bool = False) -> None:
        """Stop the server, waiting until it is gone (``kill``: at once, with SIGKILL, as
        a crash would); its directory and port stay for the next ``start``."""
        pid = self.pid
        if kill and pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.pidfile.exists() or Path(f"{self.pidfile}.state").exists():
            subprocess.run(["bash", str(SCRIPT), "stop", str(self.pidfile)], check=True, timeout=60)
        self.port = None

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
        self.stop()
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


# -- GSI: X.509 certificates and a proxy ---------------------------------------------------

#: the server's certificate is for "localhost"; the client checks its CN against the host it
#: asked ("127.0.0.1" here), unless this variable lists the names it may bear
SERVER_NAMES = "XrdSecGSISRVNAMES"


def gsi_unavailable() -> str | None:
    """Why a GSI server and its proxy cannot be made here (None: they can)."""
    why = unavailable()
    if why is not None:
        return why
    for tool, package in (("openssl", "openssl"), ("xrdgsiproxy", "xrootd-client")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    libraries = [
        "/usr/lib/*/libXrdSecgsi-[0-9]*.so",
        "/usr/lib/libXrdSecgsi-[0-9]*.so",
        "/usr/lib64/libXrdSecgsi-[0-9]*.so",
    ]
    if not any(glob.glob(pattern) for pattern in libraries):
        return (
            "xrootd's GSI plugin (libXrdSecgsi) is not installed (apt-get install xrootd-plugins)"
        )
    return None


class GSI:
    """A throwaway CA under ``directory`` (made world-readable where the server must read
    it), a host certificate and key for the server, a user certificate and key, and a
    proxy of the user's (``xrdgsiproxy init``), valid for a day."""

    SUBJECT = "/DC=test/O=daskvine_py"

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="daskvine-gsi-")).resolve()
        self.directory.chmod(0o755)  # xrootd (nobody, under root) reads the host's files
        self.cert_dir = self.directory / "certificates"
        self.host_cert = self.directory / "hostcert.pem"
        self.host_key = self.directory / "hostkey.pem"
        self.user_cert = self.directory / "usercert.pem"
        self.user_key = self.directory / "userkey.pem"
        self.proxy = self.directory / "x509up"
        self.server_config = self.directory / "gsi.cfg"
        self.user_subject = f"{self.SUBJECT}/CN=daskvine_py test user"
        self._make()

    def _openssl(self, *arguments: str) -> str:
        done = subprocess.run(
            ["openssl", *arguments], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(arguments)} failed:\n{done.stderr}")
        return done.stdout

    def _make(self) -> None:
        d = self.directory
        ca_key, ca_cert = d / "ca.key", d / "ca.pem"
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(ca_key), "-out", str(ca_cert),
            "-subj", f"{self.SUBJECT}/CN=daskvine_py test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        self.cert_dir.mkdir()
        digest = self._openssl("x509", "-hash", "-noout", "-in", str(ca_cert)).strip()
        shutil.copyfile(ca_cert, self.cert_dir / f"{digest}.0")
        usages = {
            "host": "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n",
            "user": "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n",
        }
        names = {"host": f"{self.SUBJECT}/CN=localhost", "user": self.user_subject}
        for who, usage in usages.items():
            key, cert = d / f"{who}key.pem", d / f"{who}cert.pem"
            request, extensions = d / f"{who}.csr", d / f"{who}.ext"
            extensions.write_text(usage)
            self._openssl(
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                "-out", str(request), "-subj", names[who],
            )  # fmt: skip
            self._openssl(
                "x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
                "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(extensions),
            )  # fmt: skip
            key.chmod(0o400)
            cert.chmod(0o644)
        for path in self.cert_dir.iterdir():
            path.chmod(0o644)
        self.cert_dir.chmod(0o755)
        if os.geteuid() == 0:  # xrootd runs as nobody, and wants its key its own
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(self.host_key, nobody.pw_uid, nobody.pw_gid)
            os.chown(self.host_cert, nobody.pw_uid, nobody.pw_gid)
        done = subprocess.run(
            ["xrdgsiproxy", "init", "-cert", str(self.user_cert), "-key", str(self.user_key)]
            + ["-certdir", str(self.cert_dir), "-out", str(self.proxy), "-valid", "24:00"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0 or not self.proxy.exists():
            raise RuntimeError(f"xrdgsiproxy init failed:\n{done.stdout}{done.stderr}")
        self.proxy.chmod(0o600)
        self.server_config.write_text(
            "# GSI only (tests/xrootd.py)\n"
            "xrootd.seclib libXrdSec.so\n"
            f"sec.protocol gsi -certdir:{self.cert_dir} -cert:{self.host_cert} "
            f"-key:{self.host_key} -gmapopt:10 -crl:0\n"
            "sec.protbind * only gsi\n"
        )
        self.server_config.chmod(0o644)

    def client_env(self, proxy: bool = True) -> dict[str, str]:
        """The variables a client needs: the CAs, the server's name, and the proxy."""
        env = {"X509_CERT_DIR": str(self.cert_dir), SERVER_NAMES: "localhost"}
        if proxy:
            env["X509_USER_PROXY"] = str(self.proxy)
        return env

    def close(self) -> None:
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> GSI:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.01)
