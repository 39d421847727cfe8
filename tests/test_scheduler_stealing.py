"""The ``Stealing`` component alone: asking queued tasks back for idle cores, and what
the busy worker gives back."""

from __future__ import annotations

from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.scheduler.stealing import Stealing
from daskvine_py.wire import protocol as p
from parts import context


def setup(busy_tasks: int = 4):
    busy = WorkerRecord(b"busy", "busy", 1, "tcp://busy:1")
    idle = WorkerRecord(b"idle", "idle", 2, "tcp://idle:1")
    run = RunRecord(1, 0, ())
    ctx = context(constraints={"room": lambda w: w.cores - len(w.processing)})
    tasks = ctx.tasks
    for i in range(1, busy_tasks + 1):
        t = TaskRecord(i, f"t{i}", run, b"", (), i, "t")
        t.state, t.worker = "processing", busy
        busy.processing[t] = None
        tasks[i] = t
    sent: list[tuple[str, object]] = []
    moves: list[tuple[int, str, str | None]] = []

    def transition(task, finish, worker=None):
        moves.append((task.id, finish, worker and worker.name))
        if task.worker is not None:
            task.worker.processing.pop(task, None)
        task.state, task.worker = finish, worker
        if worker is not None:
            worker.processing[task] = None

    ctx.transition = transition
    ctx.send = lambda w, m: sent.append((w.name, m))
    ctx.workers.update({w.id: w for w in (busy, idle)})
    stealing = Stealing(ctx)
    return stealing, busy, idle, tasks, sent, moves


def test_idle_cores_ask_the_newest_queued_tasks_back_once():
    stealing, busy, idle, tasks, sent, moves = setup()
    stealing.steal_for_idle_workers()
    # Two idle cores; the busy worker runs one task and queues three: the newest go.
    assert sent == [("busy", p.Withdraw((4, 3)))]
    assert stealing.withdrawing == {tasks[3], tasks[4]}
    stealing.steal_for_idle_workers()
    assert len(sent) == 1  # enough asked for already
    stealing.settled(tasks[3])  # it finished there after all
    assert stealing.withdrawing == {tasks[4]}


def test_a_task_given_back_goes_straight_to_an_idle_worker():
    stealing, busy, idle, tasks, sent, moves = setup()
    stealing.on_withdrawn(busy, p.Withdrawn((4, 99)))  # 99: stale, ignored
    assert moves == [(4, "ready", None), (4, "processing", "idle")]
    tasks[2].missing = 1  # sent ahead of an input: it waits for it here
    stealing.on_withdrawn(busy, p.Withdrawn((2,)))
    assert moves[-1] == (2, "waiting", None)


def test_nothing_is_asked_when_no_core_is_idle():
    stealing, busy, idle, tasks, sent, moves = setup(busy_tasks=1)
    stealing.workers.pop(b"idle")
    stealing.steal_for_idle_workers()
    assert sent == []


def test_only_the_answer_to_the_last_withdraw_of_a_task_moves_it():
    """Asked back, taken back (``Cancel``), sent there again and asked back again: two
    answers come, and the first is about the copy the ``Cancel`` dropped. Moving the
    task on it, while the second copy may already run there, could run it twice (the
    simulator at --delay 0.3, seeds 108 and 306)."""
    stealing, busy, idle, tasks, sent, moves = setup()
    stealing.steal_for_idle_workers()
    assert sent == [("busy", p.Withdraw((4, 3)))]
    stealing.settled(tasks[4])  # cancelled there, its Withdraw unanswered ...
    stealing.steal_for_idle_workers()  # ... sent there again, asked back again
    assert sent[-1] == ("busy", p.Withdraw((4,))) and stealing.withdrawing == {tasks[3], tasks[4]}
    stealing.on_withdrawn(busy, p.Withdrawn((4, 3)))  # the first answer: 3 moves, 4 stays
    assert moves == [(3, "ready", None), (3, "processing", "idle")]
    assert tasks[4] in stealing.withdrawing
    stealing.on_withdrawn(busy, p.Withdrawn((), (4,)))  # the last: the copy there runs
    assert tasks[4] not in stealing.withdrawing and tasks[4].worker is busy
    assert not stealing.asks
