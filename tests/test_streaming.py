"""A big graph's first tasks go while the rest is read (``manager.streaming``): the state
keeps an arriving run's results until its last part, and ``get`` computes what dask does,
raises what it raised, and runs the passes on the rest."""

from __future__ import annotations

import time

import dask
import pytest

from daskvine_py import Manager
from daskvine_py.errors import GraphCycleError
from daskvine_py.manager import streaming
from daskvine_py.plan import graph
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps

W1 = b"w1"


def _released(out: list) -> list[int]:
    return sorted(
        i
        for m in out
        if type(m) is s.Send and type(m.message) is p.Release
        for i in m.message.task_ids
    )


def test_an_arriving_run_keeps_every_result_until_its_last_part():
    st_ = s.SchedulerState()
    joined = s.WorkerJoined(W1, "w1", 4, "tcp://w1")
    first = [
        s.NewTask("x", b"", (), (), 0, "x", None),
        s.NewTask("y", b"", (), ("x",), 1, "y", None),
    ]
    st_.handle([joined, s.SubmitRun(1, first, ["z"], 3, arriving=True)])
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 8, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(2, 8, 0.1, None)),
        ]
    )
    # y, the only reader seen so far, is done: x is kept all the same (z reads it too)
    assert _released(out) == [] and st_.tasks[1].state == "memory"
    rest = [s.NewTask("z", b"", (), ("x", "y"), 2, "z", None)]
    out = st_.handle([s.ExtendRun(1, rest, {}, last=True)])
    assert _released(out) == []  # z reads both: still needed
    out = st_.handle([s.FromWorker(W1, p.TaskDone(3, 8, 0.1, dumps("z")))])
    assert [type(i) for i in out if type(i) is not s.Send] == [s.RunOutput, s.RunDone]
    assert not st_.tasks


def test_the_last_part_releases_what_no_reader_needs_any_more():
    st_ = s.SchedulerState()
    joined = s.WorkerJoined(W1, "w1", 4, "tcp://w1")
    first = [
        s.NewTask("x", b"", (), (), 0, "x", None),
        s.NewTask("y", b"", (), ("x",), 1, "y", None),
    ]
    st_.handle([joined, s.SubmitRun(1, first, ["z"], 3, arriving=True)])
    st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(1, 8, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(2, 8, 0.1, None)),
        ]
    )
    out = st_.handle([s.ExtendRun(1, [s.NewTask("z", b"", (), ("y",), 2, "z", None)], {}, True)])
    assert _released(out) == [1]  # nothing else reads x; y waits for z


def add(*parts: int) -> int:
    return sum(parts)


def tree(leaves: int) -> tuple[dict, tuple]:
    dsk: dict = {("leaf", i): (int, i) for i in range(leaves)}
    level = list(dsk)
    depth = 0
    while len(level) > 1:
        above = []
        for j in range(0, len(level), 8):
            dsk[("sum", depth, j)] = (add, *level[j : j + 8])
            above.append(("sum", depth, j))
        level, depth = above, depth + 1
    return dsk, level[0]


@pytest.fixture
def small_streams(monkeypatch):
    """Streaming from 500 tasks on, 1,000 at most, 100 at a time."""
    monkeypatch.setattr(streaming, "STREAM_MIN", 500)
    monkeypatch.setattr(streaming, "STREAM_PREFIX", 1000)
    monkeypatch.setattr(graph, "EARLY_EVERY", 100)


@pytest.fixture(scope="module")
def manager():
    with Manager() as m:
        m.start_workers(2, cores=1)
        yield m


@pytest.mark.timeout(120)
def test_a_streamed_graph_computes_what_dask_computes(small_streams, manager):
    dsk, root = tree(3000)
    # a reader far from what it reads, a reduction the rewrite makes a tree, and a chain
    dsk["far"] = (add, ("leaf", 0), ("leaf", 2999))
    dsk["total"] = (sum, [("leaf", i) for i in range(40)])
    dsk["c0"] = (add, ("leaf", 7))
    for i in range(1, 5):
        dsk[f"c{i}"] = (add, f"c{i - 1}")
    keys = [root, "far", "total", "c4", ("leaf", 5)]
    expected = dask.get(dsk, keys)
    assert manager.get(dsk, keys) == tuple(expected)
    assert manager.last_run.outcome == "done"
    # the rewrite's tree (+5 tasks) and the fused chain (-4) after the first tasks went
    assert manager.last_run.tasks == len(dsk) + 1
    assert manager.get(dsk, keys) == tuple(expected)  # and again, on the same manager


@pytest.mark.timeout(120)
def test_a_cycle_found_after_the_first_tasks_went_cancels_the_run(small_streams, manager):
    dsk, root = tree(3000)
    # the outputs are walked in their order: the whole tree is read (and its first tasks
    # go) before the loop is met; a loop inside the tree would be met at a place that
    # depends on the iteration order of frozensets, which varies with the hash seed
    dsk["loop-a"] = (add, "loop-b")
    dsk["loop-b"] = (add, "loop-a")
    with pytest.raises(GraphCycleError, match="loop-a"):
        manager.get(dsk, [root, "loop-a"])
    assert manager.last_run.outcome == "cancelled"
    dsk, root = tree(1000)
    assert manager.get(dsk, root) == sum(range(1000))


def _inc(x: int) -> int:
    return x + 1


def _total(*parts: int) -> int:
    return sum(parts)


def test_the_caller_runs_at_most_parts_ahead_parts_before_the_io_thread(
    shared_manager, monkeypatch
):
    """A graph read faster than the state takes it waits in the caller, not in the queue
    between them (``watching.PARTS_AHEAD``)."""
    from daskvine_py.manager import loop as loop_module
    from daskvine_py.manager import manager as manager_module
    from daskvine_py.manager import watching
    from daskvine_py.manager.commands import Extend

    monkeypatch.setattr(manager_module, "SUBMIT_PART", 2)
    queued = []
    sent = taken = 0
    take = loop_module.IOLoop._COMMAND_HANDLERS[Extend]
    command = loop_module.IOLoop.command

    def counted(loop, what):  # (any thread)
        nonlocal sent
        sent += type(what) is Extend
        command(loop, what)

    def slow_take(loop, what):  # an I/O thread far slower than the caller
        nonlocal taken
        taken += 1
        queued.append(sent - taken)  # parts sent and not yet taken
        time.sleep(0.005)
        take(loop, what)

    monkeypatch.setattr(loop_module.IOLoop, "command", counted)
    monkeypatch.setitem(loop_module.IOLoop._COMMAND_HANDLERS, Extend, slow_take)
    dsk = {("leaf", i): (_inc, i) for i in range(200)}
    dsk["total"] = (_total, *[("leaf", i) for i in range(200)])
    got = shared_manager.get(dsk, "total", fuse=False)
    assert got == dask.get(dsk, "total") == sum(range(1, 201))
    assert len(queued) >= 90  # (the parts after the first)
    assert max(queued) <= watching.PARTS_AHEAD
