"""The command line of ``python -m daskvine_py.worker``: its arguments, and the manager's
address and keys they name (arguments, a connection file, or the environment)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from daskvine_py.wire import security
from daskvine_py.wire.protocol import split_address


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m daskvine_py.worker",
        description="Join a daskvine_py manager and run its tasks on this node.",
    )
    parser.add_argument(
        "address",
        nargs="?",
        type=_manager_address,
        help="the manager's address, e.g. tcp://HOST:PORT (default: the connection file's)",
    )
    parser.add_argument(
        "--connection-file",
        metavar="PATH",
        default=None,
        help="the manager's connection file (manager.connection_file): its address and "
        f"keys (default: ${security.CONNECTION_FILE_ENV})",
    )
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        default=None,
        help="keys only, from a connection file or a manager's key file; the address is "
        "given as the first argument",
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count() or 1,
        help="library processes to run tasks in (default: all cores)",
    )
    parser.add_argument(
        "--memory",
        type=int,
        default=None,
        metavar="MB",
        help="memory for results, in MB; past it results spill to disk "
        "(default: the node's memory)",
    )
    parser.add_argument(
        "--disk",
        type=int,
        default=None,
        metavar="MB",
        help="disk for results spilled past --memory, in MB (default: no limit)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="where the worker makes its own directory for task directories and spill "
        "files, removed at exit (default: the system temp dir)",
    )
    parser.add_argument(
        "--lib-cores",
        type=int,
        default=1,
        metavar="C",
        help="cores per library process: the worker runs cores // C libraries (default 1)",
    )
    parser.add_argument(
        "--lib-slots",
        type=int,
        default=1,
        metavar="S",
        help="tasks each library process runs at once, in threads (default 1)",
    )
    parser.add_argument("--name", default=None, help="a name for logs and errors")
    parser.add_argument(
        "--host",
        default=None,
        help="address peers use to reach this worker (default: the "
        "interface that routes to the manager)",
    )
    parser.add_argument(
        "--peer-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port peers fetch results from (default: a free port)",
    )
    parser.add_argument(
        "--contact-address",
        type=_manager_address,
        default=None,
        metavar="tcp://HOST:PORT",
        help="address peers use when it is not the one bound (NAT, port forwarding)",
    )
    parser.add_argument(
        "--manager-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="exit after this long without hearing from the manager",
    )
    parser.add_argument(
        "--fetch-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="ask a result's next holder when a peer has not served it within this long "
        "(default 10)",
    )
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    if not args.fetch_timeout > 0:
        parser.error(f"--fetch-timeout must be > 0, not {args.fetch_timeout}")
    if not 0 <= args.peer_port < 65536:
        parser.error(f"--peer-port must be a port number, not {args.peer_port}")
    try:
        args.address, args.keys = _connection(args)
    except (security.SecurityError, ValueError) as exc:
        parser.error(str(exc))
    return args


def _manager_address(text: str) -> str:
    """An argparse type: ``tcp://HOST:PORT`` with a real port, as a one-line error."""
    try:
        _, port = split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not text.startswith("tcp://") or port == 0:
        raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT, not {text!r}")
    return text


def _connection(args: argparse.Namespace) -> tuple[str, security.Keys | None]:
    """The manager's address and the run's keys, from the arguments or the environment."""
    if args.connection_file and args.key_file:
        raise ValueError("give --connection-file or --key-file, not both")
    path = args.connection_file
    if path is None and args.key_file is None:
        path = os.environ.get(security.CONNECTION_FILE_ENV) or None
    if path is not None:
        connection = security.read_connection_file(path)
        address = args.address or _manager_address(connection.address)
        return address, connection.keys
    if args.address is None:
        raise ValueError(
            "the manager's address is needed: give tcp://HOST:PORT or --connection-file"
        )
    if args.key_file is not None:
        return args.address, security.read_key_file(args.key_file)
    return args.address, None
