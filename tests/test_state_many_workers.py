"""The scheduler state on more workers than a round always visits in full
(``dispatch.FULL_ROUND_WORKERS``): a round visits only workers that may have room, and no
task is left behind for it."""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py.scheduler import dispatch as d
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from test_state import SimulatedCluster, expected_value, random_graphs

WORKERS = d.FULL_ROUND_WORKERS + 16


def cluster_of(n: int, seed: int = 0) -> SimulatedCluster:
    cluster = SimulatedCluster(seed)
    for i in range(n):
        cluster.join(f"w{i}".encode())
    return cluster


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=3),
    seed=st.integers(0, 10**6),
    losses=st.integers(0, 3),
)
def test_random_graphs_on_many_workers_compute_the_right_outputs(graphs, seed, losses):
    cluster = cluster_of(WORKERS, seed)
    runs = {}
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 100)])
        runs[run_id] = (deps, outputs)
    names = iter(f"x{i}".encode() for i in range(100))

    def idle():
        return not any(cluster.queued.values()) and not cluster.pending

    cluster.run_until(idle, losses, names)
    for run_id, (deps, outputs) in runs.items():
        assert cluster.done.get(run_id) == "done", cluster.done
        assert cluster.outputs.get(run_id, {}) == {k: expected_value(k, deps) for k in outputs}
    assert not cluster.state.tasks and not cluster.state.runs


def wide_run(run_id: int, n: int) -> s.SubmitRun:
    tasks = [s.NewTask(f"t{run_id}-{i}", b"", (), (), i) for i in range(n)]
    return s.SubmitRun(run_id, tasks, [t.key for t in tasks], 3)


def executes(cluster: SimulatedCluster) -> int:
    return sum(len(q) for q in cluster.queued.values())


def saturated_and_watched() -> tuple[SimulatedCluster, list]:
    """Every worker saturated by a wide run, many tasks left here, and the list the
    round's saturation checks append each visited worker to."""
    cluster = cluster_of(WORKERS)
    calls: list = []
    extra = cluster.state.ctx.dispatch.extra
    cluster.state.ctx.dispatch.extra = lambda w, t: calls.append(w) or extra(w, t)
    cluster.apply([wide_run(1, 20 * WORKERS)])
    return cluster, calls


def test_a_round_visits_the_workers_that_reported_not_the_whole_cluster():
    cluster, calls = saturated_and_watched()
    state = cluster.state
    assert len(state.queue) > 0 and executes(cluster) >= 2 * WORKERS
    for _ in range(3):  # (past the round that follows the submission, which visits all)
        worker = next(w for w, q in cluster.queued.items() if q)
        message = cluster.queued[worker].pop(0)
        calls.clear()
        cluster.apply([s.FromWorker(worker, p.TaskDone(message.task_id, 8, 0.01, dumps(0)))])
        visited = {w.id for w in calls}
        assert worker in visited and len(visited) <= 2, visited


def test_a_cancelled_run_frees_every_worker_for_the_next_run():
    cluster = cluster_of(WORKERS)
    cluster.apply([wide_run(1, 20 * WORKERS)])
    cluster.apply([s.CancelRun(1)])
    for queue in cluster.queued.values():
        queue.clear()  # (the workers dropped them: Cancel)
    cluster.apply([wide_run(2, 2 * WORKERS)])
    # Every worker took some of the new run at once: none waits for a report of its own.
    assert all(queue for queue in cluster.queued.values())
    while executes(cluster) or cluster.pending:
        cluster.step()
    assert cluster.done.get(2) == "done"


@pytest.mark.parametrize("lose", [True, False])
def test_a_worker_lost_or_joined_between_rounds_is_never_sent_to_twice(lose):
    cluster = cluster_of(WORKERS)
    cluster.apply([wide_run(1, 20 * WORKERS)])
    if lose:
        cluster.lose(b"w3")
    else:
        cluster.join(b"late")
        assert cluster.queued[b"late"], "a worker that joins gets work in its first round"
    while executes(cluster) or cluster.pending:
        cluster.step()
    assert cluster.done.get(1) == "done"
    assert max(cluster.runs_of.values()) == 1 or lose


def test_the_tables_a_big_run_grew_are_given_back_when_no_run_is_left():
    cluster = cluster_of(4)
    state = cluster.state
    cluster.apply([wide_run(1, 5_000)])
    assert sys.getsizeof(state.tasks) > 100_000
    while executes(cluster) or cluster.pending:
        cluster.step()
    assert cluster.done.get(1) == "done"
    empty = sys.getsizeof({})
    assert sys.getsizeof(state.tasks) == empty
    assert sys.getsizeof(state.queue._ticket_of) == empty
    assert state.queue._items == []  # (its tickets restart from 0)
