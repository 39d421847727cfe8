"""The ``Failures`` component alone: failed, aborted and dropped runs, and what their
tasks' workers must hear."""

from __future__ import annotations

from types import SimpleNamespace

from daskvine_py.scheduler.failures import Failures
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.messages import (
    CancelRun,
    EventDropped,
    FromWorker,
    RunAborted,
    RunFailed,
    Send,
)
from daskvine_py.scheduler.records import Drop, RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from parts import context


def make():
    run = RunRecord(1, 0, ("y",))
    settled: list = []
    story: list = []

    def transition(task, finish, worker=None):
        story.append((task.id, task.state, finish))
        task.state = finish

    ctx = context(
        transition,
        tuple(WorkerRecord(n, n.decode(), 2, f"tcp://{n.decode()}:1") for n in (b"a", b"b")),
        constraints={"placing": ReadyQueue()},
        stealing={"settled": settled.append},
    )
    ctx.claims = SimpleNamespace(send=ctx.send)  # (what takes tasks back: none here)
    ctx.runs[1] = run
    failures = Failures(ctx)
    workers, tasks, out, queue = ctx.workers, ctx.tasks, ctx.out, ctx.queue
    a, b = workers[b"a"], workers[b"b"]
    x = TaskRecord(1, "x", run, b"", (), 0, "x")  # in memory on b
    x.state = "memory"
    x.hold(b)
    b.has_what.add(x)
    y = TaskRecord(2, "y", run, b"", (), 1, "y")  # running on a
    y.state, y.worker = "processing", a
    a.processing[y] = None
    z = TaskRecord(3, "z", run, b"", (), 2, "z")  # ready here
    z.state = "ready"
    queue.push(z, 2)
    for t in (x, y, z):
        run.tasks[t.key] = t
        tasks[t.id] = t
    return failures, run, (x, y, z), out, settled, story


def test_a_dropped_run_cancels_what_runs_releases_what_is_held_and_forgets_all():
    failures, run, (x, y, z), out, settled, story = make()
    failures.forget_run(run)
    assert out == [Send(b"a", p.Cancel((2,))), Send(b"b", p.Release((1,)))]
    assert {(i, f) for i, _, f in story} == {(1, "forgotten"), (2, "forgotten"), (3, "forgotten")}
    assert not failures.tasks and not failures.runs and not failures.queue
    assert not y.worker and not failures.workers[b"b"].has_what and y in settled


def test_a_failed_task_fails_its_run_and_its_worker_hears_no_cancel():
    failures, run, (x, y, z), out, settled, story = make()
    a = failures.workers[b"a"]
    failures.fail(y, a, None, "tb", "it broke", crashed=False)
    assert type(out[0]) is RunFailed and out[0].key == "y" and out[0].message == "it broke"
    assert out[1:] == [Send(b"b", p.Release((1,)))]  # no Cancel for y
    assert not failures.runs


def test_a_handler_that_raised_fails_the_runs_its_event_concerns_or_is_dropped():
    failures, run, (x, y, z), out, settled, story = make()
    error = RuntimeError("bug")
    failures.on_handler_error(FromWorker(b"a", p.Withdrawn((99,))), error, ())
    assert out == [EventDropped("a Withdrawn about task (id 99) from worker a", error)]
    out.clear()
    failures.on_handler_error(CancelRun(1), error, ())
    assert out[0] == RunAborted(1, error, "the cancellation of run 1")
    assert not failures.runs and not failures.tasks


def test_a_dismissed_task_spared_by_its_drop_is_not_cancelled():
    failures, run, (x, y, z), out, settled, story = make()
    drop = Drop(spared=y)
    failures.dismiss(y, drop)
    assert drop.cancel == {} and y.state == "forgotten" and 2 not in failures.tasks
    drop = Drop(sweep=True)
    failures.dismiss(x, drop)
    assert drop.release == {failures.workers[b"b"]: [1]}
