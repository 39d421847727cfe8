"""Dask's callbacks (``dask.callbacks.Callback``, ``dask.diagnostics``) with
``manager.get``: called as Dask's local schedulers call them, with real output, every
result compared with Dask's synchronous scheduler."""

from __future__ import annotations

import io
from operator import add

import dask
import dask.array as da
import pytest
from dask.callbacks import Callback
from dask.diagnostics import CacheProfiler, Profiler, ProgressBar, ResourceProfiler

from daskvine_py.manager import callbacks
from daskvine_py.manager.watching import Run, TaskReported, TaskSent, Watching
from daskvine_py.plan.graph import build_plan
from daskvine_py.report.runinfo import RunInfo
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps

pytestmark = pytest.mark.timeout(120)

STATE_KEYS = {
    "dependencies",
    "dependents",
    "waiting",
    "waiting_data",
    "ready",
    "running",
    "finished",
    "released",
    "cache",
}


def inc(x):
    return x + 1


def fail(x):
    raise ValueError(f"no {x}")


def graph():
    a = dask.delayed(inc)(1, dask_key_name="a")
    b = dask.delayed(inc)(a, dask_key_name="b")
    return dask.delayed(add)(a, b, dask_key_name="c")


class Recorder(Callback):
    """Every call, with what it was told, checked against what Dask promises."""

    def __init__(self, workers=()):
        super().__init__()
        self.workers = set(workers)
        self.calls: list[tuple] = []

    def _start(self, dsk):
        self.calls.append(("start", frozenset(dsk)))

    def _start_state(self, dsk, state):
        assert set(state) == STATE_KEYS
        assert state["finished"] == state["running"] == set()
        self.calls.append(("start_state", frozenset(state["ready"]), frozenset(state["waiting"])))

    def _pretask(self, key, dsk, state):
        assert key in dsk and key in state["running"] and key not in state["finished"]
        self.calls.append(("pretask", key))

    def _posttask(self, key, result, dsk, state, worker_id):
        assert key in state["finished"] and key not in state["running"]
        assert not self.workers or worker_id in self.workers
        self.calls.append(("posttask", key, result))

    def _finish(self, dsk, state, failed):
        leftover = {k: state[k] for k in ("ready", "waiting", "running") if state[k]}
        self.calls.append(("finish", failed, frozenset(state["finished"]), leftover))


def test_each_hook_is_called_as_dask_calls_it(shared_manager):
    recorder = Recorder(shared_manager.workers)
    with recorder:
        got = dask.compute(graph(), scheduler=shared_manager.get)
    assert got == dask.compute(graph(), scheduler="sync") == (5,)
    calls = recorder.calls
    assert calls[0] == ("start", frozenset("abc"))
    assert calls[1] == ("start_state", frozenset("a"), frozenset("bc"))
    assert calls[-1] == ("finish", False, frozenset("abc"), {})
    for key in "abc":
        (pre,) = [i for i, call in enumerate(calls) if call == ("pretask", key)]
        (post,) = [i for i, call in enumerate(calls) if call[:2] == ("posttask", key)]
        assert pre < post
    # The output's result comes along; results that stayed on their worker may not.
    assert [call[2] for call in calls if call[:2] == ("posttask", "c")] == [5]
    assert not Callback.active


def test_finish_hears_of_a_failure_and_the_error_still_reaches_the_caller(shared_manager):
    recorder = Recorder()
    x = dask.delayed(fail)(dask.delayed(inc)(1, dask_key_name="one"), dask_key_name="bad")
    with recorder, pytest.raises(ValueError, match="no 2"):
        dask.compute(x, scheduler=shared_manager.get)
    assert recorder.calls[-1][:2] == ("finish", True)


def test_a_callback_that_raises_stops_the_run_with_its_error(shared_manager):
    def pretask(key, dsk, state):
        raise RuntimeError(f"stop at {key}")

    with Callback(pretask=pretask), pytest.raises(RuntimeError, match="stop at"):
        dask.compute(graph(), scheduler=shared_manager.get)
    assert dask.compute(graph(), scheduler=shared_manager.get) == (5,)  # the manager goes on


def test_callbacks_passed_to_compute_are_called_and_the_registered_ones_are_not(
    shared_manager,
):
    passed, as_tuple, registered = Recorder(), Recorder(), Recorder()
    with registered:
        result = dask.compute(
            graph(), scheduler=shared_manager.get, callbacks=[passed, as_tuple._callback]
        )
    assert result == dask.compute(graph(), scheduler="sync")
    assert passed.calls[-1][:2] == as_tuple.calls[-1][:2] == ("finish", False)
    assert registered.calls == []


def test_progress_bar_draws_to_completion(shared_manager):
    out = io.StringIO()
    x = da.arange(1000, chunks=50).sum()
    with ProgressBar(out=out):
        got = dask.compute(x, scheduler=shared_manager.get)
    assert got == dask.compute(x, scheduler="sync")
    assert "[########################################] | 100% Completed" in out.getvalue()


def test_profiler_records_each_task_with_its_times_and_worker(shared_manager):
    x = da.arange(400, chunks=40)
    y = (x * 2 + 1).sum()
    with Profiler() as profiler:
        got = dask.compute(y, scheduler=shared_manager.get)
    assert got == dask.compute(y, scheduler="sync")
    results = profiler.results
    assert {r.key for r in results} == set(profiler._dsk)
    assert all(r.start_time <= r.end_time for r in results)
    assert {r.worker_id for r in results} <= set(shared_manager.workers)
    assert len(results) == len(profiler._dsk) > 10


def test_resource_profiler_samples_this_process_and_the_local_workers(shared_manager):
    x = da.random.default_rng(0).random((400, 400), chunks=100)
    y = (x @ x.T).sum()
    with ResourceProfiler(dt=0.01) as profiler:
        (got,) = dask.compute(y, scheduler=shared_manager.get)
    assert got == pytest.approx(dask.compute(y, scheduler="sync")[0])
    assert profiler.results and all(r.mem > 0 and r.cpu >= 0 for r in profiler.results)
    # Registered instead of entered: started and stopped by the run itself.
    profiler = ResourceProfiler(dt=0.01)
    profiler.register()
    try:
        dask.compute(y, scheduler=shared_manager.get)
    finally:
        profiler.unregister()
        profiler.close()
    assert profiler.results


def test_cache_profiler_sees_results_made_and_released(shared_manager):
    x = da.arange(100, chunks=10)
    y = (x + 1).sum()
    with CacheProfiler() as profiler:
        got = dask.compute(y, scheduler=shared_manager.get)
    assert got == dask.compute(y, scheduler="sync")
    assert profiler.results
    assert all(r.cache_time <= r.free_time for r in profiler.results)


# -- the caller's side, fed by hand --------------------------------------------------------


def test_the_state_follows_what_the_manager_hears():
    plan = build_plan({"a": (inc, 1), "b": (inc, "a"), "c": (add, "a", "b")}, ["c"])
    recorder = Recorder()
    hooks = callbacks.take([recorder])
    try:
        run = Run(1)
        hooks.start(plan, run)
        state = hooks.state
        hooks.dispatched("a", "w1")
        hooks.dispatched("b", "w1")  # sent ahead of "a": it leaves "waiting" at once
        assert state["running"] == {"a", "b"} and state["waiting"] == {"c": {"a", "b"}}
        hooks.finished("a", "w1", p.TaskCrashed(1, "library died"))  # it will run again
        assert state["ready"] == {"a"} and state["running"] == {"b"}
        hooks.dispatched("a", "w2")
        hooks.finished("a", "w2", p.TaskDone(1, 8, 0.1, dumps(2)))
        hooks.finished("b", "w1", p.TaskDone(2, 8, 0.1, None))
        assert state["ready"] == {"c"} and state["waiting"] == {}
        assert state["cache"] == {"a": 2}
        hooks.dispatched("c", "w1")
        hooks.finished("c", "w1", p.TaskDone(3, 8, 0.1, dumps(5)))
        assert state["released"] == {"a", "b"} and state["cache"] == {"c": 5}
        assert hooks.values == {"c": 5}
        hooks.finish(failed=False)
    finally:
        hooks.release()
    assert [c[:2] for c in recorder.calls if c[0] in ("pretask", "posttask")] == [
        ("pretask", "a"),
        ("pretask", "b"),
        ("pretask", "a"),
        ("posttask", "a"),
        ("posttask", "b"),
        ("pretask", "c"),
        ("posttask", "c"),
    ]


def test_the_feed_carries_named_records_from_the_io_thread_to_the_callbacks():
    plan = build_plan({"a": (inc, 1), "b": (inc, "a"), "c": (add, "a", "b")}, ["c"])
    recorder = Recorder()
    hooks = callbacks.take([recorder])
    try:
        watching = Watching(lambda: (0, 0, 0))
        run = Run(1)
        run.info = RunInfo(1, {}, 2)
        hooks.start(plan, run)
        watching.start(run, True, [], now=0.0)
        watching.dispatched(s.Dispatched(1, 1, "a", "inc", "w1"), now=0.1)
        done = p.TaskDone(1, 8, 0.1, dumps(2))
        watching.task_finished(s.TaskFinished(1, "a", "w1", done), now=0.2)
        assert run.feed is not None
        sent, reported = run.feed.get_nowait(), run.feed.get_nowait()
        assert type(sent) is TaskSent and (sent.key, sent.worker) == ("a", "w1")
        assert type(reported) is TaskReported and (reported.key, reported.worker) == ("a", "w1")
        assert type(reported.report) is p.TaskDone
        run.feed.put(sent)
        run.feed.put(reported)
        watching.pop(1, now=0.3)  # ends the feed
        run.done.set()
        assert hooks.waiter(run).wait(timeout=5)
        hooks.finish(failed=False)
    finally:
        hooks.release()
    assert [c[:3] for c in recorder.calls if c[0] in ("pretask", "posttask")] == [
        ("pretask", "a"),
        ("posttask", "a", 2),
    ]


def test_dask_callback_tuples_are_read_by_name():
    hooks = (None, None, print, None, None)
    cb = callbacks.DaskCallback(hooks)
    assert cb.pretask is print and cb.start is cb.start_state is cb.posttask is cb.finish is None


def test_no_active_callback_takes_no_path_at_all():
    assert not Callback.active
    assert callbacks.take(None) is None
    assert callbacks.take([]) is None
    with Callback(pretask=lambda key, dsk, state: None) as registered:
        hooks = callbacks.take(None)
        assert hooks is not None and not Callback.active  # taken for the call, as Dask does
        hooks.release()
        assert Callback.active == {registered._callback}


def test_callbacks_and_the_progress_bar_of_get_go_together(shared_manager, capsys):
    recorder = Recorder(shared_manager.workers)
    x = da.arange(200, chunks=10).sum()
    with recorder:
        got = dask.compute(x, scheduler=shared_manager.get, progress=True)
    assert got == dask.compute(x, scheduler="sync")
    assert recorder.calls[-1][:2] == ("finish", False)
    assert sum(1 for call in recorder.calls if call[0] == "posttask") == len(recorder.calls[0][1])
    assert "daskvine_py" in capsys.readouterr().err  # tqdm's bar, on stderr
