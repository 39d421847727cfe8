"""The ``Constraints`` component alone: where annotated tasks may go and when."""

from __future__ import annotations

from daskvine_py.plan.annotations import Placement, RunSettings
from daskvine_py.scheduler.constraints import Constraints, retries_of
from daskvine_py.scheduler.messages import NewTask, RunFailed
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from parts import context

BIG = Placement(cores=2)


def make(*cores: int):
    workers = {}
    for i, n in enumerate(cores):
        w = WorkerRecord(f"w{i}".encode(), f"w{i}", n, f"tcp://w{i}:1", memory=2**30)
        workers[w.id] = w
    moves: list = []
    dropped: list = []

    def transition(task, finish, worker=None):
        moves.append((task.key, finish, worker and worker.name))
        task.state, task.worker = finish, worker
        worker.processing[task] = None

    ctx = context(
        transition,
        tuple(workers.values()),
        failures={"drop_run": dropped.append, "abort": lambda *a: None},
    )
    constraints = Constraints(ctx)
    return constraints, ctx.workers, ctx.runs, ctx.out, moves, dropped


def annotated_run(runs, placements, retries=None):
    settings = RunSettings(retries or {}, placements, {p: k for k, p in placements.items()})
    run = RunRecord(1, 3, (), settings=settings)
    runs[1] = run
    added = []
    for i, key in enumerate(placements):
        task = TaskRecord(i + 1, key, run, b"", (), i, key)
        run.tasks[key] = task
        added.append((NewTask(key, b"", (), (), i), task))
    return run, [t for _, t in added], added


def test_retries_come_from_the_annotation_else_from_the_run():
    constraints, workers, runs, out, moves, dropped = make(1)
    run, (a, b), _ = annotated_run(runs, {"a": BIG, "b": BIG}, retries={"a": 7})
    assert retries_of(a) == 7 and retries_of(b) == 3


def test_a_task_taking_two_slots_goes_where_two_are_free_and_holds_them():
    constraints, workers, runs, out, moves, dropped = make(1, 2)
    run, (big,), added = annotated_run(runs, {"big": BIG})
    constraints.mark(run, added)
    assert big.placement == BIG and constraints.pending()
    big.state = "ready"
    constraints.push(big, BIG)
    assert len(constraints) == 1
    constraints.dispatch()
    assert moves == [("big", "processing", "w1")]
    w1 = workers[b"w1"]
    assert constraints.held_back(w1) == 1 and constraints.room(w1) == 0
    assert not constraints.pending()


def test_a_task_that_fits_nowhere_yet_holds_back_the_worker_that_could_take_it():
    constraints, workers, runs, out, moves, dropped = make(2)
    run, (big,), added = annotated_run(runs, {"big": BIG})
    constraints.mark(run, added)
    w0 = workers[b"w0"]
    w0.processing[TaskRecord(9, "busy", run, b"", (), 9, "b")] = None  # one slot taken
    big.state = "ready"
    constraints.push(big, BIG)
    constraints.dispatch()
    assert moves == [] and constraints.reserved == {big: w0}
    assert constraints.held_back(w0) == 2  # reserved: nothing else goes there


def test_a_run_asking_what_no_worker_offers_fails_as_it_starts():
    constraints, workers, runs, out, moves, dropped = make(1)
    run, _, added = annotated_run(runs, {"big": BIG})
    constraints.mark(run, added)
    constraints.dispatch()
    (failed,) = out
    assert type(failed) is RunFailed and failed.key == "big"
    assert "2 cores, which no connected worker can hold" in failed.message
    assert dropped == [run]
