"""The result cache's side in the scheduler state: providers, hits, losses, disk.

A component of ``state.SchedulerState``; what it does is told in ``cache_placement``
(with the records it shares with the caller's side), and the bytes it keeps are counted
by a ``cache_budget.CacheBudget``. The state calls it for runs with a ``RunCache`` only,
testing ``cache_runs`` for emptiness on its per-task paths.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from daskvine_py.scheduler.cache_budget import CacheBudget
from daskvine_py.scheduler.cache_placement import (
    ACTIVE,
    CACHE_RUN_ID,
    MAX_SECONDS,
    CacheIndex,
    CacheRun,
    unlink_readers,
)
from daskvine_py.scheduler.messages import (
    CacheClear,
    CacheStatus,
    CacheWrite,
    NewTask,
    RunCache,
    RunDone,
    RunOutput,
)
from daskvine_py.scheduler.records import (
    Drop,
    RunRecord,
    TaskRecord,
    WorkerRecord,
    needed,
)
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

logger = logging.getLogger("daskvine_py.manager")

_DISK = CacheStatus.DISK


class Caching:
    """Results kept across runs; see ``cache_placement``'s docstring.

    It shares the context's ``workers``, ``runs``, ``tasks`` and ``cache_runs`` (the
    runs with a cache plan, by id) and appends to its ``out``; its messages go through
    ``Claims.send``; ``drop_run`` and ``dismiss`` are ``Failures``'; results whose last
    copies went are lost (``Copies.lose``) or recomputed (``Copies.recompute``). While a
    cache run lasts it hears of every result stored.
    """

    __slots__ = (
        "ctx",
        "workers",
        "runs",
        "tasks",
        "out",
        "transition",
        "send",
        "drop_run",
        "dismiss",
        "index",
        "budget",
        "cache_runs",
        "owner",
        "key_of",
        "awaiting",
        "persist",
        "uploads",
        "held_for_disk",
    )

    def __init__(self, ctx: Context, budget: CacheBudget | None = None) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.runs = ctx.runs
        self.tasks = ctx.tasks
        self.out = ctx.out
        self.transition = ctx.transition
        self.send = ctx.claims.send
        self.drop_run = ctx.failures.drop_run
        self.dismiss = ctx.failures.dismiss
        #: what other threads may read (see ``CacheIndex``)
        self.index = CacheIndex()
        #: the bytes kept, per worker and at the manager
        self.budget = budget if budget is not None else CacheBudget()
        #: the runs with a cache plan, by id
        self.cache_runs: dict[int, CacheRun] = ctx.cache_runs
        #: the run record that owns the results that outlived their runs
        self.owner = RunRecord(CACHE_RUN_ID, 0, ())
        #: provider -> its cache key
        self.key_of: dict[TaskRecord, bytes] = {}
        #: provider id -> outputs of runs waiting for its value (``Upload``)
        self.awaiting: dict[int, list[TaskRecord]] = {}
        #: provider id -> (store, cache key, seconds) waiting for its value to be written
        self.persist: dict[int, tuple[object, bytes, float]] = {}
        #: provider id -> the worker asked to upload it (asked again should that one go)
        self.uploads: dict[int, WorkerRecord] = {}
        #: results not kept for lack of room, held until they reached the directory
        self.held_for_disk: set[int] = set()

    # -- hooks called by the state ------------------------------------------------------

    def open(self, run: RunRecord, info: RunCache) -> None:
        self.cache_runs[run.id] = CacheRun(info)
        self.ctx.listen("caching")  # (hears of results stored while a cache run lasts)

    def added(self, run: RunRecord, added: Sequence[tuple[NewTask, TaskRecord]]) -> None:
        """Decide, as a run's tasks arrive (inputs first), which run, which read a
        provider, which start in memory (disk) and which wait as lineage."""
        crun = self.cache_runs.get(run.id)
        if crun is None:
            return
        info = crun.info
        keys, plan = info.keys, info.plan
        providers = self.index.providers
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
                self._link(crun, record, provider, converted=key not in plan)
                if self.runs.get(run.id) is not run:
                    return  # every output was delivered: the run is over
                continue
            status = plan.get(key) if plan else None
            if status == _DISK:  # (a plain "disk" too: ``CacheStatus`` is a str)
                self._preload(crun, record, info.values[key])
                if self.runs.get(run.id) is not run:
                    return
            elif status is not None:  # skipped, or a predicted hit whose provider went
                self.transition(record, "released")
                if record.waiters or record.is_output:
                    revive.append(record)
            else:
                if ck is not None:
                    self._provide(crun, record, ck)
                    if unread:
                        record.unread = None
                if crun.link and self._read_links(crun, record, touched, count=True):
                    relinked[record] = None
        for hit in touched:
            hit.dependents = [d for d in hit.dependents if d not in relinked]
        for record in revive:
            self._revive(record)

    def result_stored(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskDone) -> bool:
        """A result is in memory: kept, uploaded or written if a cache run's plan says so
        (nothing to do while no run has a cache plan)."""
        if self.cache_runs:
            self.done(task, msg, worker)
        return True

    def done(self, task: TaskRecord, msg: p.TaskDone, worker: WorkerRecord) -> None:
        """A task of a cache run finished (its result is in memory)."""
        crun = self.cache_runs.get(task.run.id)
        if crun is None:
            return
        crun.ran_count += 1
        ck = crun.info.keys.get(task.key)
        if ck is None:
            return
        crun.ran.add(task.key)
        seconds = self.index.seconds
        if len(seconds) >= MAX_SECONDS:
            seconds.clear()
        seconds[ck] = msg.duration
        if task not in self.key_of:
            return  # not a provider (lineage of a lost hit): not kept
        store = crun.info.persist
        if task.unread:
            # A small output its worker did not keep: the manager holds it (``value``).
            value = msg.value
            assert value is not None  # (an output's report carries it: ``_on_task_done``)
            for record in self.awaiting.pop(task.id, ()):
                self._deliver(record, value, value.nbytes)
            if store is not None:
                self.out.append(CacheWrite(store, ck, value, msg.duration))
            return
        # No room on its worker: not kept there, but held until it reached the directory.
        uploading = store is not None and msg.value is None
        if not self._retain(task, worker, hold=uploading) and not uploading:
            if store is not None and msg.value is not None:  # (not uploading: it has one)
                self.out.append(CacheWrite(store, ck, msg.value, msg.duration))
            return
        if store is None and not self.awaiting:
            return  # (the usual case: nothing waits for its value)
        waiting = self.awaiting.get(task.id)
        if msg.value is not None:
            if waiting:
                del self.awaiting[task.id]
                for record in waiting:
                    self._deliver(record, msg.value, msg.value.nbytes)
            if store is not None:
                self.out.append(CacheWrite(store, ck, msg.value, msg.duration))
            return
        if store is not None:
            self.persist[task.id] = (store, ck, msg.duration)
        if (waiting or store is not None) and worker in task.who_has:
            self.uploads[task.id] = worker
            self.send(worker, p.Upload((task.id,)))

    def uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> None:
        """A provider's value arrived (or did not: ``value`` None)."""
        if self.uploads.get(msg.task_id) is worker:
            del self.uploads[msg.task_id]
        waiting = self.awaiting.pop(msg.task_id, None)
        persist = self.persist.pop(msg.task_id, None)
        if msg.task_id in self.held_for_disk:
            self.held_for_disk.discard(msg.task_id)
            held = self.tasks.get(msg.task_id)
            if held is not None:
                self._let_go(held)
        if msg.value is not None:
            for record in waiting or ():
                self._deliver(record, msg.value, msg.value.nbytes)
            if persist is not None:
                self.out.append(CacheWrite(persist[0], persist[1], msg.value, persist[2]))
            return
        if persist is not None:
            logger.debug("result %d could not be uploaded for the cache", msg.task_id)
        if not waiting:
            return
        provider = self.tasks.get(msg.task_id)
        if provider is None or provider.state != "memory":
            for record in waiting:
                self._revive(record)
            return
        self.awaiting[provider.id] = waiting
        if worker in provider.who_has:  # it is not there after all
            provider.unhold(worker)
            worker.has_what.discard(provider)
        if provider.who_has:
            self._upload(provider)
        else:
            self.ctx.copies.lose([provider])

    def worker_lost(self, worker: WorkerRecord) -> None:
        """Uploads asked of a worker that is gone: asked of another holder (a result held
        nowhere any more is recomputed, and delivered, the usual way)."""
        for provider_id in [i for i, w in self.uploads.items() if w is worker]:
            del self.uploads[provider_id]
            provider = self.tasks.get(provider_id)
            wanted = provider_id in self.awaiting or provider_id in self.persist
            if provider is not None and wanted and provider.state == "memory":
                if provider.who_has:
                    self._upload(provider)
                else:
                    self.persist.pop(provider_id, None)

    def lost(self, lost: list[TaskRecord]) -> list[TaskRecord]:
        """Of results whose every copy is gone, forget the cached ones (their readers
        switch to their own lineage); the others are the state's to recompute."""
        owner = self.owner
        if not any(task.run is owner for task in lost):
            return lost
        for task in lost:
            if task.run is owner:
                self._forget(task)
        self._publish()
        return [task for task in lost if task.run is not owner]

    def drop(self, run: RunRecord) -> None:
        """A cache run ends: count, unlink its readers of other runs' results, adopt its
        providers that hold a result, hand the others' readers back to their runs."""
        crun = self.cache_runs.pop(run.id, None)
        if crun is None:
            return
        if not self.cache_runs:
            self.ctx.listen("caching", False)
        crun.info.stats = crun.stats(len(run.tasks), self.index.seconds)
        if crun.read:  # only a provider read can be another run's record
            unlink_readers(run)
        for provider_id, waiting in list(self.awaiting.items()):
            waiting[:] = [r for r in waiting if r.run is not run]
            if not waiting:
                del self.awaiting[provider_id]
        providers = self.index.providers
        budget = self.budget
        for record in crun.provided:
            if record in budget.retaining:
                budget.unretain(record)
            ck = self.key_of.get(record)
            current = ck is not None and providers.get(ck) is record
            if current and record.state == "memory" and (record.who_has or record.unread):
                self._adopt(record, run)
                continue
            if current and ck is not None:
                del providers[ck]
            self.key_of.pop(record, None)
            self.persist.pop(record.id, None)
            self._switch(record, dropping=run)  # other runs' readers: their lineage
        self._evict()

    # -- events -----------------------------------------------------------------------

    def on_clear(self, ev: CacheClear) -> None:
        for task in list(self.budget.lru):
            self._forget(task)
        self.index.seconds.clear()
        self.index.clears += 1
        self._publish()

    # -- steps --------------------------------------------------------------------------

    def _provide(self, crun: CacheRun, record: TaskRecord, ck: bytes) -> None:
        """``record`` will compute ``ck``: later tasks with that key read it."""
        self.index.providers[ck] = record
        self.key_of[record] = ck
        record.waiters += 1  # the cache reads it too: kept while the run goes on
        record.unread = False  # an output nothing reads: its worker keeps it all the same
        crun.provided.append(record)

    def _retain(self, record: TaskRecord, worker: WorkerRecord, hold: bool) -> bool:
        """Count a provider's result against its worker's budget (older cached results
        make room first); when there is none, it is not kept (``hold``: until it has
        been uploaded for the cache directory): whether it is."""
        budget = self.budget
        budget.retain(record, worker)
        if budget.fits(worker):
            return True
        if budget.held.get(worker, 0):
            self._evict()
        # Then this run's older results there that nobody else reads now go first: the
        # newest (a run's outputs, its last stages) are the likeliest to be reused whole.
        for older, (where, _) in list(budget.retaining.items()):
            if budget.fits(worker):
                return True
            if where is worker and older is not record and self._droppable(older):
                self._unprovide(older, hold=older.id in self.persist)
        if budget.fits(worker):
            return True
        if record.id in self.awaiting:
            return True  # another run's output waits for its value
        self._unprovide(record, hold)
        return False

    def _droppable(self, record: TaskRecord) -> bool:
        """Kept only for the cache: no reader waits for it, no output for its value."""
        return (
            record.waiters <= 1
            and record.id not in self.awaiting
            and record.state == "memory"
            and not (record.is_output and not record.delivered)
        )

    def _unprovide(self, record: TaskRecord, hold: bool = False) -> None:
        """A provider the cache will not keep after all (no room): released when its
        run no longer needs it, or (``hold``) once it has been uploaded."""
        self.budget.unretain(record)
        ck = self.key_of.pop(record)
        if self.index.providers.get(ck) is record:
            del self.index.providers[ck]
        if hold:
            self.held_for_disk.add(record.id)
            return
        self.persist.pop(record.id, None)
        self._let_go(record)

    def _let_go(self, record: TaskRecord) -> None:
        record.waiters -= 1  # the cache does not read it after all
        if record.state == "memory" and not (needed(record)):
            self.transition(record, "released")

    def _link(
        self, crun: CacheRun, record: TaskRecord, provider: TaskRecord, converted: bool
    ) -> None:
        """``record`` hits: its run's readers read ``provider``; ``converted``: it was
        predicted to run, and counted as a reader of its inputs."""
        self.transition(record, "released")
        crun.link[record] = provider
        crun.hit_of.setdefault(provider, record)
        if converted:
            for dep in record.deps:
                dep.waiters -= 1
        self.budget.touch(provider)  # (if cached: used, the most recent now)
        if record.is_output:
            crun.read.add(provider)
            self._deliver_from(record, provider)

    def _read_links(
        self, crun: CacheRun, record: TaskRecord, touched: dict[TaskRecord, None], count: bool
    ) -> bool:
        """``record`` (to run) reads the providers its run's hits among its inputs stand
        for; ``count``: move its ``waiters`` and ``missing`` counts along (not when
        ``recompute`` counts next). Whether it reads any."""
        deps = list(record.deps)
        any_read = False
        for i, dep in enumerate(deps):
            provider = crun.link.get(dep)
            if provider is None:
                continue
            if self.tasks.get(provider.id) is not provider or provider.state == "released":
                del crun.link[dep]  # gone, or given up by the cache, meanwhile
                self._revive(dep)
                continue
            deps[i] = provider
            record.deps = tuple(deps)
            if provider.key != dep.key:
                crun.read_as[record.id, i] = dep.key
            provider.add_dependent(record)
            crun.read.add(provider)
            touched[dep] = None
            any_read = True
            if count:
                provider.waiters += 1
                dep.waiters -= 1
                if provider.state == "memory":
                    record.missing -= 1  # (the hit, released, was counted missing)
        return any_read

    def locations(
        self, task: TaskRecord, deps: tuple[p.DepLocation, ...]
    ) -> tuple[p.DepLocation, ...]:
        """A task's inputs as its payload names them (``CacheRun.read_as``)."""
        crun = self.cache_runs.get(task.run.id)
        return deps if crun is None or not crun.read_as else crun.renamed(task.id, deps)

    def _preload(self, crun: CacheRun, record: TaskRecord, value: Serialized) -> None:
        """A result read from the cache's directory: in memory at the manager; readers
        get it inside their ``Execute``."""
        self.transition(record, "memory")
        record.value = value
        record.nbytes = value.nbytes
        crun.reused += value.nbytes
        for reader in record.dependents:  # of the same part: they counted it missing
            reader.missing -= 1
        if record.is_output:
            self._deliver(record, value, 0)

    def _deliver_from(self, record: TaskRecord, provider: TaskRecord) -> None:
        if provider.value is not None:
            self._deliver(record, provider.value, 0)
            return
        waiting = self.awaiting.setdefault(provider.id, [])
        waiting.append(record)
        if len(waiting) == 1 and provider.state == "memory":
            self._upload(provider)  # (else asked for when it is done)

    def _upload(self, provider: TaskRecord) -> None:
        holder = min(provider.who_has, key=lambda w: w.name)
        self.uploads[provider.id] = holder
        self.send(holder, p.Upload((provider.id,)))

    def _deliver(self, record: TaskRecord, value: Serialized, nbytes: int) -> None:
        """An output that hit gets its value."""
        run = record.run
        if record.delivered or self.runs.get(run.id) is not run:
            return
        record.delivered = True
        self.out.append(RunOutput(run.id, record.key, value))
        run.undelivered -= 1
        crun = self.cache_runs.get(run.id)
        if crun is not None:
            crun.reused += nbytes
        if not run.undelivered:
            self.out.append(
                RunDone(
                    run.id, run.run_seconds, run.serialization_seconds, categories=run.categories
                )
            )
            self.drop_run(run)

    def payload(self, task: TaskRecord) -> None:
        """A task submitted without its payload (``RunCache.deferred``) is to run after
        all (lineage): make its payload now."""
        crun = self.cache_runs.get(task.run.id)
        if crun is None or crun.info.encode is None or task.key not in crun.info.deferred:
            return
        task.payload, task.functions, functions = crun.info.encode(task.key)
        task.run.functions.update(functions)

    def _revive(self, record: TaskRecord) -> None:
        """A record that stood for a result it can no longer have: compute it from its
        lineage, if its run still needs it."""
        if record.state != "released" or self.tasks.get(record.id) is not record:
            return
        if not (needed(record)):
            return
        crun = self.cache_runs.get(record.run.id)
        if crun is not None:
            crun.link.pop(record, None)
            ck = crun.info.keys.get(record.key)
            current = self.index.providers.get(ck) if ck is not None else None
            if ck is not None and (current is None or self.tasks.get(current.id) is not current):
                self._provide(crun, record, ck)
            if crun.link:  # inputs that hit: read their providers, not their lineage
                self._relink_lineage(crun, record)
        self.ctx.copies.recompute(record)

    def _relink_lineage(self, crun: CacheRun, root: TaskRecord) -> None:
        """Before ``recompute(root)``: the released records it will walk read the
        providers their inputs' hits stand for, where those still live."""
        stack, seen = [root], {root}
        while stack:
            record = stack.pop()
            touched: dict[TaskRecord, None] = {}
            self._read_links(crun, record, touched, count=False)
            for hit in touched:
                hit.dependents = [d for d in hit.dependents if d is not record]
            for dep in record.deps:
                if dep.state == "released" and dep.run is record.run and dep not in seen:
                    seen.add(dep)
                    stack.append(dep)

    def _switch(self, provider: TaskRecord, dropping: RunRecord | None = None) -> None:
        """``provider`` goes: the tasks of other runs that read it read their own run's
        record for it again, which is computed from lineage."""
        revive: list[TaskRecord] = []
        kept = []
        for reader in provider.dependents:
            if reader.state == "forgotten" or reader.run is dropping:
                continue
            crun = self.cache_runs.get(reader.run.id)
            own = crun.hit_of.get(provider) if crun is not None else None
            if own is None:  # of the provider's own run: the state's lineage
                kept.append(reader)
                continue
            reader.deps = tuple(own if dep is provider else dep for dep in reader.deps)
            own.add_dependent(reader)
            if reader.state in ACTIVE:
                own.waiters += 1
                provider.waiters -= 1
                if provider.state == "memory":
                    reader.missing += 1
                    if reader.state != "waiting":
                        self.transition(reader, "waiting")
            revive.append(own)
        provider.dependents = kept
        for crun in self.cache_runs.values():
            own = crun.hit_of.pop(provider, None)
            if own is not None:
                crun.link.pop(own, None)
                revive.append(own)
        revive.extend(self.awaiting.pop(provider.id, ()))
        for record in revive:
            self._revive(record)

    def _adopt(self, record: TaskRecord, run: RunRecord) -> None:
        """A provider outlives its run: owned by the cache, without lineage."""
        del run.tasks[record.key]
        record.run = self.owner
        record.deps = ()
        if record.dependents:  # readers in other runs still going
            record.dependents = [
                d for d in record.dependents if d.run is not run and d.state != "forgotten"
            ]
            record.waiters = 1 + sum(1 for d in record.dependents if d.state in ACTIVE)
        else:
            record.waiters = 1
        at_manager = record.unread is True  # a small output its worker did not keep
        record.is_output = record.delivered = record.unread = False
        record.payload = b""
        record.functions = ()
        self.budget.adopt(record, at_manager)

    def _forget(self, record: TaskRecord) -> None:
        """Drop a cached result everywhere (its readers switch to their lineage)."""
        self._switch(record)
        self.budget.forget(record)
        self.persist.pop(record.id, None)
        self.uploads.pop(record.id, None)
        ck = self.key_of.pop(record, None)
        if ck is not None and self.index.providers.get(ck) is record:
            del self.index.providers[ck]
        drop = Drop(spared=record)  # (nothing to cancel: it is in memory)
        if record.state != "forgotten":
            self.dismiss(record, drop)
        for worker, ids in drop.release.items():
            if self.workers.get(worker.id) is worker:
                self.send(worker, p.Release(tuple(ids)))

    def _evict(self) -> None:
        self.budget.evict(self.workers, self._busy, self._forget, self._release_copy)
        self._publish()

    def _busy(self, record: TaskRecord) -> bool:
        """Read by a run now: not evicted."""
        return record.waiters > 1 or record.id in self.awaiting

    def _release_copy(self, record: TaskRecord, worker: WorkerRecord) -> None:
        record.unhold(worker)
        worker.has_what.discard(record)
        self.send(worker, p.Release((record.id,)))

    def _publish(self) -> None:
        self.budget.forget_workers(self.workers, retained=True)
        self.budget.publish(self.index)
