"""The result cache inside the scheduler state: which results outlive their run, and how
later runs read them instead of computing them.

A mixin of ``state.SchedulerState`` (it uses its records, ``_transition``, ``_lose`` and
``_recompute``), for runs submitted with a ``RunCache`` (``get(cache=True)``):

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
- **Predictions.** The caller plans top-down (``RunCache.plan``): tasks only hits read
  are "skip", results on the cache's disk come with their value ("disk": in memory here,
  sent inside ``Execute``). Those tasks come without payloads (``RunCache.deferred``),
  made only if lineage needs them; a predicted hit whose provider went is recomputed.
- **Losses.** A provider that goes (worker lost, library died, fetch failed, its run
  dropped it, eviction) hands its readers back to their own runs' records, computed from
  lineage (``_cache_switch``): never a hang.
- **Disk.** With ``RunCache.persist`` every provider's result reaches the manager
  (``CacheWrite``, from ``TaskDone`` or ``Upload``), which writes it off the I/O thread.

Every run's ``RunCache.stats`` is filled when the run is dropped, before the caller wakes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from daskvine_py.scheduler.messages import Key, NewTask, RunDone, RunOutput, WorkerId
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

logger = logging.getLogger("daskvine_py.manager")

#: The id of the run record that owns cached results once their own run ended.
CACHE_RUN_ID = 0
#: Cached bytes each worker keeps by default (all runs' entries; spilled past ``--memory``
#: like any result). More reuses more; less leaves the worker's memory and disk to runs.
CACHE_WORKER_BYTES = 2 * 2**30
#: Bytes of small cached outputs the manager keeps itself (their workers keep no copy).
CACHE_MANAGER_BYTES = 256 * 2**20
#: Durations remembered per cache key (for "time saved"); past it they are forgotten.
MAX_SECONDS = 1_000_000

_ACTIVE = frozenset({"waiting", "ready", "processing"})

#: A deferred task's payload, made when needed: key -> payload, function ids, their bytes.
Encode = Callable[[Key], tuple[bytes, tuple[bytes, ...], dict[bytes, bytes]]]


class RunCache:
    """One run's cache plan, made in the caller's thread (``cache.Cache.prepare``) and
    read by the state, and the numbers the state writes back when the run is dropped."""

    __slots__ = ("keys", "plan", "values", "seconds", "persist", "deferred", "encode", "stats")

    def __init__(
        self,
        keys: dict[Key, bytes | None],
        plan: dict[Key, str] | None = None,
        values: dict[Key, Serialized] | None = None,
        seconds: dict[Key, float] | None = None,
        persist: Any = None,
        deferred: frozenset[Key] = frozenset(),
        encode: Encode | None = None,
    ) -> None:
        #: cache key of every task (None, or absent: not cacheable, it always runs); a run
        #: keyed as it is submitted gets them part by part, before each part arrives
        self.keys = keys
        #: "skip", "hit" or "disk" for tasks predicted not to run; absent: run
        self.plan = plan or {}
        #: the values of "disk" tasks, read from the cache directory
        self.values = values or {}
        #: original run time of the "disk" tasks (and their skipped inputs), from disk
        self.seconds = seconds or {}
        #: where results go on disk (opaque here: ``CacheWrite.store``); None: nowhere
        self.persist = persist
        #: tasks submitted without their payload (predicted not to run), and how to make
        #: one should lineage need it: ``encode(key)`` -> payload, function ids, and
        #: those functions' bytes
        self.deferred = deferred
        self.encode = encode
        #: hits, misses, uncached, tasks_run, bytes_reused, seconds_saved (``RunInfo.cache``)
        self.stats: dict[str, Any] = {}


class CacheWrite(NamedTuple):
    """Instruction: write this result to the run's cache directory."""

    store: Any
    key: bytes
    value: Serialized
    seconds: float


class CacheClear(NamedTuple):
    """Event: forget every cached result (their workers release them)."""


class CacheIndex:
    """What the state publishes of the cache. The caller's thread reads it without a lock
    (single dict lookups and ints, atomic under the GIL) to plan a run; the state
    re-checks everything when the run arrives."""

    __slots__ = ("providers", "seconds", "entries", "nbytes", "at_manager", "manager_bytes",
                 "clears")  # fmt: skip

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


class _CacheRun:
    """The state's side of one cache run."""

    __slots__ = (
        "info", "link", "hit_of", "provided", "ran", "ran_count", "read", "reused", "read_as",
    )  # fmt: skip

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


class CacheHandling:
    """The cache half of ``SchedulerState``; see the module docstring."""

    # Provided by SchedulerState.
    workers: dict[WorkerId, WorkerRecord]
    runs: dict[int, RunRecord]
    tasks: dict[int, TaskRecord]
    _out: list[Any]
    _transition: Any
    _send: Any
    _lose: Any
    _recompute: Any
    _drop_run: Any

    def _init_cache(
        self, worker_bytes: int = CACHE_WORKER_BYTES, manager_bytes: int = CACHE_MANAGER_BYTES
    ) -> None:
        #: what other threads may read (see ``CacheIndex``)
        self.cache = CacheIndex()
        #: cached bytes each worker keeps before the least recently used are released
        self.cache_worker_bytes = worker_bytes
        self.cache_manager_bytes = manager_bytes  # (small outputs no worker holds)
        self._cache_runs: dict[int, _CacheRun] = {}
        self._cache_owner = RunRecord(CACHE_RUN_ID, 0, ())
        #: adopted results, least recently used first (a dict as ordered set)
        self._cache_lru: dict[TaskRecord, None] = {}
        #: bytes of adopted results per holder (copies made after adoption not counted)
        self._cache_held: dict[WorkerRecord, int] = {}
        #: adopted results only the manager holds (small outputs), with their bytes, summed
        self._cache_at_manager: dict[TaskRecord, int] = {}
        self._cache_manager_held = 0
        #: bytes of providers' results kept for the cache while their runs go on, per
        #: worker, and the (worker, bytes) each provider counts there
        self._cache_retained: dict[WorkerRecord, int] = {}
        self._cache_retaining: dict[TaskRecord, tuple[WorkerRecord, int]] = {}
        #: provider -> its cache key
        self._cache_key_of: dict[TaskRecord, bytes] = {}
        #: provider id -> outputs of runs waiting for its value (``Upload``)
        self._awaiting: dict[int, list[TaskRecord]] = {}
        #: provider id -> (store, cache key, seconds) waiting for its value to be written
        self._persist: dict[int, tuple[Any, bytes, float]] = {}
        #: provider id -> the worker asked to upload it (asked again should that one go)
        self._uploads: dict[int, WorkerRecord] = {}
        #: results not kept for lack of room, held until they reached the directory
        self._held_for_disk: set[int] = set()

    # -- hooks called by the state ------------------------------------------------------

    def _cache_open(self, run: RunRecord, info: RunCache) -> None:
        self._cache_runs[run.id] = _CacheRun(info)

    def _cache_added(self, run: RunRecord, added: Sequence[tuple[NewTask, TaskRecord]]) -> None:
        """Decide, as a run's tasks arrive (inputs first), which run, which read a
        provider, which start in memory (disk) and which wait as lineage."""
        crun = self._cache_runs.get(run.id)
        if crun is None:
            return
        info = crun.info
        keys, plan = info.keys, info.plan
        providers = self.cache.providers
        tasks = self.tasks
        relinked: dict[TaskRecord, None] = {}  # readers that now read a provider
        touched: dict[TaskRecord, None] = {}  # the hits they read it for
        revive: list[TaskRecord] = []
        for _, record in added:
            # A planned reader count may be short (lineage revived later reads what the
            # plan skipped): outputs are kept like any result. An output nothing reads
            # that the cache keeps (below) is kept where it ends up: small, at the manager.
            unread = record.unread
            record.unread = False
            key = record.key
            ck = keys.get(key)
            provider = providers.get(ck) if ck is not None else None
            if provider is not None and tasks.get(provider.id) is provider:
                self._cache_link(crun, record, provider, converted=key not in plan)
                if self.runs.get(run.id) is not run:
                    return  # every output was delivered: the run is over
                continue
            status = plan.get(key) if plan else None
            if status == "disk":
                self._cache_preload(crun, record, info.values[key])
                if self.runs.get(run.id) is not run:
                    return
            elif status is not None:  # skipped, or a predicted hit whose provider went
                self._transition(record, "released")
                if record.waiters or record.is_output:
                    revive.append(record)
            else:
                if ck is not None:
                    self._cache_provide(crun, record, ck)
                    if unread:
                        record.unread = None
                if crun.link and self._cache_read_links(crun, record, touched, count=True):
                    relinked[record] = None
        for hit in touched:
            hit.dependents = [d for d in hit.dependents if d not in relinked]
        for record in revive:
            self._cache_revive(record)

    def _cache_done(self, task: TaskRecord, msg: p.TaskDone, worker: WorkerRecord) -> None:
        """A task of a cache run finished (its result is in memory)."""
        crun = self._cache_runs.get(task.run.id)
        if crun is None:
            return
        crun.ran_count += 1
        ck = crun.info.keys.get(task.key)
        if ck is None:
            return
        crun.ran.add(task.key)
        seconds = self.cache.seconds
        if len(seconds) >= MAX_SECONDS:
            seconds.clear()
        seconds[ck] = msg.duration
        if task not in self._cache_key_of:
            return  # not a provider (lineage of a lost hit): not kept
        store = crun.info.persist
        if task.unread:
            # A small output its worker did not keep: the manager holds it (``value``).
            for record in self._awaiting.pop(task.id, ()):
                self._cache_deliver(record, msg.value, msg.value.nbytes)
            if store is not None:
                self._out.append(CacheWrite(store, ck, msg.value, msg.duration))
            return
        # No room on its worker: not kept there, but held until it reached the directory.
        uploading = store is not None and msg.value is None
        if not self._cache_retain(task, worker, hold=uploading) and not uploading:
            if store is not None:
                self._out.append(CacheWrite(store, ck, msg.value, msg.duration))
            return
        if store is None and not self._awaiting:
            return  # (the usual case: nothing waits for its value)
        waiting = self._awaiting.get(task.id)
        if msg.value is not None:
            if waiting:
                del self._awaiting[task.id]
                for record in waiting:
                    self._cache_deliver(record, msg.value, msg.value.nbytes)
            if store is not None:
                self._out.append(CacheWrite(store, ck, msg.value, msg.duration))
            return
        if store is not None:
            self._persist[task.id] = (store, ck, msg.duration)
        if (waiting or store is not None) and worker in task.who_has:
            self._uploads[task.id] = worker
            self._send(worker, p.Upload((task.id,)))

    def _cache_uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> None:
        """A provider's value arrived (or did not: ``value`` None)."""
        if self._uploads.get(msg.task_id) is worker:
            del self._uploads[msg.task_id]
        waiting = self._awaiting.pop(msg.task_id, None)
        persist = self._persist.pop(msg.task_id, None)
        if msg.task_id in self._held_for_disk:
            self._held_for_disk.discard(msg.task_id)
            held = self.tasks.get(msg.task_id)
            if held is not None:
                self._cache_let_go(held)
        if msg.value is not None:
            for record in waiting or ():
                self._cache_deliver(record, msg.value, msg.value.nbytes)
            if persist is not None:
                self._out.append(CacheWrite(persist[0], persist[1], msg.value, persist[2]))
            return
        if persist is not None:
            logger.debug("result %d could not be uploaded for the cache", msg.task_id)
        if not waiting:
            return
        provider = self.tasks.get(msg.task_id)
        if provider is None or provider.state != "memory":
            for record in waiting:
                self._cache_revive(record)
            return
        self._awaiting[provider.id] = waiting
        if worker in provider.who_has:  # it is not there after all
            provider.who_has.discard(worker)
            worker.has_what.discard(provider)
        if provider.who_has:
            self._cache_upload(provider)
        else:
            self._lose([provider])

    def _cache_worker_lost(self, worker: WorkerRecord) -> None:
        """Uploads asked of a worker that is gone: asked of another holder (a result held
        nowhere any more is recomputed, and delivered, the usual way)."""
        for provider_id in [i for i, w in self._uploads.items() if w is worker]:
            del self._uploads[provider_id]
            provider = self.tasks.get(provider_id)
            wanted = provider_id in self._awaiting or provider_id in self._persist
            if provider is not None and wanted and provider.state == "memory":
                if provider.who_has:
                    self._cache_upload(provider)
                else:
                    self._persist.pop(provider_id, None)

    def _cache_lost(self, lost: list[TaskRecord]) -> list[TaskRecord]:
        """Of results whose every copy is gone, forget the cached ones (their readers
        switch to their own lineage); the others are the state's to recompute."""
        owner = self._cache_owner
        if not any(task.run is owner for task in lost):
            return lost
        for task in lost:
            if task.run is owner:
                self._cache_forget(task)
        self._cache_publish()
        return [task for task in lost if task.run is not owner]

    def _cache_drop(self, run: RunRecord) -> None:
        """A cache run ends: count, unlink its readers of other runs' results, adopt its
        providers that hold a result, hand the others' readers back to their runs."""
        crun = self._cache_runs.pop(run.id, None)
        if crun is None:
            return
        self._cache_stats(run, crun)
        if crun.read:  # only a provider read can be another run's record
            self._cache_unlink_readers(run)
        for provider_id, waiting in list(self._awaiting.items()):
            waiting[:] = [r for r in waiting if r.run is not run]
            if not waiting:
                del self._awaiting[provider_id]
        providers = self.cache.providers
        retaining = self._cache_retaining
        for record in crun.provided:
            if record in retaining:
                self._cache_unretain(record)
            ck = self._cache_key_of.get(record)
            current = ck is not None and providers.get(ck) is record
            if current and record.state == "memory" and (record.who_has or record.unread):
                self._cache_adopt(record, run)
                continue
            if current:
                del providers[ck]
            self._cache_key_of.pop(record, None)
            self._persist.pop(record.id, None)
            self._cache_switch(record, dropping=run)  # other runs' readers: their lineage
        self._cache_evict()

    def _cache_unlink_readers(self, run: RunRecord) -> None:
        """A run ends: the records of other runs its tasks read forget them as readers."""
        foreign: dict[TaskRecord, None] = {}
        for task in run.tasks.values():
            for dep in task.deps:
                if dep.run is not run:
                    foreign[dep] = None
                    if task.state in _ACTIVE:
                        dep.waiters -= 1
        for dep in foreign:
            dep.dependents = [d for d in dep.dependents if d.run is not run]

    # -- events -----------------------------------------------------------------------

    def _on_cache_clear(self, ev: CacheClear) -> None:
        for task in list(self._cache_lru):
            self._cache_forget(task)
        self.cache.seconds.clear()
        self.cache.clears += 1
        self._cache_publish()

    # -- steps --------------------------------------------------------------------------

    def _cache_provide(self, crun: _CacheRun, record: TaskRecord, ck: bytes) -> None:
        """``record`` will compute ``ck``: later tasks with that key read it."""
        self.cache.providers[ck] = record
        self._cache_key_of[record] = ck
        record.waiters += 1  # the cache reads it too: kept while the run goes on
        record.unread = False  # an output nothing reads: its worker keeps it all the same
        crun.provided.append(record)

    def _cache_retain(self, record: TaskRecord, worker: WorkerRecord, hold: bool) -> bool:
        """Count a provider's result against its worker's budget (older cached results
        make room first); when there is none, it is not kept (``hold``: until it has
        been uploaded for the cache directory): whether it is."""
        if record in self._cache_retaining:
            self._cache_unretain(record)  # (computed again after a loss)
        retained = self._cache_retained
        nbytes = record.nbytes
        retained[worker] = total = retained.get(worker, 0) + nbytes
        self._cache_retaining[record] = (worker, nbytes)
        limit = self.cache_worker_bytes
        if self._cache_held.get(worker, 0) + total <= limit:
            return True
        if self._cache_held.get(worker, 0):
            self._cache_evict()
        # Then this run's older results there that nobody else reads now go first: the
        # newest (a run's outputs, its last stages) are the likeliest to be reused whole.
        for older, (where, _) in list(self._cache_retaining.items()):
            if self._cache_held.get(worker, 0) + retained[worker] <= limit:
                return True
            if where is worker and older is not record and self._cache_droppable(older):
                self._cache_unprovide(older, hold=older.id in self._persist)
        if self._cache_held.get(worker, 0) + retained[worker] <= limit:
            return True
        if record.id in self._awaiting:
            return True  # another run's output waits for its value
        self._cache_unprovide(record, hold)
        return False

    def _cache_droppable(self, record: TaskRecord) -> bool:
        """Kept only for the cache: no reader waits for it, no output for its value."""
        return (
            record.waiters <= 1
            and record.id not in self._awaiting
            and record.state == "memory"
            and not (record.is_output and not record.delivered)
        )

    def _cache_unprovide(self, record: TaskRecord, hold: bool = False) -> None:
        """A provider the cache will not keep after all (no room): released when its
        run no longer needs it, or (``hold``) once it has been uploaded."""
        self._cache_unretain(record)
        ck = self._cache_key_of.pop(record)
        if self.cache.providers.get(ck) is record:
            del self.cache.providers[ck]
        if hold:
            self._held_for_disk.add(record.id)
            return
        self._persist.pop(record.id, None)
        self._cache_let_go(record)

    def _cache_let_go(self, record: TaskRecord) -> None:
        record.waiters -= 1  # the cache does not read it after all
        if record.state == "memory" and not (
            record.waiters > 0 or (record.is_output and not record.delivered)
        ):
            self._transition(record, "released")

    def _cache_unretain(self, record: TaskRecord) -> None:
        counted = self._cache_retaining.pop(record, None)
        if counted is not None:
            worker, nbytes = counted
            self._cache_retained[worker] = max(0, self._cache_retained.get(worker, 0) - nbytes)

    def _cache_link(
        self, crun: _CacheRun, record: TaskRecord, provider: TaskRecord, converted: bool
    ) -> None:
        """``record`` hits: its run's readers read ``provider``; ``converted``: it was
        predicted to run, and counted as a reader of its inputs."""
        self._transition(record, "released")
        crun.link[record] = provider
        crun.hit_of.setdefault(provider, record)
        if converted:
            for dep in record.deps:
                dep.waiters -= 1
        if provider in self._cache_lru:  # used: the most recent now
            del self._cache_lru[provider]
            self._cache_lru[provider] = None
        if record.is_output:
            crun.read.add(provider)
            self._cache_deliver_from(record, provider)

    def _cache_read_links(
        self, crun: _CacheRun, record: TaskRecord, touched: dict[TaskRecord, None], count: bool
    ) -> bool:
        """``record`` (to run) reads the providers its run's hits among its inputs stand
        for; ``count``: move its ``waiters`` and ``missing`` counts along (not when
        ``_recompute`` counts next). Whether it reads any."""
        deps = record.deps
        any_read = False
        for i, dep in enumerate(deps):
            provider = crun.link.get(dep)
            if provider is None:
                continue
            if self.tasks.get(provider.id) is not provider or provider.state == "released":
                del crun.link[dep]  # gone, or given up by the cache, meanwhile
                self._cache_revive(dep)
                continue
            deps[i] = provider
            if provider.key != dep.key:
                crun.read_as[record.id, i] = dep.key
            provider.dependents.append(record)
            crun.read.add(provider)
            touched[dep] = None
            any_read = True
            if count:
                provider.waiters += 1
                dep.waiters -= 1
                if provider.state == "memory":
                    record.missing -= 1  # (the hit, released, was counted missing)
        return any_read

    def _cache_locations(
        self, task: TaskRecord, deps: tuple[p.DepLocation, ...]
    ) -> tuple[p.DepLocation, ...]:
        """A task's inputs as its payload names them: a provider from another run is
        read under this run's key for it."""
        crun = self._cache_runs.get(task.run.id)
        if crun is None or not crun.read_as:
            return deps
        read_as = crun.read_as
        return tuple(
            loc._replace(key=read_as[task.id, i]) if (task.id, i) in read_as else loc
            for i, loc in enumerate(deps)
        )

    def _cache_preload(self, crun: _CacheRun, record: TaskRecord, value: Serialized) -> None:
        """A result read from the cache's directory: in memory at the manager; readers
        get it inside their ``Execute``."""
        self._transition(record, "memory")
        record.value = value
        record.nbytes = value.nbytes
        crun.reused += value.nbytes
        for reader in record.dependents:  # of the same part: they counted it missing
            reader.missing -= 1
        if record.is_output:
            self._cache_deliver(record, value, 0)

    def _cache_deliver_from(self, record: TaskRecord, provider: TaskRecord) -> None:
        if provider.value is not None:
            self._cache_deliver(record, provider.value, 0)
            return
        waiting = self._awaiting.setdefault(provider.id, [])
        waiting.append(record)
        if len(waiting) == 1 and provider.state == "memory":
            self._cache_upload(provider)  # (else asked for when it is done)

    def _cache_upload(self, provider: TaskRecord) -> None:
        holder = min(provider.who_has, key=lambda w: w.name)
        self._uploads[provider.id] = holder
        self._send(holder, p.Upload((provider.id,)))

    def _cache_deliver(self, record: TaskRecord, value: Serialized, nbytes: int) -> None:
        """An output that hit gets its value."""
        run = record.run
        if record.delivered or self.runs.get(run.id) is not run:
            return
        record.delivered = True
        self._out.append(RunOutput(run.id, record.key, value))
        run.undelivered -= 1
        crun = self._cache_runs.get(run.id)
        if crun is not None:
            crun.reused += nbytes
        if not run.undelivered:
            self._out.append(RunDone(run.id, run.run_seconds, run.serialization_seconds))
            self._drop_run(run)

    def _cache_payload(self, task: TaskRecord) -> None:
        """A task submitted without its payload (``RunCache.deferred``) is to run after
        all (lineage): make its payload now."""
        crun = self._cache_runs.get(task.run.id)
        if crun is None or crun.info.encode is None or task.key not in crun.info.deferred:
            return
        task.payload, task.functions, functions = crun.info.encode(task.key)
        task.run.functions.update(functions)

    def _cache_revive(self, record: TaskRecord) -> None:
        """A record that stood for a result it can no longer have: compute it from its
        lineage, if its run still needs it."""
        if record.state != "released" or self.tasks.get(record.id) is not record:
            return
        if not (record.waiters > 0 or (record.is_output and not record.delivered)):
            return
        crun = self._cache_runs.get(record.run.id)
        if crun is not None:
            crun.link.pop(record, None)
            ck = crun.info.keys.get(record.key)
            current = self.cache.providers.get(ck) if ck is not None else None
            if ck is not None and (current is None or self.tasks.get(current.id) is not current):
                self._cache_provide(crun, record, ck)
            if crun.link:  # inputs that hit: read their providers, not their lineage
                self._cache_relink_lineage(crun, record)
        self._recompute(record)

    def _cache_relink_lineage(self, crun: _CacheRun, root: TaskRecord) -> None:
        """Before ``_recompute(root)``: the released records it will walk read the
        providers their inputs' hits stand for, where those still live."""
        stack, seen = [root], {root}
        while stack:
            record = stack.pop()
            touched: dict[TaskRecord, None] = {}
            self._cache_read_links(crun, record, touched, count=False)
            for hit in touched:
                hit.dependents = [d for d in hit.dependents if d is not record]
            for dep in record.deps:
                if dep.state == "released" and dep.run is record.run and dep not in seen:
                    seen.add(dep)
                    stack.append(dep)

    def _cache_switch(self, provider: TaskRecord, dropping: RunRecord | None = None) -> None:
        """``provider`` goes: the tasks of other runs that read it read their own run's
        record for it again, which is computed from lineage."""
        revive: list[TaskRecord] = []
        kept = []
        for reader in provider.dependents:
            if reader.state == "forgotten" or reader.run is dropping:
                continue
            crun = self._cache_runs.get(reader.run.id)
            own = crun.hit_of.get(provider) if crun is not None else None
            if own is None:  # of the provider's own run: the state's lineage
                kept.append(reader)
                continue
            deps = reader.deps
            for i, dep in enumerate(deps):
                if dep is provider:
                    deps[i] = own
            own.dependents.append(reader)
            if reader.state in _ACTIVE:
                own.waiters += 1
                provider.waiters -= 1
                if provider.state == "memory":
                    reader.missing += 1
                    if reader.state != "waiting":
                        self._transition(reader, "waiting")
            revive.append(own)
        provider.dependents = kept
        for crun in self._cache_runs.values():
            own = crun.hit_of.pop(provider, None)
            if own is not None:
                crun.link.pop(own, None)
                revive.append(own)
        revive.extend(self._awaiting.pop(provider.id, ()))
        for record in revive:
            self._cache_revive(record)

    def _cache_adopt(self, record: TaskRecord, run: RunRecord) -> None:
        """A provider outlives its run: owned by the cache, without lineage."""
        del run.tasks[record.key]
        record.run = self._cache_owner
        record.deps = []
        if record.dependents:  # readers in other runs still going
            record.dependents = [
                d for d in record.dependents if d.run is not run and d.state != "forgotten"
            ]
            record.waiters = 1 + sum(1 for d in record.dependents if d.state in _ACTIVE)
        else:
            record.waiters = 1
        at_manager = record.unread is True  # a small output its worker did not keep
        record.is_output = record.delivered = record.unread = False
        record.payload = b""
        record.functions = ()
        self._cache_lru[record] = None
        if at_manager:
            self._cache_at_manager[record] = record.nbytes
            self._cache_manager_held += record.nbytes
            return
        held = self._cache_held
        for worker in record.who_has:
            held[worker] = held.get(worker, 0) + record.nbytes

    def _cache_forget(self, record: TaskRecord) -> None:
        """Drop a cached result everywhere (its readers switch to their lineage)."""
        self._cache_switch(record)
        if self._cache_lru.pop(record, False) is None:
            self._cache_unhold(record, record.who_has)
            self._cache_manager_held -= self._cache_at_manager.pop(record, 0)
        self._persist.pop(record.id, None)
        self._uploads.pop(record.id, None)
        ck = self._cache_key_of.pop(record, None)
        if ck is not None and self.cache.providers.get(ck) is record:
            del self.cache.providers[ck]
        release: dict[WorkerRecord, list[int]] = {}
        if record.state != "forgotten":
            self._transition(record, "forgotten", cancel=None, release=release, sweep=False)
        for worker, ids in release.items():
            if self.workers.get(worker.id) is worker:
                self._send(worker, p.Release(tuple(ids)))

    def _cache_unhold(self, record: TaskRecord, workers: Any) -> None:
        held = self._cache_held
        for worker in workers:
            if worker in held:
                held[worker] = max(0, held[worker] - record.nbytes)

    def _cache_evict(self) -> None:
        """Release the least recently used cached results of workers over their budget
        (a copy where others remain; the result where it was the last)."""
        limit = self.cache_worker_bytes
        held, retained = self._cache_held, self._cache_retained
        for worker in [w for w in held if self.workers.get(w.id) is not w]:
            del held[worker]  # lost: its results went with it

        def used(worker: WorkerRecord) -> int:
            return held.get(worker, 0) + retained.get(worker, 0)

        if self._cache_manager_held > self.cache_manager_bytes:
            self._cache_evict_at_manager()
        over = {worker for worker in held if used(worker) > limit}
        for record in list(self._cache_lru) if over else ():
            if not over:
                break
            if record.waiters > 1 or record.id in self._awaiting:
                continue  # read by a run now
            here = [w for w in record.who_has if w in over]
            if not here:
                continue
            if len(here) == len(record.who_has):
                self._cache_forget(record)
            else:
                self._cache_unhold(record, here)
                for worker in here:
                    record.who_has.discard(worker)
                    worker.has_what.discard(record)
                    self._send(worker, p.Release((record.id,)))
            over = {w for w in over if used(w) > limit and held.get(w, 0)}
        self._cache_publish()

    def _cache_evict_at_manager(self) -> None:
        """Forget the manager's least recently used small outputs past its budget."""
        for record in [r for r in self._cache_lru if r in self._cache_at_manager]:
            if self._cache_manager_held <= self.cache_manager_bytes:
                return
            if record.waiters <= 1 and record.id not in self._awaiting:  # (else read now)
                self._cache_forget(record)

    def _cache_publish(self) -> None:
        held = self._cache_held
        for counts in (held, self._cache_retained):
            for worker in [w for w in counts if self.workers.get(w.id) is not w]:
                del counts[worker]
        index = self.cache
        index.at_manager = len(self._cache_at_manager)
        index.manager_bytes = self._cache_manager_held
        index.entries = len(self._cache_lru) - index.at_manager
        index.nbytes = sum(self._cache_held.values())

    def _cache_stats(self, run: RunRecord, crun: _CacheRun) -> None:
        info = crun.info
        seconds = self.cache.seconds
        # (a copy at once: the caller's thread may still add keys of a run that failed)
        keys = info.keys.copy()
        keyed = len(keys) - list(keys.values()).count(None)
        ran = crun.ran
        hits = saved = 0
        if keyed > len(ran):  # (a first run computes every key: nothing to add up)
            for k, ck in keys.items():
                if ck is not None and k not in ran:
                    hits += 1
                    saved += seconds.get(ck, info.seconds.get(k, 0.0))
        info.stats = {
            "hits": hits,
            "misses": len(ran),
            "uncached": max(0, len(run.tasks) - keyed),
            "tasks_run": crun.ran_count,
            "bytes_reused": crun.reused + sum(r.nbytes for r in crun.read),
            "seconds_saved": saved,
        }

    # -- the two transitions only cache runs take (steps of the transition table) ------

    def _waiting_to_released(self, task: TaskRecord) -> None:
        """A task its run will not compute unless lineage needs it (a hit, or an input
        only hits read)."""

    def _waiting_to_memory(self, task: TaskRecord) -> None:
        """A result read from the cache's directory (``_cache_preload`` sets its value)."""
