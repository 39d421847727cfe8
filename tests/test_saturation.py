"""Saturation: EMA estimates and queue sizes, as pure functions of their samples."""

from __future__ import annotations

from daskvine_py.ema import Ema
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.records import DurationEstimates
from daskvine_py.scheduler.saturation import extra_tasks
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps


def test_ema_follows_and_forgets_on_outliers():
    ema = Ema()
    for _ in range(20):
        ema.observe(0.001)
    assert abs(ema.value - 0.001) < 1e-9
    ema.observe(0.0012)
    assert 0.001 < ema.value < 0.0012  # smoothed
    ema.observe(1.0)  # far longer than predicted: start over from the new sample
    assert ema.value == 1.0


def test_estimates_per_prefix_with_a_prior_for_new_prefixes():
    est = DurationEstimates()
    assert est.get("inc") is None
    est.observe("inc", 0.002)
    est.observe("sleep", 0.1)
    assert est.get("inc") == 0.002 and est.get("sleep") == 0.1
    assert est.get("never-seen") is not None


def test_extra_tasks_cover_the_round_trip_within_bounds():
    assert extra_tasks(2, None, None, 16) == 2  # unknown: one per core
    assert extra_tasks(1, 0.001, 0.001, 16) == 1
    assert extra_tasks(1, 0.0001, 0.001, 16) == 10  # tiny tasks: hide the round trip
    assert extra_tasks(1, 1e-7, 0.001, 16) == 16  # bounded
    assert extra_tasks(4, 10.0, 0.001, 16) == 1  # long tasks: just one in reserve
    assert extra_tasks(4, 0.0001, 0.001, 0) == 0


def joined(worker: bytes, cores: int = 1) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), cores, f"tcp://{worker.decode()}")


def test_queues_grow_once_tasks_are_known_to_be_tiny():
    st_ = s.SchedulerState(max_extra_tasks_per_core=8)
    tasks = [s.NewTask(f"t{i}", b"", (), (), i, "noop") for i in range(100)]
    out = st_.handle([joined(b"w1"), s.SubmitRun(1, tasks, [t.key for t in tasks], 3)])
    assert len(out) == 2  # unknown duration: one running, one in reserve
    first = out[0].message.task_id
    out = st_.handle([s.FromWorker(b"w1", p.TaskDone(first, 8, 1e-5, dumps(0)))], now=0.001)
    # 10 us tasks against a ~1 ms round trip: now it holds 1 + 8 (the bound).
    assert len(st_.workers[b"w1"].processing) == 9


def test_idle_workers_take_back_unstarted_tasks_but_not_a_chain():
    st_ = s.SchedulerState(max_extra_tasks_per_core=8)
    tasks = [s.NewTask(f"t{i}", b"", (), (), i, "noop") for i in range(4)]
    st_.handle([joined(b"w1"), s.SubmitRun(1, tasks, [t.key for t in tasks], 3)])
    st_.workers[b"w1"].cores = 1
    done = next(iter(st_.workers[b"w1"].processing)).id
    st_.handle([s.FromWorker(b"w1", p.TaskDone(done, 8, 1e-5, dumps(0)))], now=0.001)
    assert len(st_.workers[b"w1"].processing) == 3
    out = st_.handle([joined(b"w2")])
    # w2 is idle and nothing is queued: w1 is asked for its newest task back, and once it
    # says it dropped it unstarted, w2 gets it.
    assert [(i.worker, type(i.message)) for i in out] == [(b"w1", p.Withdraw)]
    out = st_.handle([s.FromWorker(b"w1", p.Withdrawn(out[0].message.task_ids))])
    assert [(i.worker, type(i.message)) for i in out] == [(b"w2", p.Execute)]

    chain = s.SchedulerState()
    links = [s.NewTask("a", b"", (), (), 0), s.NewTask("b", b"", (), ("a",), 1)]
    chain.handle([joined(b"w1"), s.SubmitRun(1, links, ["b"], 3)])
    chain.handle([s.FromWorker(b"w1", p.TaskDone(1, 8, 1e-5, None))], now=0.001)
    # b runs on w1 where its input is; an idle w2 must not take it.
    assert chain.handle([joined(b"w2")]) == []


def test_a_fixed_prefetch_ignores_the_estimates():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    tasks = [s.NewTask(f"t{i}", b"", (), (), i, "noop") for i in range(10)]
    out = st_.handle([joined(b"w1", cores=2), s.SubmitRun(1, tasks, ["t0"], 3)])
    assert len(out) == 2  # two cores, nothing in reserve
    st4 = s.SchedulerState(fixed_extra_tasks_per_core=4)
    assert len(st4.handle([joined(b"w1", cores=2), s.SubmitRun(1, tasks, ["t0"], 3)])) == 10
