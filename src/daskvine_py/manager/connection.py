"""How workers reach a manager: its keys and its connection file.

The ``Manager`` binds its ROUTER with the keys ``manager_keys`` finds or makes, and
writes what a worker needs to join (address and keys, ``security``) with
``write_connection_file``; ``remove_paths`` removes what it made when it closes.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
import tempfile

import zmq

from daskvine_py.errors import BindError
from daskvine_py.options import ManagerOptions
from daskvine_py.wire import security

logger = logging.getLogger("daskvine_py.manager")

#: this machine's name: connection files are named after it, and a wildcard bind is
#: reached at it
HOSTNAME = socket.gethostname()


def manager_keys(options: ManagerOptions) -> security.Keys | None:
    """The run's keys: none without security, else from ``key_file`` (made if missing)."""
    if not options.security:
        return None
    if options.key_file is None:
        return security.Keys.generate()
    path = os.fspath(options.key_file)
    if os.path.exists(path):
        return security.read_key_file(path, need_manager_secret=True)
    keys = security.Keys.generate()
    security.write_key_file(path, keys)
    return keys


#: Connections the kernel holds for the ROUTER until libzmq accepts them (capped by
#: ``net.core.somaxconn``). ZeroMQ's default, 100, is less than a batch system's join
#: storm: past it, connection attempts are dropped and retried seconds later, and a
#: worker that cannot connect gives up after its ``--manager-timeout``.
BACKLOG = 4096


def bind(router: zmq.Socket[bytes], host: str, port: int) -> int:
    """Bind ``router`` on ``host`` at ``port`` (0: a free one); the port bound. ZeroMQ's
    errors ("No such device") become a ``BindError`` saying what to change."""
    router.setsockopt(zmq.BACKLOG, BACKLOG)
    try:
        if port:
            router.bind(f"tcp://{host}:{port}")
            return port
        return router.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as exc:
        raise bind_error(host, port, exc) from exc


def bind_error(host: str, port: int, exc: zmq.ZMQError) -> BindError:
    """What a failed bind of ``host``:``port`` means, and what to do about it."""
    if exc.errno == errno.EADDRINUSE:
        reason = (
            f"port {port} is already in use (another manager or program listens on it): "
            "choose another port, or port=0 for a free one"
        )
    elif exc.errno in (errno.ENODEV, errno.EADDRNOTAVAIL, errno.EINVAL):
        reason = (
            f"{host!r} is not an address, host name or interface of this machine "
            f"({exc.strerror}): give one of this machine's addresses, '0.0.0.0' to "
            "listen on all of them, or '127.0.0.1' for local workers only"
        )
    elif exc.errno == errno.EACCES:
        reason = f"permission denied for port {port} (ports below 1024 need privileges)"
    else:
        reason = str(exc.strerror)
    return BindError(host, port, exc.errno, reason)


def reachable(host: str, port: int) -> str:
    """The address workers reach a manager bound on ``host`` at: a wildcard bind is
    reached at this host's name."""
    if host in ("0.0.0.0", "::", "*"):
        host = HOSTNAME
    return f"tcp://{host}:{port}"


def split_host(address: str) -> str:
    """The host of a ``tcp://host:port`` address."""
    return address[len("tcp://") :].rsplit(":", 1)[0]


def write_connection_file(
    path: str | os.PathLike[str] | None, address: str, keys: security.Keys | None
) -> tuple[str, list[str]]:
    """Write the connection file; its path, and what to remove when the manager closes
    (nothing when the caller chose the path: with ``key_file`` it outlives the manager)."""
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        security.write_connection_file(path, address, keys)
        return path, []
    port = address.rsplit(":", 1)[1]
    name = f"manager-{HOSTNAME}-{os.getpid()}-{port}.json"
    try:
        directory = security.private_dir(security.default_connection_dir())
        path = os.path.join(directory, name)
        security.write_connection_file(path, address, keys)
        remove_stale(directory)
        return path, [path]
    except OSError:  # no writable home directory: a private temporary one
        directory = tempfile.mkdtemp(prefix="daskvine-py-")
        path = os.path.join(directory, name)
        security.write_connection_file(path, address, keys)
        return path, [path, directory]


def remove_stale(directory: str) -> list[str]:
    """Remove the connection files in ``directory`` of managers that ended uncleanly
    (SIGKILL, a crash) on this host: their process is gone. Files of other hosts (a home
    directory shared by a cluster) and of live processes stay. The paths removed."""
    removed: list[str] = []
    prefix = f"manager-{HOSTNAME}-"
    for path, connection in security.connection_files(directory):  # (unreadable: left)
        if os.path.basename(path).startswith(prefix) and connection.manager_gone():
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    if removed:
        logger.info("removed %d connection file(s) of managers no longer running", len(removed))
    return removed


def remove_paths(paths: list[str]) -> None:
    """Remove files, then the (empty) directories made for them."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path) if os.path.isfile(path) else os.rmdir(path)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (only it may go unsecured
    without a warning)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
