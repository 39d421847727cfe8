"""The bytes the result cache keeps, and in which order it gives them up.

A part of ``caching.Caching``: accounting, and the choice of what to evict, which the
caller carries out (``evict``). Results adopted by the cache are counted against each
holder's budget (``worker_bytes``) or, small outputs that only the manager holds, against
the manager's (``manager_bytes``), and evicted least recently used first; results of runs
still going that the cache will keep are counted too (``retained``), so a run that makes
more than fits lets its older results go early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from daskvine_py.scheduler.cache_placement import (
    CACHE_MANAGER_BYTES,
    CACHE_WORKER_BYTES,
    CacheIndex,
)
from daskvine_py.scheduler.messages import WorkerId
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord


class CacheBudget:
    """Cached bytes per worker and at the manager, in least recently used order."""

    __slots__ = (
        "worker_bytes",
        "manager_bytes",
        "lru",
        "held",
        "at_manager",
        "manager_held",
        "retained",
        "retaining",
    )

    def __init__(
        self, worker_bytes: int = CACHE_WORKER_BYTES, manager_bytes: int = CACHE_MANAGER_BYTES
    ) -> None:
        #: cached bytes each worker keeps before the least recently used are released
        self.worker_bytes = worker_bytes
        self.manager_bytes = manager_bytes  # (small outputs no worker holds)
        #: adopted results, least recently used first (a dict as ordered set)
        self.lru: dict[TaskRecord, None] = {}
        #: bytes of adopted results per holder (copies made after adoption not counted)
        self.held: dict[WorkerRecord, int] = {}
        #: adopted results only the manager holds (small outputs), with their bytes, summed
        self.at_manager: dict[TaskRecord, int] = {}
        self.manager_held = 0
        #: bytes of providers' results kept for the cache while their runs go on, per
        #: worker, and the (worker, bytes) each provider counts there
        self.retained: dict[WorkerRecord, int] = {}
        self.retaining: dict[TaskRecord, tuple[WorkerRecord, int]] = {}

    def touch(self, record: TaskRecord) -> None:
        """An adopted result was used: the most recent now."""
        if record in self.lru:
            del self.lru[record]
            self.lru[record] = None

    def adopt(self, record: TaskRecord, at_manager: bool) -> None:
        """Count an adopted result: on its holders, or (``at_manager``) at the manager."""
        self.lru[record] = None
        if at_manager:
            self.at_manager[record] = record.nbytes
            self.manager_held += record.nbytes
            return
        held = self.held
        for worker in record.who_has:
            held[worker] = held.get(worker, 0) + record.nbytes

    def forget(self, record: TaskRecord) -> None:
        """An adopted result goes (nothing if it was not adopted)."""
        if self.lru.pop(record, False) is None:
            self.unhold(record, record.who_has)
            self.manager_held -= self.at_manager.pop(record, 0)

    def unhold(self, record: TaskRecord, workers: Iterable[WorkerRecord]) -> None:
        """``record``'s copies on ``workers`` no longer count."""
        held = self.held
        for worker in workers:
            if worker in held:
                held[worker] = max(0, held[worker] - record.nbytes)

    def retain(self, record: TaskRecord, worker: WorkerRecord) -> None:
        """Count a provider's result on ``worker`` while its run goes on."""
        if record in self.retaining:
            self.unretain(record)  # (computed again after a loss)
        nbytes = record.nbytes
        self.retained[worker] = self.retained.get(worker, 0) + nbytes
        self.retaining[record] = (worker, nbytes)

    def unretain(self, record: TaskRecord) -> None:
        counted = self.retaining.pop(record, None)
        if counted is not None:
            worker, nbytes = counted
            self.retained[worker] = max(0, self.retained.get(worker, 0) - nbytes)

    def fits(self, worker: WorkerRecord) -> bool:
        """Whether ``worker``'s cached and retained bytes are within its budget."""
        return self.used(worker) <= self.worker_bytes

    def used(self, worker: WorkerRecord) -> int:
        return self.held.get(worker, 0) + self.retained.get(worker, 0)

    def over(self) -> set[WorkerRecord]:
        """The workers holding adopted results beyond their budget."""
        return {worker for worker in self.held if self.used(worker) > self.worker_bytes}

    def forget_workers(self, workers: dict[WorkerId, WorkerRecord], retained: bool) -> None:
        """Stop counting workers that are gone (their copies went with them); the
        ``retained`` counts too, or only the adopted ones."""
        for counts in (self.held, self.retained) if retained else (self.held,):
            for worker in [w for w in counts if workers.get(w.id) is not w]:
                del counts[worker]

    def evict(
        self,
        workers: dict[WorkerId, WorkerRecord],
        busy: Callable[[TaskRecord], bool],
        forget: Callable[[TaskRecord], None],
        release: Callable[[TaskRecord, WorkerRecord], None],
    ) -> None:
        """Give up the least recently used results over the budgets, but those ``busy``
        (read by a run now): ``forget`` a result, or ``release`` its copy on a worker
        over budget where others remain."""
        self.forget_workers(workers, retained=False)  # lost: their results went too
        if self.manager_held > self.manager_bytes:
            for record in [r for r in self.lru if r in self.at_manager]:
                if self.manager_held <= self.manager_bytes:
                    break
                if not busy(record):
                    forget(record)
        over = self.over()
        for record in list(self.lru) if over else ():
            if not over:
                break
            if busy(record):
                continue
            here = [w for w in record.who_has if w in over]
            if not here:
                continue
            if len(here) == len(record.who_has):
                forget(record)
            else:
                self.unhold(record, here)
                for worker in here:
                    release(record, worker)
            over = {w for w in over if not self.fits(w) and self.held.get(w, 0)}

    def publish(self, index: CacheIndex) -> None:
        """Write the numbers other threads read into ``index``."""
        index.at_manager = len(self.at_manager)
        index.manager_bytes = self.manager_held
        index.entries = len(self.lru) - index.at_manager
        index.nbytes = sum(self.held.values())
