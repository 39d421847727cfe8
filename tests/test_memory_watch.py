"""``worker/memory_watch.py`` without a worker: the watch reads this process's own resident
size as if it were a library's, and its "kill" is recorded, not done. An export's copies
of a live result raise the library's limit until the library is idle with no export under
way (the copies are not its running task's: a 60 MB result spilled while a task of a
180 MB allocation ran used to get that task killed)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from daskvine_py.worker.live_results import ExportWait
from daskvine_py.worker.measure import PAGE
from daskvine_py.worker.memory_watch import BUDGET, EXPORT_COPIES, OWN, MemoryWatch
from daskvine_py.worker.store import Store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MB = 2**20


class _Process:
    """This process, standing for a library's: ``kill`` is counted."""

    pid = os.getpid()

    def __init__(self) -> None:
        self.kills = 0

    def kill(self) -> None:
        self.kills += 1


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def _touched(megabytes: int) -> bytearray:
    block = bytearray(megabytes * MB)
    block[::PAGE] = b"\1" * len(range(0, len(block), PAGE))
    return block


def _running(memory: int) -> tuple[SimpleNamespace, dict[int, SimpleNamespace]]:
    """A library (id 0) running task 7 of ``memory`` bytes, its base resident now."""
    task = SimpleNamespace(id=7, key="sleepy-7", memory=memory, state="running", lib=0)
    lib = SimpleNamespace(
        record=SimpleNamespace(id=0), process=_Process(), running=[task.id + 1, _resident()]
    )
    return lib, {task.id: task}


def test_a_task_past_its_allocation_is_killed_and_named():
    lib, tasks = _running(50 * MB)
    watch = MemoryWatch(0, tasks, Store(), "w")
    try:
        block = _touched(120)
        (exhausted,) = watch.look({0: lib}, 1.0)
        assert lib.process.kills == 1
        assert exhausted.task is tasks[7] and exhausted.limit == 50 * MB
        assert exhausted.peak >= 120 * MB
        del block
    finally:
        watch.close()


def test_an_exports_copies_raise_the_librarys_limit_until_it_is_idle():
    lib, tasks = _running(50 * MB)
    exports = {3: ExportWait(0, True)}  # live result 3 leaves library 0 for the spill
    watch = MemoryWatch(0, tasks, Store(), "w", exports)
    try:
        watch.exporting(0, 60 * MB)  # 3 copies of 60 MB, more than the task's 50
        block = _touched(120)
        assert not watch.look({0: lib}, 1.0)
        exports.clear()  # the export arrived; the task runs on, its base from before
        assert not watch.look({0: lib}, 2.0)
        assert lib.process.kills == 0
        # idle with no export under way: the credit ends, and the next task has none
        tasks[7].state = "forgotten"
        assert not watch.look({0: lib}, 3.0)
        tasks[7].state = "running"
        lib.running[1] = _resident() - 120 * MB  # (as if it began before the block)
        (exhausted,) = watch.look({0: lib}, 4.0)
        assert lib.process.kills == 1 and exhausted.limit == 50 * MB
        del block
    finally:
        watch.close()


def test_an_export_counts_its_copies():
    watch = MemoryWatch(0, {}, Store(), "w")
    watch.exporting(4, 10 * MB)
    watch.exporting(4, 5 * MB)
    assert watch._credit == {4: EXPORT_COPIES * 15 * MB}
    watch.close()


def _libraries(grown_mb: dict[int, int], memory_mb: dict[int, int]):
    """Libraries 0, 1, ... each running one task (id 10 + library) of ``memory_mb[i]``
    MB (0: none of its own), each seen grown by ``grown_mb[i]`` MB since it began."""
    libs, tasks = {}, {}
    now = _resident()
    for i, grown in grown_mb.items():
        task = SimpleNamespace(
            id=10 + i, key=f"task-{i}", memory=memory_mb[i] * MB, state="running", lib=i
        )
        tasks[task.id] = task
        libs[i] = SimpleNamespace(
            record=SimpleNamespace(id=i),
            process=_Process(),
            running=[task.id + 1, now - grown * MB],
        )
    return libs, tasks


def test_a_task_of_no_allocation_is_not_stopped_for_what_the_others_only_reserved():
    """Issue 38: three tasks of 750 MB reserved all of a 1,500 MB budget and used 10 MB
    each; a task of no allocation beside them that used 3 MB was stopped, blamed, and its
    run failed. Nothing went past anything: nothing is stopped."""
    libs, tasks = _libraries({0: 10, 1: 10, 2: 10, 3: 3}, {0: 750, 1: 750, 2: 750, 3: 0})
    watch = MemoryWatch(1500 * MB, tasks, Store(), "w")
    try:
        assert not watch.look(libs, 1.0)
        assert not any(lib.process.kills for lib in libs.values())
    finally:
        watch.close()


def test_past_the_budget_together_the_task_of_no_allocation_that_grew_most_makes_room():
    """Allocated tasks within their allocations keep their room; of the tasks of no
    allocation, the one that grew most is stopped, for the budget (``BUDGET``), not
    blamed for its own use; a task past its own allocation is stopped for that (``OWN``)."""
    libs, tasks = _libraries({0: 700, 1: 500, 2: 200, 3: 90}, {0: 750, 1: 0, 2: 0, 3: 60})
    watch = MemoryWatch(1200 * MB, tasks, Store(), "w")
    try:
        found = {e.task.key: e for e in watch.look(libs, 1.0)}
        assert set(found) == {"task-1", "task-3"}
        assert found["task-3"].kind == OWN and found["task-3"].limit == 60 * MB
        budget = found["task-1"]
        assert budget.kind == BUDGET and budget.peak >= 500 * MB
        # 700 + 500 + 200 = 1,400 MB (task 3's library, killed, counts no more): task 1
        # went 200 MB past what the others' use left it
        assert 290 * MB <= budget.limit <= 300 * MB
        assert [lib.process.kills for lib in libs.values()] == [0, 1, 0, 1]
    finally:
        watch.close()


def test_a_task_of_no_allocation_past_the_whole_budget_alone_is_stopped_for_its_own_use():
    libs, tasks = _libraries({0: 1300}, {0: 0})
    watch = MemoryWatch(1200 * MB, tasks, Store(), "w")
    try:
        (alone,) = watch.look(libs, 1.0)
        assert alone.kind == OWN and alone.limit == 1200 * MB and alone.peak >= 1300 * MB
    finally:
        watch.close()
