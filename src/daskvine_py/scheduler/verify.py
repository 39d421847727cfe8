"""Optional verification (``get(..., verify=f)``): a fraction of a run's tasks run twice,
on two workers, and their results are compared by content hash.

A component of ``state.SchedulerState``. A node whose memory corrupts data, or a worker
that answers wrong on purpose, returns a result of the right type that nothing else
would catch; re-running a sample elsewhere is what catches it (volunteer computing's
redundancy, at a fraction). How it goes:

- which tasks: a fixed share chosen from the task id (``chosen``), so a run's sample is
  spread over its whole graph and costs one multiplication per task to pick;
- a chosen task asks its worker for its value (``Execute.want_result``), and holds its
  inputs (one more ``waiters`` each) so they outlive it until the re-run has read them;
- when it is done on worker A, a shadow record with the same payload and inputs is made
  and queued for the least loaded other worker B; the run is not done before it is;
- the shadow's value comes back too, never kept on B; the two values' bytes (the pickled
  header and its buffers, never unpickled here) are hashed and compared. Equal: counted
  (``RunDone.verified``). Different: the run fails naming the key and both workers. A
  shadow that ran on A all the same (B left meanwhile) is not compared.

Values whose pickles depend on hash order (a set of strings built in two processes)
differ byte for byte however right they are: verification is for results with one
serialized form, as most numeric results have (docs/faults.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from daskvine_py.plan.annotations import Placement
from daskvine_py.scheduler.messages import Key
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord, needed
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: Spreads task ids over [0, 2^32) for the sample (Knuth's multiplicative hash).
_SPREAD = 2654435761
_SPAN = 1 << 32


class Shadow(NamedTuple):
    """The key a re-run is filed under in its run's tasks (never equal to a Dask key)."""

    key: Key


def digest(value: Serialized) -> bytes:
    """A content hash of a result as it travelled: its header and its buffers."""
    h = hashlib.blake2b(value.header, digest_size=16)
    for buffer in value.buffers:
        h.update(buffer)
    return h.digest()


def chosen(task_id: int, fraction: float) -> bool:
    """Whether a task of a run verifying ``fraction`` of its tasks is re-run."""
    return (task_id * _SPREAD) % _SPAN < fraction * _SPAN


class Verification:
    """Shadows of the chosen tasks and what their first runs produced.

    It reads the context's ``workers`` and ``tasks``; ``new_id()`` gives a task id;
    ``fail`` is ``Failures.fail`` (a task's run fails). Once a task was chosen it hears
    of every result stored, and compares those of the chosen tasks and their shadows.
    """

    __slots__ = ("ctx", "workers", "tasks", "transition", "new_id", "fail", "first")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.tasks = ctx.tasks
        self.transition = ctx.transition
        self.new_id = ctx.new_id
        self.fail = ctx.failures.fail
        #: shadow id -> (the first run's digest, its worker's name and record)
        self.first: dict[int, tuple[bytes, str, WorkerRecord]] = {}

    def added(self, run: RunRecord, added: list[TaskRecord]) -> None:
        """Choose the run's sample among tasks just added (their inputs are linked); from
        the first one chosen, hear of every result stored (for good: cheap to test)."""
        fraction = run.verify
        for task in added:
            if chosen(task.id, fraction):
                if "verification" not in self.ctx.listening:
                    self.ctx.listen("verification")
                task.echo = True
                for dep in task.deps:  # kept until the shadow has read them
                    dep.waiters += 1

    def result_stored(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskDone) -> bool:
        """A result is in memory: compared if it is a chosen task's or a shadow's
        (``echo``); False: the run failed."""
        if not task.echo:
            return True
        return self.done(task, worker, msg.value)

    def done(self, task: TaskRecord, worker: WorkerRecord, value: Serialized | None) -> bool:
        """A chosen task or a shadow reported done with ``value``; False: the run failed."""
        run = task.run
        first = self.first.pop(task.id, None)
        if first is not None:
            return self._compare(task, worker, value, first)
        task.echo = False  # once: a recomputation later is not verified again
        other = self._elsewhere(worker)
        if value is None or other is None:
            self._unhold(task)
            return True
        shadow = TaskRecord(
            self.new_id(),
            task.key,
            run,
            task.payload,
            task.functions,
            task.priority,
            task.prefix,
        )
        shadow.echo = True
        shadow.unread = True  # its worker sends the value and keeps no copy
        # Placed on the other worker only (any, should it leave): left to the queue's
        # soft targeting, an idle first worker would take its own re-run.
        shadow.placement = replace(
            task.placement or Placement(), workers=frozenset({other.name}), loose=True
        )
        shadow.deps = task.deps  # their ``waiters`` already count it (``added``)
        for dep in task.deps:  # a lost input is recomputed for it as for any reader
            dep.dependents.append(shadow)
        shadow.missing = sum(1 for dep in task.deps if dep.state != "memory")
        run.tasks[Shadow(task.key)] = shadow
        self.tasks[shadow.id] = shadow
        run.undelivered += 1  # the run ends once the comparison is made
        self.first[shadow.id] = (digest(value), worker.name, worker)
        if shadow.missing:
            return True  # an input was lost meanwhile: it waits, recomputed by lineage
        self.transition(shadow, "ready")
        return True

    def _compare(
        self,
        shadow: TaskRecord,
        worker: WorkerRecord,
        value: Serialized | None,
        first: tuple[bytes, str, WorkerRecord],
    ) -> bool:
        run = shadow.run
        run.undelivered -= 1
        expected, first_name, first_worker = first
        if value is None or worker is first_worker:
            return True  # ran where the first did: nothing learned
        if digest(value) == expected:
            run.verified += 1
            return True
        self.fail(
            shadow,
            worker,
            None,
            "",
            f"verification failed: its result on worker {first_name} and its re-run on "
            f"worker {worker.name} differ (content hashes {expected.hex()} and "
            f"{digest(value).hex()}); one of them computed it wrong",
            False,
        )
        return False

    def _unhold(self, task: TaskRecord) -> None:
        """Give back the hold on a chosen task's inputs that will have no shadow."""
        for dep in task.deps:
            dep.waiters -= 1
            if dep.state == "memory" and not needed(dep):
                self.transition(dep, "released")

    def _elsewhere(self, worker: WorkerRecord) -> WorkerRecord | None:
        """The least loaded worker other than ``worker`` (a store that is full last)."""
        best: WorkerRecord | None = None
        best_load = 0.0
        for other in self.workers.values():
            if other is worker:
                continue
            load = len(other.processing) / other.cores + (1e6 if other.full else 0.0)
            if best is None or load < best_load:
                best, best_load = other, load
        return best
