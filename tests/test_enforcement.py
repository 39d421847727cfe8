"""A task's allocation enforced on its worker (``worker/memory_watch.py``), end to end: a
real worker, driven by a manager the test speaks for, kills a library whose task goes
past its memory allocation and reports ``TaskExhausted`` (not a crash), goes on with a
fresh library, measures a task within its allocation by its own peak, spills stored
results to leave a running task's allocation room, and sizes a library's thread pools to
a task's cores. Computed results are compared with Dask's synchronous scheduler."""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import time

import dask
import pytest
from dask._task_spec import Task

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, loads
from daskvine_py.worker import threads
from daskvine_py.worker.store import Store
from test_abort import FakeManager, fake_manager_with_a_worker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

MB = 2**20


def hungry(megabytes: int) -> int:
    """``megabytes`` resident (every page written), held a moment: the watch sees it."""
    block = bytearray(megabytes * MB)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))
    time.sleep(0.5)
    return len(block) // MB


def blas_threads(_: int) -> list[int]:
    """In a library: the threads of each BLAS pool loaded (numpy's)."""
    import numpy  # noqa: F401  (loads its BLAS here)
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    """Workers inherit this process's environment: start from no pool variables set."""
    for name in threads.VARIABLES:
        monkeypatch.delenv(name, raising=False)


def worker(*args: str) -> contextlib.AbstractContextManager[tuple[FakeManager, object]]:
    return fake_manager_with_a_worker("enforced", 0.2, *args)


def _the_next_task_runs_right(manager: FakeManager, task_id: int) -> None:
    manager.execute(task_id, Task("answer", operator.add, 20, 22))
    report = manager.report(task_id)
    assert type(report) is p.TaskDone
    assert loads(report.value) == dask.get({"answer": (operator.add, 20, 22)}, "answer")


@pytest.mark.timeout(120)
def test_a_task_past_its_allocation_is_stopped_and_reported_exhausted():
    with worker("--memory", "2000") as (manager, proc):
        manager.execute(1, Task("kept", bytes, 1_000_000), want=False)  # live in the library
        assert type(manager.report(1)) is p.TaskDone
        manager.execute(2, Task("hungry", hungry, 200), memory=50 * MB)
        report = manager.report(2)
        assert type(report) is p.TaskExhausted, manager.heard
        assert report.resource == "memory" and report.limit == 50 * MB
        assert report.peak >= report.limit
        # its library's live results went with it, as after a crash
        manager.wait_for(lambda r: type(r) is p.Lost)
        assert [r for r in manager.heard if type(r) is p.Lost] == [p.Lost((1,))]
        _the_next_task_runs_right(manager, 3)  # on a fresh library
        assert not [r for r in manager.heard if type(r) is p.TaskCrashed]
        assert proc.poll() is None


@pytest.mark.timeout(120)
def test_a_task_within_its_allocation_finishes_measured_by_its_own_peak():
    with worker("--memory", "2000") as (manager, proc):
        manager.execute(1, Task("hungry", hungry, 200), memory=400 * MB)
        report = manager.report(1)
        assert type(report) is p.TaskDone, manager.heard
        assert loads(report.value) == dask.get({"h": (hungry, 200)}, "h")
        assert 0.8 * 200 * MB <= report.peak_memory <= 1.2 * 200 * MB
        # a task of no allocation of its own may take what the others leave of --memory
        manager.execute(2, Task("hungry", hungry, 200))
        assert type(manager.report(2)) is p.TaskDone
        assert proc.poll() is None


def holding(megabytes: int, marker: str, seconds: float) -> int:
    """``megabytes`` resident, then ``marker`` written, then held ``seconds``."""
    block = bytearray(megabytes * MB)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))
    with open(marker, "w"):
        pass
    time.sleep(seconds)
    return len(block) // MB


def hungry_after(megabytes: int, marker: str) -> int:
    """``hungry``, once ``marker`` exists."""
    while not os.path.exists(marker):
        time.sleep(0.01)
    return hungry(megabytes)


@pytest.mark.timeout(120)
def test_a_task_of_no_allocation_may_use_what_the_others_leave_unused():
    """Issue 38: what an allocated task only reserved is no reason to stop a task of no
    allocation; it used to be stopped here (past "300 - 200 MB"), though nothing was."""
    with worker("--cores", "2", "--memory", "300") as (manager, proc):
        # alone, a task of no allocation is not limited (as before allocations existed)
        manager.execute(1, Task("alone", hungry, 200))
        assert type(manager.report(1)) is p.TaskDone, manager.heard
        manager.execute(2, Task("sleepy", time.sleep, 3), memory=200 * MB)
        manager.wait_for(lambda r: type(r) is p.Started and 2 in r.task_ids)
        manager.execute(3, Task("beside", hungry, 200))  # in the other library
        assert type(manager.report(3)) is p.TaskDone, manager.heard
        assert type(manager.report(2)) is p.TaskDone


@pytest.mark.timeout(120)
def test_past_the_budget_the_task_of_no_allocation_makes_room_for_the_budget(tmp_path):
    """The allocated task grows to its allocation first; the one of no allocation then
    takes the libraries past the budget: it is stopped for the budget ("budget", with
    what the other's use left it), not for its own use, and the other runs on."""
    marker = str(tmp_path / "held")
    with worker("--cores", "2", "--memory", "300") as (manager, proc):
        manager.execute(1, Task("holding", holding, 200, marker, 3), memory=220 * MB)
        manager.wait_for(lambda r: type(r) is p.Started and 1 in r.task_ids)
        manager.execute(2, Task("beside", hungry_after, 200, marker))  # the other library
        report = manager.report(2)
        assert type(report) is p.TaskExhausted, manager.heard
        assert report.resource == "budget" and report.peak > report.limit
        assert report.limit <= 100 * MB  # what the other's 200 MB left of 300
        assert type(manager.report(1)) is p.TaskDone  # its library went on
        _the_next_task_runs_right(manager, 3)


@pytest.mark.timeout(120)
def test_a_library_of_two_slots_is_limited_by_the_sum_of_its_tasks_allocations():
    with worker("--lib-slots", "2", "--memory", "2000") as (manager, proc):
        manager.execute(1, Task("sleepy", time.sleep, 3), memory=100 * MB)
        manager.wait_for(lambda r: type(r) is p.Started and 1 in r.task_ids)
        # 150 MB for the two: 200 MB is past it, and the most recent task is blamed
        manager.execute(2, Task("hungry", hungry, 200), memory=50 * MB)
        report = manager.report(2)
        assert type(report) is p.TaskExhausted, manager.heard
        assert report.limit == 50 * MB and report.peak >= 150 * MB
        assert type(manager.report(1)) is p.TaskCrashed  # retried by the manager, as today
        _the_next_task_runs_right(manager, 3)


@pytest.mark.timeout(120)
def test_stored_results_spill_to_leave_a_running_task_its_allocation():
    with worker("--memory", "200") as (manager, proc):
        manager.execute(1, Task("kept", bytes, 60 * MB), want=False)  # live in the library
        assert type(manager.report(1)) is p.TaskDone
        status = manager.wait_for(lambda r: type(r) is p.Status)
        assert status.spilled_bytes == 0  # 60 MB of 200: room enough
        # 180 MB allocated to a running task: the 60 MB result leaves for the spill
        manager.execute(2, Task("sleepy", time.sleep, 2), memory=180 * MB)
        status = manager.wait_for(lambda r: type(r) is p.Status and r.spilled_bytes > 0)
        assert status.spilled_bytes >= 60 * MB
        assert type(manager.report(2)) is p.TaskDone
        manager.send(p.Upload((1,)))
        uploaded = manager.wait_for(lambda r: type(r) is p.Uploaded)
        assert loads(uploaded.value) == dask.get({"k": (bytes, 60 * MB)}, "k")


@pytest.mark.timeout(120)
def test_a_librarys_thread_pools_follow_its_tasks_cores():
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("numpy")
    with worker() as (manager, proc):
        for task_id, cores in enumerate((1, 2, 1, 3), start=1):
            manager.execute(task_id, Task(f"pools-{task_id}", blas_threads, 0), cores=cores)
            report = manager.report(task_id)
            assert type(report) is p.TaskDone, manager.heard
            blas = loads(report.value)
            assert blas and set(blas) == {cores}, (cores, blas)


def test_the_store_spills_to_leave_allocations_room(tmp_path):
    def value() -> Serialized:
        return Serialized(b"x" * 20, [])

    store = Store(100, str(tmp_path))
    for task_id in range(4):
        store.put(task_id, value())
    assert store.memory_bytes == 80 and store.disk_bytes == 0
    store.allocate(50)  # a task allocated 50 bytes runs: 30 bytes of results go to disk
    assert store.memory_bytes <= 50 and store.disk_bytes >= 40
    assert [bytes(store.get(t).header) for t in range(4)] == [b"x" * 20] * 4
    assert store.memory_bytes + store.allocated <= 100
    store.allocate(0)  # it is done: room again, nothing more spills
    spilled = store.spilled
    store.put(9, value())
    assert store.spilled == spilled and store.memory_bytes <= 100
    store.close()
