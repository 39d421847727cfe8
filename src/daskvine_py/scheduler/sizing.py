"""The memory each task is allotted, where that fits, and what a task that ran out of it
gets next: the manager's side of enforced allocations (docs/resources.md, "Sizing
categories").

A component of ``state.SchedulerState``. Every task has a category: the prefix of its key
(``TaskRecord.prefix``) unless annotated ``dask.annotate(category=...)``. A category's
``Size`` lives as long as the manager: what one run measured sizes the next.

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
- **Exhaustion** (``TaskExhausted``). The task is retried, using one of its retries as a
  crash does, with ``GROWTH`` x what it was seen to use (at least its category's "max"
  allocation), capped to the largest worker: not straight to a whole worker. When it had
  the most any worker offers already, or has no retries left, its run fails with
  ``ResourceExhausted``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from daskvine_py.errors import ResourceExhausted
from daskvine_py.options import SIZING_MODES
from daskvine_py.scheduler.messages import Instruction, TaskFinished, WorkerId
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

MB = 2**20
#: "max": the largest peak seen times this: room for the next task's being a little larger.
MARGIN = 1.25
#: The least a measured category is allotted: a task's own peak is measured as a
#: difference of resident sizes, a few MB of which are the allocator's, not the task's.
FLOOR = 8 * MB
#: A task that ran out is retried with this times what it was seen to use.
GROWTH = 1.5
#: "min-waste"/"max-throughput": peaks are kept in buckets growing by this ratio from
#: ``FLOOR`` (some 9% apart: a hundred-odd buckets up to a terabyte), each bucket's upper
#: bound a candidate allocation.
STEP = 2**0.125
#: Seconds a task counts for at least, so that instant tasks weigh something.
MIN_SECONDS = 1e-3
#: "min-waste"/"max-throughput": past this many finished tasks, the allocation is
#: computed again every this many (and at each new largest peak).
RESIZE_EVERY = 16


class Size:
    """One category's measurements, and the memory each of its tasks gets now."""

    __slots__ = ("name", "mode", "allocation", "measured", "slow", "peak", "tasks",
                 "exhausted", "buckets")  # fmt: skip

    def __init__(self, name: str, mode: str) -> None:
        self.name = name
        self.mode = mode
        #: bytes each of its tasks gets now (0: none: what the worker's budget has left)
        self.allocation = 0
        #: one of its tasks finished (the mode sizes it from then on)
        self.measured = False
        #: dispatch looks at its tasks one by one (``Sizing.fits``): unmeasured, or its
        #: allocation not yet counted in ``Sizing.largest``
        self.slow = mode != "fixed"
        #: the largest peak seen (bytes), tasks finished, tasks that ran out
        self.peak = 0
        self.tasks = 0
        self.exhausted = 0
        #: "min-waste"/"max-throughput": bucket's upper bound -> [tasks, seconds]
        self.buckets: dict[int, list[float]] = {}

    def __repr__(self) -> str:
        return (f"Size({self.name!r}, {self.mode}, allocation={self.allocation / MB:.1f} MB, "
                f"tasks={self.tasks}, exhausted={self.exhausted})")  # fmt: skip

    def measure(self, peak: int, seconds: float) -> None:
        """One of its tasks finished having used ``peak`` bytes for ``seconds``."""
        self.tasks += 1
        mode = self.mode
        if mode == "fixed":
            return
        first = not self.measured
        self.measured = True
        larger = peak > self.peak
        if larger:
            self.peak = peak
        if mode == "max":
            if first or larger:
                self.allocation = self.top()
            return
        bound = _bucket(peak)
        seconds = max(seconds, MIN_SECONDS)
        entry = self.buckets.get(bound)
        if entry is None:
            self.buckets[bound] = [1.0, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds
        if first or larger or entry is None or self.tasks % RESIZE_EVERY == 0:
            self.allocation = self._first_allocation()

    def top(self) -> int:
        """The "max" allocation: the largest peak seen and a margin (0: none seen)."""
        return max(FLOOR, int(self.peak * MARGIN)) if self.measured else 0

    def _first_allocation(self) -> int:
        """The candidate (a bucket's bound, or the "max" allocation) that wastes least or
        finishes most, a task above it paying its try and a retry at the "max" one."""
        top = self.top()
        buckets = sorted(self.buckets.items())
        tasks = sum(entry[0] for _, entry in buckets)
        seconds = sum(entry[1] for _, entry in buckets)
        waste = self.mode == "min-waste"

        def score(allotted: int, fit: float, again: float) -> float:
            """Higher is better; ``fit`` tasks fit in ``allotted``, the others ran for
            ``again`` seconds that a retry at ``top`` repeats."""
            if waste:  # memory x seconds held (less is better)
                return -(allotted * seconds + top * again)
            # tasks per second in ``top`` bytes: top / allotted at once of those that
            # fit, one at a time of those that run again
            return (top / allotted * fit + (tasks - fit)) / (seconds + again)

        best, best_score = top, score(top, tasks, 0.0)
        fit = spent = 0.0
        for bound, (count, seconds_in) in buckets:
            fit += count
            spent += seconds_in
            allotted = max(bound, FLOOR)
            if allotted >= top:
                break
            candidate = score(allotted, fit, seconds - spent)
            if candidate > best_score:
                best, best_score = allotted, candidate
        return best


def _bucket(peak: int) -> int:
    """The upper bound of the bucket that holds a peak of ``peak`` bytes."""
    if peak <= FLOOR:
        return FLOOR
    return int(FLOOR * STEP ** math.ceil(math.log(peak / FLOOR, STEP) - 1e-9))


class Sizing:
    """Categories' sizes, the fit of tasks on workers, and tasks that ran out; see the
    module docstring.

    It reads the state's ``workers`` and appends to its ``out``; ``held``: the state's;
    ``stale(worker, task_id, report)``: ``Claims.stale``; ``not_held(task_id, worker)``:
    ``Copies.not_held``; ``retry(task)``: ``Churn.out_of_retries``; ``fail``:
    ``Failures.fail``. ``mode`` is every category's mode but those in ``modes``.
    """

    __slots__ = ("workers", "out", "held", "stale", "not_held", "retry", "fail", "mode",
                 "modes", "sizes", "largest", "changed")  # fmt: skip

    def __init__(
        self,
        workers: dict[WorkerId, WorkerRecord],
        out: list[Instruction],
        held: Callable[[int, WorkerRecord], TaskRecord | None],
        stale: Callable[[WorkerRecord, int, object], bool],
        not_held: Callable[[int, WorkerRecord], None],
        retry: Callable[[TaskRecord], bool],
        fail: Callable[..., None],
        mode: str = "max",
        modes: Mapping[str, str] | None = None,
    ) -> None:
        for given in (mode, *(modes or {}).values()):
            if given not in SIZING_MODES:
                raise ValueError(f"a sizing mode is one of {SIZING_MODES}, not {given!r}")
        self.workers = workers
        self.out = out
        self.held = held
        self.stale = stale
        self.not_held = not_held
        self.retry = retry
        self.fail = fail
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
            used += other.memory
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

    def done(self, task: TaskRecord, msg: p.TaskDone) -> None:
        """``task`` finished: its run's category totals, and its category's size."""
        size = task.size
        if size is None:
            size = self.size_of(task)
        peak = msg.peak_memory
        task.run.categories.done(size.name, msg.duration, msg.cpu, peak, task.memory)
        if size.measured and peak <= size.peak and size.mode == "max":
            size.tasks += 1  # (the common case: nothing changes)
            return
        measured = size.measured
        size.measure(peak, msg.duration)
        if size.allocation > self.largest:
            self.largest = size.allocation
        if size.measured and not measured:
            self.changed = True  # its tasks waiting one per worker may go now

    def on_exhausted(self, worker: WorkerRecord, msg: p.TaskExhausted) -> None:
        """``task`` went past its allocation and was stopped: retried with more, or its
        run fails with ``ResourceExhausted``."""
        task = self.held(msg.task_id, worker)
        if task is None:
            if self.stale(worker, msg.task_id, msg):  # (else a false claim: dropped)
                self.not_held(msg.task_id, worker)
            return
        size = task.size
        if size is None:
            size = self.size_of(task)
        peak, limit = msg.peak, msg.limit
        size.exhausted += 1
        run = task.run
        run.categories.exhausted(size.name, peak, limit or task.memory)
        allowed = f"{limit / MB:.1f} MB" if limit else "its worker's budget"
        if run.watched:
            reason = f"used {peak / MB:.1f} MB of memory, past {allowed}: stopped"
            self.out.append(TaskFinished(run.id, task.key, worker.name,
                                         p.TaskCrashed(task.id, reason)))  # fmt: skip
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
            if not self.retry(task):
                return
        else:
            task.attempts += 1  # (this try: there is no more to give it)
        error = ResourceExhausted(task.key, task.prefix, peak, limit, worker.name, task.attempts)
        fail: Callable[[TaskRecord, WorkerRecord, Serialized | None, str, str, bool, str,
                        BaseException | None], None] = self.fail  # fmt: skip
        fail(task, worker, None, "", error.reason, True, "", error)
