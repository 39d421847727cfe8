"""The ``Context`` the scheduler's components share: every part built around one, and who
hears of a task's report, in which order."""

from __future__ import annotations

from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.context import Context
from daskvine_py.scheduler.messages import RunCache
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps

W1, W2 = b"w1", b"w2"


def joined(worker: bytes) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), 1, f"tcp://{worker.decode()}")


def owners(hooks: tuple) -> list[str]:
    return [type(hook.__self__).__name__ for hook in hooks]


def test_every_part_is_built_around_the_one_context_and_shares_its_records():
    st_ = s.SchedulerState()
    ctx = st_.ctx
    for name in Context.PARTS:
        assert getattr(ctx, name) is not None
    assert st_.workers is ctx.workers and st_.tasks is ctx.tasks and st_.queue is ctx.queue
    assert ctx.dispatch.out is ctx.out and ctx.caching.cache_runs is ctx.cache_runs
    assert ctx.saturation.durations is ctx.durations and st_.faults is ctx.faults
    st_.handle([], now=12.5)
    assert st_.now == ctx.now == 12.5  # one clock, set once per ``handle``


def test_a_report_is_heard_by_its_subscribers_in_the_order_of_the_parts():
    ctx = s.SchedulerState().ctx
    assert owners(ctx.done_hooks) == ["Sizing", "Faults"]
    assert owners(ctx.erred_hooks) == ["Sizing", "Faults"]
    assert owners(ctx.crashed_hooks) == ["Sizing", "Faults", "Churn"]
    assert ctx.stored_hooks == ()  # nobody needs results stored: no call per task


def test_the_cache_hears_of_results_stored_while_a_cache_run_lasts():
    st_ = s.SchedulerState()
    ctx = st_.ctx
    tasks = [s.NewTask("x", b"px", (), (), 0)]
    cache = RunCache({"x": b"kx", "y": b"ky"})
    out = st_.handle([joined(W1), s.SubmitRun(1, tasks, ["x"], 0, cache=cache)])
    assert owners(ctx.stored_hooks) == ["Caching"]
    [execute] = [i.message for i in out if type(i) is s.Send and type(i.message) is p.Execute]
    st_.handle([s.FromWorker(W1, p.TaskDone(execute.task_id, 8, 0.1, dumps(1)))])
    assert not st_.runs and ctx.stored_hooks == ()


def test_verification_hears_from_the_first_task_chosen_and_before_the_cache():
    st_ = s.SchedulerState()
    ctx = st_.ctx
    tasks = [s.NewTask("x", b"px", (), (), 0)]
    cache = RunCache({"x": b"kx", "y": b"ky"})
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["x"], 0, verify=1.0)])
    assert owners(ctx.stored_hooks) == ["Verification"]
    st_.handle([s.SubmitRun(2, [s.NewTask("y", b"py", (), (), 0)], ["y"], 0, cache=cache)])
    assert owners(ctx.stored_hooks) == ["Verification", "Caching"]
