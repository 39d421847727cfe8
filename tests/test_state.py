"""The scheduler state machine, driven with literal events: no sockets, no processes."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py.errors import InvalidTransition
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, dumps, loads

W1, W2 = b"w1", b"w2"


def joined(worker: bytes, cores: int = 1) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), cores, f"tcp://{worker.decode()}")


def chain_run(run_id: int = 1, retries: int = 3) -> s.SubmitRun:
    """a -> b -> c, output c."""
    tasks = [
        s.NewTask("a", b"pa", (), (), 0),
        s.NewTask("b", b"pb", (), ("a",), 1),
        s.NewTask("c", b"pc", (), ("b",), 2),
    ]
    return s.SubmitRun(run_id, tasks, ["c"], retries)


def sends(out, kind=None, worker=None):
    return [
        i.message
        for i in out
        if type(i) is s.Send
        and (kind is None or type(i.message) is kind)
        and (worker is None or i.worker == worker)
    ]


def test_no_workers_means_no_dispatch_until_one_joins():
    st_ = s.SchedulerState()
    assert st_.handle([chain_run()]) == []
    out = st_.handle([joined(W1)])
    # "a" can start; "b" waits only for "a", and "c" only for "b": a linear chain, sent
    # ahead whole (``CHAIN_AHEAD``) to run there link after link.
    assert out == [
        s.Send(W1, p.Execute(1, "a", b"pa", (), False)),
        s.Send(W1, p.Execute(2, "b", b"pb", (p.DepLocation(1, "a", None),), False)),
        s.Send(W1, p.Execute(3, "c", b"pc", (p.DepLocation(2, "b", None),), True)),
    ]


def test_chain_runs_in_place_and_releases_inputs():
    st_ = s.SchedulerState(chain_ahead=0)
    st_.handle([joined(W1), chain_run()])
    # a ran 0.1 ms of a 10 ms round trip: the worker can hold more, so c follows b ahead.
    out = st_.handle([s.FromWorker(W1, p.TaskDone(1, 10, 0.0001, None))], now=0.01)
    assert out == [s.Send(W1, p.Execute(3, "c", b"pc", (p.DepLocation(2, "b", None),), True))]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(2, 10, 0.1, None))])
    assert out == [s.Send(W1, p.Release((1,)))]
    value = dumps(42)
    out = st_.handle([s.FromWorker(W1, p.TaskDone(3, 10, 0.1, value))])
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]
    assert loads(out[0].value) == 42
    assert sorted(m.task_ids for m in sends(out, p.Release)) == [(2,), (3,)]
    assert not st_.tasks and not st_.runs and not st_.workers[W1].has_what


def test_inputless_siblings_are_queued_for_the_worker_that_took_one():
    # e reads a and c, f reads b and d; in priority order a, b, c, d. Taken one per
    # worker in turn, each pair would be split; queued after its sibling, it meets there.
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abcd")] + [
        s.NewTask("e", b"", (), ("a", "c"), 4),
        s.NewTask("f", b"", (), ("b", "d"), 5),
    ]
    out = st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["e", "f"], 3)])
    placed = {w: sorted(m.key for m in sends(out, p.Execute, worker=w)) for w in (W1, W2)}
    assert placed == {W1: ["a", "c"], W2: ["b", "d"]}
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 10, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(3, 10, 0.1, None)),
            s.FromWorker(W2, p.TaskDone(2, 10, 0.1, None)),
            s.FromWorker(W2, p.TaskDone(4, 10, 0.1, None)),
        ]
    )
    # each reader runs where both its inputs are: nothing to fetch from a peer
    for worker, key in ((W1, "e"), (W2, "f")):
        (execute,) = sends(out, p.Execute, worker=worker)
        assert execute.key == key and all(dep.peers == () for dep in execute.deps)


def test_a_reader_of_inputs_all_computing_on_one_worker_is_sent_ahead_there():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), (), 1),
        s.NewTask("c", b"", (), ("a", "b"), 2),
    ]
    out = st_.handle([joined(W1), s.SubmitRun(1, tasks, ["c"], 3)])
    # both inputs are being computed on w1: c waits there for them, not for us
    assert [m.key for m in sends(out, p.Execute, worker=W1)] == ["a", "b", "c"]
    (c,) = [m for m in sends(out, p.Execute) if m.key == "c"]
    assert [dep.peers for dep in c.deps] == [None, None]
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 10, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(2, 10, 0.1, None)),
        ]
    )
    assert not sends(out, p.Execute) and st_.tasks[3].state == "processing"
    out = st_.handle([s.FromWorker(W1, p.TaskDone(3, 10, 0.1, dumps(1)))])
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]


def test_a_task_sent_ahead_of_its_inputs_holds_no_core_of_its_worker():
    """c waits on w1 for a and b: w1 still holds as many tasks that can start as its
    bound (dv3-large's workers ran 10-11 of 12 while merges sent ahead waited on them,
    8% of the cluster idle)."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=1)
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), (), 1),
        s.NewTask("c", b"", (), ("a", "b"), 2),
        s.NewTask("d", b"", (), (), 3),
        s.NewTask("e", b"", (), (), 4),
        s.NewTask("f", b"", (), (), 5),
    ]
    out = st_.handle([joined(W1, cores=2), s.SubmitRun(1, tasks, ["c", "d", "e", "f"], 3)])
    # bound: 2 cores + 2 extra; c, sent ahead, is not one of the four that can start
    assert [m.key for m in sends(out, p.Execute, worker=W1)] == ["a", "b", "c", "d", "e"]
    worker = st_.workers[W1]
    assert [t.key for t in worker.ahead] == ["c"] and worker.startable() == 4
    out = st_.handle([s.FromWorker(W1, p.TaskDone(1, 10, 0.1, None))])
    assert [m.key for m in sends(out, p.Execute, worker=W1)] == ["f"]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(2, 10, 0.1, None))])
    assert not sends(out, p.Execute) and not worker.ahead  # c can start now: it counts
    assert worker.startable() == 4


def test_a_reader_sent_ahead_waits_here_again_when_an_input_is_stolen():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), (), 1),
        s.NewTask("c", b"", (), ("a", "b"), 2),
    ]
    st_.handle([joined(W1), s.SubmitRun(1, tasks, ["c"], 3)])
    assert st_.tasks[3].state == "processing"
    # w2 joins idle: b, unstarted behind a, is asked back from w1 for it
    out = st_.handle([joined(W2)])
    assert sends(out, p.Withdraw, worker=W1)
    out = st_.handle([s.FromWorker(W1, p.Withdrawn((2,)))])
    assert st_.tasks[2].worker.id == W2 and st_.tasks[3].state == "waiting"
    assert p.Cancel((3,)) in sends(out, p.Cancel, worker=W1)


def test_a_sibling_queued_for_a_busy_worker_is_taken_by_an_idle_one():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), (), 1),
        s.NewTask("c", b"", (), ("a", "b"), 2),
    ]
    out = st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["c"], 3)])
    # w1 takes a and b is queued for it, but w1 is full and w2 has nothing: w2 takes b.
    assert [m.key for m in sends(out, p.Execute, worker=W1)] == ["a"]
    assert [m.key for m in sends(out, p.Execute, worker=W2)] == ["b"]


def test_tasks_sent_ahead_are_recalled_when_their_input_goes_elsewhere():
    st_ = s.SchedulerState(chain_ahead=0)
    st_.handle([joined(W1), chain_run()])
    assert st_.tasks[2].state == "processing" and st_.tasks[2].missing == 1
    out = st_.handle([s.FromWorker(W1, p.TaskCrashed(1, "library exited")), joined(W2)])
    # b is called back from w1 while a waits to be retried; the retry goes to w1 again (the
    # crash is handled before w2 joins), and b is sent ahead behind it once more.
    assert out == [
        s.Send(W1, p.Cancel((2,))),
        s.Send(W1, p.Execute(1, "a", b"pa", (), False)),
        s.Send(W1, p.Execute(2, "b", b"pb", (p.DepLocation(1, "a", None),), False)),
    ]
    assert st_.tasks[2].state == "processing" and st_.tasks[2].worker.id == W1
    assert st_.tasks[1].attempts == 1


def test_inputs_elsewhere_are_named_with_their_peers():
    st_ = s.SchedulerState(sibling_inputs=0)  # else y would be queued for x's worker
    tasks = [
        s.NewTask("x", b"", (), (), 0),
        s.NewTask("y", b"", (), (), 1),
        s.NewTask("z", b"", (), ("x", "y"), 2),
    ]
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["z"], 3)])
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 1000, 0.1, None)),
            s.FromWorker(W2, p.TaskDone(2, 10, 0.1, None)),
        ]
    )
    (execute,) = sends(out, p.Execute, worker=W1)  # most input bytes are on w1
    assert execute.deps == (p.DepLocation(1, "x", ()), p.DepLocation(2, "y", ("tcp://w2",)))
    # w1 fetched y: it reports the replica, then finishing z releases both copies of y.
    out = st_.handle(
        [s.FromWorker(W1, p.Replicas((2,))), s.FromWorker(W1, p.TaskDone(3, 8, 0.1, dumps(0)))]
    )
    released = {
        (i.worker, i.message.task_ids)
        for i in out
        if type(i) is s.Send and type(i.message) is p.Release
    }
    assert {(W1, (1,)), (W1, (2,)), (W2, (2,)), (W1, (3,))} <= released


def test_task_error_fails_the_run_and_cancels_the_rest():
    st_ = s.SchedulerState()
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abcd")]
    st_.handle([joined(W1, cores=2), s.SubmitRun(7, tasks, list("abcd"), 3)])
    exc = dumps(ValueError("boom"))
    out = st_.handle([s.FromWorker(W1, p.TaskErred(1, exc, "tb", "ValueError: boom"))])
    failed = [i for i in out if type(i) is s.RunFailed]
    (categories,) = [f.categories for f in failed]  # the task that raised counts there
    assert {name: c.failed for name, c in categories.items()} == {"": 1}  # (no prefix)
    assert failed == [
        s.RunFailed(7, "a", "w1", exc, "tb", "ValueError: boom", False, categories=categories)
    ]
    assert sends(out, p.Cancel) == [p.Cancel((2, 3, 4))]
    assert not st_.tasks and not st_.workers[W1].processing


def test_crashes_are_retried_then_reported():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), s.SubmitRun(1, [s.NewTask("a", b"", (), (), 0)], ["a"], 1)])
    out = st_.handle([s.FromWorker(W1, p.TaskCrashed(1, "library exited with code 1"))])
    assert sends(out, p.Execute) == [p.Execute(1, "a", b"", (), True)]
    out = st_.handle([s.FromWorker(W1, p.TaskCrashed(1, "library exited with code 1"))])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.crashed and "2 attempts" in failed.message and failed.key == "a"


def test_lost_worker_recomputes_exactly_the_lost_results():
    st_ = s.SchedulerState(sibling_inputs=0)  # inputs spread over both workers
    # x1 on w1, x2 on w2, then y = f(x1, x2) is waiting for a free slot.
    tasks = [
        s.NewTask("x1", b"", (), (), 0),
        s.NewTask("x2", b"", (), (), 1),
        s.NewTask("y", b"", (), ("x1", "x2"), 2),
    ]
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["y"], 3)])
    st_.handle([s.FromWorker(W2, p.TaskDone(2, 5, 0.1, None))])
    out = st_.handle([s.WorkerLost(W2, "killed")])
    # x2 existed only on w2: it is recomputed on w1; x1 is still processing there.
    assert sends(out, p.Execute) == [p.Execute(2, "x2", b"", (), False)]
    assert st_.tasks[1].state == "processing" and st_.tasks[3].state == "waiting"


def reduction_after_a_loss(st_: s.SchedulerState) -> None:
    """x0..x3 done on two workers, then y = f(x0..x3) dispatched; the worker that holds
    half the inputs and not y is lost and another joins (issue 36: "waiting 0")."""
    tasks = [s.NewTask(f"x{i}", b"", (), (), i, "x") for i in range(4)]
    tasks.append(s.NewTask("y", b"", (), tuple(f"x{i}" for i in range(4)), 4, "y"))
    out = st_.handle([joined(W1, 2), joined(W2, 2), s.SubmitRun(1, tasks, ["y"], 3)])
    holder = {m.task_id: w for w in (W1, W2) for m in sends(out, p.Execute, worker=w)}
    assert sorted(holder) == [1, 2, 3, 4] and set(holder.values()) == {W1, W2}
    assert st_.waiting() == 1  # y, for its inputs
    out = st_.handle([s.FromWorker(w, p.TaskDone(i, 8, 0.1, None)) for i, w in holder.items()])
    (execute,) = sends(out, p.Execute)
    assert execute.key == "y" and st_.waiting() == 0
    y_on = next(w for w in (W1, W2) if sends(out, p.Execute, worker=w))
    lost = W2 if y_on == W1 else W1
    st_.handle([s.WorkerLost(lost, "killed"), joined(b"w3", 2)])


def test_readers_of_results_recomputed_after_a_loss_count_as_waiting():
    st_ = s.SchedulerState(sibling_inputs=0)  # inputs spread over both workers
    reduction_after_a_loss(st_)
    # The lost inputs are computed again; y waits for them, though four tasks reported
    # done (its run's remainder, tasks less reports, says nothing waits).
    assert st_.tasks[5].state == "waiting" and st_.recomputed == 2
    assert st_.waiting() == 1
    assert sum(c.tasks for c in st_.runs[1].categories.values()) == 4


def test_small_inputs_travel_inside_execute_large_ones_from_peers():
    st_ = s.SchedulerState(sibling_inputs=0)  # inputs spread over both workers
    tasks = [
        s.NewTask("small", b"", (), (), 0, "small", 1),
        s.NewTask("large", b"", (), (), 1, "large", 1),
        s.NewTask("y", b"", (), ("small", "large"), 2, "y", 0),
    ]
    out = st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["y"], 3)])
    holder = {m.key: w for w in (W1, W2) for m in sends(out, p.Execute, worker=w)}
    assert holder["small"] != holder["large"]
    small, large = dumps(7), 50 * 2**20
    out = st_.handle(
        [
            s.FromWorker(holder["small"], p.TaskDone(1, 30, 0.1, small)),
            s.FromWorker(holder["large"], p.TaskDone(2, large, 0.1, None)),
        ]
    )
    # y goes where the 50 MB input is; the small one comes inside the Execute.
    (execute,) = sends(out, p.Execute, worker=holder["large"])
    assert execute.key == "y"
    by_key = {d.key: d for d in execute.deps}
    assert by_key["small"].value is small and by_key["large"] == p.DepLocation(2, "large", ())
    out = st_.handle([s.FromWorker(holder["large"], p.TaskDone(3, 8, 0.1, dumps(0)))])
    # The inline copy was never held by y's worker: nothing to release there for it.
    assert sorted(sends(out, p.Release, worker=holder["large"])) == [p.Release((2,))]
    assert sends(out, p.Release, worker=holder["small"]) == [p.Release((1,))]
    assert not st_.tasks


def test_lost_worker_with_running_tasks_requeues_them():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), s.SubmitRun(1, [s.NewTask("a", b"", (), (), 0)], ["a"], 3)])
    st_.handle([s.FromWorker(W1, p.Started((1,)))])  # running there: the loss costs a retry
    out = st_.handle([s.WorkerLost(W1, "killed"), joined(W2)])
    assert out == [s.Send(W2, p.Execute(1, "a", b"", (), True))]
    assert st_.tasks[1].attempts == 1


def test_fetch_failure_forgets_the_copy_and_recomputes_it():
    st_ = s.SchedulerState(sibling_inputs=0)  # inputs spread over both workers
    tasks = [
        s.NewTask("x", b"", (), (), 0),
        s.NewTask("z", b"", (), (), 1),
        s.NewTask("y", b"", (), ("x", "z"), 2),
    ]
    out = st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["y"], 3)])
    assert sends(out, p.Execute, worker=W1) == [p.Execute(1, "x", b"", (), False)]
    assert sends(out, p.Execute, worker=W2) == [p.Execute(2, "z", b"", (), False)]
    # y goes to w2, which holds most of its input bytes, and is to fetch x from w1...
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 10, 0.1, None)),
            s.FromWorker(W2, p.TaskDone(2, 1000, 0.1, None)),
        ]
    )
    (execute,) = sends(out, p.Execute, worker=W2)
    assert execute.deps[0] == p.DepLocation(1, "x", ("tcp://w1",))
    # ...which cannot serve it: w1's copy is forgotten, x runs again, y waits for it.
    out = st_.handle([s.FromWorker(W2, p.FetchFailed(3, 1, ("tcp://w1",)))])
    assert out == [
        s.Send(W1, p.Release((1,))),
        s.Send(W2, p.Cancel((3,))),
        s.Send(W1, p.Execute(1, "x", b"", (), False)),
    ]
    assert st_.tasks[1].state == "processing" and st_.tasks[3].state == "waiting"


def test_cancel_run_releases_everything():
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=4), chain_run()])
    st_.handle([s.FromWorker(W1, p.TaskDone(1, 5, 0.1, None))])
    out = st_.handle([s.CancelRun(1)])
    assert sends(out, p.Cancel) == [p.Cancel((2, 3))]  # c was sent ahead behind b
    assert sends(out, p.Release) == [p.Release((1,))]
    assert not st_.tasks and not st_.runs


def test_stale_reports_are_harmless():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), chain_run()])
    st_.handle([s.CancelRun(1)])  # "a" may be running on w1 all the same: it reports
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 5, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(99, 5, 0.1, None)),  # never sent: dropped
            s.FromWorker(b"nobody", p.TaskDone(1, 5, 0.1, None)),
        ]
    )
    assert out == [s.Send(W1, p.Release((1,)))]


def test_invalid_transition_names_the_key_and_its_story():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), chain_run()])
    with pytest.raises(InvalidTransition, match="'a'") as info:
        st_._transition(st_.tasks[1], "released")
    assert "ready -> processing" in str(info.value)


def test_concurrent_runs_with_the_same_keys_stay_apart():
    st_ = s.SchedulerState()
    out = st_.handle([joined(W1, cores=4), chain_run(1), chain_run(2)])
    assert sorted(m.key for m in sends(out, p.Execute)) == ["a", "a", "b", "b", "c", "c"]
    assert len(st_.tasks) == 6


# -- a whole cluster simulated: random graphs, random completions, random losses ----------


class SimulatedCluster:
    """Carries out the state's instructions the way real workers would, in random order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = s.SchedulerState()
        self.stores: dict[bytes, dict[int, object]] = {}
        self.queued: dict[bytes, list[p.Execute]] = {}
        self.outputs: dict[int, dict] = {}
        self.done: dict[int, str] = {}
        self.functions: dict[int, object] = {}
        self.executions = 0
        #: answers the workers owe the state, delivered at the next step
        self.pending: list = []
        #: (run id, key) -> times executed: without losses, each task runs exactly once
        self.runs_of: dict = {}

    def apply(self, events):
        instructions = self.state.handle(events)
        waiting = sum(1 for task in self.state.tasks.values() if task.state == "waiting")
        assert self.state.waiting() == waiting  # kept by the transitions, never walked
        for instruction in instructions:
            kind = type(instruction)
            if kind is s.Send:
                self.deliver(instruction.worker, instruction.message)
            elif kind is s.RunOutput:
                self.outputs.setdefault(instruction.run_id, {})[instruction.key] = loads(
                    instruction.value
                )
            elif kind is s.RunDone:
                self.done[instruction.run_id] = "done"
            elif kind is s.RunFailed:
                self.done[instruction.run_id] = "failed: " + instruction.message

    def deliver(self, worker, message):
        if worker not in self.stores:
            return  # sent to a worker that was just lost
        if type(message) is p.Execute:
            self.queued[worker].append(message)
        elif type(message) is p.Release:
            for task_id in message.task_ids:
                self.stores[worker].pop(task_id, None)
        elif type(message) is p.Cancel:
            ids = set(message.task_ids)
            self.queued[worker] = [m for m in self.queued[worker] if m.task_id not in ids]
        elif type(message) is p.Withdraw:  # unstarted ones come back, answered later
            ids = set(message.task_ids)
            dropped = tuple(m.task_id for m in self.queued[worker] if m.task_id in ids)
            self.queued[worker] = [m for m in self.queued[worker] if m.task_id not in ids]
            if dropped:
                self.pending.append(s.FromWorker(worker, p.Withdrawn(dropped)))

    def join(self, name: bytes):
        self.stores[name] = {}
        self.queued[name] = []
        self.apply([s.WorkerJoined(name, name.decode(), 2, name.decode())])

    def lose(self, name: bytes):
        del self.stores[name]
        del self.queued[name]
        self.apply([s.WorkerLost(name, "simulated")])

    def startable(self, worker, msg):
        store = self.stores[worker]
        return all(
            dep.value is not None or dep.peers is not None or dep.task_id in store
            for dep in msg.deps
        )

    def replace_a_worker(self, names) -> None:
        """Lose a worker chosen at random; a fresh one (the next of ``names``) joins."""
        self.lose(self.rng.choice(sorted(self.stores)))
        self.join(next(names))

    def run_until(self, finished, losses: int, names) -> int:
        """Step until ``finished()``, replacing a worker now and then, at most ``losses``
        times: how many were replaced."""
        replaced = 0
        for _ in range(10_000):
            if finished():
                break
            if replaced < losses and self.rng.random() < 0.05:
                replaced += 1
                self.replace_a_worker(names)
                continue
            self.step()
        return replaced

    def step(self):
        if self.pending:
            pending, self.pending = self.pending, []
            self.apply(pending)
            return
        choices = [
            (w, i) for w, q in self.queued.items() for i, m in enumerate(q) if self.startable(w, m)
        ]
        assert choices, f"deadlock: nothing can start: {self.queued}"
        worker, index = self.rng.choice(choices)
        msg = self.queued[worker].pop(index)
        store = self.stores[worker]
        inputs = {}
        events = []
        fetched = []
        for dep in msg.deps:
            if dep.value is not None:  # a small input sent inside the Execute
                inputs[dep.key] = loads(dep.value)
                continue
            if dep.task_id in store:
                inputs[dep.key] = store[dep.task_id]
                continue
            holders = [w for w in self.stores if w.decode() in (dep.peers or ())]
            source = next((w for w in holders if dep.task_id in self.stores[w]), None)
            if source is None:  # as a real worker does, naming itself if it was the holder
                peers = dep.peers or (worker.decode(),)
                self.apply([s.FromWorker(worker, p.FetchFailed(msg.task_id, dep.task_id, peers))])
                return
            store[dep.task_id] = inputs[dep.key] = self.stores[source][dep.task_id]
            fetched.append(dep.task_id)
        if fetched:
            events.append(s.FromWorker(worker, p.Replicas(tuple(fetched))))
        self.executions += 1
        self.runs_of[msg.task_id] = self.runs_of.get(msg.task_id, 0) + 1
        value = (msg.key, tuple(sorted(inputs.items(), key=repr)))
        ser = dumps(value)
        # keep None (an output the cache keeps): kept only if too large to travel inline
        if msg.keep or (msg.keep is None and not p.inlinable(ser)):
            store[msg.task_id] = value
        # Small results go back inline (as real workers do) half the time here, so both
        # inline inputs and fetches from peers are exercised.
        if not msg.want_result and not (p.inlinable(ser) and self.rng.random() < 0.5):
            ser = None
        events.append(s.FromWorker(worker, p.TaskDone(msg.task_id, 8, 0.001, ser)))
        self.apply(events)


def expected_value(key, deps):
    return (key, tuple(sorted(((d, expected_value(d, deps)) for d in deps[key]), key=repr)))


@st.composite
def random_graphs(draw):
    n = draw(st.integers(1, 25))
    deps = {}
    for i in range(n):
        k = f"t{i}"
        deps[k] = tuple(
            draw(st.sets(st.sampled_from([f"t{j}" for j in range(i)]), max_size=3)) if i else ()
        )
    outputs = draw(st.lists(st.sampled_from(sorted(deps)), min_size=1, max_size=4, unique=True))
    return deps, outputs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=3),
    seed=st.integers(0, 10**6),
    losses=st.integers(0, 3),
)
def test_random_graphs_with_random_losses_compute_the_right_outputs(graphs, seed, losses):
    cluster = SimulatedCluster(seed)
    cluster.join(b"w0")
    cluster.join(b"w1")
    runs = {}
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 100)])
        runs[run_id] = (deps, outputs)
    names = iter(f"w{i}".encode() for i in range(2, 100))

    def idle():
        return not any(cluster.queued.values()) and not cluster.pending

    lost = cluster.run_until(idle, losses, names) > 0
    for run_id, (deps, outputs) in runs.items():
        assert cluster.done.get(run_id) == "done", cluster.done
        assert cluster.outputs.get(run_id, {}) == {k: expected_value(k, deps) for k in outputs}
    if not lost:  # taking work back for idle workers never runs a task twice
        assert max(cluster.runs_of.values(), default=1) == 1, cluster.runs_of
    # Nothing left behind: no task records, no data on any worker.
    assert not cluster.state.tasks and not cluster.state.runs
    assert all(not store for store in cluster.stores.values()), cluster.stores
    assert all(not w.has_what and not w.processing for w in cluster.state.workers.values())


def test_serialized_values_pass_through_the_state_untouched():
    """An output's value reaches the caller as the worker sent it: the state neither copies
    nor unpickles it (small inputs riding inside an Execute: the test above)."""
    st_ = s.SchedulerState()
    st_.handle([joined(W1), s.SubmitRun(1, [s.NewTask("x", b"", (), (), 0)], ["x"], 3)])
    value = dumps(list(range(10)))
    assert isinstance(value, Serialized)
    out = st_.handle([s.FromWorker(W1, p.TaskDone(1, 80, 0.1, value))])
    done = s.RunDone(1, run_seconds=0.1, serialization_seconds=0.0)
    assert out[:2] == [s.RunOutput(1, "x", value), s.Send(W1, p.Release((1,)))]
    assert out[2][:4] == done[:4] and out[2].categories[""].tasks == 1
    assert out[0].value is value and loads(out[0].value) == list(range(10))


def test_functions_travel_once_per_worker():
    st_ = s.SchedulerState()
    tasks = [s.NewTask(k, b"", (b"f1",), (), i) for i, k in enumerate("abc")]
    submit = s.SubmitRun(1, tasks, list("abc"), 3, {b"f1": b"code"})
    out = st_.handle([joined(W1, cores=4), submit])
    assert sends(out)[0] == p.Function(b"f1", b"code")
    assert [type(m) for m in sends(out)] == [p.Function, p.Execute, p.Execute, p.Execute]
    # A later run with the same function sends none.
    again = s.SubmitRun(2, [s.NewTask("d", b"", (b"f1",), (), 0)], ["d"], 3, {b"f1": b"code"})
    assert [type(m) for m in sends(st_.handle([again]))] == [p.Execute]


def test_a_run_in_parts_keeps_inputs_for_dependents_still_to_come():
    st_ = s.SchedulerState()
    first = [s.NewTask("x", b"", (), (), 0, "x", 2), s.NewTask("y", b"", (), ("x",), 1, "y", 0)]
    st_.handle([joined(W1, cores=4), s.SubmitRun(1, first, ["y", "z"], 3)])
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 8, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(2, 8, 0.1, dumps("y"))),
        ]
    )
    # y is delivered but the run is not done (z is owed), and x is kept for z. y is an
    # output nothing reads: its worker kept no copy, so there is nothing to release.
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput]
    assert st_.tasks[1].state == "memory" and sends(out, p.Release) == []
    out = st_.handle([s.ExtendRun(1, [s.NewTask("z", b"", (), ("x",), 2, "z", 0)])])
    assert sends(out, p.Execute) == [
        p.Execute(3, "z", b"", (p.DepLocation(1, "x", ()),), True, 0, False)
    ]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(3, 8, 0.1, dumps("z")))])
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]
    assert sends(out, p.Release) == [p.Release((1,))]
    assert not st_.tasks


def test_only_outputs_that_tasks_read_are_kept_on_workers():
    st_ = s.SchedulerState()
    tasks = [s.NewTask("a", b"", (), (), 0, "a", 1), s.NewTask("b", b"", (), ("a",), 1, "b", 0)]
    out = st_.handle([joined(W1, cores=1), s.SubmitRun(1, tasks, ["a", "b"], 0)])
    assert [(m.key, m.keep) for m in sends(out, p.Execute)] == [("a", True), ("b", False)]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(1, 8, 0.1, dumps(1)))])
    assert sends(out, p.Release) == []  # b still reads a
    out = st_.handle([s.FromWorker(W1, p.TaskDone(2, 8, 0.1, dumps(2)))])
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]
    assert sends(out, p.Release) == [p.Release((1,))]  # a, which b read; never b
    assert not st_.tasks


def test_a_full_worker_gets_no_new_work_but_keeps_serving():
    st_ = s.SchedulerState(chain_ahead=0, fixed_extra_tasks_per_core=0)
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abcd")]
    tasks.append(s.NewTask("e", b"", (), ("a",), 9))
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, list("bcde"), 3)])
    (first,) = st_.workers[W1].processing
    assert first.key == "a"
    # w1 says its store is full: what it holds runs on, nothing new goes there.
    out = st_.handle(
        [s.FromWorker(W1, p.DiskFull(True)), s.FromWorker(W1, p.TaskDone(first.id, 5, 0.1, None))]
    )
    assert not sends(out, p.Execute, worker=W1)
    executed = []
    while st_.workers[W2].processing:
        (task,) = st_.workers[W2].processing
        executed.append(task.key)
        out = st_.handle([s.FromWorker(W2, p.TaskDone(task.id, 5, 0.1, dumps(0)))])
        assert not sends(out, p.Execute, worker=W1)
        # An input held by the full worker is fetched from it: it still serves peers.
        for execute in sends(out, p.Execute, worker=W2):
            if execute.key == "e":
                assert execute.deps == (p.DepLocation(first.id, "a", ("tcp://w1",)),)
    assert sorted(executed) == list("bcde") and not st_.runs
    # Room again: work goes to w1 as before.
    st_.handle([s.FromWorker(W1, p.DiskFull(False))])
    out = st_.handle(
        [
            s.SubmitRun(
                2, [s.NewTask("x", b"", (), (), 0), s.NewTask("y", b"", (), (), 1)], ["x", "y"], 3
            )
        ]
    )
    assert sends(out, p.Execute, worker=W1)


def test_replicas_are_requested_and_a_lost_holder_costs_no_recomputation():
    st_ = s.SchedulerState()
    tasks = [
        s.NewTask("x", b"", (), (), 0),
        s.NewTask("y", b"", (), (), 1),
        s.NewTask("z", b"", (), ("x", "y"), 2),
    ]
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["z"], 3, replicas=2)])
    x = st_.tasks[1]
    holder, other = x.worker.id, (W2 if x.worker.id == W1 else W1)
    out = st_.handle([s.FromWorker(holder, p.TaskDone(1, 5, 0.1, None))])
    assert sends(out, p.Replicate) == [p.Replicate(1, (f"tcp://{holder.decode()}",))]
    assert sends(out, p.Replicate, worker=other)
    st_.handle([s.FromWorker(other, p.Replicas((1,)))])
    assert x.who_has == {st_.workers[W1], st_.workers[W2]}
    st_.handle([s.WorkerLost(holder, "preempted")])
    assert x.state == "memory" and st_.recomputed == 0


def test_outputs_that_tasks_read_are_replicated_and_unread_ones_are_not():
    st_ = s.SchedulerState()
    tasks = [
        s.NewTask("x", b"", (), (), 0),
        s.NewTask("y", b"", (), (), 1),
        s.NewTask("z", b"", (), ("x",), 2),
    ]
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, ["x", "y", "z"], 3, replicas=2)])
    x, y = st_.tasks[1], st_.tasks[2]
    out = st_.handle([s.FromWorker(x.worker.id, p.TaskDone(1, 5, 0.1, dumps(1)))])
    assert [m.task_id for m in sends(out, p.Replicate)] == [1]  # z reads x: x is copied
    out = st_.handle([s.FromWorker(y.worker.id, p.TaskDone(2, 5, 0.1, dumps(2)))])
    assert sends(out, p.Replicate) == []  # nothing reads y: its value went to the caller
    assert y.state == "released" and not y.who_has


def test_recomputed_counts_each_lost_result_brought_back():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), chain_run()])
    st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 5, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(2, 5, 0.1, None)),
        ]
    )
    assert st_.tasks[1].state == "released" and st_.tasks[2].state == "memory"
    st_.handle([s.WorkerLost(W1, "killed"), joined(W2)])
    # b was lost and c needs it: b comes back, and a with it (b's input, released).
    assert st_.recomputed == 2


def test_when_every_worker_is_full_work_goes_on_rather_than_waiting_forever():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), s.FromWorker(W1, p.DiskFull(True))])
    out = st_.handle([s.SubmitRun(1, [s.NewTask("a", b"", (), (), 0)], ["a"], 3)])
    assert sends(out, p.Execute) == [p.Execute(1, "a", b"", (), True)]


def test_work_is_taken_back_only_once_its_worker_gave_it_up_unstarted():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abc")]
    out = st_.handle([joined(W1, cores=1), s.SubmitRun(1, tasks, list("abc"), 3)])
    assert [m.task_id for m in sends(out, p.Execute, worker=W1)] == [1, 2, 3]
    out = st_.handle([joined(W2, cores=1)])  # idle, and nothing queued: ask W1 for one back
    assert sends(out) == [p.Withdraw((3,))] and st_.tasks[3].worker.id == W1
    out = st_.handle([joined(W2, cores=1)])  # asking again would take too much
    assert not sends(out)
    out = st_.handle([s.FromWorker(W1, p.Withdrawn((3,)))])
    assert sends(out, p.Execute, worker=W2) == [p.Execute(3, "c", b"", (), True)]
    # Had W1 started it, its result would simply count: nothing runs twice.
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    st_.handle([joined(W1, cores=1), s.SubmitRun(1, tasks, list("abc"), 3)])
    st_.handle([joined(W2, cores=1)])
    value = dumps(3)
    out = st_.handle([s.FromWorker(W1, p.TaskDone(3, 8, 0.1, value))])
    assert not sends(out, p.Execute) and any(type(i) is s.RunOutput for i in out)
    assert sends(out, p.Withdraw) == [p.Withdraw((2,))]  # W2 is still idle: ask for the next


def test_the_pace_follows_the_shortest_recent_task_and_stops_with_the_runs():
    """The loop lets reports gather for 1% of the shortest recent task's time, at most
    5 ms; one shorter task brings it down at once, longer ones raise it slowly; tasks
    under 50 ms, and no runs, mean none."""
    st_ = s.SchedulerState()
    tasks = [s.NewTask(f"t{i}", b"p", (), (), i) for i in range(6)]
    st_.handle([joined(W1, cores=6), s.SubmitRun(1, tasks, [f"t{i}" for i in range(6)], 0)])
    assert st_.pace == 0.0  # nothing finished yet

    def done(task_id: int, seconds: float) -> float:
        st_.handle([s.FromWorker(W1, p.TaskDone(task_id, 8, seconds, dumps(task_id)))])
        return st_.pace

    assert done(1, 2.0) == s.PACE_MAX
    assert done(2, 0.1) == pytest.approx(0.001)
    assert done(3, 0.01) == 0.0  # under PACE_MIN: a sleep would cost more
    assert done(4, 2.0) == pytest.approx(s.PACE_FRACTION * (0.01 + s.PACE_RISE * 1.99))
    st_.handle([s.FromWorker(W1, p.Started((5,)))])  # no task finished: as it was
    assert st_.pace == pytest.approx(0.00209)
    done(5, 2.0)
    assert st_.pace > 0.00209
    done(6, 2.0)
    assert not st_.runs and st_.pace == 0.0
