"""Issue 17: the content-addressed result cache, on real workers. Every result is compared
with Dask's synchronous scheduler; ``last_run.cache["tasks_run"]`` says what ran."""

from __future__ import annotations

import os
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from dask import delayed

from daskvine_py import Manager, uncached

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cached():
    with Manager(cache=True) as manager:
        manager.start_workers(2, cores=1)
        yield manager


@pytest.fixture
def m(cached):
    cached.cache.clear()
    return cached


def dynamic(source: str, name: str):
    """A function defined at run time, as in a notebook: pickled by value."""
    namespace: dict = {"__name__": "notebook_cell"}
    exec(source, namespace)
    return namespace[name]


def pipeline(load, select, fill, n=6, final=sum):
    """n chunks: load -> select -> fill, then one sum: 3n + 1 tasks."""
    parts = [delayed(fill)(delayed(select)(delayed(load)(i))) for i in range(n)]
    return delayed(final)(parts)


LOAD = "def load(i):\n    return list(range(i * 10, i * 10 + 10))\n"
SELECT = "def select(xs):\n    return [x for x in xs if x % 2 == 0]\n"
FILL = "def fill(xs):\n    return sum(x * x for x in xs)\n"
STAGES = (dynamic(LOAD, "load"), dynamic(SELECT, "select"), dynamic(FILL, "fill"))


def ran(manager) -> int:
    return manager.last_run.cache["tasks_run"]


def test_rerunning_an_unchanged_graph_runs_nothing(m):
    first = pipeline(*STAGES)
    (got,) = dask.compute(first, scheduler=m.get)
    assert got == dask.compute(first, scheduler="sync")[0]
    assert ran(m) == 19 and m.last_run.cache["hits"] == 0
    again = pipeline(*STAGES)  # rebuilt: dask.delayed names every call anew
    (got,) = dask.compute(again, scheduler=m.get)
    assert got == dask.compute(again, scheduler="sync")[0]
    assert ran(m) == 0 and m.last_run.cache["hits"] == 19
    assert m.last_run.cache["seconds_saved"] > 0 and m.last_run.cache["bytes_reused"] > 0


def test_changing_a_functions_code_reruns_it_and_its_dependents_only(m):
    dask.compute(pipeline(*STAGES), scheduler=m.get)
    fill = dynamic(FILL.replace("x * x", "x * x * x"), "fill")
    changed = pipeline(STAGES[0], STAGES[1], fill)
    (got,) = dask.compute(changed, scheduler=m.get)
    assert got == dask.compute(changed, scheduler="sync")[0]
    assert ran(m) == 7  # six fills and the sum read the cached selections


def test_changing_a_literal_argument_reruns_that_task_and_its_dependents(m):
    load, select, fill = STAGES
    dask.compute(pipeline(*STAGES), scheduler=m.get)
    parts = [delayed(fill)(delayed(select)(delayed(load)(i if i != 3 else 30))) for i in range(6)]
    changed = delayed(sum)(parts)
    (got,) = dask.compute(changed, scheduler=m.get)
    assert got == dask.compute(changed, scheduler="sync")[0]
    assert ran(m) == 4  # load(30), its select and fill, the sum


def count_lines(path):
    with open(path) as file:
        return len(file.readlines())


def test_touching_an_input_file_reruns_the_tasks_that_read_it(m, tmp_path):
    paths = [str(tmp_path / f"part{i}.txt") for i in range(4)]
    for path in paths:
        with open(path, "w") as file:
            file.write("a\nb\n")

    def graph():
        return delayed(sum)([delayed(count_lines)(path) for path in paths])

    assert dask.compute(graph(), scheduler=m.get) == (8,)
    # A file is keyed by its size and mtime (cache/keys.py, ``KeyMaker.file_of``): the
    # appended line changes its size, so its key changes even where the filesystem's clock
    # is too coarse to give it a later mtime (no sleep makes that sure on every one).
    with open(paths[2], "a") as file:
        file.write("c\n")
    assert dask.compute(graph(), scheduler=m.get) == dask.compute(graph(), scheduler="sync")
    assert ran(m) == 2  # count_lines of the touched file, and the sum


def test_an_array_pipeline_is_reused_and_a_changed_last_stage_reruns_alone(m):
    x = da.random.default_rng(42).random((600, 600), chunks=100)
    first = (x - x.mean(axis=0)).std(axis=0)
    got = first.compute(scheduler=m.get)
    assert np.allclose(got, first.compute(scheduler="sync"))
    total = ran(m)
    got = first.compute(scheduler=m.get)
    assert np.allclose(got, first.compute(scheduler="sync")) and ran(m) == 0
    last = (x - x.mean(axis=0)).var(axis=0)  # the centring is the same
    got = last.compute(scheduler=m.get)
    assert np.allclose(got, last.compute(scheduler="sync"))
    assert 0 < ran(m) < total


def test_tasks_under_annotate_cache_false_and_uncached_functions_always_run(m):
    load, select, fill = STAGES
    stamp = uncached(dynamic("def stamp(x):\n    return x\n", "stamp"))

    def graph():
        with dask.annotate(cache=False):
            loaded = delayed(load)(1)
        return delayed(fill)(delayed(select)(loaded)), delayed(stamp)(delayed(load)(2))

    for _ in range(2):
        got = dask.compute(*graph(), scheduler=m.get, optimize_graph=False)
        assert got == dask.compute(*graph(), scheduler="sync")
    # The annotated load and what reads it (select, fill), and the uncached stamp; the
    # second load is cached.
    assert ran(m) == 4 and m.last_run.cache["uncached"] == 4


def test_two_concurrent_gets_that_share_tasks_compute_each_once(m):
    results: list = [None, None]
    infos: list = [None, None]
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        results[i] = m.get(*as_dict(pipeline(*STAGES)))
        infos[i] = m.last_run  # (either run's: both are read below through their sum)

    def as_dict(value):
        graph = dict(value.__dask_graph__())
        return graph, value.key

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    expected = dask.compute(pipeline(*STAGES), scheduler="sync")[0]
    assert results == [expected, expected]
    # 19 tasks between them, whichever way the two plans met: the output at the manager.
    info = m.cache.info()
    assert info["workers"]["entries"] == 18 and info["manager"]["entries"] == 1


def test_killing_a_worker_between_runs_recomputes_only_what_it_held():
    with Manager(cache=True, heartbeat_interval=0.2, worker_timeout=3.0) as manager:
        procs = manager.start_workers(2, cores=1)
        graph = pipeline(*STAGES, n=8)
        dask.compute(graph, scheduler=manager.get)
        # Where results are: the manager's private records (nothing public shows it).
        holders = {
            t.key: {w.name for w in t.who_has}
            for t in manager._state.tasks.values()
            if t.run.id == 0
        }
        # The output is small: the manager holds it, no worker does.
        assert holders.pop(graph.key) == set()
        assert manager.cache.info()["manager"]["entries"] == 1
        held_by = {
            name: {k for k, names in holders.items() if names == {name}} for name in manager.workers
        }
        victim = max(held_by, key=lambda name: len(held_by[name]))
        lost = held_by[victim]
        assert lost
        dependencies = {k: set(dask.core.get_dependencies(graph.dask, k)) for k in graph.dask}

        def recomputed(key):  # what a rerun must compute again: lost, read by the lost
            if key not in lost:
                return set()
            return {key}.union(*(recomputed(dep) for dep in dependencies[key]))

        procs[int(victim.split("-")[1])].kill()
        deadline = time.monotonic() + 30
        while victim in manager.workers and time.monotonic() < deadline:
            time.sleep(0.01)
        # The unchanged graph is its cached output, whoever was lost.
        (got,) = dask.compute(pipeline(*STAGES, n=8), scheduler=manager.get)
        assert got == dask.compute(graph, scheduler="sync")[0] and ran(manager) == 0
        # A new last stage reads the fills: only the lost ones (and their lost inputs) run.
        changed = pipeline(*STAGES, n=8, final=max)
        (got,) = dask.compute(changed, scheduler=manager.get)
        assert got == dask.compute(changed, scheduler="sync")[0]
        again = set().union(*(recomputed(dep) for dep in dependencies[graph.key]))
        assert ran(manager) == 1 + len(again) > 1
        assert manager.last_run.cache["hits"] == 25 - ran(manager)


def test_a_restarted_manager_reuses_the_cache_directory_and_a_truncated_entry_misses(tmp_path):
    directory = tmp_path / "cache"
    load, select, fill = STAGES

    def chain():
        return delayed(fill)(delayed(select)(delayed(load)(5)))

    expected = dask.compute(chain(), scheduler="sync")
    with Manager(cache=True, cache_dir=directory) as manager:
        manager.start_workers(1, cores=1)
        assert dask.compute(chain(), scheduler=manager.get) == expected
        manager.cache.flush()
        assert manager.cache.info()["disk"][0]["entries"] == 3
    with Manager(cache=True, cache_dir=directory) as manager:
        manager.start_workers(1, cores=1)
        assert dask.compute(chain(), scheduler=manager.get) == expected
        assert ran(manager) == 0
        # The output's entry, written last, is cut short: it misses, and only its task
        # runs again (its input comes from the directory).
        files = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        newest = files[-1]
        with open(newest, "r+b") as file:
            file.truncate(newest.stat().st_size // 2)
        manager.cache.clear()  # (the workers' copies too: only the directory is left)
    with Manager(cache=True, cache_dir=directory) as manager:
        manager.start_workers(1, cores=1)
        assert not list(directory.iterdir())  # cleared
    with Manager(cache=True, cache_dir=directory) as manager:
        manager.start_workers(1, cores=1)
        assert dask.compute(chain(), scheduler=manager.get) == expected
        manager.cache.flush()
        files = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        with open(files[-1], "r+b") as file:
            file.truncate(files[-1].stat().st_size // 2)
    with Manager(cache=True, cache_dir=directory) as manager:
        manager.start_workers(1, cores=1)
        assert dask.compute(chain(), scheduler=manager.get) == expected
        assert ran(manager) == 1


def test_eviction_keeps_the_cache_directory_under_its_limit(tmp_path):
    directory = tmp_path / "cache"
    limit = 3 * 2**20
    with Manager(cache=True, cache_dir=directory, cache_dir_limit=limit) as manager:
        manager.start_workers(1, cores=1)
        x = da.ones((1000, 1000), chunks=(250, 1000)) * 2  # 2 MB chunks
        got = x.sum(axis=0).compute(scheduler=manager.get)
        assert np.array_equal(got, np.full(1000, 2000.0))
        manager.cache.flush()
        assert sum(p.stat().st_size for p in directory.iterdir()) <= limit
        assert manager.cache.info()["disk"][0]["bytes"] <= limit


def test_a_result_that_cannot_be_pickled_is_simply_not_kept_on_disk(tmp_path):
    make = dynamic("def make(n):\n    import threading\n    return threading.Lock()\n", "make")
    use = dynamic("def use(lock):\n    return type(lock).__name__\n", "use")
    with Manager(cache=True, cache_dir=tmp_path / "c") as manager:
        manager.start_workers(1, cores=1)
        graph = delayed(use)(delayed(make)(1))
        assert dask.compute(graph, scheduler=manager.get) == dask.compute(graph, scheduler="sync")
        manager.cache.flush()
        assert manager.cache.info()["disk"][0]["entries"] == 1  # the output only
        assert dask.compute(delayed(use)(delayed(make)(1)), scheduler=manager.get)[0] == "lock"
        assert ran(manager) == 0


def test_cache_off_by_default_and_per_get(shared_manager):
    graph = pipeline(*STAGES)
    dask.compute(graph, scheduler=shared_manager.get)
    assert shared_manager.last_run.cache is None
    assert not shared_manager.cache.info()["workers"]["entries"]
    with pytest.raises(ValueError, match="cache must be"):
        shared_manager.get({"x": 1}, "x", cache="yes")
    assert os.environ.get("DASKVINE_PY_NEVER") is None
