"""Task modes, exec modes, import hoisting and the environment of a task, on real workers.

Every mode must give what Dask's synchronous scheduler gives; every failure (a module
that does not import, a task that kills its process, a function that cannot be loaded on
the worker) must be a clear error that leaves the workers usable.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import time

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pandas as pd
import pytest

from daskvine_py import Manager, TaskFailed
from daskvine_py.errors import ImportHoistingError, WorkerImportError
from daskvine_py.manager.launch import spawn
from mode_tasks import getenv, hard_exit, inc, leave_behind, module_loaded, pid, segfault

pytestmark = pytest.mark.integration

#: (task_mode, exec_mode) of every way a task can run
MODES = [("function-calls", "direct"), ("function-calls", "fork"), ("tasks", "direct")]
MODE_IDS = ["direct", "fork", "tasks"]


@pytest.fixture(scope="module")
def modes_manager():
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        yield manager


def _collections():
    dd = pytest.importorskip("dask.dataframe")
    x = da.arange(40, chunks=20).reshape(4, 10)
    array = (x + x.T.sum(axis=0)[:4, None]).mean(axis=1)
    bag = db.from_sequence(range(30), npartitions=3).map(inc).filter(lambda v: v % 3).sum()
    pdf = pd.DataFrame({"k": np.arange(30) % 4, "v": np.arange(30.0)})
    frame = dd.from_pandas(pdf, npartitions=2).groupby("k").v.sum()
    parts = [dask.delayed(inc)(i) for i in range(4)]
    delayed = dask.delayed(sum)(parts)
    return {"array": array, "bag": bag, "dataframe": frame, "delayed": delayed}


@pytest.mark.timeout(300)  # tasks mode starts an interpreter (and imports) per task
@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_every_mode_matches_sync_on_collections(modes_manager, task_mode, exec_mode):
    for name, collection in _collections().items():
        got = collection.compute(
            scheduler=modes_manager.get, task_mode=task_mode, exec_mode=exec_mode
        )
        want = collection.compute(scheduler="sync")
        if name == "array":
            np.testing.assert_allclose(got, want)
        elif name == "dataframe":
            pd.testing.assert_series_equal(got.sort_index(), want.sort_index())
        else:
            assert got == want, name


def test_modes_run_where_they_say_and_do_not_stick(modes_manager):
    """fork and tasks run each task in a process of its own; the next get is back in the
    library processes, because options never stick to the manager."""
    dsk = {("p", i): (pid, i) for i in range(6)}
    keys = list(dsk)
    libraries = set(modes_manager.get(dsk, keys))
    assert len(libraries) <= 2
    for task_mode, exec_mode in MODES[1:]:
        pids = modes_manager.get(dsk, keys, task_mode=task_mode, exec_mode=exec_mode)
        assert len(set(pids)) == len(pids) and not set(pids) & libraries
    assert set(modes_manager.get(dsk, keys)) <= libraries


@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_env_vars_are_seen_by_the_task_and_not_by_the_next_run(modes_manager, task_mode, exec_mode):
    dsk = {("e", i): (getenv, "DASKVINE_TEST_VAR") for i in range(4)}
    keys = list(dsk)
    got = modes_manager.get(
        dsk,
        keys,
        task_mode=task_mode,
        exec_mode=exec_mode,
        env_vars={"DASKVINE_TEST_VAR": "on"},
    )
    assert got == ("on",) * 4
    assert modes_manager.get(dsk, keys) == (None,) * 4


@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_task_directory_is_the_cwd_and_temp_dir_and_is_removed(modes_manager, task_mode, exec_mode):
    dsk = {("t", i): (leave_behind, i) for i in range(3)}
    got = modes_manager.get(
        dsk, list(dsk), task_mode=task_mode, exec_mode=exec_mode, task_sandbox=True
    )
    cwds = [cwd for cwd, _ in got]
    assert len(set(cwds)) == 3  # one directory per task
    for cwd, temp in got:
        assert os.path.dirname(temp) == cwd
        assert not os.path.exists(cwd)  # removed after the task, with what it left


@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_hoisted_modules_are_imported_before_the_tasks(modes_manager, task_mode, exec_mode):
    dsk = {("m", i): (module_loaded, "wave") for i in range(4)}
    got = modes_manager.get(
        dsk, list(dsk), task_mode=task_mode, exec_mode=exec_mode, import_modules=["wave"]
    )
    assert got == (True,) * 4


@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_hoisting_a_missing_module_fails_the_run_clearly(modes_manager, task_mode, exec_mode):
    dsk = {("h", i): (inc, i) for i in range(4)}
    with pytest.raises(ImportHoistingError, match=r"'no_such_module_xyz' on worker local-"):
        modes_manager.get(
            dsk,
            list(dsk),
            task_mode=task_mode,
            exec_mode=exec_mode,
            import_modules=["no_such_module_xyz"],
            retries=0,
        )
    assert modes_manager.get(dsk, list(dsk)) == (1, 2, 3, 4)


@pytest.mark.parametrize("crash", [hard_exit, segfault], ids=["os._exit", "segfault"])
@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_a_task_that_kills_its_process_is_reported(modes_manager, task_mode, exec_mode, crash):
    how = "exited with code 7" if crash is hard_exit else "killed by signal SIGSEGV"
    with pytest.raises(TaskFailed, match=rf"'crash'.*on worker local-.*{how}.*2 attempts"):
        modes_manager.get(
            {"crash": (crash, 1)}, "crash", task_mode=task_mode, exec_mode=exec_mode, retries=1
        )
    assert modes_manager.get({"x": (inc, 1)}, "x", task_mode=task_mode, exec_mode=exec_mode) == 2
    assert modes_manager.get({"x": (inc, 1)}, "x") == 2


@pytest.mark.parametrize(("task_mode", "exec_mode"), MODES, ids=MODE_IDS)
def test_function_from_a_module_missing_on_the_worker(
    modes_manager, tmp_path, task_mode, exec_mode
):
    """The module is on the client's sys.path only (added after the workers started)."""
    (tmp_path / "client_only_mod.py").write_text(
        textwrap.dedent(
            """
            def triple(x):
                return 3 * x
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import client_only_mod

        with pytest.raises(
            WorkerImportError,
            match=r"task 'f' needs module 'client_only_mod', which worker local-\d+ cannot import",
        ):
            modes_manager.get(
                {"f": (client_only_mod.triple, 1)}, "f", task_mode=task_mode, exec_mode=exec_mode
            )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("client_only_mod", None)
    assert modes_manager.get({"x": (inc, 1)}, "x", task_mode=task_mode, exec_mode=exec_mode) == 2


def root(x):
    return np.sqrt(x)


def test_hoisting_candidates_are_recorded(modes_manager):
    """From the modules of the run's functions and the modules their code names."""
    x = (da.ones(20, chunks=5) + 1).map_blocks(root)
    x.compute(scheduler=modes_manager.get)
    candidates = modes_manager.last_run.hoisting_candidates
    assert {"dask", "numpy"} <= set(candidates)
    assert not {"os", "builtins", "daskvine_py"} & set(candidates)
    assert modes_manager.last_run.options["task_mode"] == "function-calls"


def test_bad_options_are_clear(modes_manager):
    with pytest.raises(ValueError, match="task_mode"):
        modes_manager.get({"x": 1}, "x", task_mode="threads")
    with pytest.raises(ValueError, match="exec_mode"):
        modes_manager.get({"x": 1}, "x", exec_mode="spawn")
    with pytest.raises(ValueError, match="env_vars"):
        modes_manager.get({"x": 1}, "x", env_vars={"A": 1})
    with pytest.raises(TypeError, match="start_workers"):
        modes_manager.get({"x": 1}, "x", lib_resources={"cores": 1, "slots": 2})


@pytest.mark.parametrize("exec_mode", ["direct", "fork"])
def test_libraries_with_several_slots(exec_mode):
    """One worker, one library of three slots: three tasks run at once in it."""
    with Manager() as manager:
        manager.start_workers(1, cores=1, lib_resources={"cores": 1, "slots": 3})
        assert manager.workers["local-0"]["cores"] == 3
        dsk = {("s", i): (inc, i) for i in range(30)}
        dsk["total"] = (sum, list(dsk))
        assert manager.get(dsk, "total", exec_mode=exec_mode) == sum(range(1, 31))
        with pytest.raises(TaskFailed, match="exited with code 7"):
            manager.get({"crash": (hard_exit, 1)}, "crash", exec_mode=exec_mode, retries=0)
        assert manager.get({"x": (inc, 1)}, "x") == 2


def test_workdir_holds_task_directories_and_is_removed_at_exit(tmp_path):
    """Task directories go away after each task, even one that crashed; the worker's own
    directory inside --workdir goes away when the worker exits."""
    with Manager(heartbeat_interval=0.2, worker_timeout=5.0) as manager:
        manager._local_processes.append(
            spawn(
                None,
                name="wd",
                extra_args=["--workdir", str(tmp_path)],
                connection_file=manager.connection_file,
            )
        )
        manager.wait_for_workers(1)
        (own,) = tmp_path.iterdir()
        assert own.name.startswith(f"daskvine-{socket.gethostname()}-")
        dsk = {("t", i): (leave_behind, i) for i in range(3)}
        for task_mode, exec_mode in MODES:
            got = manager.get(
                dsk, list(dsk), task_mode=task_mode, exec_mode=exec_mode, task_sandbox=True
            )
            assert all(cwd.startswith(str(own)) for cwd, _ in got)
            with pytest.raises(TaskFailed):
                manager.get(
                    {"c": (hard_exit, 1)},
                    "c",
                    task_mode=task_mode,
                    exec_mode=exec_mode,
                    task_sandbox=True,
                    retries=0,
                )
        assert list((own / "tasks").iterdir()) == []
    assert list(tmp_path.iterdir()) == []


def test_a_workdir_left_by_a_killed_worker_is_removed_by_the_next(tmp_path):
    with Manager(heartbeat_interval=0.2, worker_timeout=5.0) as manager:
        args = ["--workdir", str(tmp_path)]
        first = spawn(None, name="first", extra_args=args, connection_file=manager.connection_file)
        manager._local_processes.append(first)
        manager.wait_for_workers(1)
        first.kill()
        first.wait()
        (left,) = tmp_path.iterdir()
        manager._local_processes.append(
            spawn(None, name="next", extra_args=args, connection_file=manager.connection_file)
        )
        deadline = time.monotonic() + 60
        while "next" not in manager.workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left.exists()
        assert manager.get({"x": (inc, 1)}, "x") == 2
