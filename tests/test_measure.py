"""Every task measured: its CPU seconds and its own peak resident memory (its process's
growth while it ran), summed by category in ``Manager.last_run.categories``."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import dask
import pytest

from daskvine_py import Manager
from daskvine_py.plan.graph import LegacyCall
from daskvine_py.wire.serialize import TaskEncoder
from daskvine_py.worker import library, measure, pipe
from measure_tasks import HUNGRY_MB, MB, hungry, spin, tiny, total
from measure_tasks import touched as _touched

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")


def _trim() -> None:
    """Hand the C heap's free pages back to the system: a block allocated next must
    fault in pages of its own, not reuse ones still resident from an earlier test."""
    ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


@linux
@pytest.mark.timeout(60)
def test_the_high_water_mark_is_reset_and_read_in_bytes():
    measure.reset_peak()
    base = measure.peak_memory()
    block = _touched(64)
    high = measure.peak_memory()
    del block
    measure.reset_peak()
    after = measure.peak_memory()
    assert base > 0
    assert high - base >= 60 * MB  # the 64 MB just touched, seen in bytes
    assert after < high - 60 * MB  # reset to what is resident now: the block is gone


@pytest.mark.integration
@linux
@pytest.mark.timeout(60)
def test_a_tasks_peak_is_its_own_growth_not_its_processs_size():
    _trim()
    begun = measure.begin()
    assert begun[0] > 0  # the process's size as the task begins
    block = _touched(64)
    cpu, peak = measure.end(begun)
    assert 60 * MB <= peak <= 70 * MB and cpu > 0  # (touching 64 MB takes CPU)
    # the block stays: the next task starts from a process 64 MB larger, and its own
    # peak holds none of it
    base = measure.base()
    begun = measure.begin()  # (its base: the mark just reset, the resident size)
    assert abs(begun[0] - base) < 2 * MB and base >= peak
    assert measure.end(begun)[1] < 8 * MB
    del block


@pytest.mark.integration
@linux
@pytest.mark.timeout(60)
def test_the_mark_read_from_status_agrees_with_getrusages():
    # (the path taken when ``ru_maxrss`` kept a figure older than the reset)
    _trim()
    start, cpu, _ = measure.begin()
    block = _touched(32)
    fast = measure.end((start, cpu, False))[1]
    exact = measure.end((start, cpu, True))[1]
    assert 30 * MB <= fast and abs(fast - exact) < 2 * MB
    del block


@pytest.mark.integration
@linux
@pytest.mark.timeout(60)
def test_a_large_result_sent_away_leaves_the_next_tasks_base():
    """A library's task returns 64 MB that it sends and does not keep: the next task's
    base is read afresh (not the size the last read saw, with the result still there),
    and a live result the worker has it forget leaves it too."""
    encoder = TaskEncoder()
    runner = library.Runner("w", "/tmp")

    def call(task_id: int, keep: bool, *task: object) -> pipe.Call:
        payload, _ = encoder.encode(LegacyCall(task, frozenset()))
        runner.decoder.add_functions(encoder.functions)
        return pipe.Call(task_id, f"k{task_id}", payload, [], keep, not keep)

    for forget in (False, True):
        _trim()
        before = measure.base()
        done = runner.execute(call(1, forget, _touched, 64), None)
        assert type(done) is pipe.Done and 60 * MB <= done.peak_memory <= 70 * MB
        done = None  # (the last read saw the result, still here as the task ended)
        if forget:
            runner.forget(1)
        assert measure.base() < before + 8 * MB  # gone: read again, not the last read's
        done = runner.execute(call(2, False, tiny, 1), None)
        assert done.peak_memory < 8 * MB


@linux
@pytest.mark.timeout(60)
def test_a_forked_child_measures_itself_not_its_parent():
    measure.peak_memory()  # the parent's files are open
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            measure.reset_peak()
            base = measure.peak_memory()
            block = _touched(64)
            grew = measure.peak_memory() - base
            del block
            os.write(write, str(grew).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        grew = int(pipe.read())
    os.waitpid(pid, 0)
    assert grew >= 60 * MB  # read from the files of its parent, it would not have grown


@linux
@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "task_mode, exec_mode",
    [("function-calls", "direct"), ("function-calls", "fork"), ("tasks", "direct")],
)
def test_every_task_is_measured_by_category(task_mode, exec_mode):
    dsk: dict = {("hungry", i): (hungry, i) for i in range(2)}
    dsk.update({("tiny", i): (tiny, i) for i in range(6)})
    dsk.update({("spin", i): (spin, 300_000) for i in range(2)})
    dsk["total"] = (total, *[k for k in dsk])
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        got = manager.get(dsk, "total", task_mode=task_mode, exec_mode=exec_mode)
        categories = manager.last_run.categories
    assert got == dask.get(dsk, "total")

    assert set(categories) == {"hungry", "tiny", "spin", "total"}
    counts = {name: category.tasks for name, category in categories.items()}
    assert counts == {"hungry": 2, "tiny": 6, "spin": 2, "total": 1}
    hungry_, tiny_, spin_ = categories["hungry"], categories["tiny"], categories["spin"]
    # A task's peak is its own: what it allocated, not its process's base (the
    # interpreter, dask), within 20%.
    assert tiny_.peak_memory_mb < 0.2 * HUNGRY_MB
    assert 0.8 * HUNGRY_MB <= hungry_.peak_memory_mb <= 1.2 * HUNGRY_MB
    assert spin_.cpu_s > 0 and hungry_.cpu_s > 0
    assert all(c.wall_s > 0 for c in categories.values())
    assert all(c.exhausted == 0 for c in categories.values())
    # Sized from their first measured task on (one of them ran unmeasured per worker).
    assert tiny_.allocated_memory_mb > 0
    # Bytes out are the results' sizes; "total" read every other result, once.
    assert all(c.output_bytes > 0 and c.failed == 0 for c in categories.values())
    made = sum(c.output_bytes for name, c in categories.items() if name != "total")
    assert categories["total"].input_bytes == made
    assert all(c.input_bytes == 0 for name, c in categories.items() if name != "total")
