"""The worker's state with shipped software (``RunConfig.software``): literal events in,
instructions out. Prepared once per key, no task starts until the libraries run the
run's software, idle libraries replaced, an unfit node says so once and leaves."""

from __future__ import annotations

import logging

from daskvine_py.wire import protocol as p
from daskvine_py.wire.exits import EXIT_UNFIT
from daskvine_py.worker import pipe
from daskvine_py.worker.messages import (
    Boot,
    FilesShipped,
    FromLibrary,
    Leave,
    LibraryDied,
    PrepareSoftware,
    SoftwarePrepared,
    StartLibrary,
    StopLibraries,
    ToLibrary,
)
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

ME = "tcp://me:1"
REGISTER = p.Register(p.PROTOCOL_VERSION, "w", 2, 0, "host", ME, 1)
WELCOME = p.Welcome("w", 1.0)


def software(key: str) -> p.Software:
    env = p.Environment("archive", "e" + key, 10, "local", "3.11", "x86_64", "2.36", "bin/python")
    return p.Software(key, env, None, ("tcp://manager:1",))


def config(run_id: int, soft: p.Software | None) -> p.RunConfig:
    return p.RunConfig(run_id, "function-calls", "direct", (), (), False, soft)


def execute(task_id: int, run_id: int) -> p.Execute:
    return p.Execute(task_id, f"k{task_id}", b"payload", (), False, run_id, True)


def boot(own_python: bool = True, libraries: int = 2) -> WorkerState:
    state = WorkerState(Store(), name="w", peer_address=ME)
    out = state.handle([Boot(REGISTER, libraries, 1, own_python)], 0.0)
    if own_python:
        assert out == [StartLibrary(i, 1) for i in range(1, libraries + 1)]
        ready = [FromLibrary(i, pipe.Ready(), 0.0) for i in range(1, libraries + 1)]
        assert state.handle(ready, 0.0) == [REGISTER]
    else:
        assert out == [REGISTER]  # the small install registers at once, with no library
    state.handle([WELCOME], 0.0)
    return state


def of(kind: type, out: list) -> list:
    return [i for i in out if type(i) is kind]


def test_a_worker_of_its_own_python_replaces_idle_libraries_once_the_software_is_prepared():
    state = boot()
    soft = software("s1")
    out = state.handle([config(1, soft), execute(10, 1)], 0.0)
    assert out == [PrepareSoftware(soft)]  # the task waits: no request to the old libraries
    out = state.handle([SoftwarePrepared("s1")], 0.0)
    assert of(StopLibraries, out) == [StopLibraries((1, 2))]
    assert of(StartLibrary, out) == [StartLibrary(3, 1, None, "s1"), StartLibrary(4, 1, None, "s1")]
    assert state.software == "s1"
    (request,) = of(ToLibrary, out)  # to a new library: it reads it once it has started
    assert request.library_id in (3, 4) and type(request.request) is pipe.Run


def test_the_switch_waits_for_tasks_running_on_the_old_libraries():
    state = boot()
    out = state.handle([execute(1, 0)], 0.0)
    assert of(ToLibrary, out)  # running on library 1, of the worker's own Python
    state.handle([config(2, software("s1")), execute(2, 2)], 0.0)
    out = state.handle([SoftwarePrepared("s1")], 0.0)
    assert not of(StopLibraries, out)  # library 1 still runs task 1
    done = pipe.Done(1, None, 0.01, 0, False, 0.0, 0.0, 0)
    out = state.handle([FromLibrary(1, done, 0.0)], 0.0)
    assert of(StopLibraries, out) == [StopLibraries((1, 2))]
    assert of(p.TaskDone, out)


def test_software_is_prepared_once_per_key_and_a_second_run_of_it_starts_at_once():
    state = boot()
    soft = software("s1")
    state.handle([config(1, soft)], 0.0)
    state.handle([SoftwarePrepared("s1")], 0.0)
    state.handle([FromLibrary(i, pipe.Ready(), 0.0) for i in (3, 4)], 0.0)
    out = state.handle([config(2, soft), execute(5, 2)], 0.0)
    assert not of(PrepareSoftware, out) and not of(StopLibraries, out)
    assert of(ToLibrary, out)


def test_the_small_install_starts_its_first_libraries_with_the_shipped_software():
    state = boot(own_python=False)
    out = state.handle([config(1, software("s1")), execute(1, 1)], 0.0)
    assert out == [PrepareSoftware(software("s1"))]
    out = state.handle([SoftwarePrepared("s1")], 0.0)
    assert not of(StopLibraries, out)
    assert of(StartLibrary, out) == [StartLibrary(1, 1, None, "s1"), StartLibrary(2, 1, None, "s1")]


def test_a_node_that_cannot_run_the_software_says_why_once_and_leaves():
    state = boot()
    state.handle([config(1, software("s1"))], 0.0)
    why = "worker w on n1: the environment 'local' needs glibc 2.99 or newer, this node has 2.36"
    out = state.handle([SoftwarePrepared("s1", why)], 0.0)
    assert of(p.Goodbye, out) == [p.Goodbye(why, "s1")]
    assert of(Leave, out) == [Leave(why, EXIT_UNFIT, logging.ERROR, False)]


def test_the_small_install_refuses_a_run_that_ships_no_software_naming_the_fix():
    state = boot(own_python=False)
    out = state.handle([execute(1, 0)], 0.0)  # a run of the defaults sends no RunConfig
    (goodbye,) = of(p.Goodbye, out)
    assert goodbye.unfit == "none"
    assert "no Python environment of its own" in goodbye.reason
    assert "environment=" in goodbye.reason


def test_a_superseded_preparation_that_failed_costs_nothing():
    state = boot()
    state.handle([config(1, software("s1"))], 0.0)
    state.handle([config(2, software("s2"))], 0.0)  # the user changed a module meanwhile
    out = state.handle([SoftwarePrepared("s1", "broken")], 0.0)
    assert not of(p.Goodbye, out) and not of(Leave, out)
    out = state.handle([SoftwarePrepared("s2")], 0.0)
    assert of(StartLibrary, out) == [StartLibrary(3, 1, None, "s2"), StartLibrary(4, 1, None, "s2")]


def test_libraries_of_the_software_that_never_start_make_the_node_unfit():
    state = boot()
    state.handle([config(1, software("s1"))], 0.0)
    state.handle([SoftwarePrepared("s1")], 0.0)
    out: list = []
    library = 3
    for _ in range(3):
        out = state.handle([LibraryDied(library, "exited with status 1", None)], 0.0)
        library = max(state.dispatch.libraries, default=library) if not of(Leave, out) else 0
    (goodbye,) = of(p.Goodbye, out)
    assert goodbye.unfit == "s1" and "could not start" in goodbye.reason


def test_libraries_are_replaced_when_a_run_ships_other_files():
    """A client reading its credentials once per process (XRootD's X.509 proxy) must not
    keep running on what it read before a run shipped, or renewed, the proxy."""
    state = boot()
    out = state.handle([execute(1, 0)], 0.0)  # the worker's libraries, with no files
    assert of(ToLibrary, out)
    files = config(2, None)._replace(env_vars=(("X509_USER_PROXY", "/w/files/X509"),))
    state.handle([FilesShipped("d1"), files, execute(2, 2)], 0.0)
    done = pipe.Done(1, None, 0.01, 0, False, 0.0, 0.0, 0)
    out = state.handle([FromLibrary(1, done, 0.0)], 0.0)  # idle now: replaced
    assert of(StopLibraries, out) == [StopLibraries((1, 2))]
    assert of(StartLibrary, out) == [StartLibrary(3, 1), StartLibrary(4, 1)]
    (request,) = of(ToLibrary, out)  # task 2 goes to a new library only
    assert request.library_id in (3, 4)
    out = state.handle([FilesShipped("d1"), config(3, None), execute(3, 3)], 0.0)
    assert not of(StopLibraries, out)  # the same files again: nothing to replace
