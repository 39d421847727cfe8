"""The I/O loop's typed commands, driven by hand: no thread, no workers (issue 14)."""

from __future__ import annotations

import threading

import pytest
import zmq

from daskvine_py.errors import ManagerDied, SchedulerError
from daskvine_py.manager.commands import Cancel, Close, Extend, Submit
from daskvine_py.manager.loop import IOLoop
from daskvine_py.manager.watching import Run
from daskvine_py.options import ManagerOptions
from daskvine_py.report.runinfo import RunInfo
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p


@pytest.fixture
def loop():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    io = IOLoop(router, s.SchedulerState(), ManagerOptions(security=False), [])
    try:
        yield io
    finally:
        io.close_pipe()
        router.close(linger=0)
        context.term()


def new_run(run_id: int) -> Run:
    run = Run(run_id)
    run.info = RunInfo(run_id, tasks=1)
    return run


def submit(run: Run, watch: bool = False) -> Submit:
    event = s.SubmitRun(run.id, [s.NewTask("x", b"", (), (), 0)], ["x"], 0, watched=watch)
    return Submit(run, event, watch)


def test_commands_are_named_records():
    run = new_run(1)
    command = submit(run, watch=True)
    assert command.run is run and command.watch and command.event.run_id == 1
    assert Cancel(run).run is run and Close() == ()


def test_submit_extend_and_cancel_reach_the_state_in_order(loop):
    run = new_run(1)
    extend = s.ExtendRun(1, [s.NewTask("y", b"", (), (), 1)])
    loop.command(submit(run, watch=True))
    loop.command(Extend(run, extend))
    loop.command(Cancel(run))
    assert loop._drain_commands() is True
    assert [type(e) for e in loop.events] == [s.SubmitRun, s.ExtendRun, s.CancelRun]
    assert not loop.watching.runs and not loop.watching.watched


def test_more_tasks_of_a_run_that_ended_are_not_passed_on(loop):
    run = new_run(1)
    loop.command(Extend(run, s.ExtendRun(1, [])))
    loop.command(Cancel(run))  # never submitted: nothing to cancel either
    loop._drain_commands()
    assert loop.events == []


def test_close_stops_the_loop_and_leaves_later_commands(loop):
    run = new_run(1)
    loop.command(Close())
    loop.command(submit(run))
    assert loop._drain_commands() is False
    assert not loop.watching.runs


def test_a_command_that_raises_fails_its_run_only(loop):
    good, bad = new_run(1), new_run(2)
    original = loop.watching.start

    def start(run, watch, workers, now):
        if run is bad:
            raise RuntimeError("a bug")
        original(run, watch, workers, now)

    loop.watching.start = start
    loop.command(submit(bad))
    loop.command(submit(good))
    assert loop._drain_commands() is True
    assert [type(e) for e in loop.events] == [s.SubmitRun]  # the good one's
    # The bad run was never recorded, so no AbortRun would reach it: it ends at once.
    assert set(loop.watching.runs) == {1}
    assert bad.done.is_set() and isinstance(bad.failure, SchedulerError)
    assert "the Submit command of run 2" in str(bad.failure)
    assert not good.done.is_set()


def test_a_command_queued_after_the_loop_died_fails_its_run_at_once(loop):
    loop.error = RuntimeError("gone")
    run = new_run(1)
    loop.command(submit(run))
    assert run.done.is_set() and isinstance(run.failure, ManagerDied)
    assert isinstance(run.failure.__cause__, RuntimeError)


def test_callers_see_workers_join_and_leave_through_the_published_snapshot(loop):
    reg = p.Register(p.PROTOCOL_VERSION, "w1", 2, 1 << 20, "elsewhere", "tcp://w1:1", 7)
    seen = []

    def wait():
        with loop.changed:
            seen.append(loop.changed.wait_for(lambda: bool(loop.snapshot), timeout=30))

    waiter = threading.Thread(target=wait)
    waiter.start()
    loop._on_stranger(b"id1", [reg], now=0.0)
    waiter.join(30)
    assert seen == [True]
    (info,) = loop.snapshot.values()
    assert info["name"] == "w1" and info["cores"] == 2 and info["pid"] == 7
    assert b"id1" in loop.liveness
    loop._on_worker_batch(b"id1", loop.workers[b"id1"], [p.Status(5, 6, 7)], now=1.0)
    assert loop.snapshot[b"id1"]["stored_bytes"] == 5
    loop._lose_worker(b"id1", "test")
    assert loop.snapshot == {} and b"id1" not in loop.liveness
    assert [type(e) for e in loop.events] == [s.WorkerJoined, s.WorkerLost]
