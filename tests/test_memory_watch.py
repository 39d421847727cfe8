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
from daskvine_py.worker.memory_watch import EXPORT_COPIES, MemoryWatch
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
    lib = SimpleNamespace(record=SimpleNamespace(id=0), process=_Process(),
                          running=[task.id + 1, _resident()])  # fmt: skip
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
