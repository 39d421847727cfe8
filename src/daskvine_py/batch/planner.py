"""How many worker jobs a pool should have: a pure planner, tested with a fake clock.

A pool submits ``python -m daskvine_py.worker`` jobs through a batch system and sizes itself
to the work. ``PoolPlanner.plan`` takes what is known at ``now`` (the cores the work needs,
the pool's jobs and their states, the pool's connected workers and how long each has been
idle) and returns what to do: submit so many jobs, cancel these pending ones, retire these
idle workers, report these failures. No provider, no sockets, no clock: ``pool.py`` is the
I/O shell that asks the batch system and the manager, and carries out the plan.

The rules:

- **Wanted workers** = the cores needed by waiting and running tasks, divided by each
  worker's cores, rounded up, clamped to ``[min_workers, max_workers]``.
- **Counted workers** = jobs that are pending or running and whose worker has not left:
  a job counts from its submission, so a slow batch queue is not flooded with duplicates.
- Fewer counted than wanted: submit the difference, unless a submission or a job failed
  recently (``retry_after``, doubling up to ``max_retry_after`` while failures go on): a
  broken ``worker_init`` must not become a job storm.
- More counted than wanted: cancel pending jobs, newest first (they cost nothing yet).
  A held job is cancelled too: it would wait for a person to release it.
- A connected worker idle for ``idle_timeout``, beyond ``min_workers``, is retired (told
  to leave; its job then ends by itself). A pending job is never kept past need.
- A job that failed, was held, or ended before its worker ever joined (a ``worker_init``
  that failed, a Python that is not there) is reported once, with the batch system's
  message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

#: Job states, as the pool sees them (a provider's states mapped onto these).
JobStateName = Literal["pending", "running", "done", "failed", "held", "cancelled"]
#: States in which a job counts towards the pool's size.
LIVE_STATES = frozenset({"pending", "running"})


class Demand(NamedTuple):
    """What the work asks of the workers: the manager's I/O thread computes it (it is what
    ``Manager.demand()`` returns, and what a ``protocol.StatusReply`` carries)."""

    #: tasks queued at the manager and tasks on workers: the cores the work could use now
    cores_needed: int
    #: worker name -> (cores, seconds since it last held a task; 0 while it holds any)
    workers: dict[str, tuple[int, float]]


@dataclass
class PoolJob:
    """One batch job of the pool."""

    job_id: str
    #: the ``--name`` of the worker it starts, to match it with the manager's workers
    worker: str
    submitted: float
    state: JobStateName = "pending"
    #: the batch system's own words on why it failed or is held
    message: str = ""
    #: its worker registered at some point, and when it left (None: not yet)
    joined: bool = False
    left: float | None = None
    reported: bool = False  #: its failure was reported already
    cancelled: bool = False  #: the pool asked the batch system to cancel it


@dataclass(frozen=True)
class WorkerView:
    """A connected worker of the pool, as the manager sees it."""

    name: str
    cores: int
    #: seconds since it last had a task (0 while it runs or holds any)
    idle_for: float


@dataclass
class Plan:
    """What to do now."""

    submit: int = 0
    cancel: list[str] = field(default_factory=list)  #: job ids
    retire: list[str] = field(default_factory=list)  #: worker names
    failures: list[PoolJob] = field(default_factory=list)  #: to report, once each


@dataclass
class PoolPlanner:
    """The sizing rules of one pool (see the module docstring); holds the retry backoff."""

    cores_per_worker: int
    min_workers: int = 0
    max_workers: int = 1
    #: seconds a worker may sit idle before it is retired (beyond ``min_workers``)
    idle_timeout: float = 60.0
    #: seconds to wait after a failed submission or job before submitting again
    retry_after: float = 10.0
    max_retry_after: float = 300.0
    _backoff: float = 0.0
    _blocked_until: float = 0.0

    def __post_init__(self) -> None:
        if self.cores_per_worker < 1:
            raise ValueError(f"cores_per_worker must be >= 1, not {self.cores_per_worker}")
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 0 <= min_workers <= max_workers, got {self.min_workers} and "
                f"{self.max_workers}"
            )

    def wanted(self, cores_needed: int) -> int:
        """Workers the work calls for, within the pool's bounds."""
        workers = math.ceil(max(0, cores_needed) / self.cores_per_worker)
        return min(self.max_workers, max(self.min_workers, workers))

    def failed(self, now: float) -> None:
        """A submission or a job failed: hold off new submissions for a while."""
        self._backoff = min(self.max_retry_after, max(self.retry_after, 2 * self._backoff))
        self._blocked_until = now + self._backoff

    def plan(
        self,
        now: float,
        cores_needed: int,
        jobs: Mapping[str, PoolJob],
        workers: Iterable[WorkerView],
    ) -> Plan:
        plan = Plan()
        connected = {worker.name: worker for worker in workers}
        for job in jobs.values():
            if job.worker in connected:
                job.joined = True
            elif job.joined and job.left is None:
                job.left = now  # its worker left (retired, lost, or its job ended)
            # (one we cancelled ending unjoined is what we asked for: batch systems may
            # report it done, e.g. Parsl's Slurm provider for a job gone from the queue)
            ended_unjoined = job.state == "done" and not job.joined and not job.cancelled
            if (job.state in ("failed", "held") or ended_unjoined) and not job.reported:
                job.reported = True  # a job that ended before its worker joined failed too
                plan.failures.append(job)
            if job.state == "held" and not job.cancelled:
                plan.cancel.append(job.job_id)  # it would wait for a person to release it
                job.cancelled = True
        if plan.failures:
            self.failed(now)
        elif any(job.joined for job in jobs.values()):
            self._backoff = 0.0  # a worker got in: the jobs work
        live = [
            job
            for job in jobs.values()
            if job.state in LIVE_STATES and job.left is None and not job.cancelled
        ]
        wanted = self.wanted(cores_needed)
        if len(live) < wanted:
            if now >= self._blocked_until:
                plan.submit = wanted - len(live)
        elif len(live) > wanted:
            pending = sorted(
                (job for job in live if not job.joined),
                key=lambda job: job.submitted,
                reverse=True,
            )
            for job in pending[: len(live) - wanted]:
                job.cancelled = True
                plan.cancel.append(job.job_id)
        # Idle workers beyond the floor leave, longest idle first; a worker retiring
        # counts as gone for the floor.
        keep = max(self.min_workers, wanted)
        staying = len(live) - sum(1 for job in live if job.cancelled)
        idle = sorted(
            (w for w in connected.values() if w.idle_for >= self.idle_timeout),
            key=lambda w: w.idle_for,
            reverse=True,
        )
        for worker in idle:
            if staying <= keep:
                break
            plan.retire.append(worker.name)
            staying -= 1
        return plan


def job_state(name: str) -> JobStateName:
    """A Parsl ``JobState`` name (``PENDING``, ``RUNNING``, ...) as the pool's state."""
    return _PARSL_STATES.get(name.upper(), "failed")


_PARSL_STATES: dict[str, JobStateName] = {
    "UNKNOWN": "pending",  # not in the queue's answer yet, or briefly unreadable
    "PENDING": "pending",
    "RUNNING": "running",
    "COMPLETED": "done",
    "CANCELLED": "cancelled",
    "SCALED_IN": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "MISSING": "failed",
    "HELD": "held",
}
