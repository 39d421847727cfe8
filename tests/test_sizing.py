"""Sizing categories in the scheduler state: literal events in, instructions out (what
each task is allotted, where it fits, what a task that ran out gets next)."""

from __future__ import annotations

import sys
import threading

import dask
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py import Manager, ResourceExhausted, config
from daskvine_py.plan.annotations import MB, Placement, RunSettings, settle
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.category_size import FLOOR, MARGIN, Size
from daskvine_py.scheduler.sizing import GROWTH
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from keyed import KeyedWorker
from test_state import SimulatedCluster, expected_value, random_graphs

W1, W2 = b"w1", b"w2"


def joined(worker: bytes, cores: int = 4, memory_mb: int = 1000) -> s.WorkerJoined:
    name = worker.decode()
    return s.WorkerJoined(worker, name, cores, f"tcp://{name}", memory_mb * MB, f"host-{name}")


def run_of(keys, prefix="load", run_id=1, retries=3, settings=None) -> s.SubmitRun:
    tasks = [s.NewTask(k, b"", (), (), i, prefix=prefix) for i, k in enumerate(keys)]
    return s.SubmitRun(run_id, tasks, list(keys), retries, settings=settings)


def executes(out) -> list[tuple[bytes, p.Execute]]:
    return [
        (i.worker, i.message) for i in out if type(i) is s.Send and type(i.message) is p.Execute
    ]


def done(worker: bytes, task_id: int, peak_mb: float) -> s.FromWorker:
    return s.FromWorker(
        worker, p.TaskDone(task_id, 8, 0.5, dumps(0), 0.0, 0.0, 0.1, int(peak_mb * MB))
    )


def exhausted(
    worker: bytes, task_id: int, peak_mb: float, limit: int, resource: str = "memory"
) -> s.FromWorker:
    return s.FromWorker(worker, p.TaskExhausted(task_id, resource, int(peak_mb * MB), limit))


def test_a_category_runs_one_unmeasured_task_per_worker_then_is_sized_from_its_first():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1), run_of([f"t{i}" for i in range(6)])])
    (first,) = executes(out)
    assert first[1].memory == 0 and first[1].cores == 1  # generous while unmeasured
    out = st_.handle([done(W1, first[1].task_id, 100)])
    sent = executes(out)
    allocation = int(100 * MB * MARGIN)
    # 1000 MB hold 7 tasks of 125 MB; 4 cores take 4 of the 5 left.
    assert [e.memory for _, e in sent] == [allocation] * 4
    assert st_.ctx.sizing.sizes["load"].allocation == allocation


def test_a_worker_holds_tasks_only_while_their_allocations_fit_its_memory():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, cores=4, memory_mb=1000), run_of([f"t{i}" for i in range(8)])])
    (first,) = executes(out)
    out = st_.handle([done(W1, first[1].task_id, 300)])  # 375 MB each: two fit in 1000
    assert len(executes(out)) == 2
    held = sum(t.memory for t in st_.workers[W1].processing)
    assert held <= 1000 * MB
    # One ends: one more starts, never three at once.
    some = next(iter(st_.workers[W1].processing))
    out = st_.handle([done(W1, some.id, 300)])
    assert len(executes(out)) == 1 and len(st_.workers[W1].processing) == 2


def test_a_task_sent_unmeasured_holds_its_categorys_allocation_once_that_is_known():
    # Its worker lets it take what the others leave: the others must leave it that much.
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1), joined(W2), run_of([f"t{i}" for i in range(8)])])
    firsts = dict(executes(out))
    assert set(firsts) == {W1, W2} and all(e.memory == 0 for e in firsts.values())
    out = st_.handle([done(W2, firsts[W2].task_id, 300)])  # 375 MB each from now on
    out += st_.handle([s.FromWorker(W1, p.Started((firsts[W1].task_id,)))])
    on_w1 = [e for w, e in executes(out) if w == W1]
    # W1 runs the unmeasured one (375 MB now) and one more: three would pass 1000 MB.
    assert [e.memory for e in on_w1] == [375 * MB]
    assert sum(t.allotted() for t in st_.workers[W1].processing) <= 1000 * MB


def test_small_tasks_fill_the_cores_that_large_ones_leave_idle():
    tasks = [s.NewTask(f"big{i}", b"", (), (), i, prefix="big") for i in range(6)]
    tasks += [s.NewTask(f"small{i}", b"", (), (), 6 + i, prefix="small") for i in range(6)]
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle(
        [joined(W1, cores=4, memory_mb=1000), s.SubmitRun(1, tasks, [t.key for t in tasks], 3)]
    )
    # Unmeasured: one of each category, the second found past the other big ones.
    assert sorted(e.key for _, e in executes(out)) == ["big0", "small0"]
    out = st_.handle(
        [done(W1, st_.runs[1].tasks["big0"].id, 300), done(W1, st_.runs[1].tasks["small0"].id, 1)]
    )
    sent = {e.key: e.memory for _, e in executes(out)}
    # Two big ones (375 MB each) fit, a third would not; small ones take the other cores.
    assert sent == {"big1": 375 * MB, "big2": 375 * MB, "small1": FLOOR, "small2": FLOOR}
    assert st_.runs[1].tasks["big3"].state == "ready"  # passed over: queued again
    out = st_.handle([done(W1, st_.runs[1].tasks["big1"].id, 300)])
    assert [e.key for _, e in executes(out)] == ["big3"]  # first in line again


def test_an_allocation_above_every_worker_is_capped_to_the_largest():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W2, memory_mb=400), run_of([f"t{i}" for i in range(4)])])
    first = executes(out)[0]
    out = st_.handle([done(W2, first[1].task_id, 1000)])  # 1250 MB: no worker has it
    assert [(w, e.memory) for w, e in executes(out)] == [(W2, 400 * MB)]
    assert executes(st_.handle([joined(W1, memory_mb=100)])) == []  # too small for one


def test_fixed_mode_allots_only_annotations_and_runs_unmeasured_tasks_freely():
    two = Placement(cores=2, memory=200 * MB)
    settings = RunSettings({}, {"big": two}, {two: "big"})
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="fixed")
    out = st_.handle([joined(W1), run_of(["big", "a", "b"], settings=settings)])
    allotted = {e.key: (e.cores, e.memory) for _, e in executes(out)}
    assert allotted == {"big": (2, 200 * MB), "a": (1, 0), "b": (1, 0)}


def test_modes_are_set_per_category_and_a_category_annotation_names_it():
    settings = RunSettings({}, {}, {}, {"x": "hungry", "y": "hungry"})
    st_ = s.SchedulerState(
        fixed_extra_tasks_per_core=0, sizing="max", sizing_categories={"hungry": "fixed"}
    )
    out = st_.handle([joined(W1), run_of(["x", "y", "z"], settings=settings)])
    # "hungry" is fixed: both go at once; "load" (z's prefix) is unmeasured: one.
    assert sorted(e.key for _, e in executes(out)) == ["x", "y", "z"]
    sizes = st_.ctx.sizing.sizes
    assert sizes["hungry"].mode == "fixed" and sizes["load"].mode == "max"


def test_a_category_annotation_is_read_per_task_and_checked():
    _, settings = settle({"category": {"a": "hungry", "b": None, "c": "hungry"}}, {"a", "b"})
    assert settings is not None and dict(settings.categories) == {"a": "hungry"}
    with pytest.raises(ValueError, match="'a': category must be a non-empty string"):
        settle({"category": {"a": 3}}, {"a"})
    with pytest.raises(ValueError, match="sizing must be one of"):
        Manager(sizing="largest")
    with pytest.raises(ValueError, match="sizing_categories"):
        Manager(sizing_categories={"load": "most"})
    with dask.config.set(
        {
            "daskvine_py.manager.sizing": "min-waste",
            "daskvine_py.manager.sizing_categories": {"load": "fixed"},
        }
    ):
        options = config.manager_options(None, None, {})
    assert options.sizing == "min-waste" and options.sizing_categories == {"load": "fixed"}


def test_a_task_that_ran_out_is_retried_with_more_and_the_categories_count_it():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, memory_mb=1000), run_of(["a", "b"])])
    (first,) = executes(out)
    out = st_.handle([done(W1, first[1].task_id, 100)])
    ((_, second),) = executes(out)
    assert second.memory == int(100 * MB * MARGIN)
    out = st_.handle([exhausted(W1, second.task_id, 130, second.memory)])
    ((_, again),) = executes(out)
    assert again.task_id == second.task_id
    assert again.memory == int(int(130 * MB) * GROWTH)  # what it used, and more: not all
    assert st_.tasks[second.task_id].attempts == 1
    out = st_.handle([done(W1, again.task_id, 130)])
    (finished,) = [i for i in out if type(i) is s.RunDone]
    category = finished.categories["load"]
    assert category.exhausted == 1 and category.tasks == 2
    assert category.allocated_memory_mb == pytest.approx(again.memory / MB)
    assert st_.ctx.sizing.sizes["load"].exhausted == 1


def test_a_retry_gets_at_least_the_largest_its_category_was_seen_to_need():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="min-waste")
    out = st_.handle([joined(W1, cores=1, memory_mb=4000), run_of([f"t{i}" for i in range(5)])])
    for peak in (70, 500):
        ((_, e),) = executes(out)
        out = st_.handle([done(W1, e.task_id, peak)])
    ((_, small),) = executes(out)  # one in two fit in ~70 MB: min-waste allots that
    assert 70 * MB <= small.memory < 80 * MB
    out = st_.handle([exhausted(W1, small.task_id, 75, small.memory)])
    ((_, again),) = executes(out)
    assert again.task_id == small.task_id and again.memory == int(500 * MB * MARGIN)


def test_a_task_that_ran_out_of_the_largest_worker_fails_its_run_naming_it():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, memory_mb=500), run_of(["a"])])
    ((_, first),) = executes(out)
    assert first.memory == 0
    out = st_.handle([exhausted(W1, first.task_id, 510, 0)])  # its whole worker, still not enough
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    error = failed.error
    assert isinstance(error, ResourceExhausted) and error.key == "a"
    assert "510.0 MB" in str(error) and "load" in str(error) and "w1" in str(error)
    assert failed.categories["load"].exhausted == 1
    assert not st_.runs and not st_.workers[W1].processing


def test_a_task_out_of_retries_fails_with_resource_exhausted():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, memory_mb=4000), run_of(["a", "b"], retries=1)])
    (first,) = executes(out)
    out = st_.handle([done(W1, first[1].task_id, 10)])
    ((_, e),) = executes(out)
    out = st_.handle([exhausted(W1, e.task_id, 20, e.memory)])
    ((_, e),) = executes(out)
    out = st_.handle([exhausted(W1, e.task_id, 40, e.memory)])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert isinstance(failed.error, ResourceExhausted) and failed.error.attempts == 2
    assert f"{e.memory / MB:.1f} MB" in str(failed.error)


def test_a_task_stopped_for_its_workers_budget_runs_again_with_an_allocation_never_failing():
    """Issue 38: a task of no allocation stopped because the libraries together went past
    the budget (3 MB of its own) failed its run with ``ResourceExhausted`` at once. Such a
    stop uses no retry; the task runs again with an allocation of its own."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, memory_mb=1500), run_of(["small"], retries=0)])
    ((_, first),) = executes(out)
    assert first.memory == 0  # unmeasured: of no allocation
    for _ in range(3):  # never fatal, however often (each try is one of no fault)
        out = st_.handle([exhausted(W1, first.task_id, 3, 0, resource="budget")])
        assert not [i for i in out if type(i) in (s.RunFailed, s.RunAborted)]
        ((_, again),) = executes(out)
        assert again.task_id == first.task_id and again.memory == FLOOR
        assert st_.tasks[first.task_id].attempts == 0
    out = st_.handle([done(W1, again.task_id, 3)])
    (finished,) = [i for i in out if type(i) is s.RunDone]
    assert finished.categories["load"].exhausted == 0  # its own use never ran out


def test_a_stale_exhausted_report_changes_nothing():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    st_.handle([joined(W1), joined(W2), run_of(["a"])])
    task = st_.runs[1].tasks["a"]
    other = W2 if task.worker.id == W1 else W1
    out = st_.handle([exhausted(other, task.id, 10, 0)])
    assert not [i for i in out if type(i) in (s.RunFailed, s.Send)]
    assert task.state == "processing" and task.attempts == 0


def test_min_waste_and_max_throughput_pick_an_allocation_from_the_peaks_seen():
    # Most tasks use ~50 MB; one in ten uses 1000 MB.
    sizes = {mode: Size("x", mode) for mode in ("max", "min-waste", "max-throughput")}
    for size in sizes.values():
        for i in range(100):
            size.measure((1000 if i % 10 == 0 else 50) * MB, 1.0)
    top = int(1000 * MB * MARGIN)
    assert sizes["max"].allocation == top
    for mode in ("min-waste", "max-throughput"):
        allocation = sizes[mode].allocation
        assert 50 * MB <= allocation < 100 * MB, (mode, allocation / MB)
    # All alike: nothing below the largest pays.
    alike = Size("y", "min-waste")
    for _ in range(20):
        alike.measure(300 * MB, 1.0)
    assert 300 * MB <= alike.allocation <= top
    assert Size("z", "max").allocation == 0
    tiny = Size("t", "max")
    tiny.measure(0, 0.0)
    assert tiny.allocation == FLOOR


def test_a_worker_without_a_memory_figure_is_not_sized():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, sizing="max")
    out = st_.handle([joined(W1, memory_mb=0), run_of([f"t{i}" for i in range(4)])])
    assert [e.memory for _, e in executes(out)] == [0, 0, 0, 0]


class SizedCluster(SimulatedCluster):
    """The simulated cluster on workers of 100 MB, with tasks whose peaks depend on their
    kind (``t3`` and ``t13`` alike: 27 MB), some stopped past their allocation now and then."""

    def __init__(self, seed: int, mode: str) -> None:
        super().__init__(seed)
        self.state = s.SchedulerState(sizing=mode)
        self.allotted: dict[int, int] = {}
        self.stopped = 0

    def join(self, name: bytes) -> None:
        self.stores[name] = {}
        self.queued[name] = []
        self.apply([s.WorkerJoined(name, name.decode(), 2, name.decode(), 100 * MB)])

    def deliver(self, worker, message):
        if type(message) is p.Execute:
            self.allotted[message.task_id] = message.memory
        super().deliver(worker, message)

    def apply(self, events):
        changed = []
        for event in events:
            if type(event) is s.FromWorker and type(event.message) is p.TaskDone:
                msg = event.message
                task = self.state.tasks.get(msg.task_id)
                peak = int(task.prefix[-1]) * 9 * MB if task is not None else 0
                limit = self.allotted.get(msg.task_id, 0)
                if limit and (peak > limit or self.rng.random() < 0.05):
                    self.stores[event.worker].pop(msg.task_id, None)  # stopped: nothing kept
                    self.stopped += 1
                    over = max(peak, limit + MB)
                    event = s.FromWorker(
                        event.worker, p.TaskExhausted(msg.task_id, "memory", over, limit)
                    )
                else:
                    event = s.FromWorker(event.worker, msg._replace(peak_memory=peak))
            changed.append(event)
        super().apply(changed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=3),
    seed=st.integers(0, 10**6),
    mode=st.sampled_from(["max", "min-waste", "max-throughput", "fixed"]),
)
def test_random_graphs_with_sizing_and_stopped_tasks_end_right(graphs, seed, mode):
    cluster = SizedCluster(seed, mode)
    cluster.join(b"w0")
    cluster.join(b"w1")
    runs = {}
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i, prefix=f"t{k[-1]}") for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 100)])
        runs[run_id] = (deps, outputs)

    def idle():
        return not any(cluster.queued.values()) and not cluster.pending

    cluster.run_until(idle, 0, iter(()))
    stopped = sum(size.exhausted for size in cluster.state.ctx.sizing.sizes.values())
    assert stopped <= cluster.stopped  # (a report about a task no longer held counts nowhere)
    for run_id, (deps, outputs) in runs.items():
        ended = cluster.done.get(run_id)
        assert ended is not None, cluster.done
        if ended == "done":
            assert cluster.outputs.get(run_id, {}) == {k: expected_value(k, deps) for k in outputs}
        else:
            assert "ran out of memory" in ended, ended
    assert not cluster.state.tasks and not cluster.state.runs
    assert all(not w.processing for w in cluster.state.workers.values())
    assert cluster.state.ctx.sizing.largest == 0  # (no run left: the bound starts again)


# -- with workers --------------------------------------------------------------------------

HUNGRY_MB = 150


def hungry(i: int) -> int:
    block = bytearray(HUNGRY_MB * MB)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))  # every page resident
    return i + block[4096]


def tiny(i: int) -> int:
    return i + 1


def total(*parts: int) -> int:
    return sum(parts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peaks are read from VmHWM")
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_categories_are_sized_from_their_measured_tasks_across_runs():
    dsk: dict = {("hungry", i): (hungry, i) for i in range(4)}
    dsk.update({("tiny", i): (tiny, i) for i in range(8)})
    dsk["total"] = (total, *list(dsk))
    with Manager() as manager:
        manager.start_workers(2, cores=2, memory=1000)
        first = manager.get(dsk, "total")
        measured = dict(manager.last_run.categories)
        again = manager.get(dsk, "total")  # every category sized from the first run
        sized = dict(manager.last_run.categories)
    assert first == again == dask.get(dsk, "total")
    assert measured["hungry"].peak_memory_mb >= HUNGRY_MB - 10
    # The second run's hungry tasks each had the largest peak seen, and a margin.
    allotted = sized["hungry"].allocated_memory_mb
    largest = max(measured["hungry"].peak_memory_mb, sized["hungry"].peak_memory_mb)
    assert measured["hungry"].peak_memory_mb * MARGIN * 0.99 <= allotted
    assert allotted <= largest * MARGIN * 1.01
    assert sized["tiny"].allocated_memory_mb >= FLOOR / MB
    assert all(c.exhausted == 0 for c in (*measured.values(), *sized.values()))


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_task_that_ran_out_of_its_whole_worker_fails_get_with_resource_exhausted():
    dsk = {("hungry", 0): (tiny, 1)}
    failure: list[BaseException] = []

    def run(manager: Manager) -> None:
        try:
            manager.get(dsk, ("hungry", 0))
        except BaseException as exc:
            failure.append(exc)

    with Manager() as manager, KeyedWorker(manager, cores=1) as worker:
        caller = threading.Thread(target=run, args=(manager,))
        caller.start()
        (execute,) = worker.receive(p.Execute, 1)
        assert execute.memory == 0 and execute.cores == 1  # its whole worker's budget
        worker.send(p.TaskExhausted(execute.task_id, "memory", 700 * MB, 0))
        caller.join(30)
        assert not caller.is_alive()
    (error,) = failure
    assert isinstance(error, ResourceExhausted) and error.key == ("hungry", 0)
    assert "700.0 MB" in str(error) and "hungry" in str(error) and error.worker == "liar"
