"""The state's instructions for the manager's watching and accounting, its "forgotten" end
of every task, and its one staleness check: literal events in, instructions out (issue 14)."""

from __future__ import annotations

from unittest import mock

from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps

W1, W2 = b"w1", b"w2"


def joined(worker: bytes, cores: int = 1) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), cores, f"tcp://{worker.decode()}")


def pair(watched: bool) -> s.SubmitRun:
    """x -> y, output y, prefixes "x" and "y"."""
    tasks = [s.NewTask("x", b"", (), (), 0, "x"), s.NewTask("y", b"", (), ("x",), 1, "y")]
    return s.SubmitRun(1, tasks, ["y"], 0, watched=watched)


def not_sent(out):
    return [i for i in out if type(i) is not s.Send]


def test_a_watched_run_yields_its_dispatches_and_the_reports_the_state_takes():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    out = st_.handle([joined(W1), pair(watched=True)])
    assert not_sent(out) == [
        s.Dispatched(1, 1, "x", "x", "w1"),
        s.Dispatched(1, 2, "y", "y", "w1"),  # sent ahead
    ]
    done = p.TaskDone(1, 8, 0.1, None)
    assert not_sent(st_.handle([s.FromWorker(W1, done)])) == [s.TaskFinished(1, "x", "w1", done)]
    erred = p.TaskErred(2, None, "tb", "ValueError: no")
    out = st_.handle([s.FromWorker(W1, erred)])
    assert [type(i) for i in not_sent(out)] == [s.TaskFinished, s.RunFailed]
    assert not_sent(out)[0] == s.TaskFinished(1, "y", "w1", erred)


def test_a_stale_report_of_a_watched_run_yields_nothing():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), joined(W2), pair(watched=True)])
    # x runs on w1: the same report from w2, or about a task no one knows, is stale.
    out = st_.handle(
        [
            s.FromWorker(W2, p.TaskDone(1, 8, 0.1, None)),
            s.FromWorker(W2, p.TaskCrashed(1, "killed")),
            s.FromWorker(W1, p.TaskDone(99, 8, 0.1, None)),
        ]
    )
    assert not_sent(out) == []
    assert st_.tasks[1].state == "processing"


def test_an_unwatched_run_yields_no_watching_instructions():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    out = st_.handle([joined(W1), pair(watched=False)])
    out += st_.handle([s.FromWorker(W1, p.TaskDone(1, 8, 0.1, None))])
    out += st_.handle([s.FromWorker(W1, p.TaskDone(2, 8, 0.1, dumps(3)))])
    assert [type(i) for i in not_sent(out)] == [s.RunOutput, s.RunDone]


def test_every_run_ends_with_the_seconds_its_tasks_ran_and_serialized():
    """Watched or not: the state sums ``duration`` and ``serialization`` of the reports it
    takes, and hands the sums over with ``RunDone`` (``manager.last_run`` shows them)."""
    for watched in (False, True):
        st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
        st_.handle([joined(W1), joined(W2), pair(watched=watched)])
        out = st_.handle(
            [
                s.FromWorker(W1, p.TaskDone(1, 8, 0.25, None, 0.0, 0.5)),
                s.FromWorker(W2, p.TaskDone(1, 8, 4.0, None, 0.0, 8.0)),  # stale: not counted
                s.FromWorker(W1, p.TaskDone(2, 8, 0.125, dumps(3), 0.0, 1.0)),
            ]
        )
        (done,) = [i for i in out if type(i) is s.RunDone]
        assert done[:4] == s.RunDone(1, run_seconds=0.375, serialization_seconds=1.5)[:4]
        assert {name: c.wall_s for name, c in done.categories.items()} == {"x": 0.25, "y": 0.125}


def test_every_run_sums_its_tasks_by_category():
    """The CPU seconds and peak memory each task's library measured, by key prefix."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    tasks = [s.NewTask(("x", i), b"", (), (), i, "x") for i in range(3)]
    tasks.append(s.NewTask("y", b"", (), tuple(("x", i) for i in range(3)), 3, "y"))
    st_.handle([joined(W1, cores=4), s.SubmitRun(1, tasks, ["y"], 0)])
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 8, 0.5, None, 0.0, 0.0, 0.25, 300 * 2**20)),
            s.FromWorker(W1, p.TaskDone(2, 8, 0.5, None, 0.0, 0.0, 0.5, 500 * 2**20)),
            s.FromWorker(W1, p.TaskDone(3, 8, 0.5, None, 0.0, 0.0, 0.25, 100 * 2**20)),
            s.FromWorker(W1, p.TaskDone(4, 8, 0.125, dumps(3), 0.0, 0.0, 0.0, 2**20)),
        ]
    )
    (done,) = [i for i in out if type(i) is s.RunDone]
    x, y = done.categories["x"], done.categories["y"]
    assert (x.tasks, x.wall_s, x.cpu_s, x.peak_memory_mb) == (3, 1.5, 1.0, 500.0)
    assert (y.tasks, y.wall_s, y.cpu_s, y.peak_memory_mb) == (1, 0.125, 0.0, 1.0)
    assert (x.allocated_memory_mb, x.exhausted) == (0, 0)


def test_a_failed_run_carries_the_seconds_of_the_tasks_done_before():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    st_.handle([joined(W1), pair(watched=False)])
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 8, 0.25, None, 0.0, 0.5)),
            s.FromWorker(W1, p.TaskErred(2, None, "tb", "ValueError: no")),
        ]
    )
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert (failed.run_seconds, failed.serialization_seconds) == (0.25, 0.5)
    assert failed.message == "ValueError: no" and not failed.crashed


def test_inputs_sent_inside_execute_are_counted_once_per_worker_and_handle():
    st_ = s.SchedulerState(chain_ahead=0, fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), joined(W2), pair(watched=False)])
    value = dumps(5)
    # w1 fills up as x finishes there: y goes to w2 with x's small value inside it.
    out = st_.handle(
        [s.FromWorker(W1, p.TaskDone(1, 8, 0.1, value)), s.FromWorker(W1, p.DiskFull(True))]
    )
    (execute,) = [i.message for i in out if type(i) is s.Send]
    assert execute.deps == (p.DepLocation(1, "x", (), value),)
    assert not_sent(out) == [s.BytesInlined(W2, "w2", len(value.header))]
    assert not hasattr(st_.workers[W2], "inlined_bytes")


def test_every_task_of_a_run_that_ends_is_forgotten_through_the_table():
    st_ = s.SchedulerState(chain_ahead=0, fixed_extra_tasks_per_core=0)
    tasks = [
        s.NewTask(k, b"", (), deps, i)
        for i, (k, deps) in enumerate([("a", ()), ("b", ()), ("c", ("a",)), ("d", ("b",))])
    ]
    st_.handle([joined(W1), s.SubmitRun(1, tasks, ["c", "d"], 0)])
    st_.handle([s.FromWorker(W1, p.TaskDone(1, 8, 0.1, None))])  # a in memory, b processing
    records = dict(st_.runs[1].tasks)
    before = {key: task.state for key, task in records.items()}
    assert before == {"a": "memory", "b": "processing", "c": "ready", "d": "waiting"}
    out = st_.handle([s.CancelRun(1)])
    assert {task.state for task in records.values()} == {"forgotten"}
    assert {(start, finish) for _, start, finish in st_.story if finish == "forgotten"} == {
        (state, "forgotten") for state in before.values()
    }
    assert sorted(map(tuple, (i.message for i in out))) == [((1,),), ((2,),)]  # Release, Cancel
    assert not st_.tasks and not st_.runs and not st_.queue
    assert not st_.workers[W1].processing and not st_.workers[W1].has_what


def test_a_failed_task_is_forgotten_without_a_cancel_to_its_worker():
    st_ = s.SchedulerState(chain_ahead=0, fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), pair(watched=False)])
    out = st_.handle([s.FromWorker(W1, p.TaskErred(1, None, "", "boom"))])
    assert [type(i) for i in out] == [s.RunFailed]
    assert not st_.tasks and not st_.workers[W1].processing


def test_reports_are_routed_by_the_table_and_an_unknown_one_is_dropped():
    st_ = s.SchedulerState()
    st_.handle([joined(W1)])
    assert set(st_._reports) == {
        p.TaskDone,
        p.TaskErred,
        p.TaskCrashed,
        p.FetchFailed,
        p.Replicas,
        p.Lost,
        p.Withdrawn,
        p.Started,
        p.DiskFull,
        p.Relay,
        p.Uploaded,
        p.Transfers,
        p.TaskExhausted,
        p.InputServer,
        p.InputsDropped,
    }
    (dropped,) = st_.handle([s.FromWorker(W1, p.Heartbeat())])
    assert type(dropped) is s.EventDropped and isinstance(dropped.error, TypeError)
    seen = []
    with mock.patch.dict(st_._reports, {p.DiskFull: lambda w, m: seen.append(m)}):
        st_.handle([s.FromWorker(W1, p.DiskFull(True))])
    assert seen == [p.DiskFull(True)] and not st_.workers[W1].full


def test_the_load_counts_every_runs_ready_processing_and_running_tasks():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abcde")]
    st_.handle([joined(W1, cores=2), s.SubmitRun(1, tasks, list("abcde"), 0)])
    assert st_.load() == (1, 4, 2)
