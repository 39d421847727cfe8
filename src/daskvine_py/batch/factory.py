"""``python -m daskvine_py.factory``: a worker pool on a batch system, for a manager elsewhere.

::

    python -m daskvine_py.factory --batch slurm --connection-file PATH \\
        --max-workers 50 --cores 12 --memory 24000 --idle-timeout 120 \\
        --worker-init "module load python; source ~/venv/bin/activate" \\
        --scheduler-options "#SBATCH --partition=short"

Run on a login node (where ``sbatch``, ``condor_submit``... work), it is the pool that
``manager.scale`` starts inside the manager's process (``pool.WorkerPool``, the same
class), for a manager running anywhere its connection file names: a notebook on another
machine, a job of its own. It learns how much work is waiting through a
``status.StatusClient`` (an authenticated ``StatusRequest`` on the port workers dial), and
retires idle workers through it. Its jobs run ``python -m daskvine_py.worker
--connection-file PATH``: the file must be readable at the same path where they land (a
shared home directory). Its keys never appear on a command line.

SIGINT or SIGTERM cancels every job the factory started, then it exits (status 0). Exit
statuses otherwise: 2 for bad arguments or a connection file that cannot be used, 4 when
the manager refuses it (keys of another run, another protocol version).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from daskvine_py.batch.pool import WorkerPool
from daskvine_py.batch.status import StatusClient
from daskvine_py.wire import security

logger = logging.getLogger("daskvine_py.factory")

#: The batch systems of ``--batch``, and the Parsl provider for each.
PROVIDERS = {
    "slurm": "SlurmProvider",
    "condor": "CondorProvider",
    "pbs": "PBSProProvider",
    "lsf": "LSFProvider",
    "sge": "GridEngineProvider",
    "local": "LocalProvider",
}
EXIT_USAGE = 2
EXIT_REFUSED = 4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m daskvine_py.factory",
        description="Keep worker jobs on a batch system, sized to a daskvine_py manager's "
        "work (through Parsl's providers).",
    )
    parser.add_argument(
        "--batch",
        required=True,
        choices=sorted(PROVIDERS),
        help="the batch system to submit worker jobs to",
    )
    parser.add_argument(
        "--connection-file",
        metavar="PATH",
        default=None,
        help="the manager's connection file (manager.connection_file), readable at the "
        f"same path where the jobs run (default: ${security.CONNECTION_FILE_ENV})",
    )
    parser.add_argument(
        "--min-workers",
        type=int,
        default=0,
        metavar="N",
        help="worker jobs kept even without work (default 0)",
    )
    parser.add_argument(
        "--max-workers", type=int, default=1, metavar="N", help="worker jobs at most (default 1)"
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=1,
        metavar="N",
        help="each worker's cores, requested from the batch system (default 1)",
    )
    parser.add_argument(
        "--memory",
        type=int,
        default=None,
        metavar="MB",
        help="each worker's memory for results (its --memory), also requested from the "
        "batch system where the provider can (Slurm, HTCondor, PBS)",
    )
    parser.add_argument(
        "--disk",
        type=int,
        default=None,
        metavar="MB",
        help="each worker's disk for spilled results (its --disk)",
    )
    parser.add_argument(
        "--worker-init",
        default="",
        metavar="COMMANDS",
        help='shell commands a job runs before the worker, e.g. "module load python; '
        'source ~/venv/bin/activate"',
    )
    parser.add_argument(
        "--scheduler-options",
        action="append",
        default=[],
        metavar="LINE",
        help='a line for the job description, e.g. "#SBATCH --partition=short" or '
        "'+JobFlavour = \"workday\"' (repeatable)",
    )
    parser.add_argument(
        "--walltime",
        default="01:00:00",
        metavar="HH:MM:SS",
        help="each job's time limit (default 01:00:00)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="retire a worker idle this long, beyond --min-workers (default 60)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often to ask the manager and the batch system (default 5)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        metavar="PATH",
        help="the Python that runs the worker where a job lands (default: this one)",
    )
    parser.add_argument(
        "--script-dir",
        default=None,
        metavar="DIR",
        help="where job scripts and their output go; jobs must be able to write there "
        "(default: a new directory under ~/.daskvine_py/jobs)",
    )
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    if args.cores < 1:
        parser.error(f"--cores must be >= 1, not {args.cores}")
    if not 0 <= args.min_workers <= args.max_workers or args.max_workers < 1:
        parser.error(
            "need 0 <= --min-workers <= --max-workers and --max-workers >= 1, got "
            f"{args.min_workers} and {args.max_workers}"
        )
    for flag in ("idle_timeout", "poll_interval"):
        if not 0 < getattr(args, flag) < math.inf:
            parser.error(f"--{flag.replace('_', '-')} must be a number > 0")
    path = args.connection_file or os.environ.get(security.CONNECTION_FILE_ENV)
    if not path:
        parser.error(
            "the manager's connection file is needed: --connection-file PATH or "
            f"${security.CONNECTION_FILE_ENV}"
        )
    try:
        security.read_connection_file(path)
    except security.SecurityError as exc:
        parser.error(str(exc))
    args.connection_file = path
    return args


def make_provider(args: argparse.Namespace) -> Any:
    """The Parsl provider of ``--batch``, asking for each job what the worker uses."""
    try:
        from parsl import providers
        from parsl.launchers import SimpleLauncher
    except ImportError as exc:
        raise SystemExit(
            f"python -m daskvine_py.factory needs Parsl's providers ({exc}): "
            "pip install 'daskvine-py[batch]'"
        ) from None
    options = "".join(line.rstrip("\n") + "\n" for line in args.scheduler_options)
    common: dict[str, Any] = {"init_blocks": 0, "min_blocks": 0, "max_blocks": args.max_workers,
                              "worker_init": args.worker_init}  # fmt: skip
    if args.batch == "local":
        return providers.LocalProvider(**common)
    common.update(walltime=args.walltime, scheduler_options=options, launcher=SimpleLauncher())
    gigabytes = None if args.memory is None else math.ceil(args.memory / 1024)
    if args.batch == "slurm":
        return providers.SlurmProvider(
            exclusive=False, cores_per_node=args.cores, mem_per_node=gigabytes, **common
        )
    if args.batch == "condor":
        return providers.CondorProvider(cores_per_slot=args.cores, mem_per_slot=gigabytes, **common)
    if args.batch == "pbs":
        select = "" if args.memory is None else f"mem={args.memory}mb"
        return providers.PBSProProvider(cpus_per_node=args.cores, select_options=select, **common)
    if args.batch == "lsf":
        return providers.LSFProvider(
            request_by_nodes=False, cores_per_block=args.cores, cores_per_node=args.cores, **common
        )
    return providers.GridEngineProvider(**common)  # cores: a parallel environment option


def default_script_dir() -> str:
    directory = security.private_dir(os.path.join(os.path.expanduser("~"), ".daskvine_py", "jobs"))
    return tempfile.mkdtemp(prefix=f"factory-{socket.gethostname()}-{os.getpid()}-", dir=directory)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    client = StatusClient(args.connection_file, f"factory-{socket.gethostname()}-{os.getpid()}")
    try:
        provider = make_provider(args)
        provider.script_dir = args.script_dir or default_script_dir()
        os.makedirs(provider.script_dir, exist_ok=True)
    except BaseException:
        client.close()
        raise
    stop = threading.Event()

    def on_signal(number: int, frame: Any) -> None:
        logger.info("%s: cancelling the jobs and exiting", signal.Signals(number).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pool = WorkerPool(
        client,
        provider,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        cores=args.cores,
        memory=args.memory,
        disk=args.disk,
        idle_timeout=args.idle_timeout,
        poll_interval=args.poll_interval,
        python=args.python,
    )
    logger.info(
        "pool %s for the manager at %s: %s jobs (scripts and output in %s)",
        pool.name,
        client.address,
        args.batch,
        provider.script_dir,
    )
    code = 0
    seen: Any = None
    try:
        while not stop.wait(min(1.0, args.poll_interval)):
            if client.refused is not None:
                logger.error(
                    "the manager will not answer: %s; cancelling the jobs and exiting",
                    client.refused,
                )
                code = EXIT_REFUSED
                break
            status = pool.status()
            if (status["jobs"], status["workers"]) != seen:
                seen = status["jobs"], status["workers"]
                logger.info("jobs %s, workers %s", status["jobs"], status["workers"])
    finally:
        pool.close()
        client.close()
    return code

