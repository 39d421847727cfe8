"""CurveZMQ on every TCP socket: keys, connection files, and the gate that admits peers.

A manager and its workers share one set of keys (``Keys``):

- the manager's key pair: its ROUTER is a CurveZMQ server; the secret half never leaves
  the manager (it is not in the connection file);
- the workers' key pair, which every worker of the run holds: it is the client key a
  worker shows the manager and its peers, and the server key of every worker's peer
  ROUTER, so a worker fetching from a peer checks that the peer holds it too.

A ``Gate`` (pyzmq's ZAP authenticator, run in its own thread) sits behind every server
socket and admits only clients that prove they hold the workers' secret key. Everything
else is refused during the handshake, before a byte reaches ``protocol.decode``, so an
unauthenticated connection can never make anyone unpickle anything. CurveZMQ encrypts
every message after the handshake. The crypto is libzmq's (libsodium); nothing here is.

A connection file (JSON, mode 0600 in a 0700 directory) carries what a worker needs:
the manager's address, its public key, and the workers' key pair, and names the host and
the process that wrote it, so that a worker, a factory or ``status`` on that host given
the file of a manager that has exited says so at once (``read_live_connection_file``).
It is handed to workers by path (``--connection-file``, or ``DASKVINE_PY_CONNECTION_FILE``
in their environment), never on a command line: ``ps`` shows every user's arguments.
Managers write theirs in ``default_connection_dir()`` unless told otherwise, which is
where ``status`` looks for them (``connection_files``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import tempfile
from collections.abc import Mapping
from typing import Any, NamedTuple

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger("daskvine_py.wire.security")

#: Names a connection file to a worker started without ``--connection-file``.
CONNECTION_FILE_ENV = "DASKVINE_PY_CONNECTION_FILE"
#: Where managers write their connection files unless told otherwise.
CONNECTION_DIR_ENV = "DASKVINE_PY_CONNECTION_DIR"
#: Version of the connection and key file formats.
FILE_FORMAT = 1
#: Distinct addresses whose refusals are logged; past it, refusals are only counted
#: (a flood from many addresses must not become a flood of log lines).
MAX_LOGGED_REFUSALS = 100


class SecurityError(ValueError):
    """A key or connection file that cannot be used; the message names the file."""


class StaleConnectionFile(SecurityError):
    """A connection file whose manager has certainly exited (it ran on this host and its
    process is gone): nothing will ever answer at its address."""


class Keys(NamedTuple):
    """The keys of a run, z85-encoded (40 characters each)."""

    manager_public: bytes
    worker_public: bytes
    worker_secret: bytes
    #: only in the manager's own key file: a worker never needs it
    manager_secret: bytes | None = None

    @classmethod
    def generate(cls) -> Keys:
        manager_public, manager_secret = zmq.curve_keypair()
        worker_public, worker_secret = zmq.curve_keypair()
        return cls(manager_public, worker_public, worker_secret, manager_secret)

    def for_workers(self) -> Keys:
        """These keys without the manager's secret half."""
        return self._replace(manager_secret=None)


class Connection(NamedTuple):
    """What a worker needs to join a manager."""

    address: str
    keys: Keys | None  #: None: the manager runs without security
    #: the host and process id of the manager that wrote the file (None: a file written
    #: before they were recorded, or by hand)
    host: str | None = None
    pid: int | None = None

    def manager_gone(self) -> bool:
        """Whether the file's manager has certainly exited: it ran on this host and its
        process is not there. False when that cannot be known here (another host, a file
        without them): the worker then learns it from the manager's silence."""
        if self.pid is None or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # another user's process (EPERM): it is there
            return False
        return False


# -- sockets --------------------------------------------------------------------------


def serve(sock: zmq.Socket[bytes], public: bytes, secret: bytes) -> None:
    """Make ``sock`` a CurveZMQ server (before it binds)."""
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def connect_as_worker(sock: zmq.Socket[bytes], server_public: bytes, keys: Keys) -> None:
    """Make ``sock`` a CurveZMQ client with the workers' keys (before it connects)."""
    sock.curve_serverkey = server_public
    sock.curve_publickey = keys.worker_public
    sock.curve_secretkey = keys.worker_secret


class Gate(ThreadAuthenticator):
    """Admits only CurveZMQ clients that hold ``allowed_key``'s secret half.

    One per ZeroMQ context, started before any server socket of the context binds (a
    server socket with no ZAP handler would admit every key). Each refused address is
    logged once, as a WARNING naming ``owner``; later refusals are only counted.
    """

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], allowed_key: bytes, owner: str
    ) -> None:
        super().__init__(context, log=logging.getLogger("daskvine_py.wire.security.zap"))
        self.owner = owner
        self.allowed_key = allowed_key
        #: handshakes refused since the start (any thread may read it)
        self.refused = 0
        self._logged: set[str] = set()
        self._address = ""
        self.configure_curve_callback("*", self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) > 3:
            self._address = msg[3].decode("ascii", "replace")
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question for a CurveZMQ client: may the holder of ``key`` connect?"""
        if key == self.allowed_key:
            return True
        self.refused += 1
        address = self._address
        if address not in self._logged and len(self._logged) < MAX_LOGGED_REFUSALS:
            self._logged.add(address)
            logger.warning(
                "%s refused a connection from %s: its key is not this run's worker key "
                "(only holders of the connection file may connect; further refusals "
                "from there are not logged)",
                self.owner,
                address or "an unknown address",
            )
        return False


# -- files ----------------------------------------------------------------------------


def default_connection_dir() -> str:
    """``$DASKVINE_PY_CONNECTION_DIR``, else ``~/.daskvine_py/connections``: under the
    home directory, which batch nodes usually share with the login node."""
    configured = os.environ.get(CONNECTION_DIR_ENV)
    if configured:
        return configured
    return os.path.join(os.path.expanduser("~"), ".daskvine_py", "connections")


def private_dir(path: str) -> str:
    """Make ``path`` (and missing parents) with mode 0700; warn if others can enter it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        logger.warning(
            "directory %s is open to other users (mode %o): keys written there are "
            "protected by their own mode 0600 only",
            path,
            mode,
        )
    return path


def write_private_json(path: str, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically, mode 0600 from the first byte."""
    directory = private_dir(os.path.dirname(os.path.abspath(path)))
    fd, temporary = tempfile.mkstemp(prefix=".part-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(data, file, indent=1)
            file.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_connection_file(
    path: str, address: str, keys: Keys | None, host: str | None = None, pid: int | None = None
) -> None:
    """The file a worker joins with: the address and, with security, the keys it needs
    (never the manager's secret key); ``host`` and ``pid``, the manager's (default: this
    host and process, which wrote it)."""
    data: dict[str, Any] = {
        "format": FILE_FORMAT,
        "address": address,
        "security": bool(keys),
        "host": socket.gethostname() if host is None else host,
        "pid": os.getpid() if pid is None else pid,
    }
    if keys is not None:
        data.update(_key_fields(keys.for_workers()))
    write_private_json(path, data)


def write_key_file(path: str, keys: Keys) -> None:
    """A manager's keys, secret half included, to reuse across restarts (``key_file=``)."""
    write_private_json(path, {"format": FILE_FORMAT, **_key_fields(keys)})


def read_connection_file(path: str) -> Connection:
    data = _read_json(path)
    address = data.get("address")
    if not isinstance(address, str) or not address:
        raise SecurityError(f"connection file {path} names no manager address")
    # Files written before the host and pid were recorded (or by hand) have neither.
    host = data.get("host") if isinstance(data.get("host"), str) else None
    pid = data.get("pid")
    pid = pid if type(pid) is int and pid > 0 else None
    if data.get("security") is False:
        return Connection(address, None, host, pid)
    return Connection(address, _keys_from(data, path, need_secret=False), host, pid)


def read_live_connection_file(path: str) -> Connection:
    """``read_connection_file``, refusing at once a file whose manager has exited
    (``StaleConnectionFile``, naming the file and what to do) rather than leave its reader
    to wait for an answer that never comes. What workers, factories and ``status`` read."""
    connection = read_connection_file(path)
    if connection.manager_gone():
        raise StaleConnectionFile(
            f"connection file {path} is stale: the manager that wrote it (process "
            f"{connection.pid} on this host) has exited. Start the manager again and use "
            "the connection file it writes (manager.connection_file)"
        )
    return connection


def connection_files(directory: str) -> list[tuple[str, Connection]]:
    """The connection files in ``directory`` (``*.json``) that can be read, with what
    they hold, by name; anything else there (key files, another user's) is passed over."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            found.append((path, read_connection_file(path)))
        except SecurityError:
            continue
    return found


def read_key_file(path: str, need_manager_secret: bool = False) -> Keys:
    """Keys from a key file or a connection file; ``need_manager_secret`` for a manager."""
    return _keys_from(_read_json(path), path, need_manager_secret)


def _key_fields(keys: Keys) -> dict[str, str]:
    fields = {
        "manager_public_key": keys.manager_public.decode("ascii"),
        "worker_public_key": keys.worker_public.decode("ascii"),
        "worker_secret_key": keys.worker_secret.decode("ascii"),
    }
    if keys.manager_secret is not None:
        fields["manager_secret_key"] = keys.manager_secret.decode("ascii")
    return fields


def _read_json(path: str) -> dict[str, Any]:
    try:
        # Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SecurityError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise SecurityError(
                f"{path} is not a regular file ({_file_kind(status.st_mode)}): "
                "give the path of the file the manager wrote"
            )
        os.set_blocking(fd, True)
        mode = stat.S_IMODE(status.st_mode)
        with os.fdopen(fd) as file:
            fd = -1  # the file owns it now
            data = json.load(file)
    except SecurityError:
        raise
    except OSError as exc:
        raise SecurityError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SecurityError(f"{path} is not a daskvine_py key or connection file: {exc}") from exc
    finally:
        if fd >= 0:
            os.close(fd)
    if not isinstance(data, dict):
        raise SecurityError(f"{path} is not a daskvine_py key or connection file")
    if mode & 0o077:
        logger.warning("%s is readable by other users (mode %o): chmod 600 it", path, mode)
    return data


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _keys_from(data: Mapping[str, Any], path: str, need_secret: bool) -> Keys:
    names = ["manager_public_key", "worker_public_key", "worker_secret_key"]
    if need_secret:
        names.append("manager_secret_key")
    values = []
    for name in names:
        value = data.get(name)
        if not isinstance(value, str) or len(value) != 40:
            raise SecurityError(f"{path} has no valid {name} (40 z85 characters)")
        values.append(value.encode("ascii"))
    keys = Keys(values[0], values[1], values[2], values[3] if need_secret else None)
    _check_pair(keys.worker_public, keys.worker_secret, path, "worker")
    if keys.manager_secret is not None:
        _check_pair(keys.manager_public, keys.manager_secret, path, "manager")
    return keys


def _check_pair(public: bytes, secret: bytes, path: str, whose: str) -> None:
    try:
        derived = zmq.curve_public(secret)
    except (zmq.ZMQError, ValueError) as exc:
        raise SecurityError(f"{path}: the {whose} secret key is not a valid key") from exc
    if derived != public:
        raise SecurityError(f"{path}: the {whose} public and secret keys do not match")


#: Failed CurveZMQ handshakes with the manager, with none succeeding between them, after
#: which a worker gives up. One ZAP refusal or mechanism mismatch is enough: the manager
#: said no, and libzmq does not reconnect after either. Two, not one, for failures
#: without detail: a connection cut mid-handshake looks the same, and it reconnects.
HANDSHAKE_FAILURES = 2
#: Handshake failures after which libzmq drops the connection for good.
_FINAL_HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_HANDSHAKE_FAILURE: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the manager refused this {who}'s key",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the manager speaks another security mechanism",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the manager's key is not the one this {who} has",
}
_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class HandshakeWatch:
    """The CurveZMQ handshakes of a worker's (or a status client's: ``who``) socket to its
    manager, so that one the manager refuses exits saying why, and whether the connection
    is up (``connected``), so that one waiting on a busy manager knows it is not talking
    to nobody. Made before the socket connects."""

    def __init__(self, sock: zmq.Socket[bytes], has_keys: bool, who: str = "worker") -> None:
        self.sock = sock
        self.has_keys = has_keys
        self.who = who
        #: the monitor socket: readable when a handshake ended
        self.events = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
        self.failures = 0
        #: the connection is up: TCP connected and the handshake done (libzmq reports one
        #: for every mechanism, keys or none), not disconnected since. libzmq's own
        #: threads answer handshakes, so a manager whose loop is busy still completes it.
        self.connected = False
        #: handshakes that succeeded: more than one, and the connection was made again
        self.succeeded = 0

    def refusal(self) -> str | None:
        """Why the manager will never take this worker, once the handshakes so far say
        so; None until then. Also keeps ``connected``."""
        while self.events.poll(0):
            event = recv_monitor_message(self.events)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failures = 0
                self.connected = True
                self.succeeded += 1
                continue
            if event == zmq.EVENT_DISCONNECTED:
                self.connected = False
                continue
            self.failures += 1
            if event not in _FINAL_HANDSHAKE_FAILURES and self.failures < HANDSHAKE_FAILURES:
                continue
            if not self.has_keys:
                return f"this {self.who} has no keys, and the manager requires them"
            reason = _HANDSHAKE_FAILURE.get(event, "handshake failed (event {event})")
            return reason.format(who=self.who, event=event)
        return None

    def close(self) -> None:
        self.sock.disable_monitor()
        self.events.close(linger=0)
