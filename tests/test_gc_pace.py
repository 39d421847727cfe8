"""The collector's pace during runs: raised while a ``get`` runs, the process's own after."""

from __future__ import annotations

import gc
import threading

import dask
import pytest

from daskvine_py.manager import gc_pace


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_nested_runs_raise_the_thresholds_once_and_restore_them_after_the_last(thresholds):
    gc.set_threshold(700, 10, 10)
    gc_pace.run_started()
    gc_pace.run_started()
    paced = (gc_pace.YOUNG, gc_pace.MIDDLE, gc_pace.OLD)
    assert gc.get_threshold() == paced
    gc_pace.run_ended()
    assert gc.get_threshold() == paced  # one run still going
    gc_pace.run_ended()
    assert gc.get_threshold() == (700, 10, 10)


def test_the_users_own_settings_win(thresholds):
    gc.set_threshold(100_000, 50, 200)  # already higher: kept
    gc_pace.run_started()
    assert gc.get_threshold() == (100_000, 50, 200)
    gc_pace.run_ended()
    assert gc.get_threshold() == (100_000, 50, 200)
    gc.set_threshold(700, 10, 10)
    gc_pace.run_started()
    gc.set_threshold(1234, 5, 5)  # changed during the run: not overwritten at its end
    gc_pace.run_ended()
    assert gc.get_threshold() == (1234, 5, 5)
    gc.set_threshold(0)  # collections off: left off
    gc_pace.run_started()
    assert gc.get_threshold()[0] == 0
    gc_pace.run_ended()
    assert gc.get_threshold()[0] == 0


def test_a_real_get_paces_the_collector_while_it_runs(shared_manager, thresholds):
    gc.set_threshold(700, 10, 10)
    seen = []
    event = threading.Event()

    def look(x: int) -> int:
        return x + 1

    def during(x: int) -> int:
        return x

    graph = {"a": (look, 1), "b": (during, "a")}
    with dask.config.set(scheduler="sync"):
        expected = dask.get(graph, "b")
    # The thresholds are read in this process while the run goes on: from a callback.
    from dask.callbacks import Callback

    with Callback(pretask=lambda key, dsk, state: seen.append(gc.get_threshold()) or event.set()):
        assert shared_manager.get(graph, "b") == expected
    assert event.is_set() and all(t[0] == gc_pace.YOUNG for t in seen), seen
    assert gc.get_threshold() == (700, 10, 10)
