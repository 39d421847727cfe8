"""Bad input and failing tasks: clear errors naming the key, nothing hangs, manager stays usable."""

from __future__ import annotations

import os
import signal
import threading
import time

import dask
import numpy as np
import pytest

from beacon import Beacon, interrupt_once_a_task_runs, ping_then_sleep
from daskvine_py import GraphCycleError, RemoteTraceback, SerializationError, TaskFailed

pytestmark = pytest.mark.integration


def inc(x):
    return x + 1


def divide_by_zero(x):
    return x / 0


def raise_custom(x):
    raise CustomError(f"custom failure on {x}")


class CustomError(Exception):
    pass


def return_lock(x):
    return threading.Lock()


def exit_process(x):
    os._exit(3)


def slow(x, seconds=0.05):
    time.sleep(seconds)
    return x


def test_task_exception_keeps_type_message_and_remote_traceback(shared_manager):
    dsk = {"x": 1, "y": (divide_by_zero, "x")}
    with pytest.raises(ZeroDivisionError, match="division by zero") as info:
        shared_manager.get(dsk, "y")
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "divide_by_zero" in cause.text and "x / 0" in cause.text
    assert any("'y'" in note for note in getattr(info.value, "__notes__", ["'y'"]))


def test_a_link_of_a_chain_that_raises_is_named(shared_manager):
    # x -> y -> bad -> z runs as one task (a chain named 'z'); the error names 'bad'.
    dsk = {"x": 1, "y": (inc, "x"), "bad": (divide_by_zero, "y"), "z": (inc, "bad")}
    with pytest.raises(ZeroDivisionError) as info:
        shared_manager.get(dsk, "z")
    notes = getattr(info.value, "__notes__", [])
    assert any("'bad'" in note and "'z'" in note for note in notes), notes
    assert shared_manager.last_run.tasks == 1
    # Unfused, every task goes on its own; the error is the same.
    with pytest.raises(ZeroDivisionError) as info:
        shared_manager.get(dsk, "z", fuse=False)
    assert any("'bad'" in note for note in getattr(info.value, "__notes__", [])), notes
    assert shared_manager.last_run.tasks == 4


def test_user_exception_class_travels(shared_manager):
    with pytest.raises(CustomError, match="custom failure on 5"):
        shared_manager.get({"a": 5, "b": (raise_custom, "a")}, "b")


def test_failure_cancels_the_rest_of_the_graph(shared_manager):
    dsk = {f"s{i}": (slow, i, 0.05) for i in range(40)}
    dsk["bad"] = (divide_by_zero, 1)
    dsk["all"] = (sum, [f"s{i}" for i in range(40)] + ["bad"])
    with pytest.raises(ZeroDivisionError):
        shared_manager.get(dsk, "all")
    # Nothing of that graph is left in the scheduler, and the manager keeps serving.
    assert not shared_manager._state.tasks and not shared_manager._state.runs
    assert shared_manager.get({"z": (inc, 1)}, "z") == 2


def test_cycle_names_its_keys(shared_manager):
    dsk = {"a": (inc, "c"), "b": (inc, "a"), "c": (inc, "b"), "d": 1}
    with pytest.raises(GraphCycleError, match="cycle") as info:
        shared_manager.get(dsk, "c")
    assert set(info.value.cycle) == {"a", "b", "c"}
    assert "'a'" in str(info.value)


def test_missing_dependency_is_a_key_error(shared_manager):
    from dask._task_spec import Task, TaskRef

    with pytest.raises(KeyError, match="missing"):
        shared_manager.get({"a": Task("a", inc, TaskRef("missing"))}, "a")


def test_unpicklable_function_names_the_key(shared_manager):
    lock = threading.Lock()
    dsk = {"x": 1, "locked": (lambda x, _lock=lock: x, "x")}
    with pytest.raises(SerializationError, match="'locked'"):
        shared_manager.get(dsk, "locked")
    # inside a chain (x -> locked -> after runs as one task): the link is named
    with pytest.raises(SerializationError, match="'locked'"):
        shared_manager.get({**dsk, "after": (inc, "locked")}, "after")


def touch(path):
    with open(path, "w"):
        pass
    return path


class PicklesOnceItExists:
    """Cannot be pickled; says so only once ``path`` exists (a task wrote it) or after 30 s."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise TypeError(f"cannot pickle {type(self).__name__}")


def test_unpicklable_task_after_the_first_part_fails_after_tasks_ran(
    shared_manager, monkeypatch, tmp_path
):
    """The graph goes out in parts of SUBMIT_PART tasks, each pickled while earlier ones run:
    a task that cannot be pickled in a later part fails the run after tasks of earlier parts
    ran (docs/errors.md)."""
    from daskvine_py.manager import manager as manager_module

    monkeypatch.setattr(manager_module, "SUBMIT_PART", 1)
    marker = str(tmp_path / "ran")
    dsk = {"mark": (touch, marker), "late": (lambda x, _o: x, "mark", PicklesOnceItExists(marker))}
    with pytest.raises(SerializationError, match="'late'"):
        shared_manager.get(dsk, "late", fuse=False)  # fused, the two would be one task
    assert os.path.exists(marker)  # "mark" ran before the error
    assert shared_manager.get({"x": (inc, 1)}, "x") == 2


def test_unpicklable_result_names_the_key(shared_manager):
    with pytest.raises(SerializationError, match="result of task 'lock'"):
        shared_manager.get({"x": 1, "lock": (return_lock, "x")}, "lock")


def test_process_killing_task_is_retried_then_reported(shared_manager):
    with pytest.raises(TaskFailed, match=r"'die'.*exited with code 3") as info:
        shared_manager.get({"x": 1, "die": (exit_process, "x")}, "die", retries=1)
    assert info.value.key == "die" and info.value.worker.startswith("local-")
    # The library process was restarted: the worker is still usable.
    assert shared_manager.get({"x": 1, "y": (inc, "x")}, "y") == 2


def test_options_do_not_stick(shared_manager):
    with pytest.raises(TaskFailed):
        shared_manager.get({"die": (exit_process, 1)}, "die", retries=0)
    assert shared_manager.get({"x": (inc, 1)}, "x") == 2


def test_ctrl_c_cancels_the_run_and_keeps_the_manager(shared_manager):
    # A process started in the background by a shell ignores SIGINT: ask for Ctrl-C's usual
    # meaning explicitly, so the test does not depend on how pytest was started.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with Beacon() as beacon:
        dsk = {f"s{i}": (ping_then_sleep, i, beacon.address, 0.2) for i in range(50)}
        interrupter = interrupt_once_a_task_runs(beacon)
        try:
            with pytest.raises(KeyboardInterrupt):
                shared_manager.get(dsk, list(dsk))
        finally:
            interrupter.join()
            signal.signal(signal.SIGINT, previous)
        assert shared_manager.last_run.outcome == "cancelled"
        # The next run is not queued behind the cancelled one's tasks.
        assert shared_manager.get({"x": (inc, 41)}, "x") == 42
        started = 1 + len(beacon.drain())
    assert started < 50
    assert not shared_manager._state.tasks  # the cancelled run left nothing in the state


def test_only_outputs_travel_to_the_manager(shared_manager):
    """Ten 8 MB intermediates reduced to scalars: the manager sees kilobytes, not 80 MB."""
    dsk = {f"big{i}": (np.full, 1_000_000, float(i)) for i in range(10)}
    dsk.update({f"sum{i}": (np.sum, f"big{i}") for i in range(10)})
    before = shared_manager.received_bytes
    got = shared_manager.get(dsk, [f"sum{i}" for i in range(10)])
    assert got == tuple(1_000_000.0 * i for i in range(10))
    assert shared_manager.received_bytes - before < 200_000


def test_closed_manager_refuses_work():
    from daskvine_py import Manager

    manager = Manager()
    manager.close()
    with pytest.raises(RuntimeError, match="closed"):
        manager.get({"x": 1}, "x")


def test_dask_compute_error_path(shared_manager):
    @dask.delayed
    def fails(v):
        raise ValueError(f"bad value {v}")

    with pytest.raises(ValueError, match="bad value 3"):
        dask.compute(fails(3), scheduler=shared_manager.get)
