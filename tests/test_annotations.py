"""Dask annotations with ``manager.get``: what reaches the scheduler from each graph form,
and each honoured annotation on real workers, every result compared with Dask's
synchronous scheduler."""

from __future__ import annotations

import os
import time

import dask
import dask.array as da
import dask.bag as db
import pytest

from beacon import Beacon, ping
from daskvine_py import Manager
from daskvine_py.errors import TaskFailed
from daskvine_py.plan import annotations as a

pytestmark = pytest.mark.timeout(120)


def handed(collection, **kwargs):
    """The graph object Dask hands a scheduler for ``collection``."""
    seen = []

    def scheduler(dsk, keys, **options):
        seen.append(dsk)
        return dask.get(dsk, keys)

    dask.compute(collection, scheduler=scheduler, **kwargs)
    return seen[0]


def inc(x):
    return x + 1


# -- what reaches the scheduler ------------------------------------------------------------


def test_delayed_annotations_reach_the_scheduler():
    with dask.annotate(priority=5, retries=2, resources={"cores": 2}, workers="w1", colour="red"):
        x = dask.delayed(inc)(1, dask_key_name="x")
    y = dask.delayed(inc)(x, dask_key_name="y")
    found = a.read(handed(y))
    priorities, settings = a.settle(found, {"x", "y"})
    assert priorities == {"x": 5}
    assert settings.retries == {"x": 2}
    assert settings.placements == {"x": a.Placement(cores=2, workers=frozenset({"w1"}))}


def test_array_annotations_arrive_without_low_level_fusion():
    ones = da.ones((4,), chunks=1)
    with dask.annotate(priority=lambda key: key[1]):  # one layer: Dask cannot fuse two callables
        x = ones + 1
    with dask.config.set({"optimization.fuse.active": False}):
        priorities, _ = a.settle(a.read(handed(x)), set(x.__dask_keys__()))
    assert priorities == {(x.name, i): i for i in range(4)}


def test_bag_annotations_arrive_without_graph_optimization():
    with dask.annotate(retries=4):
        b = db.from_sequence(range(4), npartitions=2).map(inc)
    _, settings = a.settle(a.read(handed(b, optimize_graph=False)), set(b.__dask_keys__()))
    assert set(settings.retries.values()) == {4} and len(settings.retries) == 2


def test_a_plain_graph_carries_no_annotations():
    assert a.read({"x": 1, "y": (inc, "x")}) == {}
    assert a.settle({}, {"x"}) == ({}, None)


def test_unknown_annotations_are_ignored():
    with dask.annotate(colour="red", owner="me"):
        x = dask.delayed(inc)(1, dask_key_name="x")
    assert a.settle(a.read(handed(x)), {"x"}) == ({}, None)


@pytest.mark.parametrize(
    ("annotation", "words"),
    [
        ({"priority": "high"}, "priority annotation must be a number"),
        ({"retries": -1}, "retries must be a whole number"),
        ({"resources": {"GPU": 1}}, "not 'GPU'"),
        ({"resources": {"cores": 0}}, "resources['cores'] must be a whole number >= 1"),
        ({"resources": {"memory": "lots"}}, "resources['memory'] annotation must be a number"),
        ({"workers": [3]}, "workers must be a worker name"),
        ({"workers": ["w1"], "allow_other_workers": "yes"}, "allow_other_workers must be"),
    ],
)
def test_an_annotation_that_means_nothing_here_is_an_error_naming_the_key(annotation, words):
    with pytest.raises(ValueError, match="task 'x'") as info:
        a.settle({name: {"x": value} for name, value in annotation.items()}, {"x"})
    assert words in str(info.value)


def test_user_priorities_go_first_and_dask_order_among_equals():
    order = {"a": 0, "b": 1, "c": 2, "d": 3}
    assert a.reprioritize(order, {"c": 10, "d": 10, "a": -1}) == {"c": 0, "d": 1, "b": 2, "a": 3}


# -- on real workers --------------------------------------------------------------------------


def record(directory, name, value, seconds=0.0):
    """Run for ``seconds``, noting where and when in ``directory``, in a file ``name`` (not
    a key of the graph: a string argument equal to a key would be read as that key)."""
    start = time.monotonic()
    time.sleep(seconds)
    if directory is not None:
        with open(os.path.join(directory, name), "w") as f:
            f.write(f"{os.getppid()} {start} {time.monotonic()}")
    return value * 2


def diary(directory):
    """key -> (worker pid, start, end) of the tasks that wrote in ``directory``."""
    out = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            pid, start, end = f.read().split()
        out[name] = (int(pid), float(start), float(end))
    return out


@pytest.fixture(scope="module")
def sized():
    """local-0: one core and 300 MB; local-1: two cores (two one-core libraries) and
    3000 MB; local-2: one two-core library of two slots, and 3000 MB."""
    with Manager() as manager:
        manager.start_workers(1, cores=1, memory=300)
        manager.start_workers(1, cores=2, memory=3000)
        manager.start_workers(1, cores=2, memory=3000, lib_resources={"cores": 2, "slots": 2})
        pids = {name: info["pid"] for name, info in manager.workers.items()}
        yield manager, pids


@pytest.mark.integration
def test_priority_orders_ready_tasks_higher_first():
    def graph(address):
        tasks = []
        for i, priority in enumerate([3, -1, 7, 0, 5, 10, 2]):
            with dask.annotate(priority=priority):
                tasks.append(dask.delayed(ping_and_double)(address, i, dask_key_name=f"t{i}"))
        return dask.delayed(sum)(tasks, dask_key_name="total")

    # One worker with one slot and nothing queued beyond it: the order tasks are sent in is
    # the order they run in.
    with Manager(fixed_extra_tasks_per_core=0) as manager, Beacon() as beacon:
        manager.start_workers(1, cores=1)
        (result,) = dask.compute(graph(beacon.address), scheduler=manager.get)
        order = [int(m) for m in beacon.wait(7)]
    assert result == dask.compute(graph(None), scheduler="sync")[0]
    assert order == [5, 2, 4, 0, 6, 3, 1]  # priorities 10, 7, 5, 3, 2, 0, -1


def ping_and_double(address, i):
    if address is not None:
        ping(address, str(i).encode())
    return 2 * i


@pytest.mark.integration
def test_annotated_retries_override_get_retries(sized, tmp_path):
    manager, _ = sized

    def graph(crashes, retries):
        with dask.annotate(retries=retries):
            x = dask.delayed(crash_then_double)(str(tmp_path / "count"), crashes, 21)
        return x

    # Two crashes, allowed by the annotation although the call allows none.
    (result,) = dask.compute(graph(2, 2), scheduler=manager.get, retries=0)
    assert result == dask.compute(graph(0, 2), scheduler="sync")[0] == 42
    # One crash, allowed by the call but not by the annotation.
    (tmp_path / "count").unlink()
    with pytest.raises(TaskFailed, match="1 attempt\\)"):
        dask.compute(graph(1, 0), scheduler=manager.get, retries=5)


def crash_then_double(path, crashes, x):
    attempts = int(open(path).read()) if os.path.exists(path) else 0
    if attempts < crashes:
        with open(path, "w") as f:
            f.write(str(attempts + 1))
        os._exit(1)  # kills the library process: a crash, as a segfault would be
    return 2 * x


def test_resources_gate_placement_and_a_big_task_runs_alone(sized, tmp_path):
    manager, pids = sized

    def graph(directory):
        run = dask.delayed(record)
        parts = [
            run(directory, f"small-{i}", i, 0.05, dask_key_name=f"task-small-{i}")
            for i in range(12)
        ]
        with dask.annotate(resources={"cores": 2}):
            parts += [
                run(directory, f"big-{i}", i, 0.2, dask_key_name=f"task-big-{i}") for i in range(3)
            ]
        with dask.annotate(resources={"memory": 1000}):
            parts += [dask.delayed(record)(directory, "mem", 7, dask_key_name="task-mem")]
        return dask.delayed(sum)(parts)

    (result,) = dask.compute(graph(str(tmp_path)), scheduler=manager.get)
    assert result == dask.compute(graph(None), scheduler="sync")[0]
    ran = diary(tmp_path)
    # Only the two-slot workers (two libraries, or one library of two slots) have room
    # for a big task, and 1000 MB to spare.
    two_slots = {pids["local-1"], pids["local-2"]}
    assert {ran[f"big-{i}"][0] for i in range(3)} <= two_slots
    assert ran["mem"][0] in two_slots
    # Whatever ran on a big task's worker while it ran there overlaps it in time: there
    # must be nothing of the kind.
    for i in range(3):
        worker, start, end = ran[f"big-{i}"]
        beside = [
            k
            for k, (pid, s, e) in ran.items()
            if pid == worker and k != f"big-{i}" and s < end and e > start
        ]
        assert beside == [], (f"big-{i}", beside)


def test_workers_restrict_placement(sized, tmp_path):
    manager, pids = sized

    def graph(directory):
        with dask.annotate(workers=["local-0"]):
            pinned = [
                dask.delayed(record)(directory, f"p{i}", i, dask_key_name=f"task-p{i}")
                for i in range(6)
            ]
        with dask.annotate(workers=["nobody"], allow_other_workers=True):
            loose = dask.delayed(record)(None, "loose", 5, dask_key_name="task-loose")
        return dask.delayed(sum)([*pinned, loose])

    (result,) = dask.compute(graph(str(tmp_path)), scheduler=manager.get)
    assert result == dask.compute(graph(None), scheduler="sync")[0]
    assert {pid for pid, _, _ in diary(tmp_path).values()} == {pids["local-0"]}


def test_a_restriction_to_absent_workers_is_an_error_naming_them(sized):
    manager, _ = sized
    with dask.annotate(workers=["nobody"]):
        x = dask.delayed(inc)(1, dask_key_name="stranded")
    with pytest.raises(TaskFailed, match=r"'stranded'.*workers \['nobody'\]"):
        dask.compute(x, scheduler=manager.get)


def test_a_task_no_worker_can_hold_is_an_error_naming_the_key_and_the_ask(sized):
    manager, _ = sized
    with dask.annotate(resources={"cores": 4}):
        x = dask.delayed(inc)(1, dask_key_name="huge")
    y = dask.delayed(inc)(x, dask_key_name="after")
    with pytest.raises(TaskFailed, match=r"'huge'.*4 cores.*local-1 \(2 cores"):
        dask.compute(y, scheduler=manager.get)
    with dask.annotate(resources={"memory": 10_000}):
        z = dask.delayed(inc)(1, dask_key_name="greedy")
    with pytest.raises(TaskFailed, match=r"'greedy'.*10000 MB of memory"):
        dask.compute(z, scheduler=manager.get)


def test_a_resource_workers_do_not_offer_is_an_error_before_anything_runs(sized):
    manager, _ = sized
    with dask.annotate(resources={"GPU": 1}):
        x = dask.delayed(inc)(1, dask_key_name="gpu-task")
    with pytest.raises(ValueError, match=r"'gpu-task'.*not 'GPU'"):
        dask.compute(x, scheduler=manager.get)


def test_annotated_arrays_compute_the_same_as_sync(sized):
    manager, _ = sized
    with dask.annotate(priority=3, resources={"cores": 2}, retries=1):
        x = da.arange(40, chunks=5) * 3
    y = (x + 1).sum()
    with dask.config.set({"optimization.fuse.active": False}):
        assert dask.compute(y, scheduler=manager.get) == dask.compute(y, scheduler="sync")
