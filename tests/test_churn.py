"""Churn: a lost worker costs a retry only to tasks running there, and results worth it get
a second copy while workers keep being lost.

The state driven with literal events first (no sockets, no processes); then real workers
killed with SIGKILL, again and again, the one holding the most results each time.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import dask
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beacon import Beacon, ping
from daskvine_py import Manager, TaskFailed
from daskvine_py.scheduler import churn
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from test_state import SimulatedCluster, expected_value, random_graphs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from churn import holder_of_most  # noqa: E402  (benchmarks/churn.py, not the scheduler's)

W1, W2, W3 = b"w1", b"w2", b"w3"


def joined(worker: bytes, cores: int = 1, memory: int = 0) -> s.WorkerJoined:
    name = worker.decode()
    return s.WorkerJoined(worker, name, cores, f"tcp://{name}", memory)


def one_task(retries: int) -> s.SubmitRun:
    return s.SubmitRun(1, [s.NewTask("a", b"", (), (), 0)], ["a"], retries)


def failures(out) -> list[s.RunFailed]:
    return [i for i in out if type(i) is s.RunFailed]


def sends(out, kind, worker=None):
    return [
        i.message
        for i in out
        if type(i) is s.Send and type(i.message) is kind and (worker is None or i.worker == worker)
    ]


def task(st_: s.SchedulerState, key: str) -> s.TaskRecord:
    return next(t for t in st_.tasks.values() if t.key == key)


def finish(st_: s.SchedulerState, key: str, nbytes: int = 100, now: float = 0.0) -> list:
    """``key``'s worker reports it done (with a value, in case it is an output)."""
    t = task(st_, key)
    assert t.state == "processing", t
    return st_.handle([s.FromWorker(t.worker.id, p.TaskDone(t.id, nbytes, 0.01, dumps(0)))], now)


# -- retries: only a task running on a lost worker pays ------------------------------------


def test_a_task_queued_on_a_lost_worker_keeps_its_retries():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), one_task(retries=0)])
    out = st_.handle([s.WorkerLost(W1, "its process exited with code -9"), joined(W2)])
    assert not failures(out)
    assert sends(out, p.Execute, W2) == [p.Execute(1, "a", b"", (), True)]
    assert st_.tasks[1].attempts == 0


def test_a_task_running_on_a_lost_worker_uses_a_retry():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), one_task(retries=1)])
    st_.handle([s.FromWorker(W1, p.Started((1,)))])
    out = st_.handle([s.WorkerLost(W1, "its process exited with code -9"), joined(W2)])
    assert not failures(out) and st_.tasks[1].attempts == 1
    assert sends(out, p.Execute, W2) == [p.Execute(1, "a", b"", (), True)]
    # Queued on w2 and lost with it: no retry used; running there: the second, too many.
    out = st_.handle([s.WorkerLost(W2, "silent for 3.0 s"), joined(W3)])
    assert not failures(out) and st_.tasks[1].attempts == 1
    st_.handle([s.FromWorker(W3, p.Started((1,)))])
    (failed,) = failures(st_.handle([s.WorkerLost(W3, "its process exited with code -9")]))
    assert failed.key == "a" and failed.crashed
    assert failed.message == (
        "its worker was lost while running it 2 times; last: its process exited with code -9"
    )


@pytest.mark.parametrize("reason", ["it left: SIGTERM", "ejected: it ignored Withdraw"])
def test_a_worker_that_left_or_was_ejected_costs_no_retry(reason):
    st_ = s.SchedulerState()
    st_.handle([joined(W1), one_task(retries=0)])
    st_.handle([s.FromWorker(W1, p.Started((1,)))])
    out = st_.handle([s.WorkerLost(W1, reason), joined(W2)])
    assert not failures(out) and st_.tasks[1].attempts == 0
    assert sends(out, p.Execute, W2) == [p.Execute(1, "a", b"", (), True)]


def test_results_held_and_tasks_sent_ahead_on_a_lost_worker_cost_no_retry():
    st_ = s.SchedulerState()
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), ("a",), 1),
        s.NewTask("c", b"", (), ("b",), 2),
    ]
    st_.handle([joined(W1), s.SubmitRun(1, tasks, ["c"], 0)])
    finish(st_, "a")  # a held on w1; b running there, c sent ahead behind it
    b, c = task(st_, "b"), task(st_, "c")
    assert c.state == "processing" and c.missing == 1
    out = st_.handle([s.WorkerLost(W1, "its process exited with code -9"), joined(W2)])
    assert not failures(out)
    assert (b.attempts, c.attempts) == (0, 0) and st_.recomputed == 1  # a, from nothing
    assert [m.key for m in sends(out, p.Execute, W2)] == ["a", "b", "c"]


def test_started_is_stamped_once_and_only_where_the_task_is():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), joined(W2), one_task(retries=3)])
    a = st_.tasks[1]
    here, elsewhere = a.worker.id, (W2 if a.worker.id == W1 else W1)
    st_.handle([s.FromWorker(elsewhere, p.Started((1, 99)))], now=1.0)  # not sent there
    assert a.started_at is None
    st_.handle([s.FromWorker(here, p.Started((1,)))], now=2.0)
    st_.handle([s.FromWorker(here, p.Started((1,)))], now=3.0)  # (said twice: the first)
    assert a.started_at == 2.0
    # A crash sends it back to the queue: it has not started on its next worker yet.
    st_.handle([s.FromWorker(here, p.TaskCrashed(1, "library exited"))], now=4.0)
    assert a.state == "processing" and a.started_at is None and a.attempts == 1


# -- temporary replicas under churn ---------------------------------------------------------


def tree(leaves: int = 8, trees: int = 1) -> s.SubmitRun:
    """``trees`` partial sums of ``leaves`` leaves each, and a total reading them all."""
    tasks = []
    for t in range(trees):
        tasks += [s.NewTask(f"l{t}-{i}", b"", (), (), len(tasks)) for i in range(leaves)]
        tasks.append(
            s.NewTask(f"n{t}", b"", (), tuple(f"l{t}-{i}" for i in range(leaves)), len(tasks))
        )
    tasks.append(s.NewTask("total", b"", (), tuple(f"n{t}" for t in range(trees)), len(tasks)))
    return s.SubmitRun(1, tasks, ["total"], 3)


def run_leaves(st_: s.SchedulerState, leaves: int = 8, trees: int = 1, now: float = 0.0):
    """Finish every leaf and partial sum; the instructions of the last, per partial sum."""
    outs = {}
    for t in range(trees):
        for i in range(leaves):
            finish(st_, f"l{t}-{i}", now=now)
        outs[f"n{t}"] = finish(st_, f"n{t}", now=now)
    return outs


def test_no_replica_without_losses():
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=9), joined(W2), tree()])
    assert not sends(run_leaves(st_)["n0"], p.Replicate) and st_.churn.replicas == 0


def test_under_churn_a_result_with_a_long_lineage_gets_a_second_copy():
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=9), joined(W2), joined(W3), tree()])
    st_.handle([s.WorkerLost(W3, "its process exited with code -9")], now=1.0)
    out = run_leaves(st_, now=2.0)["n0"]
    n0 = task(st_, "n0")
    (holder,) = n0.who_has
    (replicate,) = sends(out, p.Replicate)  # n0 only: a leaf's loss redoes one task
    assert replicate == p.Replicate(n0.id, (holder.peer_address,))
    (target,) = [i.worker for i in out if type(i) is s.Send and i.message is replicate]
    assert target != holder.id and st_.churn.replicas == 1
    # The copy arrives; then n0's holder is lost too: nothing is recomputed, and the copy
    # left alone gets a second one (one more loss: churn goes on).
    st_.handle([s.FromWorker(target, p.Replicas((n0.id,)))], now=3.0)
    assert len(n0.who_has) == 2
    st_.handle([joined(W3)], now=3.0)
    out = st_.handle([s.WorkerLost(holder.id, "its process exited with code -9")], now=4.0)
    assert st_.recomputed == 0 and n0.state == "memory"
    assert [m.task_id for m in sends(out, p.Replicate)] == [n0.id]


def test_a_loss_copies_results_already_made_that_are_worth_it():
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=9), joined(W2), joined(W3), tree()])
    assert not sends(run_leaves(st_)["n0"], p.Replicate)
    n0 = task(st_, "n0")
    (holder,) = n0.who_has
    other = next(w for w in (W1, W2, W3) if w != holder.id and not st_.workers[w].has_what)
    out = st_.handle([s.WorkerLost(other, "its process exited with code -9")], now=1.0)
    assert [m.task_id for m in sends(out, p.Replicate)] == [n0.id]


def test_under_churn_a_result_many_tasks_read_gets_a_second_copy():
    st_ = s.SchedulerState()
    readers = churn.MANY_READERS
    tasks = [s.NewTask("x", b"", (), (), 0), s.NewTask("y", b"", (), (), 1)]
    tasks += [s.NewTask(f"rx{i}", b"", (), ("x",), 2) for i in range(readers)]
    tasks += [s.NewTask(f"ry{i}", b"", (), ("y",), 3) for i in range(readers - 1)]
    keys = [t.key for t in tasks if t.key.startswith("r")]
    # One core, nothing sent ahead: the readers wait while x and y are made.
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, chain_ahead=0)
    st_.handle([joined(W1), joined(W2), joined(W3), s.SubmitRun(1, tasks, keys, 3)])
    st_.handle([s.WorkerLost(W3, "its process exited with code -9")])
    replicated = []
    for key in ("x", "y"):
        replicated += [m.task_id for m in sends(finish(st_, key), p.Replicate)]
    assert replicated == [task(st_, "x").id]


def test_replicas_stop_when_losses_stop():
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=9), joined(W2), joined(W3), tree(trees=2)])
    st_.handle([s.WorkerLost(W3, "its process exited with code -9")], now=0.0)
    calm = 2 * churn.LOSS_HALF_LIFE  # one loss, two half-lives ago: a quarter of a loss
    outs = run_leaves(st_, trees=2, now=calm)
    assert not sends(outs["n0"], p.Replicate) and not sends(outs["n1"], p.Replicate)
    assert st_.churn.level == 0.0 and st_.churn.replicas == 0


def test_temporary_replicas_are_bounded_in_count(monkeypatch):
    monkeypatch.setattr(churn, "REPLICAS_PER_WORKER", 1)  # two workers left: two copies
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=30), joined(W2), joined(W3), tree(leaves=4, trees=5)])
    st_.handle([s.WorkerLost(W3, "its process exited with code -9")])
    outs = run_leaves(st_, leaves=4, trees=5)
    assert sum(len(sends(out, p.Replicate)) for out in outs.values()) == 2
    assert st_.churn.replicas == 2


def test_temporary_replicas_are_bounded_in_bytes():
    # 5% of the 4,000 bytes two workers offer: 200 bytes, room for two 100-byte copies.
    st_ = s.SchedulerState()
    workers = [joined(W1, cores=30, memory=2000), joined(W2, memory=2000), joined(W3)]
    st_.handle([*workers, tree(leaves=4, trees=5)])
    st_.handle([s.WorkerLost(W3, "its process exited with code -9")])
    outs = run_leaves(st_, leaves=4, trees=5)
    assert sum(len(sends(out, p.Replicate)) for out in outs.values()) == 2
    # Once the partial sums are read and released, their copies no longer count.
    out = finish(st_, "total")
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]
    st_.handle([s.WorkerLost(W2, "its process exited with code -9")])
    assert st_.churn.extra == {} and st_.churn.extra_bytes == 0


class ReplicatingCluster(SimulatedCluster):
    """``test_state``'s simulated cluster whose workers also carry out ``Replicate``."""

    def deliver(self, worker, message):
        if type(message) is not p.Replicate or worker not in self.stores:
            return super().deliver(worker, message)
        source = next((w for w in self.stores if w.decode() in message.peers), None)
        if source is not None and message.task_id in self.stores[source]:
            self.stores[worker][message.task_id] = self.stores[source][message.task_id]
            self.pending.append(s.FromWorker(worker, p.Replicas((message.task_id,))))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=3),
    seed=st.integers(0, 10**6),
    losses=st.integers(1, 4),
)
def test_random_graphs_under_churn_compute_right_and_leave_no_copy_behind(graphs, seed, losses):
    cluster = ReplicatingCluster(seed)
    for name in (b"w0", b"w1", b"w2"):
        cluster.join(name)
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 100)])
    cluster.replace_a_worker(iter([b"x0"]))  # churn from the start: copies are made
    names = iter(f"w{i}".encode() for i in range(3, 100))

    def idle():
        return not any(cluster.queued.values()) and not cluster.pending

    cluster.run_until(idle, losses - 1, names)
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        assert cluster.done.get(run_id) == "done", cluster.done
        assert cluster.outputs.get(run_id, {}) == {k: expected_value(k, deps) for k in outputs}
    assert not cluster.state.tasks and not cluster.state.runs
    assert all(not store for store in cluster.stores.values()), cluster.stores


# -- real workers, killed again and again ----------------------------------------------------


def step(x, seconds, address):
    """One task of the graph: a little work, then a ping saying one more is done."""
    time.sleep(seconds)
    if address is not None:
        ping(address)
    return x + 1


def kill_my_worker(x):
    """Kill the worker this library runs under (its parent), as a task may by exhausting
    the node's memory; after a moment, as such a task would (its worker has said by then
    that it started)."""
    time.sleep(0.2)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)


def add_all(parts, address):
    if address is not None:
        ping(address)
    return sum(parts)


def probe_shape(n: int, address, fan_in: int = 8, seconds: float = 0.01) -> tuple[dict, object]:
    """The churn probe's shape, small: two stages of maps (each second-stage task reads
    two first-stage results) and a tree of sums. ``seconds`` 0: the same graph for Dask's
    scheduler, without the naps."""
    dsk: dict = {("a", i): (step, i, seconds, address) for i in range(n)}
    dsk.update(
        {
            ("b", i): (step, (add_all, [("a", i), ("a", (i + 1) % n)], None), seconds, address)
            for i in range(n)
        }
    )
    level, keys = 0, [("b", i) for i in range(n)]
    while len(keys) > 1:
        level += 1
        groups = [keys[i : i + fan_in] for i in range(0, len(keys), fan_in)]
        for j, group in enumerate(groups):
            dsk[(f"sum{level}", j)] = (add_all, list(group), address)
        keys = [(f"sum{level}", j) for j in range(len(groups))]
    return dsk, keys[0]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_worker_holding_the_most_killed_six_times_with_default_retries():
    """More kills than the default retries (3): the run still ends right."""
    kills, every = 6, 40
    with Manager(heartbeat_interval=0.2, worker_timeout=3.0) as manager, Beacon() as beacon:
        manager.start_workers(3, cores=1)
        dsk, total = probe_shape(150, beacon.address)
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(v=manager.get(dsk, total)))
        thread.start()
        killed = []
        while len(killed) < kills and thread.is_alive():
            beacon.wait(every)  # tasks done since the last kill: progress, not time
            pid = holder_of_most(manager, empty_too=True)  # (benchmarks/churn.py)
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            manager.start_workers(1, cores=1, wait=False)  # its replacement
        deadline = time.monotonic() + 180
        while thread.is_alive() and time.monotonic() < deadline:
            beacon.drain()  # the rest of the pings, so that no task waits to connect
            thread.join(0.1)
        assert not thread.is_alive()
        assert len(killed) == kills, killed
        assert "v" in result, result
        assert result["v"] == dask.get(probe_shape(150, None, seconds=0)[0], total)
        assert manager._state.recomputed > 0


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_task_that_kills_every_worker_it_runs_on_uses_its_retries():
    """Its worker says it started there, so each loss counts: it fails after its retries."""
    with Manager(heartbeat_interval=0.2, worker_timeout=3.0) as manager:
        manager.start_workers(4, cores=1)  # one left when it fails
        with pytest.raises(TaskFailed, match=r"'poison'.*lost while running it 3 times"):
            manager.get({"poison": (kill_my_worker, 1)}, "poison", retries=2)
