"""The ``LiveTasks`` component alone: literal live results, tasks and export replies in,
library requests, peer answers and uploads out."""

from __future__ import annotations

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import pipe
from daskvine_py.worker.live_tasks import MANAGER_IDENT, LiveTasks
from daskvine_py.worker.messages import AnswerPeer, ToLibrary
from daskvine_py.worker.records import WorkerTask
from daskvine_py.worker.store import Store


def make(store=None):
    """A ``LiveTasks`` and its instructions: (component, out)."""
    out = []
    return LiveTasks(store or Store(), out), out


def task(task_id, *dep_ids, tasks_mode=False):
    deps = tuple(p.DepLocation(d, f"k{d}", ()) for d in dep_ids)
    config = p.RunConfig(1, "tasks", "direct", (), (), False) if tasks_mode else None
    return WorkerTask(p.Execute(task_id, f"k{task_id}", b"", deps, False), config)


def test_a_task_runs_where_most_of_its_live_inputs_are_after_the_others_are_exported():
    live, *_ = make()
    live.live.add(1, lib=0, nbytes=100)
    live.live.add(2, lib=1, nbytes=5_000)
    live.store.put(3, dumps(3))
    live.live.add(3, lib=0, nbytes=9_000)  # also stored: it counts for no library
    assert live.place(task(9)) == (None, ())
    assert live.place(task(9, 3)) == (None, ())
    assert live.place(task(9, 1)) == (0, [])
    assert live.place(task(9, 1, 2, 3)) == (1, [1])
    assert live.place(task(9, 1, 2, tasks_mode=True)) == (None, [1, 2])  # a task process


def test_one_export_serves_every_task_and_peer_that_waits_for_it():
    live, out = make()
    live.live.add(1, lib=0, nbytes=100)
    live.export(1, task_id=9)
    assert live.serve_peer(1, b"peer") and live.serve_peer(1, MANAGER_IDENT)
    assert not live.serve_peer(2, b"peer")  # not live here
    assert out == [ToLibrary(0, pipe.Export([1], False))]  # asked once
    out.clear()
    wait = live.on_exported(pipe.Exported(1, dumps("one"), 0.001, ""))
    assert wait is not None and wait.tasks == {9}
    value = live.store.get(1)
    assert out == [AnswerPeer(b"peer", p.Data(1, value)), p.Uploaded(1, value)]
    assert loads(live.store.get(1)) == "one" and 1 in live.live  # kept live too
    assert not list(live.leaks())


def test_a_result_that_cannot_be_serialized_stays_stuck_in_its_library():
    live, *_ = make()
    live.live.add(1, lib=0, nbytes=100)
    live.export(1, drop=True)
    assert live.live.leaving_bytes == 100
    wait = live.on_exported(pipe.Exported(1, None, 0.0, "TypeError: a lock"))
    assert wait is not None and live.live.entries[1].stuck and live.live.leaving_bytes == 0
    assert 1 not in live.store and not live.serve_peer(1, b"peer")


def test_release_is_one_forget_per_library_and_eviction_spills_the_oldest(tmp_path):
    live, out = make(Store(25_000, str(tmp_path)))
    for task_id, lib in ((1, 0), (2, 1), (3, 0), (4, 0)):
        live.live.add(task_id, lib, nbytes=10_000)
    live.forget([3, 2, 4, 5])
    assert out == [ToLibrary(0, pipe.Forget([3, 4])), ToLibrary(1, pipe.Forget([2]))]
    out.clear()
    live.live.add(6, 1, nbytes=10_000)
    live.store.put(6, dumps(6))
    live.evict(15_000)  # the oldest first: 1 is exported, 6 (stored) just forgotten
    assert out == [ToLibrary(0, pipe.Export([1], True)), ToLibrary(1, pipe.Forget([6]))]
    live.on_exported(pipe.Exported(1, dumps(b"x" * 100), 0.001, ""))
    assert not live.live.entries and 1 in live.store and live.store.reserved == 0


def test_a_dead_library_loses_what_only_it_held_and_abandons_its_exports():
    live, *_ = make()
    for task_id, lib in ((1, 0), (2, 0), (3, 1)):
        live.live.add(task_id, lib, nbytes=100)
    live.store.put(2, dumps(2))
    live.export(1, task_id=9)
    live.export(3, task_id=9)
    live.unwait(3, 9)
    assert live.lose(0, live.store) == [1]  # 2 is stored
    ((task_id, wait),) = live.abandon(0)
    assert task_id == 1 and wait.tasks == {9}
    assert list(live.live.entries) == [3] and list(live.exports) == [3]
    assert live.exports[3].tasks == set()
