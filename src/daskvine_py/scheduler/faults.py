"""Stragglers, stuck workers and black holes: fast abort, ejection and quarantine.

A component of ``state.SchedulerState``. At hundreds of nodes some are always wrong: one
runs everything ten times slower, one fails every task in milliseconds (a broken install,
the "black hole"), one takes tasks and never answers. Three answers, each cheap per task:

- **Fast abort** (TaskVine's idea). A task that has run (from its worker's ``Started``)
  past its category's limit is taken back (``Abort``) and sent to another worker, at most
  ``MAX_ABORTS`` times (then it is let run); it does not count against its retries. The
  limit is the largest of ``fast_abort`` times the category's mean duration, the mean plus
  ``SPREAD`` standard deviations (a category whose durations legitimately spread wide is
  not cut at its tail) and ``FLOOR`` seconds, once ``MIN_SAMPLES`` tasks of the category
  are done. On a worker of good pace (its tasks ran about as long as their kinds usually
  do: ``SLOW_PACE``) a task gets ``GOOD_PACE`` times as long: slow workers, not long tasks,
  are what this is for. Checked on the manager's tick (``Tick``, about once a second),
  from the oldest started task of each category on: the walk stops at the first one
  within its limit.
- **Ejection** (``Eject``). A worker that holds tasks, none known to be running, and
  reports no progress (``Started``, ``TaskDone``, ``TaskErred``, ``TaskCrashed``, an
  input arrived or a relay asked: ``Replicas``, ``Relay``) for
  longer than both ``stall`` seconds (the manager's ``worker_timeout``) and ``STALL_FACTOR``
  times their usual duration; or one that leaves a ``Withdraw`` unanswered for ``patience``
  seconds while the task has not started and has reported on tasks sent after it: a
  worker answers every ``Withdraw`` (``Withdrawn``) before it reads what came next on
  the connection, so a slow link delays the answer and those reports alike and is
  never taken for one that ignores it (the simulator at 0.3 s delays ejected honest
  workers by the clock alone). The manager tells it to leave; its tasks run
  elsewhere.
- **Quarantine**. A worker gets a strike when a task that failed there then succeeds
  elsewhere, and for each failure past ``BURST`` in a row of a kind that succeeds on
  other workers (one failure alone may be the task's own bug; a kind that fails
  wherever it runs, a graph whose tasks all raise, is no broken worker; an error its
  second worker confirms counts for neither); each task
  done there forgives half a strike. At ``STRIKES`` it gets no new tasks (``Quarantined``:
  one WARNING, ``manager.workers``, the report) but keeps serving the results it holds. A
  worker whose aborted tasks ran over ``SLOW_RATIO`` times faster elsewhere
  ``SLOW_CONFIRMED`` times, or that had
  that many aborted and finished none, is quarantined as slow, and what it holds is taken
  back. An abort counts only once proved (``Aborted``): the manager's clock holds the
  link, and a ``TaskDone`` held up on it looks like a task running on (the simulator at
  0.05 and 0.3 s delays quarantined honest workers so). The worker's report on a task
  sent after the ``Abort`` proves it read the ``Abort`` with the task still running; the
  task's ``TaskDone`` crossing the ``Abort`` gives its run by the worker's clock;
  silence proves nothing. A task's error is retried once on another worker (one not
  erring lately) before it fails the run: a black hole's errors are so absorbed, and a
  deterministic error fails the run after its second worker raised it. Every error on a
  quarantined worker, or on the worker that failed the task first, is retried (up to
  ``MAX_ERROR_RETRIES``). Should every worker be quarantined while work waits, the one
  with the fewest strikes is released (with a WARNING), so that a run never hangs: it
  runs, or fails with its error.
- **Inputs implicate their producer** (issue 38: a worker answering every task with
  ``0.0`` got the honest workers whose tasks then raised on its zeros quarantined).
  Each result records the worker that computed it (``TaskRecord.made_by``). A failure
  of a task whose inputs came from other workers is no burst of its worker's; its
  retry goes to a witness, a worker that computed none of its inputs, if there is one;
  a success on a worker that computed some strikes no one (its own results read back
  prove nothing); a success on a witness strikes the failed worker only once its failed
  tasks succeeded on ``WITNESSES`` workers (one may be a liar "succeeding" at a task
  that raises everywhere). A task raised on two workers, its inputs computed by a third that did
  not raise it: that producer settles it. Raised there too: the task's own error, no
  one is struck. Succeeded there: the producer is the suspect (``suspect``: its
  results make honest workers' tasks fail), its result is not used, and the run fails
  with the error the others raised. At ``SUSPECTED`` it is quarantined; tasks done do
  not forgive it. A verification (``verify``) that a third worker settles suspects the
  odd one out the same way.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from daskvine_py.scheduler.messages import (
    Eject,
    Quarantined,
    Tick,
    WorkerId,
)
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: The default multiplier: TaskVine's when fast abort is on. Stragglers that run 10x
#: slower are caught well before they end; with ``SPREAD`` a category's legitimately long
#: tasks are not.
DEFAULT_FAST_ABORT = 3.0
#: Tasks of a category done before its mean is trusted.
MIN_SAMPLES = 10
#: Tasks that ran this long at most are never aborted: noise, and not worth a kill.
FLOOR = 1.0
#: Standard deviations above the mean a task may run before it is a straggler.
SPREAD = 4.0
#: The mean and spread follow about this many recent tasks of a category.
WINDOW = 1000
#: Fast aborts of one task at most; then it is let run wherever it is.
MAX_ABORTS = 2
#: Aborted tasks that then ran faster elsewhere before their worker is quarantined as slow.
SLOW_CONFIRMED = 3
#: An aborted task shows its worker slow when it then took less than this share of the
#: time it had already run there: a worker of ordinary speed beside one twice as fast is
#: no straggler (the simulator's seeds 49 and 230 quarantined such workers when kinds
#: whose durations spread wide were aborted there and rerun on the fast one).
SLOW_RATIO = 2.0
#: Strikes (failures that other workers do not share) before a worker is quarantined.
STRIKES = 3.0
#: What one task done forgives of a worker's strikes.
FORGIVEN = 0.5
#: Retries of a task's error on other workers: one, more only after quarantined workers.
MAX_ERROR_RETRIES = 3
#: Errors in a row on one worker, of kinds that succeed on other workers, past which each
#: error is a strike: a black hole fails many tasks quickly. (One that is the first to
#: run a kind is struck as its failed tasks then succeed elsewhere.)
BURST = 8
#: Times a worker was the suspect of a disagreement (``suspect``) before it is quarantined:
#: its results were the inputs of a task that raised on two other workers and succeeded
#: only on it, or a verification's third worker agreed against it. Never forgiven by
#: tasks done (a liar does its tasks quickly).
SUSPECTED = 2
#: Workers on which tasks that failed on a worker then succeeded, before each such task
#: is a strike: a liar "succeeding" at tasks that raise everywhere is one witness.
WITNESSES = 2
#: A worker's pace: the EMA (weight ``PACE_WEIGHT``) of the log of its tasks' durations
#: against their kinds' means, over kinds of ``PACE_MIN`` s or more. A task past its limit
#: on a worker whose pace is under log(2) (half as fast again as usual, or faster) is
#: more likely long than straggling: it is let run to ``GOOD_PACE`` times its limit.
PACE_WEIGHT = 0.1
PACE_MIN = 0.1
SLOW_PACE = math.log(2.0)
GOOD_PACE = 3.0
#: A worker making no progress is ejected past this many times its tasks' usual duration.
STALL_FACTOR = 10.0
#: Seconds a worker may take to fetch an input from one holder (a worker's
#: ``fetch_timeout``, 10 s by default): it asks each holder in turn, then the manager
#: (``Relay``), before it gives up (``FetchFailed``). Holders preempted without a word
#: answer nothing, and the manager may not know them gone yet.
FETCH_ALLOWANCE = 10.0


class Category:
    """What the tasks of one kind (``TaskRecord.prefix``) took, and where they succeeded."""

    __slots__ = ("count", "mean", "var", "winners")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.var = 0.0
        #: up to two workers a task of this kind succeeded on
        self.winners: tuple[WorkerRecord, ...] = ()

    def observe(self, duration: float, worker: WorkerRecord) -> None:
        self.count += 1
        weight = 1.0 / min(self.count, WINDOW)
        delta = duration - self.mean
        self.mean += weight * delta
        self.var = (1.0 - weight) * (self.var + weight * delta * delta)
        winners = self.winners
        if len(winners) < 2 and worker not in winners:
            self.winners = (*winners, worker)

    def limit(self, factor: float) -> float:
        """Seconds a task of this kind may run before it is a straggler (inf: unknown)."""
        if self.count < MIN_SAMPLES:
            return math.inf
        return max(FLOOR, factor * self.mean, self.mean + SPREAD * math.sqrt(self.var))

    def succeeded_elsewhere(self, worker: WorkerRecord) -> bool:
        return any(winner is not worker for winner in self.winners)


class Erred:
    """A task whose error is being retried: the workers it raised on, in order; how many
    times it was retried; whether its first worker was struck for it (a burst); the
    producer of its inputs asked to settle it, and the error it fails with then."""

    __slots__ = ("failed", "tries", "struck", "settling", "error")

    def __init__(self, worker: WorkerRecord, struck: bool) -> None:
        self.failed = [worker]
        self.tries = 0
        self.struck = struck
        self.settling: WorkerRecord | None = None
        self.error: p.TaskErred | None = None


class Aborted:
    """A started task taken back from ``worker``: how long the manager saw it run there
    (``ran``: from its ``Started`` arriving to the ``Abort`` going out, at ``at``), the
    tasks sent to the worker at ``at`` before the ``Abort`` (``before``), whether it
    counts towards "finished none" (``counted``: a straggler's abort on a worker that
    had finished no task), whether the worker proved it was still running it when the
    ``Abort`` came (``proven``), and what it then took elsewhere (``elsewhere``).

    The manager's clock holds the link's delays, a stall among them: a ``TaskDone``
    held up on the way looks like a task running on. Only proof counts against the
    worker: a report on a task sent after the ``Abort`` (the worker read the ``Abort``
    first, one connection keeps the order, and had not reported the task done before
    it), or the task's own late ``TaskDone``, whose duration is the worker's own."""

    __slots__ = ("worker", "ran", "limit", "at", "before", "counted", "proven", "elsewhere")

    def __init__(
        self,
        worker: WorkerRecord,
        ran: float,
        limit: float,
        at: float,
        before: set[TaskRecord],
        counted: bool,
    ) -> None:
        self.worker = worker
        self.ran = ran
        #: the limit it was aborted past (0: not a straggler's abort)
        self.limit = limit
        self.at = at
        self.before = before
        self.counted = counted
        self.proven = False
        self.elsewhere: float | None = None


def producers(task: TaskRecord, but: WorkerRecord | None = None) -> list[WorkerRecord]:
    """The workers that computed ``task``'s inputs (each once), ``but`` aside."""
    found: list[WorkerRecord] = []
    for dep in task.deps:
        made = dep.made_by
        if made is not None and made is not but and made not in found:
            found.append(made)
    return found


class Faults:
    """Fast aborts, ejections and quarantines; see the module docstring.

    It shares the context's ``workers``, ``queue`` and ``durations`` and appends to its
    ``out``; its messages go through ``Claims.send``; ``fail`` is ``Failures.fail``;
    ``withdrawing`` the tasks ``Stealing`` asked back. It hears of every task's result
    (the duration estimates, and what it watches). The manager sets ``factor``, ``stall``
    and ``patience`` from its options.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.out = ctx.out
        self.queue = ctx.queue
        self.durations = ctx.durations
        self.transition = ctx.transition
        self.send = ctx.claims.send
        self.held = ctx.held
        self.fail = ctx.failures.fail
        self.withdrawing = ctx.stealing.withdrawing
        #: the manager's ``fast_abort`` (0: off unless a run turns it on)
        self.factor = DEFAULT_FAST_ABORT
        #: seconds without progress before a worker may be ejected (``worker_timeout``)
        self.stall = 30.0
        #: seconds a ``Withdraw`` may go unanswered (heartbeat intervals)
        self.patience = 10.0
        self.categories: dict[str, Category] = {}
        #: started tasks that may be aborted, per category, oldest first
        self.watch: dict[str, dict[TaskRecord, float]] = {}
        #: fast aborts per task; where each last ran and for how long
        self.aborts: dict[TaskRecord, int] = {}
        self.aborted: dict[TaskRecord, Aborted] = {}
        #: per worker, the tasks aborted there whose run it has not yet proved (``Aborted``)
        self.unproven: dict[WorkerRecord, list[TaskRecord]] = {}
        #: tasks whose error is being retried
        self.erred_on: dict[TaskRecord, Erred] = {}
        #: per worker: its last progress report; strikes; slowness shown (errors in a
        #: row: ``WorkerRecord.errors``; of them, those of tasks whose inputs it computed
        #: itself or that had none: ``own``, what a burst counts); disagreements it was
        #: the suspect of (``suspect``)
        self.progress: dict[WorkerRecord, float] = {}
        self.heard = ctx.heard  # (the context's: ``Claims`` reads it too)
        self.strikes: dict[WorkerRecord, float] = {}
        self.own: dict[WorkerRecord, int] = {}
        self.suspected: dict[WorkerRecord, int] = {}
        #: per worker: the workers that ran tasks it failed, successfully (``WITNESSES``)
        self.witnessed: dict[WorkerRecord, set[WorkerRecord]] = {}
        self.slow: dict[WorkerRecord, int] = {}
        #: per worker: how fast its tasks run against their kinds' means (``PACE_WEIGHT``)
        self.pace: dict[WorkerRecord, float] = {}
        #: workers that finished a task (one that finished none and whose tasks are all
        #: aborted is quarantined as slow without waiting for them to run elsewhere)
        self.productive: set[WorkerRecord] = set()
        #: tasks asked back (``Withdraw``): of which worker, and when the tick first saw
        #: them asked of it (a task lost with its worker and asked again elsewhere starts
        #: again: the simulator ejected the new worker at once on the old one's clock)
        self.asked: dict[TaskRecord, tuple[WorkerRecord | None, float]] = {}
        self.ejected: set[WorkerId] = set()
        self.quarantined: dict[WorkerRecord, str] = {}

    # -- reports (per task: a few dict operations) ----------------------------------------

    def on_fetching(self, worker: WorkerRecord, msg: p.Replicas | p.Relay) -> None:
        """An input arrived there, or it asks the manager to relay one (its holders
        failed it): it works at its tasks' inputs, no stuck worker. (A swarm worker at
        600 x 12 whose peers' results went through the manager was ejected as stuck.)
        Only reports the claims check kept reach here: about inputs of its own tasks."""
        self.progress[worker] = self.ctx.now

    def on_started(self, worker: WorkerRecord, msg: p.Started) -> None:
        now = self.ctx.now
        self.progress[worker] = now
        heard = self.heard.get(worker, -math.inf)
        for task_id in msg.task_ids:
            task = self.held(task_id, worker)
            if task is None:
                continue
            if task.sent_at > heard:
                heard = self.heard[worker] = task.sent_at
            if worker in self.unproven:
                self._proved(worker, task)
            if task.started_at != now:
                continue  # said twice: its clock runs from the first (``Churn`` stamps it)
            if self.aborts.get(task, 0) >= MAX_ABORTS or not self.factor_of(task.run):
                continue
            watch = self.watch.get(task.prefix)
            if watch is None:
                watch = self.watch[task.prefix] = {}
            watch.pop(task, None)  # (to the end: its order is the start time)
            watch[task] = now

    def task_done(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskDone) -> None:
        """``task`` succeeded on ``worker`` (it was held there) in ``msg.duration``."""
        duration = msg.duration
        prefix = task.prefix
        self.durations.observe(prefix, duration)
        self._reported(task, worker)
        if task.started_at is not None:
            watch = self.watch.get(prefix)
            if watch is not None:
                watch.pop(task, None)
        category = self.categories.get(prefix)
        if category is None:
            category = self.categories[prefix] = Category()
        elif category.count >= MIN_SAMPLES and category.mean >= PACE_MIN:
            ratio = math.log(max(duration, 1e-3) / category.mean)
            known = self.pace.get(worker)
            self.pace[worker] = ratio if known is None else known + PACE_WEIGHT * (ratio - known)
        category.observe(duration, worker)
        if worker not in self.productive:
            self.productive.add(worker)
        if worker.errors:
            worker.errors = 0
        if self.own:
            self.own.pop(worker, None)
        if self.strikes and worker in self.strikes:
            self.strikes[worker] = max(0.0, self.strikes[worker] - FORGIVEN)
        task.made_by = worker
        if self.erred_on:
            erred = self.erred_on.pop(task, None)
            if erred is not None:
                self._succeeded(task, worker, erred)
        if self.aborted:
            aborted = self.aborted.get(task)
            if aborted is not None:
                if aborted.worker is worker:
                    del self.aborted[task]  # (sent back there: nothing to compare)
                else:
                    aborted.elsewhere = duration
                    if aborted.proven:
                        self._compare(task, aborted)

    def _succeeded(self, task: TaskRecord, worker: WorkerRecord, erred: Erred) -> None:
        """``task``, which raised on ``erred.failed``, succeeded on ``worker``.

        On a worker that computed none of its inputs (a witness), its first worker is
        struck: it failed what runs elsewhere. On one that computed some, nothing is
        learned (its success may be its own wrong inputs read back): no strike. On the
        producer asked to settle it after two other workers raised it on its inputs, that
        producer is the suspect: its results make honest workers' tasks fail, and its
        success is no answer to trust; the run fails with the error the others raised.
        """
        first = erred.failed[0]
        if worker is erred.settling and erred.error is not None:
            names = " and ".join(w.name for w in erred.failed)
            why = (
                f"task {task.key!r:.60} raised on {names} reading its results, and "
                f"succeeded only on {worker.name}"
            )
            self.suspect(worker, why)
            error = erred.error
            message = (
                f"{error.message} (it raised on workers {names}; it succeeded only on "
                f"worker {worker.name}, which computed its inputs: that worker is the "
                "suspect, and its result was not used)"
            )
            self.fail(
                task, worker, error.exception, error.traceback, message, False, error.type_name
            )
            if task.unread is not True and self.workers.get(worker.id) is worker:
                self.send(worker, p.Release((task.id,)))  # (it keeps what it computed)
            return
        if len(erred.failed) > 1 or erred.struck or worker is first:
            return  # (raised on two workers: its own error, or its inputs')
        if worker in producers(task):
            return  # no witness: a liar's task reading its own results back succeeds
        # One witness alone may be a liar "succeeding" at a task that raises everywhere:
        # its failures must have succeeded on two workers before they count.
        seen = self.witnessed.get(first)
        if seen is None:
            seen = self.witnessed[first] = set()
        seen.add(worker)
        if len(seen) < WITNESSES:
            return
        self.strike(first, f"task {task.key!r:.60} failed there, then succeeded on {worker.name}")

    def task_erred(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskErred) -> None:
        """``task`` raised on ``worker``: try it on another worker, or fail its run.

        Its first error is retried on a witness: another worker, one that computed none
        of its inputs if there is one. Should the witness raise it too, and a worker
        that computed its inputs did not raise it, that producer settles it (a third
        try): raised there too, it is the task's own error; succeeded there, the producer
        is the suspect (``_succeeded``). Either way the run fails with the error.
        """
        self._ended(task, worker)
        erred = self.erred_on.get(task)
        if erred is not None and worker not in erred.failed:
            # Another worker raised it too: the task's own error, or its inputs' (no
            # worker's where it surfaced). The first is forgiven it (else a run of such
            # errors, their runs failing before anything succeeds there, looks like a
            # black hole), and this one is not charged with it.
            first = erred.failed[0]
            if len(erred.failed) == 1:
                first.errors = max(0, first.errors - 1)
                if first in self.own and not producers(task, first):
                    self.own[first] = max(0, self.own[first] - 1)
            erred.failed.append(worker)
            if erred.settling is None:
                settler = self._settler(task, erred)
                if settler is not None:
                    erred.settling, erred.error = settler, msg
                    erred.tries += 1
                    self.move(task, settler)
                    return
        else:
            worker.errors += 1
            struck = False
            if not producers(task, worker):  # (else its inputs may be the cause)
                own = self.own[worker] = self.own.get(worker, 0) + 1
                category = self.categories.get(task.prefix)
                if category is None:
                    category = self.categories[task.prefix] = Category()
                struck = self._burst(task, worker, category, "failed", own)
            if erred is None:
                erred = Erred(worker, struck)
        tries = erred.tries
        # Not the second worker to fail it: a quarantined one, or its first one again
        # (stealing may hand a task back to a worker with room: a black hole has room).
        again = tries > 0 and worker is erred.failed[0]
        if tries < 1 or ((again or worker in self.quarantined) and tries < MAX_ERROR_RETRIES):
            target = self.elsewhere(worker, producers(task), self.witnessed.get(erred.failed[0]))
            if target is not None:
                erred.tries = tries + 1
                self.erred_on[task] = erred
                self.move(task, target)
                return
        self.erred_on.pop(task, None)
        self.fail(task, worker, msg.exception, msg.traceback, msg.message, False, msg.type_name)

    def _settler(self, task: TaskRecord, erred: Erred) -> WorkerRecord | None:
        """A worker that computed inputs of ``task`` and has not raised it, that may take
        it now: the one to settle whether the task or its inputs are wrong."""
        for made in producers(task):
            if made in erred.failed or self.workers.get(made.id) is not made:
                continue
            if made.full or made.quarantined is not None or made.id in self.ejected:
                continue
            return made
        return None

    def task_crashed(self, task: TaskRecord, worker: WorkerRecord, msg: p.TaskCrashed) -> None:
        """``task``'s process died on ``worker`` (its retries are ``Churn``'s to count)."""
        self._ended(task, worker)
        worker.errors += 1
        if producers(task, worker):
            return  # (its inputs, computed elsewhere, may be the cause)
        own = self.own[worker] = self.own.get(worker, 0) + 1
        category = self.categories.get(task.prefix)
        if category is None:
            category = self.categories[task.prefix] = Category()
        self._burst(task, worker, category, "crashed", own)

    def _burst(
        self, task: TaskRecord, worker: WorkerRecord, category: Category, how: str, own: int
    ) -> bool:
        """A strike for a failure past ``BURST`` in a row (``own``: of tasks whose inputs
        it computed itself, or that had none), of a kind that succeeds on other workers
        (a failure alone may be the task's own bug: a data-dependent error fails wherever
        it runs; a kind that failed wherever it ran is no sign of a broken worker, whose
        failed tasks then succeed elsewhere: a strike each)."""
        if own < BURST or not category.succeeded_elsewhere(worker):
            return False  # (a kind that failed wherever it ran: its own bug, or its graph's)
        self.strike(
            worker,
            f"{own} of its tasks {how} in a row; tasks of "
            f"{task.prefix!r:.40} succeed on other workers",
        )
        return True

    def _reported(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """``worker`` reported ``task`` ended: progress, and all sent before it read."""
        self.progress[worker] = self.ctx.now
        if task.sent_at > self.heard.get(worker, -math.inf):
            self.heard[worker] = task.sent_at
        if worker in self.unproven:
            self._proved(worker, task)

    def _ended(self, task: TaskRecord, worker: WorkerRecord) -> None:
        self._reported(task, worker)
        if task.started_at is not None and task.prefix in self.watch:
            self.watch[task.prefix].pop(task, None)

    def factor_of(self, run: RunRecord) -> float:
        """The run's fast-abort multiplier (0: off)."""
        factor = run.fast_abort
        return (self.factor or 0.0) if factor is None else factor

    # -- quarantine -------------------------------------------------------------------

    def strike(self, worker: WorkerRecord, why: str) -> None:
        strikes = self.strikes[worker] = self.strikes.get(worker, 0.0) + 1.0
        if strikes >= STRIKES:
            self.quarantine(worker, why)

    def suspect(self, worker: WorkerRecord, why: str) -> None:
        """``worker`` was the odd one of a disagreement that a third worker settled:
        quarantined at ``SUSPECTED`` (tasks done forgive none of it)."""
        count = self.suspected[worker] = self.suspected.get(worker, 0) + 1
        if count >= SUSPECTED:
            self.quarantine(worker, f"suspect: {why} ({count} times)")

    def quarantine(self, worker: WorkerRecord, reason: str) -> None:
        """No new tasks for ``worker``; a slow one's tasks are taken back at once."""
        if worker in self.quarantined or self.workers.get(worker.id) is not worker:
            return
        worker.quarantined = reason
        self.quarantined[worker] = reason
        self.out.append(Quarantined(worker.id, worker.name, reason))
        if reason.startswith("slow"):
            for task in list(worker.processing):
                if task.state == "processing" and task.worker is worker:
                    self.abort(task, worker, "its worker was quarantined", counted=False)

    def release(self, worker: WorkerRecord, why: str) -> None:
        worker.quarantined = None
        self.quarantined.pop(worker, None)
        self.strikes.pop(worker, None)
        self.suspected.pop(worker, None)
        self.witnessed.pop(worker, None)
        self.slow.pop(worker, None)
        self.out.append(Quarantined(worker.id, worker.name, None, why))

    # -- taking work back -------------------------------------------------------------

    def elsewhere(
        self,
        away: WorkerRecord,
        avoid: list[WorkerRecord] | None = None,
        witnesses: set[WorkerRecord] | None = None,
    ) -> WorkerRecord | None:
        """The least loaded worker but ``away`` that may take a task now: not quarantined,
        full or ejected, not erring lately unless every other one is, and not one of
        ``avoid`` (those that computed its inputs: no witness) unless every other is;
        of the rest, one not among ``witnesses`` (of ``away``'s failures: a second)."""
        best, best_load = None, math.inf
        for worker in self.workers.values():
            if worker is away or worker.full or worker.quarantined is not None:
                continue
            if worker.id in self.ejected:
                continue
            load = len(worker.processing) / max(1, worker.cores)
            if worker.errors:
                load += 1e9  # a black hole empties its queue fastest: the last choice
            if avoid and worker in avoid:
                load += 1e12
            if witnesses and worker in witnesses:
                load += 1e6
            if load < best_load:
                best, best_load = worker, load
        return best

    def move(self, task: TaskRecord, target: WorkerRecord | None) -> None:
        """``task`` (processing) leaves its worker: to ``target`` if it can start there."""
        if task.missing:
            self.transition(task, "waiting")
            return
        self.transition(task, "ready")
        if target is not None and task.placement is None:
            self.queue.remove(task)
            self.transition(task, "processing", target)

    def abort(
        self,
        task: TaskRecord,
        worker: WorkerRecord,
        reason: str,
        counted: bool,
        limit: float = 0.0,
    ) -> None:
        """Stop ``task`` on ``worker`` (even running) and run it elsewhere (``limit``: the
        one it ran past)."""
        now = self.ctx.now
        if task.started_at is not None:
            before = {t for t in worker.processing if t.sent_at == now and t is not task}
            # (counted: every task it had ran past its limit, as far as the manager saw)
            none = counted and worker not in self.productive
            ran = now - task.started_at
            self.aborted[task] = Aborted(worker, ran, limit, now, before, none)
            pending = self.unproven.get(worker)
            if pending is None:
                pending = self.unproven[worker] = []
            pending.append(task)
        self.send(worker, p.Abort((task.id,), reason))
        self.move(task, self.elsewhere(worker))
        if counted:
            self.aborts[task] = self.aborts.get(task, 0) + 1

    # -- proof that an aborted task ran as long as the manager saw --------------------

    def _proved(self, worker: WorkerRecord, report: TaskRecord) -> None:
        """``worker`` reported on ``report`` (held there): the tasks aborted there
        before ``report`` was sent ran at least as long as the manager saw them run
        (it read their ``Abort`` before ``report``, with no word of them done)."""
        pending = self.unproven[worker]
        sent = report.sent_at
        kept = []
        for task in pending:
            aborted = self.aborted.get(task)
            if aborted is None or aborted.worker is not worker or aborted.proven:
                continue  # (forgotten, or aborted again elsewhere since)
            if sent > aborted.at or (sent == aborted.at and report not in aborted.before):
                self._prove(task, aborted)
            else:
                kept.append(task)
        if kept:
            self.unproven[worker] = kept
        else:
            del self.unproven[worker]

    def stale_done(self, worker: WorkerRecord, task_id: int, duration: float | None) -> None:
        """A report about a task not processing on ``worker``: one aborted there whose
        result or error crossed the ``Abort``. It ended there (in ``duration``, by the
        worker's own clock, if it succeeded): no proof of a run that went on. A duration
        past the limit it was aborted at is compared with what it took elsewhere; one
        within it shows no slowness (the link made it late)."""
        task = self.ctx.tasks.get(task_id)
        aborted = None if task is None else self.aborted.get(task)
        if task is None or aborted is None or aborted.worker is not worker or aborted.proven:
            return
        if duration is None or duration <= aborted.limit:
            # It raised or crashed there, or ran within its kind's limit by its own clock:
            # the link, not the worker, made it look long (no slowness shown).
            del self.aborted[task]
            return
        aborted.ran, aborted.counted = duration, False  # (it finished)
        self._prove(task, aborted)

    def _prove(self, task: TaskRecord, aborted: Aborted) -> None:
        aborted.proven = True
        worker = aborted.worker
        if aborted.counted:
            shown = self.slow[worker] = self.slow.get(worker, 0) + 1
            if shown >= SLOW_CONFIRMED:
                self.quarantine(
                    worker,
                    f"slow: {shown} of its tasks ran past their kinds' limits, and it "
                    "finished none",
                )
        if aborted.elsewhere is not None:
            self._compare(task, aborted)

    def _compare(self, task: TaskRecord, aborted: Aborted) -> None:
        """A proven aborted task's run there against what it took elsewhere."""
        del self.aborted[task]
        elsewhere = aborted.elsewhere
        if aborted.counted or elsewhere is None or elsewhere * SLOW_RATIO >= aborted.ran:
            return  # (counted already, as a task of a worker that finished none)
        slow = aborted.worker
        shown = self.slow[slow] = self.slow.get(slow, 0) + 1
        if shown >= SLOW_CONFIRMED:
            self.quarantine(
                slow,
                f"slow: {shown} of its tasks were aborted after "
                "running longer there than they then took elsewhere",
            )

    def eject(self, worker: WorkerRecord, reason: str) -> None:
        if worker.id not in self.ejected:
            self.ejected.add(worker.id)
            self.out.append(Eject(worker.id, reason))

    # -- the tick ---------------------------------------------------------------------

    def on_tick(self, ev: Tick) -> None:
        now = self.ctx.now
        self._prune()  # (first: a lost worker is no longer quarantined, nor stuck)
        self._stragglers(now)
        self._stuck(now)
        self._unanswered(now)
        self._all_quarantined()

    def _stragglers(self, now: float) -> None:
        """Abort what ran past its limit, oldest first; the walk stops at the first task
        within its limit, and passes over the few long ones on workers of a good pace."""
        found = []
        pace = self.pace
        for prefix, watch in self.watch.items():
            category = self.categories.get(prefix)
            gone = []
            for task, start in watch.items():
                worker = task.worker
                if task.started_at != start or worker is None or task.state != "processing":
                    gone.append(task)  # done, moved or forgotten since (restamped elsewhere)
                    continue
                if category is None:
                    break
                limit = category.limit(self.factor_of(task.run))
                ran = now - start
                if ran <= limit:
                    break
                if worker in pace and pace[worker] < SLOW_PACE and ran <= GOOD_PACE * limit:
                    continue  # a long task rather than a slow worker: let it run longer
                gone.append(task)
                found.append((task, worker, ran, limit))
            for task in gone:
                del watch[task]
        for task, worker, ran, limit in found:
            if task.state == "processing" and task.worker is worker:
                reason = f"ran {ran:.1f} s, past {limit:.1f} s for its kind ({task.prefix})"
                self.abort(task, worker, reason, counted=True, limit=limit)

    def _stuck(self, now: float) -> None:
        stall = self.stall
        for worker in list(self.workers.values()):
            processing = worker.processing
            if not processing or worker.id in self.ejected:
                continue
            oldest = next(iter(processing))
            since = max(self.progress.get(worker, -math.inf), oldest.sent_at)
            quiet = now - since
            if quiet <= stall:
                continue
            expected = self.durations.get(oldest.prefix)  # (a kind not seen: any kind's)
            if expected is None or quiet <= STALL_FACTOR * expected:
                continue  # (None: no task has finished yet, no telling how long they take)
            if any(task.started_at is not None for task in processing):
                continue  # running something: fast abort's to judge
            if quiet <= stall + _fetching(worker, processing):
                continue  # its inputs may still be on their way (holders gone silent)
            self.eject(
                worker,
                f"it holds {len(processing)} tasks and reported no progress "
                f"for {quiet:.0f} s (such tasks take {expected:.2g} s)",
            )

    def _unanswered(self, now: float) -> None:
        asked = self.asked
        for task in self.withdrawing:
            noted = asked.get(task)
            if noted is None or noted[0] is not task.worker:  # (asked again, elsewhere)
                asked[task] = (task.worker, now)
        ignored: dict[WorkerRecord, int] = {}
        for task, (worker, since) in list(asked.items()):
            if task not in self.withdrawing or worker is None or task.worker is not worker:
                del asked[task]
            elif (
                now - since > self.patience
                and task.started_at is None
                and self.heard.get(worker, -math.inf) > since
            ):
                # It reported on work sent after the Withdraw, so it read the Withdraw
                # and did not answer: not a slow link (the answer would have come first).
                ignored[worker] = ignored.get(worker, 0) + 1
        for worker, count in ignored.items():
            self.eject(
                worker,
                f"it left Withdraw of {count} unstarted tasks unanswered for "
                f"over {self.patience:g} s",
            )

    def _all_quarantined(self) -> None:
        """Work waits and every worker is quarantined: release the least struck one."""
        quarantined = self.quarantined
        if not quarantined or not self.queue or len(quarantined) < len(self.workers):
            return
        best = min(
            quarantined,
            key=lambda w: (
                self.suspected.get(w, 0),
                self.strikes.get(w, 0.0),
                self.slow.get(w, 0),
            ),
        )
        self.release(
            best,
            "every worker was quarantined and work waits: released the one with the fewest strikes",
        )

    def _prune(self) -> None:
        """Forget what concerns lost workers and forgotten tasks (small tables)."""
        workers = self.workers
        tables = (
            self.progress,
            self.heard,
            self.strikes,
            self.own,
            self.suspected,
            self.witnessed,
            self.slow,
            self.pace,
            self.quarantined,
            self.unproven,
        )
        for table in tables:
            for worker in [w for w in table if workers.get(w.id) is not w]:
                del table[worker]
        self.ejected = {wid for wid in self.ejected if wid in workers}
        self.productive = {w for w in self.productive if workers.get(w.id) is w}
        for tasks in (self.aborts, self.aborted, self.erred_on):
            for task in [t for t in tasks if t.state == "forgotten"]:
                del tasks[task]


def _fetching(worker: WorkerRecord, processing: dict[TaskRecord, None]) -> float:
    """Seconds ``worker`` may still spend fetching the inputs of the tasks it holds: per
    input held elsewhere, a try of each holder and one through the manager (inputs are
    fetched at once, their holders in turn). Found by the simulator (30 workers, DV3,
    seed 4015): a worker whose input's three holders were preempted silently tried each
    for 10 s and was ejected as stuck just as it asked the manager to relay it."""
    longest = 0
    for task in processing:
        for dep in task.deps:
            if dep.value is None and worker not in dep.who_has and not _made_on(dep, worker):
                longest = max(longest, len(dep.who_has) + 1)
    return FETCH_ALLOWANCE * longest


def _made_on(dep: TaskRecord, worker: WorkerRecord) -> bool:
    """Whether ``dep`` is being computed on ``worker`` itself (its reader was sent ahead):
    nothing is fetched for it, and its own progress is what the stall check watches."""
    return dep.state == "processing" and dep.worker is worker
