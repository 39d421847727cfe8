"""The result cache inside the scheduler state: which results outlive their run, and how
later runs read them instead of computing them.

The records the caller's side (``cache.result_cache``) and the state share; the state's
side is the ``caching.Caching`` component (its byte budgets: ``cache_budget``), for runs
submitted with a ``messages.RunCache`` (``get(cache=True)``):

- **Providers.** A cacheable task that runs provides its cache key
  (``CacheIndex.providers``); the cache counts as one more reader (``waiters``), so the
  result stays while its run goes on. When the run ends each provider still held is
  *adopted* by the cache's own run record (never in ``runs``), without lineage, until a
  budget (``cache_worker_bytes``; small outputs nothing reads are held by the manager
  itself, ``cache_manager_bytes``) or ``CacheClear`` evicts it, least recently used first.
- **Hits.** A task whose key has a live provider (cached, or running in another run, or
  earlier in its own) stays "released" (its lineage), and its run's readers read the
  provider (a dependency across runs); an output that hits gets the provider's value
  (kept here, or ``Upload``). Two concurrent runs of a graph compute each task once.
- **Predictions.** The caller plans top-down (``RunCache.plan``, ``CacheStatus``): tasks
  only hits read are "skip", results on the cache's disk come with their value ("disk":
  in memory here, sent inside ``Execute``). Those tasks come without payloads
  (``RunCache.deferred``), made only if lineage needs them; a predicted hit whose
  provider went is recomputed.
- **Losses.** A provider that goes (worker lost, library died, fetch failed, its run
  dropped it, eviction) hands its readers back to their own runs' records, computed from
  lineage (``Caching.switch``): never a hang.
- **Disk.** With ``RunCache.persist`` every provider's result reaches the manager
  (``CacheWrite``, from ``TaskDone`` or ``Upload``), which writes it off the I/O thread.

Every run's ``RunCache.stats`` is filled when the run is dropped, before the caller wakes.
"""

from __future__ import annotations

from collections.abc import Mapping

from daskvine_py.scheduler.messages import Key, RunCache
from daskvine_py.scheduler.records import RunRecord, TaskRecord
from daskvine_py.wire import protocol as p

__all__ = [
    "ACTIVE",
    "CACHE_MANAGER_BYTES",
    "CACHE_RUN_ID",
    "CACHE_WORKER_BYTES",
    "MAX_SECONDS",
    "CacheIndex",
    "CacheRun",
    "unlink_readers",
]

#: The id of the run record that owns cached results once their own run ended.
CACHE_RUN_ID = 0
#: Cached bytes each worker keeps by default (all runs' entries; spilled past ``--memory``
#: like any result). More reuses more; less leaves the worker's memory and disk to runs.
CACHE_WORKER_BYTES = 2 * 2**30
#: Bytes of small cached outputs the manager keeps itself (their workers keep no copy).
CACHE_MANAGER_BYTES = 256 * 2**20
#: Durations remembered per cache key (for "time saved"); past it they are forgotten.
MAX_SECONDS = 1_000_000

#: The states of a task that still reads its inputs.
ACTIVE = frozenset({"waiting", "ready", "processing"})


class CacheIndex:
    """What the state publishes of the cache. The caller's thread reads it without a lock
    (single dict lookups and ints, atomic under the GIL) to plan a run; the state
    re-checks everything when the run arrives."""

    __slots__ = (
        "providers",
        "seconds",
        "entries",
        "nbytes",
        "at_manager",
        "manager_bytes",
        "clears",
    )

    def __init__(self) -> None:
        #: cache key -> the live record of its result (cached, or in a run)
        self.providers: dict[bytes, TaskRecord] = {}
        #: cache key -> seconds its task ran the last time it ran
        self.seconds: dict[bytes, float] = {}
        #: cached results on workers (adopted), and their bytes counting every copy
        self.entries = 0
        self.nbytes = 0
        #: small cached outputs only the manager holds, and their bytes
        self.at_manager = 0
        self.manager_bytes = 0
        #: ``CacheClear`` events handled so far
        self.clears = 0


class CacheRun:
    """The state's side of one cache run."""

    __slots__ = (
        "info",
        "link",
        "hit_of",
        "provided",
        "ran",
        "ran_count",
        "read",
        "reused",
        "read_as",
    )

    def __init__(self, info: RunCache) -> None:
        self.info = info
        #: this run's hit records -> the provider they stand for
        self.link: dict[TaskRecord, TaskRecord] = {}
        #: provider -> one of this run's hit records for it (its lineage, should it go)
        self.hit_of: dict[TaskRecord, TaskRecord] = {}
        #: this run's records registered as providers
        self.provided: list[TaskRecord] = []
        #: cacheable keys that ran, and tasks run (every report taken)
        self.ran: set[Key] = set()
        self.ran_count = 0
        #: providers this run read or took an output from; bytes of disk values used
        self.read: set[TaskRecord] = set()
        self.reused = 0
        #: (reader id, input position) -> the key its payload names an input it reads
        #: from a provider by (the provider's own key may be another run's name)
        self.read_as: dict[tuple[int, int], Key] = {}

    def stats(self, tasks: int, seconds: Mapping[bytes, float]) -> dict[str, float]:
        """``RunCache.stats`` of the run (of ``tasks`` tasks), as it is dropped;
        ``seconds``: the last run time of each cache key (``CacheIndex.seconds``)."""
        info = self.info
        # (a copy at once: the caller's thread may still add keys of a run that failed)
        keys = info.keys.copy()
        keyed = len(keys) - list(keys.values()).count(None)
        ran = self.ran
        hits = 0
        saved = 0.0
        if keyed > len(ran):  # (a first run computes every key: nothing to add up)
            for k, ck in keys.items():
                if ck is not None and k not in ran:
                    hits += 1
                    saved += seconds.get(ck, info.seconds.get(k, 0.0))
        return {
            "hits": hits,
            "misses": len(ran),
            "uncached": max(0, tasks - keyed),
            "tasks_run": self.ran_count,
            "bytes_reused": self.reused + sum(r.nbytes for r in self.read),
            "seconds_saved": saved,
        }

    def renamed(self, task_id: int, deps: tuple[p.DepLocation, ...]) -> tuple[p.DepLocation, ...]:
        """A task's inputs as its payload names them: a provider from another run is
        read under this run's key for it."""
        read_as = self.read_as
        return tuple(
            loc._replace(key=read_as[task_id, i]) if (task_id, i) in read_as else loc
            for i, loc in enumerate(deps)
        )


def unlink_readers(run: RunRecord) -> None:
    """A run ends: the records of other runs its tasks read forget them as readers."""
    foreign: dict[TaskRecord, None] = {}
    for task in run.tasks.values():
        for dep in task.deps:
            if dep.run is not run:
                foreign[dep] = None
                if task.state in ACTIVE:
                    dep.waiters -= 1
    for dep in foreign:
        dep.dependents = [d for d in dep.dependents if d.run is not run]
