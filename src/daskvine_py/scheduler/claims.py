"""Reports checked against what the manager told each worker.

A component of ``state.SchedulerState``. A worker may report on the tasks the manager sent
it (done, erred, crashed, started, withdrawn, an input it could not fetch), on copies it was
asked to make or fetched as inputs of its tasks (``Replicas``, ``Relay``), on results it
holds (``Lost``), on uploads it was asked for (``Uploaded``) and on bytes from its peers
(``Transfers``, which the manager's loop checks: ``manager/transfers.py``). The common
case, a report about a task processing there, costs nothing here: the state's handlers
look the task up anyway (``held``), and only a report that misses comes here.

Such a report is *stale* when the manager took the task back from that worker meanwhile
(cancelled, aborted, withdrawn, asked to upload or copy it) and the worker could not know
yet: it stays harmless (the handler's usual answer) and is not counted. A task told to
abort (``Abort``) may still be reported by a worker that sent its report before the
``Abort`` reached it: such reports arrive within ``ABORT_GRACE`` seconds of the
``Abort``, or before the worker shows it read the ``Abort`` (it reports on a task sent
after it: ``has_read``); later ones come from a worker that ignores ``Abort`` and are
false claims. What was taken
back is remembered per worker: ``REMEMBERED`` ids and more per core, the oldest of
tasks gone forgotten past that, and more room made for live ones (a task
cancelled while it runs reports when it ends, which may be long after). Anything else is
a *false claim*: dropped with no answer, counted per worker, logged at most once a minute
per worker, and at ``EJECT_AFTER`` (none forgiven: ``FORGIVE_AFTER``) the worker is
ejected (``Eject``). The false claims of one batch of events (one ``handle``) count once:
a race the manager did not foresee makes a burst of reports at once, and a burst alone
must not eject an honest worker (issue 38 saw twenty in one batch); a liar lies batch
after batch. A copy
reported lost or fetched just as its result was released is a race the manager cannot
tell from a lie (releases are not remembered: that would cost every task): it is applied,
harmlessly, and not counted. So is a copy reported within ``ABORT_GRACE`` of the last
time the manager took work back from that worker (or asked it for a result), or before
the worker shows it read that word (``has_read``): it may have fetched it for a task
taken back meanwhile, whose record is gone (its run ended while the result stays,
cached), or whose id the bounded memory forgot (a swarm of 600 lagging workers at
issue 38's timing: 640 ids taken back from one, its burst of honest ``Replicas``
judged false). It is released there, never counted as a copy.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from daskvine_py.scheduler.messages import Eject, ToWorker
from daskvine_py.scheduler.records import TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

logger = logging.getLogger("daskvine_py.manager")

#: Batches with false claims that eject a worker. An honest worker makes none, short of
#: a race the memory below forgot (rare, and a burst at once); a liar lies in every
#: batch it sends. Twenty is well clear of the first and stops the second within a
#: second or two.
EJECT_AFTER = 20
#: Seconds without a false claim after which a worker's count starts again: only a worker
#: that keeps lying is ejected, not one that met a rare race twenty times in a day.
FORGIVE_AFTER = 600.0
#: Seconds after an ``Abort`` within which a report of its task crossed it on the way
#: (sent before the ``Abort`` arrived), and after any word taking work back within which
#: a copy fetched for it is reported: a round trip, with room for a busy manager's
#: queue and a worker's loop pass. A worker that ignores ``Abort`` reports its tasks as
#: they end, and tasks are aborted for running long: most of its reports come later.
ABORT_GRACE = 10.0
#: Task ids taken back remembered per worker, and more per core (tasks running there).
REMEMBERED = 256
REMEMBERED_PER_CORE = 32

#: Reports that name tasks by the tuple ``task_ids``.
IdsReport = TypeVar("IdsReport", p.Started, p.Withdrawn, p.Lost, p.Replicas, p.Relay)
#: Reports of copies made (``_copies``).
CopiesReport = TypeVar("CopiesReport", p.Replicas, p.Relay)
#: A report of one kind, read by a handler of that kind.
Report = TypeVar("Report", bound=p.ToManager)
#: A report's handler: (the worker, the report).
Handler = Callable[[WorkerRecord, Report], None]
#: A check of reports of one kind (``_CHECKS``): the report, a copy with fewer ids, or None.
Check = Callable[["Claims", WorkerRecord, Report], "Report | None"]


#: How ``stale_done`` names the report it checks (the state keeps the record itself).
_DONE = "a TaskDone"
#: What is wrong with most false claims.
_NEVER = "which the manager never sent or asked it for"


class Told:
    """What one worker was told that outlives a task's stay there, and its false claims."""

    __slots__ = ("ids", "cap", "false", "last", "ejected", "word", "batch")

    def __init__(self, cores: int) -> None:
        #: task ids taken back from it or asked of it, oldest first: when it was last told
        #: to abort the task (then it must report nothing more of it once the ``Abort``
        #: reached it), None if the last word was another
        self.ids: dict[int, float | None] = {}
        self.cap = REMEMBERED + REMEMBERED_PER_CORE * max(1, cores)
        #: batches with false claims since it last went ``FORGIVE_AFTER`` seconds without
        #: one, and when the last was (the state's clock)
        self.false = 0
        self.last = 0.0
        self.ejected = False
        #: when the manager last took a task back from it or asked it for a result
        self.word = -math.inf
        #: the batch of events (``Context.batch``) of its last counted false claim
        self.batch = -1


class Claims:
    """Per worker, what it may still report on, and its false claims; see the module
    docstring.

    It reads the context's ``workers``, ``tasks``, ``next_id`` (the id the next task will
    get: no task had a larger one) and clock, and appends to its ``out``; ``withdrawing``
    is ``Stealing``'s (tasks asked back).
    """

    __slots__ = ("ctx", "workers", "tasks", "out", "_send", "held", "withdrawing", "told", "drops")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.workers = ctx.workers
        self.tasks = ctx.tasks
        self.out = ctx.out
        self._send = ctx.send
        self.held = ctx.held
        self.withdrawing = ctx.stealing.withdrawing
        #: by worker record (a worker that rejoins is a new record, with a clean slate)
        self.told: dict[WorkerRecord, Told] = {}
        #: the warnings about false claims: one a minute per worker at most
        self.drops = p.DropLog(logger)

    # -- what the manager tells workers ---------------------------------------------------

    def send(self, worker: WorkerRecord, message: ToWorker) -> None:
        """The context's ``send``, remembering what takes a task back or asks for a result
        (``Cancel``, ``Abort``, ``Upload``, ``Replicate``): the components' sends go here
        (never ``Execute``'s: the per-task path)."""
        if isinstance(message, (p.Cancel, p.Upload, p.Abort)):
            aborted = type(message) is p.Abort
            for task_id in message.task_ids:
                self.remember(worker, task_id, aborted)
        elif isinstance(message, p.Replicate):
            self.remember(worker, message.task_id)
        self._send(worker, message)

    def remember(self, worker: WorkerRecord | None, task_id: int, aborted: bool = False) -> None:
        """``task_id`` left ``worker`` (or was asked of it): reports about it are stale.
        ``aborted``: it was told to stop it (``Abort``): it should report nothing more."""
        if worker is None or self.workers.get(worker.id) is not worker:
            return  # (gone: nothing more comes from it)
        told = self._told(worker)
        ids = told.ids
        # The latest word counts: a task aborted there, sent there again and then
        # cancelled may be reported once more (its run was not aborted).
        ids.pop(task_id, None)
        ids[task_id] = self.ctx.now if aborted else None
        told.word = self.ctx.now
        if len(ids) > told.cap:
            self._make_room(told)

    def _make_room(self, told: Told) -> None:
        """The oldest ids of tasks gone are forgotten (the newest quarter stays: a
        task's record may go as it is taken back, its report still on the way); should
        the rest still fill three quarters of the bound, it doubles: live tasks bound
        it. At 600 x 12 the manager asked one worker for more copies (``Replicate``)
        than the bound, and forgetting the oldest judged its honest ``Replicas`` false."""
        ids, tasks = told.ids, self.tasks
        older = itertools.islice(ids, len(ids) - told.cap // 4)
        for gone in [task_id for task_id in older if task_id not in tasks]:
            del ids[gone]
        if len(ids) > told.cap * 3 // 4:
            told.cap *= 2

    def has_read(self, worker: WorkerRecord, since: float) -> bool:
        """Whether ``worker`` has read what the manager sent it at ``since``: it reported
        on a task sent later (``Context.heard``), and one connection keeps the order. A
        worker whose loop lags reports, honestly, on work already taken back for as long
        as it has not; ``ABORT_GRACE`` alone judged a lagging swarm's honest workers."""
        heard = self.ctx.heard.get(worker)
        return heard is not None and heard > since

    def _told(self, worker: WorkerRecord) -> Told:
        told = self.told.get(worker)
        if told is None:
            if len(self.told) > 2 * len(self.workers) + 8:  # forget workers that are gone
                workers = self.workers
                for gone in [w for w in self.told if workers.get(w.id) is not w]:
                    del self.told[gone]
            told = self.told[worker] = Told(worker.cores)
        return told

    # -- reports that missed ----------------------------------------------------------------

    def stale(self, worker: WorkerRecord, task_id: int, report: object) -> bool:
        """A report about a task not processing on ``worker``: True if the manager sent it
        there (taken back since, or its result is held there), the caller's usual answer
        follows; False: a false claim, counted, to be dropped."""
        told = self.told.get(worker)
        if told is not None and task_id in told.ids:
            aborted = told.ids[task_id]
            if (
                aborted is not None
                and self.ctx.now - aborted > ABORT_GRACE
                and (report == _DONE or type(report) is p.TaskErred)
                and self.has_read(worker, aborted)
            ):
                # Not one in flight as the Abort went out: a worker that ignores Abort
                # (its tasks ran elsewhere meanwhile).
                self.false_claim(worker, report, task_id, "after it was told to abort it")
            return True
        task = self.tasks.get(task_id)
        if task is not None and worker in task.who_has:
            return True
        self.false_claim(worker, report, task_id)
        return False

    def stale_done(self, worker: WorkerRecord, task_id: int) -> None:
        """A ``TaskDone`` about a task not processing there: nothing needs the copy,
        unless it is known to be there already (a false claim gets no answer)."""
        if self.stale(worker, task_id, _DONE):
            known = self.tasks.get(task_id)
            if known is None or worker not in known.who_has:
                self._send(worker, p.Release((task_id,)))

    def on_transfers(self, worker: WorkerRecord, msg: p.Transfers) -> None:
        """A ``Transfers`` the manager's loop found impossible (peers that never joined,
        byte counts no link moves): not counted in the transfers; a false claim."""
        self.false_claim(worker, "a Transfers naming peers it cannot have fetched from", None)

    def false_claim(
        self, worker: WorkerRecord, report: object, task_id: int | None, why: str = _NEVER
    ) -> None:
        """Count, log (once a minute per worker) and, at ``EJECT_AFTER``, eject."""
        told = self._told(worker)
        if told.ejected:
            return  # told to leave: the rest of its messages are dropped quietly
        if told.batch == self.ctx.batch:
            return  # one of a burst in one batch: counted once (the first is logged)
        told.batch = self.ctx.batch
        now = self.ctx.now
        if now - told.last > FORGIVE_AFTER:
            told.false = 0
        told.false += 1
        told.last = now
        what = report if isinstance(report, str) else f"a {type(report).__name__}"
        if task_id is not None:
            what = f"{what} about task {task_id}"
        name = worker.name if worker.name.isprintable() else repr(worker.name)[1:-1]
        self.drops.warn(
            ("false claim", worker.id),
            now,
            "worker %s reported %s, %s: dropped (%d batches with such so far; ejected at %d)",
            name,
            what,
            why,
            told.false,
            EJECT_AFTER,
        )
        if told.false >= EJECT_AFTER:
            told.ejected = True
            last = what if why == _NEVER else f"{what}, {why}"
            reason = (
                f"{told.false} batches of reports about work it was never given (the last: {last})"
            )
            self.out.append(Eject(worker.id, reason))

    # -- the reports only claims reach, checked before their handlers -------------------------

    def checked(self, kind: type[Report], *handlers: Handler[Report]) -> Handler[Report]:
        """The state's handler of reports of ``kind``: their claims checked first, then
        ``handlers`` called with what is left (a report, perhaps with fewer ids)."""
        check: Check[Report] = _CHECKS[kind]
        withdrawn = kind is p.Withdrawn

        def on_report(worker: WorkerRecord, msg: Report) -> None:
            kept = check(self, worker, msg)
            if kept is None:
                return
            for handler in handlers:
                handler(worker, kept)
            if withdrawn:  # gone for good by its own word (remembered as taken back)
                self.forget(worker, cast(p.Withdrawn, kept).task_ids)

        return on_report

    def forget(self, worker: WorkerRecord, task_ids: Iterable[int]) -> None:
        """Forget ids remembered for ``worker``: no report about them can follow."""
        told = self.told.get(worker)
        if told is not None:
            for task_id in task_ids:
                told.ids.pop(task_id, None)

    def _task_report(self, worker: WorkerRecord, msg: p.FetchFailed) -> p.FetchFailed | None:
        """``FetchFailed``: about a task processing there, or a stale one."""
        if self.held(msg.task_id, worker) is not None or self.stale(worker, msg.task_id, msg):
            return msg
        return None

    def _started(self, worker: WorkerRecord, msg: p.Started) -> p.Started | None:
        """Tasks that began running: those processing there (stale ones are dropped).
        One record a loop pass on every worker: the usual case is one lookup per id."""
        tasks = self.tasks
        for task_id in msg.task_ids:
            task = tasks.get(task_id)
            if task is None or task.worker is not worker:  # (set while processing only)
                break
        else:
            return msg
        kept = []
        for task_id in msg.task_ids:
            if self.held(task_id, worker) is not None:
                kept.append(task_id)
            else:
                self.stale(worker, task_id, msg)
        return _same_or_fewer(msg, kept)

    def _withdrawn(self, worker: WorkerRecord, msg: p.Withdrawn) -> p.Withdrawn | None:
        """Tasks given back: only those asked back (``Withdraw``) still processing there.
        One given back unasked might be running there: moved, it would run twice."""
        kept = []
        told = self.told.get(worker)
        for task_id in msg.task_ids:
            task = self.held(task_id, worker)
            if task is not None and task in self.withdrawing:
                kept.append(task_id)
            elif told is None or task_id not in told.ids:
                self.false_claim(worker, msg, task_id)
        # Those it keeps: only the ones asked back and still there are news.
        staying = tuple(
            task_id
            for task_id in msg.kept
            if (task := self.held(task_id, worker)) is not None and task in self.withdrawing
        )
        if len(kept) == len(msg.task_ids) and staying == msg.kept:
            return msg
        if not kept and not staying:
            return None
        return p.Withdrawn(tuple(kept), staying)

    def _copies(self, worker: WorkerRecord, msg: CopiesReport) -> CopiesReport | None:
        """``Replicas`` and ``Relay``: copies of results it was asked to make or fetched
        for its tasks. Claiming another would make it a holder peers fetch from."""
        kept: list[int] = []
        gone: list[int] = []  # copies of results whose run ended: released in one record
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                if 0 < task_id < self.ctx.next_id:  # a race, or a lie: harmless either way
                    (gone if type(msg) is p.Replicas else kept).append(task_id)
                    continue
            elif worker in task.who_has or self._fetching(worker, task):
                kept.append(task_id)
                continue
            told = self.told.get(worker)
            if (
                told is not None
                and told.word > -math.inf  # (something was taken back from it)
                and (
                    self.ctx.now - told.word <= ABORT_GRACE or not self.has_read(worker, told.word)
                )
            ):
                # Fetched, perhaps, for a task taken back since and gone: a race.
                if type(msg) is p.Replicas:
                    gone.append(task_id)  # (the worker need not keep it)
                continue
            self.false_claim(worker, msg, task_id)
        if gone:
            self._send(worker, p.Release(tuple(gone)))
        return _same_or_fewer(msg, kept)

    def _fetching(self, worker: WorkerRecord, task: TaskRecord) -> bool:
        """Whether ``worker`` was asked to copy ``task``'s result, or holds (or held until
        taken back) a task that reads it. The shorter of its readers and the worker's
        tasks is searched."""
        told = self.told.get(worker)
        ids: Mapping[int, float | None] = told.ids if told is not None else {}
        if task.id in ids:
            return True
        readers = task.dependents
        processing = worker.processing
        if len(readers) <= len(processing):
            return any(r.worker is worker or r.id in ids for r in readers)
        if any(task in reader.deps for reader in processing):
            return True
        return bool(ids) and any(r.id in ids for r in readers)

    def _lost(self, worker: WorkerRecord, msg: p.Lost) -> p.Lost | None:
        """Results it no longer holds: a result in memory it was never said to hold is a
        false claim (one that left memory may have been released just then: a race)."""
        told = self.told.get(worker)
        kept = []
        for task_id in msg.task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                if 0 < task_id < self.ctx.next_id:
                    continue  # its run ended: nothing to do, nothing to count
            elif worker in task.who_has:
                kept.append(task_id)
                continue
            elif task.state != "memory" or (told is not None and task_id in told.ids):
                continue
            self.false_claim(worker, msg, task_id)
        return _same_or_fewer(msg, kept)

    def _uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> p.Uploaded | None:
        """A result sent to the manager: only one asked of this worker (``Upload``), else
        a value nobody asked it for would reach the workers waiting for it."""
        told = self.told.get(worker)
        if told is not None and msg.task_id in told.ids:
            return msg
        self.false_claim(worker, msg, msg.task_id)
        return None


def _same_or_fewer(msg: IdsReport, kept: list[int]) -> IdsReport | None:
    """``msg`` itself if every id was kept (the usual case), a copy with ``kept``, or None."""
    if len(kept) == len(msg.task_ids):
        return msg
    return msg._replace(task_ids=tuple(kept)) if kept else None


#: The check of each kind of report ``Claims.checked`` takes. (Each takes the kind it is
#: filed under: a table by type, whose values mypy cannot tie to their keys.)
_CHECKS: dict[type, Check[Any]] = {
    p.FetchFailed: Claims._task_report,
    p.Started: Claims._started,
    p.Withdrawn: Claims._withdrawn,
    p.Replicas: Claims._copies,
    p.Relay: Claims._copies,
    p.Lost: Claims._lost,
    p.Uploaded: Claims._uploaded,
}
