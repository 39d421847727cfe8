"""The ``Dispatch`` component alone: literal tasks and libraries in, library requests out.
Its task table and transitions are stand-ins here for the state's."""

from __future__ import annotations

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from daskvine_py.worker.dispatch import LIBRARY_BATCH, Dispatch
from daskvine_py.worker.live_tasks import LiveTasks
from daskvine_py.worker.records import WorkerTask
from daskvine_py.worker.store import Store


def make():
    """A dispatch with a task table whose transitions only set the state (and queue a
    task that becomes ``queued``, as the state does), and the tasks it could not run."""
    store = Store()
    tasks: dict[int, WorkerTask] = {}
    lost: list[tuple[int, int]] = []

    def transition(task, finish):
        task.state = finish
        if finish == "queued":
            dispatch.enqueue(task)

    live = LiveTasks(store, [])
    dispatch = Dispatch(tasks, {}, live, store, transition, lambda t, d: lost.append((t.id, d)))
    return dispatch, tasks, lost


def add(tasks, task_id, *deps):
    task = tasks[task_id] = WorkerTask(
        p.Execute(task_id, f"k{task_id}", b"x", tuple(deps), False), None
    )
    return task


def sent(requests):
    return [(lib.id, [call.task_id for call in run.calls]) for lib, run in requests]


def test_one_task_per_free_slot_and_tiny_tasks_in_batches():
    dispatch, tasks, _ = make()
    for lib_id in (1, 2):
        dispatch.on_ready(dispatch.add_library(lib_id, slots=1))
    for task_id in range(20):
        dispatch.queue(add(tasks, task_id))
    assert sent(dispatch.start_runnable()) == [(1, [0]), (2, [1])]
    dispatch.recent_duration.observe(0.0001)
    for lib in dispatch.libraries.values():
        lib.sent.clear()
    batches = sent(dispatch.start_runnable())
    assert [len(ids) for _, ids in batches] == [LIBRARY_BATCH, LIBRARY_BATCH]
    assert dispatch.start_runnable() == []  # every slot is busy


def test_functions_go_once_with_each_librarys_next_request():
    dispatch, tasks, _ = make()
    dispatch.add_function(b"f", b"code")
    lib = dispatch.add_library(1, slots=1)
    dispatch.queue(add(tasks, 1))
    ((_, run),) = dispatch.start_runnable()
    assert run.functions == [(b"f", b"code")] and lib.unsent == []


def test_a_queued_task_whose_input_is_held_nowhere_cannot_run():
    dispatch, tasks, lost = make()
    dispatch.add_library(1, slots=1)
    dispatch.store.put(7, dumps(7))
    dispatch.queue(add(tasks, 1, p.DepLocation(7, "k7", ())))
    dispatch.store.release(7)
    assert dispatch.start_runnable() == [] and lost == [(1, 7)]
