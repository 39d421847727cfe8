"""The command line of ``python -m daskvine_py.worker`` (``daskvine-py-worker``): its
arguments, and the manager's address and keys they name (arguments, a connection file,
or the environment).

Every value is checked here, where it enters: a bad one is a usage error naming it (exit
status 2, argparse's), never a traceback from deep inside the worker or a hang. A
connection file whose manager ran on this host and has exited is refused at once.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
from collections.abc import Sequence

from daskvine_py import command_line
from daskvine_py.command_line import LOG_LEVELS, MAX_CORES, MAX_MB, integer, seconds
from daskvine_py.wire import security
from daskvine_py.wire.protocol import split_address
from daskvine_py.worker import gpus

#: Tasks one library process runs at once, each in a thread of its own.
MAX_LIB_SLOTS = 1024
#: GPUs one worker may offer.
MAX_GPUS = 1024


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        # the installed command's own name when run as it, for usage lines
        prog="daskvine-py-worker"
        if os.path.basename(sys.argv[0]) == "daskvine-py-worker"
        else "python -m daskvine_py.worker",
        description="Join a daskvine_py manager and run its tasks on this node "
        "(installed as daskvine-py-worker too).",
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
        type=integer(1, MAX_CORES),
        default=os.cpu_count() or 1,
        help=f"library processes to run tasks in, 1 to {MAX_CORES} (default: all cores, "
        f"{os.cpu_count() or 1} here)",
    )
    parser.add_argument(
        "--memory",
        type=integer(1, MAX_MB),
        default=None,
        metavar="MB",
        help="memory for running tasks' allocations and results together, in MB; a task "
        "past its allocation is stopped, results past what is left spill to disk "
        "(default: the node's memory)",
    )
    parser.add_argument(
        "--disk",
        type=integer(0, MAX_MB),
        default=None,
        metavar="MB",
        help="disk for results spilled past --memory, in MB (default: no limit); also the "
        "bound of the node's input cache as this worker's libraries fill it (default: 10 GiB)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="where the worker makes its own directory for task directories and spill "
        "files, removed at exit (default: the system temp dir)",
    )
    parser.add_argument(
        "--software-cache",
        default=None,
        metavar="DIR",
        help="where the environments and code that runs ship are kept, shared by the "
        "workers of this node and kept across their restarts (default: "
        "$DASKVINE_PY_SOFTWARE_CACHE, else daskvine_py-UID/software in the system temp dir)",
    )
    parser.add_argument(
        "--input-cache",
        default=None,
        metavar="DIR",
        help="where the remote inputs of runs with cache_inputs are kept, shared by the "
        "workers of this node (default: $DASKVINE_PY_INPUT_CACHE, else "
        "daskvine_py-UID/inputs in the system temp dir): node-local, for its file locks",
    )
    parser.add_argument(
        "--lib-cores",
        type=integer(1, MAX_CORES),
        default=1,
        metavar="C",
        help="cores per library process: the worker runs cores // C libraries (default 1)",
    )
    parser.add_argument(
        "--lib-slots",
        type=integer(1, MAX_LIB_SLOTS),
        default=1,
        metavar="S",
        help=f"tasks each library process runs at once, in threads, 1 to {MAX_LIB_SLOTS} "
        "(default 1)",
    )
    parser.add_argument(
        "--gpus",
        type=integer(0, MAX_GPUS),
        default=None,
        metavar="N",
        help="GPUs for tasks that ask for some, each a task's own while it runs: the "
        "first N devices CUDA_VISIBLE_DEVICES names if set, else 0 to N-1 (default: "
        "those CUDA_VISIBLE_DEVICES names if set, else those nvidia-smi -L lists, else 0)",
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
        type=integer(0, 65535),
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
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="exit after this long without hearing from the manager, counted from when "
        "the registration is sent (default 30). While connected to it (the handshake "
        "done), a registration waits for its answer 20 times as long, with one warning "
        "past the first timeout: a manager welcoming many workers is busy, not gone",
    )
    parser.add_argument(
        "--fetch-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="ask a result's next holder when a peer has not served it within this long "
        "(default 10)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="INFO: one line when the worker joins, loses the manager and leaves, never "
        "one per task; WARNING: faults only (default INFO)",
    )
    args = parser.parse_args(argv)
    _check_threads(parser, args)
    try:
        args.gpus = gpus.detect(args.gpus)  # device ids
    except ValueError as exc:
        parser.error(str(exc))
    if args.workdir is not None and not args.workdir.strip():
        parser.error("--workdir: an empty path names no directory")
    if args.workdir is not None and os.path.exists(args.workdir):
        if not os.path.isdir(args.workdir) or not os.access(args.workdir, os.W_OK | os.X_OK):
            parser.error(f"--workdir {args.workdir}: not a directory this user can write to")
    try:
        args.address, args.keys = _connection(args)
    except (security.SecurityError, ValueError) as exc:
        parser.error(str(exc))
    if args.host is not None or args.peer_port != 0:
        _check_host(parser, args.host, args.peer_port)
    return args


def _check_threads(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The libraries and their threads must fit in what this user may run (``ulimit -u``
    counts threads as processes)."""
    libraries = command_line.libraries(args.cores, args.lib_cores)
    needed = libraries * (args.lib_slots + 1)
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and needed > soft:
        parser.error(
            f"--cores {args.cores} --lib-cores {args.lib_cores} --lib-slots {args.lib_slots} "
            f"needs {needed} processes and threads, past this user's limit of {soft} "
            "(ulimit -u)"
        )


def _check_host(parser: argparse.ArgumentParser, host: str | None, port: int) -> None:
    """``--host`` must be an address of this host that peers can be served on (and
    ``--peer-port`` free there): found now, not as a traceback once the worker binds."""
    try:
        split_address(f"tcp://{host or '0.0.0.0'}:1")
        infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM)
    except (ValueError, OSError, UnicodeError) as exc:
        parser.error(f"--host {host!r} is not a host name or IP address: {exc}")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            given = [f"--host {host!r}"] if host else []
            given += [f"--peer-port {port}"] if port else []
            what = " ".join(given)
            parser.error(f"{what}: cannot serve peers there: {exc.strerror or exc}")


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
        connection = security.read_live_connection_file(path)
        try:
            address = args.address or _manager_address(connection.address)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"connection file {path}: {exc}") from None
        return address, connection.keys
    if args.address is None:
        raise ValueError(
            "the manager's address is needed: give tcp://HOST:PORT or --connection-file"
        )
    if args.key_file is not None:
        return args.address, security.read_key_file(args.key_file)
    return args.address, None


def counted(n: int, one: str, many: str | None = None) -> str:
    """``1 core``, ``2 cores``: what the worker's lifecycle lines say."""
    return f"{n} {one if n == 1 else many or one + 's'}"
