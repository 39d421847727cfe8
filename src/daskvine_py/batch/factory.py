"""``python -m daskvine_py.factory`` (``daskvine-py-factory``): a worker pool on a batch
system, for a manager elsewhere.

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

Every argument is checked before anything starts (a usage error naming it, status 2),
and so are the batch system's commands (``sbatch``, ``squeue``, ``scancel`` for Slurm):
without them the factory exits at once, naming what is missing (status 3).

It logs one INFO line when it starts, one whenever its jobs' numbers change (at most
every ``REPORT_INTERVAL`` seconds: submitted, pending, running, ended, and the workers
connected), and one when it stops; nothing per task or per job.

SIGINT or SIGTERM cancels every job the factory started, removes the directory it made
for their scripts (kept when jobs failed: their output is there), then it exits (status
0), at once: a request waiting for the manager's answer is woken rather than waited for.
A factory whose manager is gone (its connection file removed, as a manager does when it
closes, or stale: the manager's process on this host has exited, as a worker checks)
says so and does the same, with status 5: its jobs' workers have nobody to work for. A
manager on another host that stops answering, its file still there, may come back: the
factory waits for it, submitting nothing meanwhile. Exit statuses otherwise: 2 for bad
arguments or a connection file that cannot be used, 3 when the batch system's commands or
Parsl are missing, 4 when the manager refuses it (keys of another run, another protocol
version).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from daskvine_py.batch.pool import BatchSystemMissing, WorkerPool, check_commands
from daskvine_py.batch.status import StatusClient
from daskvine_py.command_line import (
    LOG_LEVELS,
    MAX_CORES,
    MAX_MB,
    configure_logging,
    integer,
    seconds,
)
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
EXIT_NO_BATCH_SYSTEM = 3
EXIT_REFUSED = 4
EXIT_MANAGER_GONE = 5
#: Workers a pool may hold (the other bounds are the worker's, in ``command_line``).
MAX_WORKERS = 100_000
#: Seconds between two log lines about the jobs' numbers, however often they change.
REPORT_INTERVAL = 30.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        # the installed command's own name when run as it, for usage lines
        prog="daskvine-py-factory"
        if os.path.basename(sys.argv[0]) == "daskvine-py-factory"
        else "python -m daskvine_py.factory",
        description="Keep worker jobs on a batch system, sized to a daskvine_py manager's "
        "work (through Parsl's providers). Installed as daskvine-py-factory too.",
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
        type=integer(0, MAX_WORKERS),
        default=0,
        metavar="N",
        help="worker jobs kept even without work (default 0)",
    )
    parser.add_argument(
        "--max-workers",
        type=integer(1, MAX_WORKERS),
        default=1,
        metavar="N",
        help="worker jobs at most (default 1)",
    )
    parser.add_argument(
        "--cores",
        type=integer(1, MAX_CORES),
        default=1,
        metavar="N",
        help=f"each worker's cores, requested from the batch system, 1 to {MAX_CORES} (default 1)",
    )
    parser.add_argument(
        "--memory",
        type=integer(1, MAX_MB),
        default=None,
        metavar="MB",
        help="each worker's memory for results (its --memory), also requested from the "
        "batch system where the provider can (Slurm, HTCondor, PBS)",
    )
    parser.add_argument(
        "--disk",
        type=integer(0, MAX_MB),
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
        type=_walltime,
        default="01:00:00",
        metavar="HH:MM:SS",
        help="each job's time limit (default 01:00:00)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="retire a worker idle this long, beyond --min-workers (default 60)",
    )
    parser.add_argument(
        "--poll-interval",
        type=seconds,
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
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="INFO: a line at the start, when the jobs' numbers change, and at the end, "
        "never one per task; WARNING: faults only (default INFO)",
    )
    args = parser.parse_args(argv)
    if args.min_workers > args.max_workers:
        parser.error(
            f"--min-workers {args.min_workers} is more than --max-workers {args.max_workers}"
        )
    if args.script_dir is not None and os.path.exists(args.script_dir):
        if not os.path.isdir(args.script_dir) or not os.access(args.script_dir, os.W_OK):
            parser.error(f"--script-dir {args.script_dir}: not a directory this user can write to")
    path = args.connection_file or os.environ.get(security.CONNECTION_FILE_ENV)
    if not path:
        parser.error(
            "the manager's connection file is needed: --connection-file PATH or "
            f"${security.CONNECTION_FILE_ENV}"
        )
    try:
        security.read_live_connection_file(path)
    except security.SecurityError as exc:
        parser.error(str(exc))
    args.connection_file = path
    return args


def _walltime(text: str) -> str:
    """An argparse type: a job's time limit as batch systems write it, [D-]HH:MM:SS."""
    if not re.fullmatch(r"(\d+-)?\d{1,4}(:\d{2}){0,2}", text):
        raise argparse.ArgumentTypeError(f"expected [D-]HH:MM:SS, not {text!r}")
    return text


def make_provider(args: argparse.Namespace) -> Any:
    """The Parsl provider of ``--batch``, asking for each job what the worker uses."""
    try:
        from parsl import providers
        from parsl.launchers import SimpleLauncher
    except ImportError as exc:
        raise BatchSystemMissing(
            f"the factory needs Parsl's providers ({exc}): pip install 'daskvine-py[batch]'"
        ) from None
    options = "".join(line.rstrip("\n") + "\n" for line in args.scheduler_options)
    common: dict[str, Any] = {
        "init_blocks": 0,
        "min_blocks": 0,
        "max_blocks": args.max_workers,
        "worker_init": args.worker_init,
    }
    if args.batch == "local":
        return providers.LocalProvider(**common)
    common.update(walltime=args.walltime, scheduler_options=options, launcher=SimpleLauncher())
    gigabytes = None if args.memory is None else -(-args.memory // 1024)
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
    configure_logging(args.log_level)
    stop = threading.Event()
    why = ["it was told to stop"]

    def on_signal(number: int, frame: Any) -> None:
        why[0] = signal.Signals(number).name
        stop.set()

    # Before anything is made: a signal from here on ends in the clean-up below.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        # Before the first submission, and before anything is made to be cleaned up.
        provider = make_provider(args)
        check_commands(provider)
    except BatchSystemMissing as exc:
        logger.error("factory cannot submit %s jobs: %s", args.batch, exc)
        return EXIT_NO_BATCH_SYSTEM
    made_dir = args.script_dir is None
    try:
        provider.script_dir = args.script_dir or default_script_dir()
        os.makedirs(provider.script_dir, exist_ok=True)
    except OSError as exc:
        logger.error("factory cannot make its directory for job scripts: %s", exc)
        return EXIT_USAGE
    client = StatusClient(args.connection_file, f"factory-{socket.gethostname()}-{os.getpid()}")
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
        "factory started: %d to %d %s jobs of %d cores for the manager at %s (pool %s; "
        "job scripts and output in %s)",
        args.min_workers,
        args.max_workers,
        args.batch,
        args.cores,
        client.address,
        pool.name,
        provider.script_dir,
    )
    code = 0
    report = _JobReport()
    try:
        while not stop.wait(min(1.0, args.poll_interval)):
            if client.refused is not None:
                logger.error("the manager will not answer: %s", client.refused)
                why[0] = "the manager refused it"
                code = EXIT_REFUSED
                break
            gone = client.manager_gone()
            if gone is not None:
                logger.error("the factory stops and cancels its jobs: %s", gone)
                why[0] = "its manager is gone"
                code = EXIT_MANAGER_GONE
                break
            report.update(pool.status(), time.monotonic())
    finally:
        live = sum(pool.status()["jobs"].get(state, 0) for state in ("pending", "running"))
        # The pool's thread may be waiting for the manager's answer (up to the client's
        # timeout, 10 s): closing the client wakes it, and the pool stops at once.
        pool.stop()
        client.close()
        pool.close()
        status = pool.status()
        failed = bool(status["failures"])
        if made_dir and not failed:
            shutil.rmtree(provider.script_dir, ignore_errors=True)
            kept = f"removed {provider.script_dir}"
        else:
            reason = "the failed jobs' output is there" if made_dir else "it was given"
            kept = f"kept {provider.script_dir} ({reason})"
        logger.info(
            "factory stopped (%s): %d jobs submitted in all, %d cancelled now; %s",
            why[0],
            sum(status["jobs"].values()),
            live,
            kept,
        )
    return code


class _JobReport:
    """The factory's line about its jobs: logged when their numbers change, at most every
    ``REPORT_INTERVAL`` seconds (one line per change would be one per job)."""

    def __init__(self) -> None:
        #: the last line logged: none yet about a pool with no jobs
        self.logged = self._line({"jobs": {}, "workers": []})
        self.logged_at = -REPORT_INTERVAL

    def update(self, status: dict[str, Any], now: float) -> None:
        line = self._line(status)
        if line != self.logged and now - self.logged_at >= REPORT_INTERVAL:
            logger.info("%s", line)
            self.logged, self.logged_at = line, now

    @staticmethod
    def _line(status: dict[str, Any]) -> str:
        jobs: dict[str, int] = status["jobs"]
        ended = sum(n for state, n in jobs.items() if state not in ("pending", "running"))
        failed = jobs.get("failed", 0)
        return (
            f"jobs: {sum(jobs.values())} submitted, {jobs.get('pending', 0)} pending, "
            f"{jobs.get('running', 0)} running, {ended} ended"
            + (f" ({failed} of them failed)" if failed else "")
            + f"; {len(status['workers'])} workers connected"
        )
