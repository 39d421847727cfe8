"""The ``Dispatch`` component alone: the dispatch round and the ``Execute`` of a task,
with literal records, the other components' steps as plain functions (``parts``)."""

from __future__ import annotations

from daskvine_py.scheduler.constraints import Constraints
from daskvine_py.scheduler.dispatch import Dispatch
from daskvine_py.scheduler.messages import BytesInlined, Dispatched, Send
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.scheduler.sizing import Sizing
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from parts import context


def make(extra: int = 0, cache_runs: dict | None = None):
    calls: list = []

    def transition(task, finish, worker=None):
        calls.append(("transition", task.id, finish))
        task.state = finish
        dispatch.assign(task, worker)

    ctx = context(
        transition,
        (WorkerRecord(b"w", "w", 1, "tcp://w:1"),),
        saturation={"extra": lambda w, t: extra},
        locality={"send_ahead": lambda t, w: calls.append(("ahead", t.id))},
        stealing={"steal_for_idle_workers": lambda: calls.append(("steal",))},
        caching={"locations": lambda t, deps: deps},
        failures={"abort": lambda *a: calls.append(("abort", a))},
    )
    ctx.cache_runs.update(cache_runs or {})
    ctx.constraints = Constraints(ctx)
    ctx.sizing = Sizing(ctx, mode="fixed")
    dispatch = Dispatch(ctx)
    return dispatch, ctx.workers[b"w"], ctx.queue, ctx.out, calls


def test_a_round_fills_each_worker_to_its_saturation_then_steals():
    dispatch, w, queue, out, calls = make(extra=1)
    run = RunRecord(1, 0, ())
    tasks = [TaskRecord(i, f"t{i}", run, b"", (), i, "t") for i in (1, 2, 3)]
    for t in tasks:
        t.state = "ready"
        queue.push(t, t.priority)
    dispatch.dispatch()
    # One core and one extra: the two best go, each followed by its chain; no stealing
    # while a task is still queued here.
    assert calls == [
        ("transition", 1, "processing"),
        ("ahead", 1),
        ("transition", 2, "processing"),
        ("ahead", 2),
    ]
    assert [m.message.task_id for m in out] == [1, 2] and len(queue) == 1
    w.processing.clear()
    calls.clear()
    dispatch.dispatch()
    assert calls[-1] == ("steal",) and not queue


def test_an_execute_carries_the_config_and_functions_once_and_small_inputs_inline():
    dispatch, w, queue, out, calls = make()
    config = p.RunConfig(7, "tasks", "fork", (), (), True)
    run = RunRecord(7, 0, ("b",), config=config, watched=True)
    run.functions[b"f"] = b"code"
    a = TaskRecord(1, "a", run, b"", (), 0, "a")
    a.state, a.value = "memory", dumps(5)  # small, held at the manager
    b = TaskRecord(2, "b", run, b"payload", (b"f",), 1, "b")
    b.deps = (a,)
    b.is_output = True
    dispatch.ctx.now = 12.5
    dispatch.assign(b, w)
    sent = [i.message for i in out if type(i) is Send]
    assert sent[0] == config and sent[1] == p.Function(b"f", b"code")
    execute = sent[2]
    assert type(execute) is p.Execute and execute.task_id == 2 and execute.run_id == 7
    assert execute.deps == (p.DepLocation(1, "a", (), a.value),)
    assert out[-1] == Dispatched(7, 2, "b", "b", "w")
    assert b.worker is w and b.sent_at == 12.5 and b.sent_idle and b in w.processing
    c = TaskRecord(3, "c", run, b"", (b"f",), 2, "c")
    out.clear()
    dispatch.assign(c, w)
    assert [type(i.message) for i in out if type(i) is Send] == [p.Execute]  # once each
    out.clear()
    dispatch.count_inlined()
    assert out == [BytesInlined(b"w", "w", len(a.value.header))]
    dispatch.count_inlined()
    assert out == [BytesInlined(b"w", "w", len(a.value.header))]  # counted once


def test_a_full_worker_gets_no_new_work_while_another_has_room():
    dispatch, w, queue, out, calls = make()
    other = WorkerRecord(b"o", "o", 1, "tcp://o:1")
    dispatch.workers[other.id] = other
    t = TaskRecord(1, "t", RunRecord(1, 0, ()), b"", (), 0, "t")
    t.state = "ready"
    queue.push(t, 0, b"w")
    dispatch.on_disk_full(w, p.DiskFull(True))
    assert w.full and dispatch.full == {w}
    dispatch.dispatch()
    assert t.worker is other  # its lane at w was forgotten: anyone takes it
    dispatch.on_disk_full(w, p.DiskFull(False))
    assert not w.full and not dispatch.full
