"""Workers on a batch system, through any Parsl execution provider, sized to the work.

``manager.scale(provider, min_workers=0, max_workers=N, cores=...)`` returns a running
``WorkerPool``: a thread that, every ``poll_interval`` seconds, asks the provider for its
jobs' states and its ``WorkSource`` for the work's demand (``planner.Demand``), hands both
to the pure ``planner.PoolPlanner``, and carries out its plan: submit
``python -m daskvine_py.worker`` jobs, cancel pending jobs no longer needed, retire idle
workers (the manager tells them to leave; their jobs then end), and report jobs that
failed with the batch system's own message (a warning, and in ``status()``).

The work source is the ``Manager`` itself in its own process (``manager.scale``), or a
``status.StatusClient`` that asks a manager elsewhere over its port
(``python -m daskvine_py.factory``): the pool does the same with either.

A job's worker joins with the manager's connection file, named in the job's command; the
file (mode 0600) must be readable where the job runs: a shared home directory, or a path
the provider's ``worker_init`` copies it to. Its keys never appear in the command.
``close()`` (and the manager's) cancels every job the pool started.

A pool whose provider's commands are not on PATH (``sbatch`` for Slurm...) is refused when
it is made (``BatchSystemMissing``): every submission would fail, again and again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Protocol

from daskvine_py.batch.planner import (
    LIVE_STATES,
    Demand,
    PoolJob,
    PoolPlanner,
    WorkerView,
    job_state,
)
from daskvine_py.command_line import WorkerCommand

logger = logging.getLogger("daskvine_py.batch.pool")

_POOL_IDS = itertools.count(1)

#: The commands Parsl's providers run to submit, watch and cancel jobs, by provider class.
PROVIDER_COMMANDS: dict[str, tuple[str, ...]] = {
    "SlurmProvider": ("sbatch", "squeue", "scancel"),
    "CondorProvider": ("condor_submit", "condor_q", "condor_rm"),
    "PBSProProvider": ("qsub", "qstat", "qdel"),
    "TorqueProvider": ("qsub", "qstat", "qdel"),
    "GridEngineProvider": ("qsub", "qstat", "qdel"),
    "LSFProvider": ("bsub", "bjobs", "bkill"),
}


class BatchSystemMissing(RuntimeError):
    """What a pool needs to submit jobs is not here: Parsl, or its batch system's commands."""


def missing_commands(provider: Any) -> list[str]:
    """The commands ``provider`` runs that are not on PATH here (none for providers that
    run none, or that this table does not know)."""
    needed = PROVIDER_COMMANDS.get(type(provider).__name__, ())
    return [command for command in needed if shutil.which(command) is None]


def check_commands(provider: Any) -> None:
    """``BatchSystemMissing``, naming them, when ``provider``'s commands are not on PATH."""
    missing = missing_commands(provider)
    if missing:
        kind = type(provider).__name__
        needed = ", ".join(PROVIDER_COMMANDS[kind])
        raise BatchSystemMissing(
            f"{', '.join(missing)} not found on PATH ({kind} needs {needed}). Run it where "
            "the batch system's commands work, e.g. a login node, or put them on PATH "
            "(module load ...)"
        )


class WorkSource(Protocol):
    """What a pool sizes itself on, and how it retires a worker: a ``Manager`` (in its
    own process), or a ``status.StatusClient`` (a manager elsewhere)."""

    #: the connection file the pool's workers join with
    connection_file: str

    def demand(self) -> Demand:
        """The cores the work could use now, and each connected worker's idle time."""
        ...

    def retire(self, name: str, reason: str) -> None:
        """Tell the worker ``name`` to leave."""
        ...


class WorkerPool:
    """Worker jobs of one provider for one manager; see the module docstring.

    Parameters
    ----------
    source
        The manager the workers join (``manager.scale`` passes itself), or a
        ``status.StatusClient`` for a manager elsewhere: it says how much work is waiting,
        retires idle workers, and names the connection file the jobs join with.
    provider
        A Parsl ``ExecutionProvider`` (``SlurmProvider``, ``CondorProvider``,
        ``LocalProvider``...), configured with the batch system's own options
        (partition, ``worker_init``, ``scheduler_options``, walltime).
    min_workers, max_workers
        Bounds on the pool's jobs.
    cores, memory, disk
        Each worker's ``--cores``, and ``--memory``/``--disk`` in MB (None: the worker's
        defaults). Request as much from the batch system in the provider's options.
    idle_timeout
        Seconds a worker may sit without tasks before it is told to leave (beyond
        ``min_workers``).
    poll_interval
        Seconds between looks at the batch system and the manager. Shorter reacts sooner;
        each look runs the provider's status command (``squeue``, ``condor_q``).
    python
        The Python that runs the worker where the job lands (default: this one, which
        suits a shared file system).
    manager_timeout
        Each worker's ``--manager-timeout``: seconds it waits without hearing from the
        manager before it exits on its own, ending its job, so that a manager that died
        or was cut off leaves no job holding the batch system's cores (the manager sends
        heartbeats meanwhile, so a quiet run is not silence).
    """

    def __init__(
        self,
        source: WorkSource,
        provider: Any,
        *,
        min_workers: int = 0,
        max_workers: int = 1,
        cores: int = 1,
        memory: int | None = None,
        disk: int | None = None,
        idle_timeout: float = 60.0,
        poll_interval: float = 5.0,
        python: str = sys.executable,
        manager_timeout: float = 60.0,
    ) -> None:
        check_commands(provider)
        self.source = source
        self.provider = provider
        self.planner = PoolPlanner(cores, min_workers, max_workers, idle_timeout)
        self.poll_interval = poll_interval
        self.name = f"pool{next(_POOL_IDS)}-{os.getpid()}"
        self._worker = WorkerCommand(
            python,
            connection_file=source.connection_file,
            cores=cores,
            memory=memory,
            disk=disk,
            manager_timeout=manager_timeout,
        )
        if getattr(provider, "script_dir", None) is None:
            # Where the provider writes job scripts and their output: visible to the
            # user, kept after the pool closes for the logs of failed jobs.
            provider.script_dir = tempfile.mkdtemp(prefix=f"daskvine-{self.name}-")
        #: every job the pool submitted, by job id (the pool's thread writes)
        self.jobs: dict[str, PoolJob] = {}
        #: failures reported so far: the batch system's words, newest last
        self.failures: list[str] = []
        self._numbers = itertools.count()
        #: why the last look at the work failed (a manager that does not answer), if it did
        self._unreachable: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"daskvine-{self.name}", daemon=True)
        self._thread.start()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<WorkerPool {self.name} {self.status()['jobs']}>"

    def status(self) -> dict[str, Any]:
        """Jobs by state, connected workers, and the failures reported (a snapshot)."""
        with self._lock:
            counts: dict[str, int] = {}
            for job in self.jobs.values():
                counts[job.state] = counts.get(job.state, 0) + 1
            return {
                "jobs": counts,
                "workers": sorted(job.worker for job in self.jobs.values() if _connected(job)),
                "failures": list(self.failures),
            }

    def stop(self) -> None:
        """Stop sizing, without waiting: what the pool's thread is doing (asking its
        source, submitting) is its last step; a source that fails now is not reported."""
        self._stop.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop sizing, and cancel every job the pool started that has not ended."""
        self.stop()
        self._thread.join(timeout)
        with self._lock:
            live = [job.job_id for job in self.jobs.values() if job.state in LIVE_STATES]
        if live:
            try:
                self.provider.cancel(live)
            except Exception as exc:
                logger.warning("pool %s could not cancel jobs %s: %r", self.name, live, exc)
            with self._lock:
                for job_id in live:
                    self.jobs[job_id].state = "cancelled"

    # -- the pool's thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick(time.monotonic())
            except Exception:
                logger.exception("pool %s: sizing failed; trying again", self.name)
            self._stop.wait(self.poll_interval)

    def _tick(self, now: float) -> None:
        self._refresh_states()
        try:
            demand = self.source.demand()
        except ConnectionError as exc:  # a manager elsewhere that does not answer (yet)
            if self._stop.is_set():
                return  # (its source closed as the pool stops)
            if self._unreachable is None:
                logger.warning("pool %s: %s; submitting nothing until it answers", self.name, exc)
            self._unreachable = str(exc)
            return
        if self._unreachable is not None:
            logger.warning("pool %s: the manager answers again", self.name)
            self._unreachable = None
        ours = {job.worker for job in self.jobs.values()}
        # Cores of workers outside this pool (local ones, another pool's) serve the work
        # first: the pool covers the rest.
        others = sum(cores for name, (cores, _) in demand.workers.items() if name not in ours)
        workers = [
            WorkerView(name, cores, idle)
            for name, (cores, idle) in demand.workers.items()
            if name in ours
        ]
        with self._lock:
            plan = self.planner.plan(now, demand.cores_needed - others, self.jobs, workers)
        for job in plan.failures:
            self._report(job)
        if plan.cancel:
            self.provider.cancel(plan.cancel)
        for name in plan.retire:
            logger.debug(
                "pool %s: retiring worker %s, idle for %g s",
                self.name,
                name,
                self.planner.idle_timeout,
            )
            self.source.retire(name, f"idle for {self.planner.idle_timeout:g} s")
        for _ in range(plan.submit):
            if not self._submit(now):
                break

    def _refresh_states(self) -> None:
        with self._lock:
            ids = [job.job_id for job in self.jobs.values() if job.state in LIVE_STATES]
        if not ids:
            return
        statuses = self.provider.status(ids)
        with self._lock:
            for job_id, status in zip(ids, statuses, strict=True):
                job = self.jobs[job_id]
                if job.cancelled and status.state.name in ("UNKNOWN", "MISSING"):
                    job.state = "cancelled"  # gone from the queue after our cancel
                    continue
                job.state = job_state(status.state.name)
                job.message = _job_message(status)

    def _submit(self, now: float) -> bool:
        worker = f"{self.name}-{next(self._numbers)}"
        command = shlex.join(dataclasses.replace(self._worker, name=worker).argv())
        try:
            job_id = str(self.provider.submit(command, 1, job_name=f"daskvine-{worker}"))
        except Exception as exc:
            self.planner.failed(now)
            self._warn(f"submitting a worker job failed: {exc}")
            return False
        with self._lock:
            self.jobs[job_id] = PoolJob(job_id, worker, now)
        return True

    def _report(self, job: PoolJob) -> None:
        what = {"held": "is held", "failed": "failed"}.get(
            job.state, "ended before its worker joined"
        )
        self._warn(f"worker job {job.job_id} ({job.worker}) {what}: {job.message or 'no message'}")

    def _warn(self, text: str) -> None:
        logger.warning("pool %s: %s", self.name, text)
        with self._lock:
            self.failures.append(text)


def _connected(job: PoolJob) -> bool:
    return job.joined and job.left is None


def _job_message(status: Any) -> str:
    """The batch system's message, and the end of the job's error output if it has one."""
    parts = [status.message] if getattr(status, "message", None) else []
    if getattr(status, "exit_code", None) not in (None, 0):
        parts.append(f"exit code {status.exit_code}")
    path = getattr(status, "stderr_path", None)
    if path and os.path.exists(path):
        try:
            with open(path, errors="replace") as file:
                tail = file.read()[-2000:].strip()
        except OSError:
            tail = ""
        if tail:
            parts.append(f"its stderr ({path}) ends with:\n{tail}")
    return "; ".join(parts)
