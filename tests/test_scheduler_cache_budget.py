"""The ``CacheBudget`` part alone: bytes kept per worker and at the manager, and which
results go first."""

from __future__ import annotations

from daskvine_py.scheduler.cache_budget import CacheBudget
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord

RUN = RunRecord(0, 0, ())


def result(id: int, nbytes: int, *holders: WorkerRecord) -> TaskRecord:
    record = TaskRecord(id, f"r{id}", RUN, b"", (), id, "r")
    record.nbytes = nbytes
    for holder in holders:
        record.hold(holder)
    return record


def test_least_recently_used_results_go_first_and_busy_ones_stay():
    a = WorkerRecord(b"a", "a", 1, "tcp://a:1")
    b = WorkerRecord(b"b", "b", 1, "tcp://b:1")
    budget = CacheBudget(worker_bytes=250, manager_bytes=100)
    old, busy, new = result(1, 100, a), result(2, 100, a), result(3, 100, a)
    shared = result(4, 100, a, b)
    for record in (old, busy, new, shared):
        budget.adopt(record, at_manager=False)
    budget.touch(old)  # used again: the most recent now
    assert budget.held == {a: 400, b: 100} and budget.over() == {a}
    forgotten: list[int] = []
    released: list[tuple[int, str]] = []

    def forget(record):
        forgotten.append(record.id)
        budget.forget(record)

    budget.evict(
        {b"a": a, b"b": b},
        lambda r: r is busy,
        forget,
        lambda r, w: released.append((r.id, w.name)),
    )
    # busy is read now; new goes whole; shared loses its copy on a only; 200 <= 250 then.
    assert forgotten == [3] and released == [(4, "a")]
    assert budget.held == {a: 200, b: 100} and budget.fits(a)
    index = CacheIndex()
    budget.publish(index)
    assert (index.entries, index.nbytes) == (3, 300)


def test_results_at_the_manager_and_retained_ones_have_their_own_counts():
    a = WorkerRecord(b"a", "a", 1, "tcp://a:1")
    budget = CacheBudget(worker_bytes=150, manager_bytes=100)
    small, other = result(1, 60, a), result(2, 60, a)
    budget.adopt(small, at_manager=True)
    budget.adopt(other, at_manager=True)
    forgotten: list[int] = []

    def forget(record):
        forgotten.append(record.id)
        budget.forget(record)

    budget.evict({b"a": a}, lambda r: False, forget, lambda r, w: None)
    assert forgotten == [1] and budget.manager_held == 60  # the older one went
    running = result(3, 120, a)
    budget.retain(running, a)
    assert budget.used(a) == 120 and budget.fits(a)
    budget.retain(running, a)  # computed again: counted once
    assert budget.retained == {a: 120}
    budget.unretain(running)
    assert budget.retained == {a: 0}
    budget.forget_workers({}, retained=True)  # a is gone
    assert budget.retained == {} and budget.held == {}
