"""The pool's sizing rules, with literal jobs and workers and a fake clock."""

from __future__ import annotations

import pytest

from daskvine_py.batch.planner import PoolJob, PoolPlanner, WorkerView, job_state


def jobs(*specs):
    """``("j1", "w1", submitted, state)`` tuples as the pool's job table."""
    return {job_id: PoolJob(job_id, worker, at, state) for job_id, worker, at, state in specs}


def test_wanted_workers_follow_the_cores_needed_within_bounds():
    planner = PoolPlanner(cores_per_worker=4, min_workers=1, max_workers=5)
    assert [planner.wanted(c) for c in (0, 1, 4, 5, 17, 1000)] == [1, 1, 1, 2, 5, 5]


def test_it_grows_to_the_work_counting_pending_jobs():
    planner = PoolPlanner(cores_per_worker=2, max_workers=4)
    table = jobs(("j1", "w1", 0.0, "pending"))
    plan = planner.plan(1.0, cores_needed=6, jobs=table, workers=[])
    assert plan.submit == 2 and not plan.cancel and not plan.retire  # 3 wanted, 1 pending
    table.update(jobs(("j2", "w2", 1.0, "pending"), ("j3", "w3", 1.0, "pending")))
    assert planner.plan(2.0, 6, table, []).submit == 0  # queued jobs count: no duplicates


def test_pending_jobs_no_longer_needed_are_cancelled_newest_first():
    planner = PoolPlanner(cores_per_worker=1, max_workers=4)
    table = jobs(
        ("j1", "w1", 0.0, "running"), ("j2", "w2", 1.0, "pending"), ("j3", "w3", 2.0, "pending")
    )
    plan = planner.plan(3.0, cores_needed=1, jobs=table, workers=[WorkerView("w1", 1, 0.0)])
    assert plan.cancel == ["j3", "j2"] and plan.submit == 0


def test_a_job_the_pool_cancelled_that_ends_unjoined_is_no_failure():
    planner = PoolPlanner(cores_per_worker=1, max_workers=2)
    table = jobs(("j1", "w1", 0.0, "running"), ("j2", "w2", 1.0, "running"))
    plan = planner.plan(2.0, cores_needed=1, jobs=table, workers=[WorkerView("w1", 1, 0.0)])
    assert plan.cancel == ["j2"]
    table["j2"].state = "done"  # gone from the queue after the cancel
    assert planner.plan(3.0, 1, table, [WorkerView("w1", 1, 0.0)]).failures == []
    # (one nobody cancelled that ends unjoined is still a failure: the test below)


def test_idle_workers_beyond_the_floor_are_retired_longest_idle_first():
    planner = PoolPlanner(cores_per_worker=1, min_workers=1, max_workers=4, idle_timeout=30)
    table = jobs(*((f"j{i}", f"w{i}", 0.0, "running") for i in range(3)))
    workers = [WorkerView("w0", 1, 40.0), WorkerView("w1", 1, 100.0), WorkerView("w2", 1, 10.0)]
    plan = planner.plan(200.0, cores_needed=0, jobs=table, workers=workers)
    assert plan.retire == ["w1", "w0"]  # w2 is not idle long enough; one stays (the floor)
    busy = planner.plan(200.0, cores_needed=3, jobs=table, workers=workers)
    assert busy.retire == []  # the work needs all three


def test_a_worker_that_left_no_longer_counts_and_is_replaced_if_needed():
    planner = PoolPlanner(cores_per_worker=1, max_workers=2)
    table = jobs(("j1", "w1", 0.0, "running"), ("j2", "w2", 0.0, "running"))
    planner.plan(1.0, 2, table, [WorkerView("w1", 1, 0.0), WorkerView("w2", 1, 0.0)])
    # w2 is gone (lost or retired) while the batch system still says its job runs.
    plan = planner.plan(2.0, 2, table, [WorkerView("w1", 1, 0.0)])
    assert table["j2"].left == 2.0 and plan.submit == 1


def test_failed_held_and_never_joined_jobs_are_reported_once_and_slow_submissions():
    planner = PoolPlanner(cores_per_worker=1, max_workers=3, retry_after=10, max_retry_after=40)
    table = jobs(("j1", "w1", 0.0, "failed"), ("j2", "w2", 0.0, "held"), ("j3", "w3", 0.0, "done"))
    table["j1"].message = "worker_init: module: command not found"
    plan = planner.plan(1.0, cores_needed=3, jobs=table, workers=[])
    assert [job.job_id for job in plan.failures] == ["j1", "j2", "j3"]
    assert plan.submit == 0 and plan.cancel == ["j2"]  # backing off; the held job goes
    again = planner.plan(5.0, 3, table, [])
    assert again.failures == [] and again.cancel == []  # reported and cancelled once
    assert planner.plan(11.5, 3, table, []).submit == 3
    table.update(jobs(("j4", "w4", 11.5, "failed"), ("j5", "w5", 11.5, "failed")))
    assert planner.plan(12.0, 3, table, []).submit == 0
    assert planner.plan(31.0, 3, table, []).submit == 0  # the wait doubled: 20 s
    assert planner.plan(32.5, 3, table, []).submit == 3


def test_a_worker_joining_resets_the_backoff():
    planner = PoolPlanner(cores_per_worker=1, max_workers=2, retry_after=10)
    table = jobs(("j1", "w1", 0.0, "failed"))
    planner.plan(1.0, 2, table, [])
    table.update(jobs(("j2", "w2", 12.0, "running")))
    planner.plan(13.0, 2, table, [WorkerView("w2", 1, 0.0)])
    table.update(jobs(("j3", "w3", 14.0, "failed")))
    planner.plan(15.0, 2, table, [WorkerView("w2", 1, 0.0)])
    assert planner.plan(25.5, 2, table, [WorkerView("w2", 1, 0.0)]).submit == 1  # 10 s again


def test_parsl_states_map_onto_the_pools():
    assert [
        job_state(s)
        for s in ("PENDING", "RUNNING", "COMPLETED", "HELD", "TIMEOUT", "SCALED_IN", "weird")
    ] == ["pending", "running", "done", "held", "failed", "cancelled", "failed"]


def test_bad_bounds_are_errors():
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        PoolPlanner(cores_per_worker=1, min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="cores_per_worker"):
        PoolPlanner(cores_per_worker=0)
