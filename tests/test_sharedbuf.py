"""Large buffers between a worker and its libraries through shared memory (sharedbuf.py)."""

from __future__ import annotations

import glob
import multiprocessing as mp
import os

import dask
import numpy as np
import pytest

from daskvine_py.wire import sharedbuf
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import pipe

pytestmark = pytest.mark.skipif(not sharedbuf.AVAILABLE, reason="no POSIX shared memory here")


def segments(owner: int | None = None) -> list[str]:
    pattern = f"{sharedbuf.PREFIX}{owner}-*" if owner is not None else f"{sharedbuf.PREFIX}*"
    return glob.glob(os.path.join(sharedbuf.SHM_DIR, pattern))


def echo(conn):
    """A library's side: read a record, send it back (both directions cross processes)."""
    pipe.send(conn, pipe.receive(conn))


@pytest.mark.integration
def test_large_buffers_cross_processes_through_segments_that_are_gone_once_read():
    big = np.arange(sharedbuf.MIN_BYTES // 8 * 3, dtype=np.float64)  # 3x the threshold
    small = np.arange(100.0)
    before = set(segments())
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=echo, args=(there,))
    child.start()
    try:
        pipe.send(here, pipe.Exported(7, dumps((big, small)), 0.5, ""))
        back = pipe.receive(here)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    got_big, got_small = loads(back.value)
    assert back.task_id == 7 and np.array_equal(got_big, big) and np.array_equal(got_small, small)
    assert set(segments()) == before  # every segment unlinked by its reader


@pytest.mark.integration
def test_segments_of_dead_workers_are_removed_and_those_of_live_ones_kept():
    ctx = mp.get_context("spawn")
    gone = ctx.Process(target=os.getpid)
    gone.start()
    gone.join(30)
    data = memoryview(bytes(1000))
    dead_one = sharedbuf.put(data, gone.pid)
    mine = sharedbuf.put(data, os.getpid())
    try:
        sharedbuf.remove_dead()
        assert segments(gone.pid) == []
        assert [os.path.basename(p) for p in segments(os.getpid())] == [mine[1:]]
    finally:
        sharedbuf.remove_owned(os.getpid())
        sharedbuf.remove_owned(gone.pid)
    assert segments(os.getpid()) == []
    with pytest.raises(FileNotFoundError):
        sharedbuf.take(dead_one)


def test_a_name_outside_the_project_is_refused():
    with pytest.raises(ValueError, match="not a segment"):
        sharedbuf.take("/some-other-segment")


def block(seed):
    return np.random.default_rng(seed).random((400, 400))  # 1.28 MB


def transpose_sum(x):
    return x.T + 1.0


@pytest.mark.integration
def test_arrays_between_the_libraries_of_one_worker_match_sync():
    from daskvine_py import Manager

    dsk = {f"x{i}": (block, i) for i in range(6)}
    dsk.update({f"y{i}": (transpose_sum, f"x{i}") for i in range(6)})
    dsk.update({f"z{i}": (np.add, f"y{i}", f"y{(i + 1) % 6}") for i in range(6)})
    dsk["total"] = (sum, [(np.sum, f"z{i}") for i in range(6)])
    with Manager() as manager:
        manager.start_workers(1, cores=2)  # one worker, two libraries
        got = manager.get(dsk, ["total", "z3"])
        pids = [proc.pid for proc in manager._local_processes]
        # results read by another library were exported (serialized) and moved
        assert manager.last_run.serialization_seconds > 0
    want = dask.get(dsk, ["total", "z3"])
    assert np.isclose(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert all(segments(pid) == [] for pid in pids)
