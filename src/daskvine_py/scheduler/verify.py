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
  (``RunDone.verified``). A shadow that ran on A all the same (B left meanwhile) is not
  compared;
- different: a third worker C settles it (a referee, made as the shadow was: its
  inputs are held for it until the comparison). The two that agree win, the odd one is
  the suspect (``Faults.suspect``: quarantined the second time). C agrees with A: the
  result the run used stands, and counts as verified. C agrees with B: A's result was
  wrong and the run read it, so the run fails naming A. Three different results, no
  third worker to ask (not quarantined, full, A or B), or a referee that ran on A or B
  all the same: the run fails naming the key and both workers, and no one is struck.

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
    """The key a re-run is filed under in its run's tasks (never equal to a Dask key);
    ``referee``: the third run that settles a disagreement."""

    key: Key
    referee: bool = False


class Disagreement(NamedTuple):
    """What a referee settles: the digests of a task's first run and its re-run, and
    the workers that computed them."""

    first: bytes
    first_worker: WorkerRecord
    second: bytes
    second_worker: WorkerRecord


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

    __slots__ = (
        "ctx",
        "workers",
        "tasks",
        "transition",
        "new_id",
        "fail",
        "suspect",
        "first",
        "referees",
    )

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.tasks = ctx.tasks
        self.transition = ctx.transition
        self.new_id = ctx.new_id
        self.fail = ctx.failures.fail
        self.suspect = ctx.faults.suspect
        #: shadow id -> (the first run's digest, its worker's name and record)
        self.first: dict[int, tuple[bytes, str, WorkerRecord]] = {}
        #: referee id -> the disagreement it settles
        self.referees: dict[int, Disagreement] = {}

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
        first = self.first.pop(task.id, None)
        if first is not None:
            return self._compare(task, worker, value, first)
        disagreement = self.referees.pop(task.id, None)
        if disagreement is not None:
            return self._settle(task, worker, value, disagreement)
        task.echo = False  # once: a recomputation later is not verified again
        # A worker that takes new tasks (a quarantined one never would: the run hung)
        other = self._elsewhere((worker,), usable=True)
        if value is None or other is None:
            self._unhold(task)
            return True
        # Its inputs are held once more, for a referee should the results differ.
        shadow = self._rerun(task, other, Shadow(task.key), hold=True)
        self.first[shadow.id] = (digest(value), worker.name, worker)
        return True

    def _rerun(self, task: TaskRecord, on: WorkerRecord, key: Shadow, hold: bool) -> TaskRecord:
        """A record running ``task``'s payload again on ``on``, its value sent back and
        not kept, filed under ``key``; its inputs already hold it (``hold``: once more,
        for a referee after it)."""
        run = task.run
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
            task.placement or Placement(), workers=frozenset({on.name}), loose=True
        )
        shadow.deps = task.deps  # their ``waiters`` already count it (``added``)
        for dep in task.deps:  # a lost input is recomputed for it as for any reader
            dep.add_dependent(shadow)
            if hold:
                dep.waiters += 1
        shadow.missing = sum(1 for dep in task.deps if dep.state != "memory")
        run.tasks[key] = shadow
        self.tasks[shadow.id] = shadow
        run.undelivered += 1  # the run ends once the comparison is made
        if not shadow.missing:  # (else an input was lost meanwhile: it waits, recomputed
            self.transition(shadow, "ready")  # by lineage)
        return shadow

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
            self._unhold(shadow)
            return True  # ran where the first did: nothing learned
        got = digest(value)
        if got == expected:
            run.verified += 1
            self._unhold(shadow)
            return True
        differ = (
            f"verification failed: its result on worker {first_name} and its re-run on "
            f"worker {worker.name} differ (content hashes {expected.hex()} and {got.hex()})"
        )
        third = self._elsewhere((first_worker, worker), usable=True)
        if third is None:
            return self._failed(shadow, worker, f"{differ}; no third worker to settle which")
        referee = self._rerun(shadow, third, Shadow(shadow.key, True), hold=False)
        self.referees[referee.id] = Disagreement(expected, first_worker, got, worker)
        return True

    def _settle(
        self, referee: TaskRecord, worker: WorkerRecord, value: Serialized | None, d: Disagreement
    ) -> bool:
        """A referee's result: the two that agree win, the odd one is the suspect."""
        run = referee.run
        run.undelivered -= 1
        first, second = d.first_worker, d.second_worker
        differ = (
            f"verification failed: its result on worker {first.name} and its re-run on "
            f"worker {second.name} differ"
        )
        if value is None or worker is first or worker is second:
            return self._failed(referee, worker, f"{differ}, and no third worker settled it")
        got = digest(value)
        if got == d.first:
            run.verified += 1
            self.suspect(
                second,
                f"its result of task {referee.key!r:.60} differed from those of "
                f"{first.name} and {worker.name}, which agree",
            )
            return True
        if got == d.second:
            self.suspect(
                first,
                f"its result of task {referee.key!r:.60} differed from those of "
                f"{second.name} and {worker.name}, which agree",
            )
            return self._failed(
                referee,
                worker,
                f"{differ}; a third run on worker {worker.name} agrees with "
                f"{second.name}: worker {first.name} computed it wrong (it is the suspect), "
                "and the run read its result",
            )
        return self._failed(
            referee,
            worker,
            f"{differ}, and a third run on worker {worker.name} matches neither: a task "
            "whose result differs from run to run cannot be verified",
        )

    def _failed(self, task: TaskRecord, worker: WorkerRecord, message: str) -> bool:
        self.fail(task, worker, None, "", message, False)
        return False

    def _unhold(self, task: TaskRecord) -> None:
        """Give back the hold on a chosen task's inputs that will have no shadow."""
        for dep in task.deps:
            dep.waiters -= 1
            if dep.state == "memory" and not needed(dep):
                self.transition(dep, "released")

    def _elsewhere(
        self, away: tuple[WorkerRecord, ...], usable: bool = False
    ) -> WorkerRecord | None:
        """The least loaded worker but those ``away`` (a store that is full last;
        ``usable``: none that is full or quarantined)."""
        best: WorkerRecord | None = None
        best_load = 0.0
        for other in self.workers.values():
            if other in away:
                continue
            if usable and (other.full or other.quarantined is not None):
                continue
            load = len(other.processing) / other.cores + (1e6 if other.full else 0.0)
            if best is None or load < best_load:
                best, best_load = other, load
        return best
