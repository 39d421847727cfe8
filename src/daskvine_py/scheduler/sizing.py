"""The memory each task is allotted, where that fits, and what a task that ran out of it
gets next: the manager's side of enforced allocations (docs/resources.md, "Sizing
categories").

A component of ``state.SchedulerState``. Every task has a category: the prefix of its key
(``TaskRecord.prefix``) unless annotated ``dask.annotate(category=...)``. A category's
``Size`` (``category_size``) lives as long as the manager: what one run measured sizes
the next.

- **Allocation** (``Execute.memory``, bytes). Annotated ``resources={"memory": MB}`` is
  the task's own. Otherwise, while its category has no finished task, a task gets 0: the
  worker lets it use what the other tasks' allocations leave of its budget; and a worker
  holds one such task per category at a time, so that it is not filled with unknown,
  maybe hungry tasks. From the first ``TaskDone`` on, the category's mode sizes it:
  "max", the largest peak seen times ``MARGIN`` (at least ``FLOOR``); "min-waste" and
  "max-throughput", the allocation that, over the peaks seen, wastes least memory x
  seconds or finishes most tasks per second, a task that does not fit costing its first
  try and a second at the "max" size; "fixed", none (only annotations count).
- **Placement.** A worker holds tasks only while their allocations fit its ``--memory``.
  Dispatch asks ``fits`` only when it could matter: a category still unmeasured, or the
  largest allocation any task may hold (``largest``) times the tasks the worker may hold
  above its memory; else the check is a multiplication and a comparison. A worker that
  gave no memory figure (0) is not sized. An allocation larger than every worker's memory
  is capped to the largest.
- **Exhaustion** (``TaskExhausted``, "memory": its own use). The task is retried, using
  one of its retries as a crash does, with ``GROWTH`` x what it was seen to use (at least
  its category's "max" allocation), capped to the largest worker: not straight to a whole
  worker. When it had the most any worker offers already, or has no retries left, its
  run fails with ``ResourceExhausted``. A task stopped for its worker's budget
  ("budget": the libraries together went past it, the allocated ones within their
  allocations) did nothing wrong: it runs again with an allocation of its own, using no
  retry, and never fails its run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from daskvine_py.errors import ResourceExhausted
from daskvine_py.options import SIZING_MODES
from daskvine_py.scheduler.category_size import FLOOR, Size
from daskvine_py.scheduler.messages import TaskFinished
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

MB = 2**20
#: A task that ran out is retried with this times what it was seen to use.
GROWTH = 1.5


class Sizing:
    """Categories' sizes, the fit of tasks on workers, and tasks that ran out; see the
    module docstring.

    It reads the context's ``workers`` and appends to its ``out``; a task that ran out
    is retried (``Churn.out_of_retries``) or fails its run (``Failures.fail``). ``mode``
    is every category's mode but those in ``modes``. It hears of every task's result:
    its category's totals in the run, and its size.
    """

    __slots__ = ("ctx", "workers", "out", "held", "mode", "modes", "sizes", "largest", "changed")

    def __init__(
        self, ctx: Context, mode: str = "max", modes: Mapping[str, str] | None = None
    ) -> None:
        for given in (mode, *(modes or {}).values()):
            if given not in SIZING_MODES:
                raise ValueError(f"a sizing mode is one of {SIZING_MODES}, not {given!r}")
        self.ctx = ctx
        self.workers = ctx.workers
        self.out = ctx.out
        self.held = ctx.held
        self.mode = mode
        self.modes = dict(modes or {})
        #: every category seen since the start, by name
        self.sizes: dict[str, Size] = {}
        #: no task processing may hold more than this (bytes): while it times the tasks
        #: a worker may hold stays within its memory, nothing needs summing
        self.largest = 0
        #: a category's first task finished: the next round visits every worker
        self.changed = False

    # -- what dispatch asks --------------------------------------------------------------

    def category(self, task: TaskRecord) -> str:
        """``task``'s category: its key's prefix unless annotated ``category=``."""
        return (task.size or self.size_of(task)).name

    def size_of(self, task: TaskRecord) -> Size:
        """``task``'s category (found once per task), and its own ask from annotations."""
        name = task.prefix
        settings = task.run.settings
        if settings is not None and settings.categories:
            name = settings.categories.get(task.key, name)
        size = self.sizes.get(name)
        if size is None:
            size = self.sizes[name] = Size(name, self.modes.get(name, self.mode))
        task.size = size
        placement = task.placement
        if placement is not None and placement.memory and not task.asks:
            task.asks = placement.memory
            if task.asks > self.largest:
                self.largest = task.asks
        return size

    def fits(self, worker: WorkerRecord, task: TaskRecord, size: Size, limit: int) -> bool:
        """Whether ``worker`` (holding fewer than ``limit`` tasks) may take ``task`` now:
        one unmeasured task of a category at a time, allocations within its memory."""
        memory = worker.memory
        if not memory:
            return True  # no memory figure: nothing to size against
        if size.slow:
            if not size.measured:
                if not task.asks:
                    for other in worker.processing:
                        if other.size is size:
                            return False
            else:
                if size.allocation > self.largest:
                    self.largest = size.allocation
                size.slow = False
        need = task.asks or size.allocation
        if need > memory:
            need = min(need, self.top())  # (what no worker has is capped to the largest)
            if need > memory:
                return False  # a larger worker will take it
        largest = self.largest
        if need > largest:
            self.largest = largest = need
        if largest * limit <= memory:
            return True
        used = need
        for other in worker.processing:
            used += other.allotted()
        return used <= memory

    def top(self) -> int:
        """The largest memory a connected worker offers (bytes)."""
        return max((worker.memory for worker in self.workers.values()), default=0)

    def idle(self) -> None:
        """No run is left, hence no task processing: ``largest`` starts again from what
        the next runs' categories hold."""
        self.largest = 0
        for size in self.sizes.values():
            if size.measured and size.mode != "fixed":
                size.slow = True

    # -- reports -----------------------------------------------------------------------------

    def task_done(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskDone) -> None:
        """``task`` finished: its run's category totals, and its category's size."""
        size = task.size
        if size is None:
            size = self.size_of(task)
        peak = msg.peak_memory
        task.run.categories.done(
            size.name, msg.duration, msg.cpu, peak, msg.nbytes, task.deps, task.memory
        )
        if msg.inputs:
            task.run.categories.files(size.name, msg.inputs)
        if size.measured and peak <= size.peak and size.mode == "max":
            size.tasks += 1  # (the common case: nothing changes)
            return
        measured = size.measured
        size.measure(peak, msg.duration)
        if size.allocation > self.largest:
            self.largest = size.allocation
        if size.measured and not measured:
            self.changed = True  # its tasks waiting one per worker may go now

    def task_erred(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskErred) -> None:
        """``task`` raised: a failure of its category in its run."""
        task.run.categories.fail(self.category(task))

    def task_crashed(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        """``task``'s process died: a failure of its category in its run."""
        task.run.categories.fail(self.category(task))

    def _made_room(self, task: TaskRecord, worker: WorkerRecord, size: Size, peak: int) -> None:
        """``task``, of no allocation, was stopped because the worker's libraries together
        went past its budget: no fault of its own, so it uses no retry and never fails its
        run. It runs again with an allocation of its own (what it was seen to use, grown,
        at least its category's "max"), which placement keeps room for and which only its
        own use can exhaust: the same stop cannot come back to it."""
        run = task.run
        if run.watched:
            reason = (
                f"stopped at {peak / MB:.1f} MB to keep worker {worker.name} within its "
                "memory budget: run again with an allocation of its own"
            )
            self.out.append(
                TaskFinished(run.id, task.key, worker.name, p.TaskCrashed(task.id, reason))
            )
        grown = min(max(int(peak * GROWTH), size.top(), FLOOR), self.top())
        task.asks = max(task.asks, grown)
        if task.asks > self.largest:
            self.largest = task.asks
        self.ctx.transition(task, "ready" if task.missing == 0 else "waiting")  # no retry

    def on_exhausted(self, worker: WorkerRecord, msg: p.TaskExhausted) -> None:
        """``task`` went past its allocation and was stopped: retried with more, or its
        run fails with ``ResourceExhausted``; one stopped for its worker's budget is
        retried (``_made_room``)."""
        task = self.held(msg.task_id, worker)
        if task is None:
            if self.ctx.claims.stale(worker, msg.task_id, msg):  # (else a false claim)
                self.ctx.copies.not_held(msg.task_id, worker)
            return
        size = task.size
        if size is None:
            size = self.size_of(task)
        peak, limit = msg.peak, msg.limit
        if msg.resource == "budget":
            return self._made_room(task, worker, size, peak)
        size.exhausted += 1
        run = task.run
        run.categories.exhausted(size.name, peak, limit or task.memory)
        allowed = f"{limit / MB:.1f} MB" if limit else "its worker's budget"
        if run.watched:
            reason = f"used {peak / MB:.1f} MB of memory, past {allowed}: stopped"
            self.out.append(
                TaskFinished(run.id, task.key, worker.name, p.TaskCrashed(task.id, reason))
            )
        top = self.top()
        had = limit or worker.memory  # (0: it could use its whole worker)
        if had < top:
            # More than it was seen to use, and at least its category's "max" allocation:
            # what the modes that allot less count a retry at.
            grown = max(int(max(peak, had) * GROWTH), size.top())
            grown = min(grown, top)
            task.asks = grown
            if grown > self.largest:
                self.largest = grown
            if not self.ctx.churn.out_of_retries(task):
                return
        else:
            task.attempts += 1  # (this try: there is no more to give it)
        error = ResourceExhausted(task.key, task.prefix, peak, limit, worker.name, task.attempts)
        fail: Callable[
            [
                TaskRecord,
                WorkerRecord,
                Serialized | None,
                str,
                str,
                bool,
                str,
                BaseException | None,
            ],
            None,
        ] = self.ctx.failures.fail
        fail(task, worker, None, "", error.reason, True, "", error)
