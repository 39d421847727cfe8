"""What a user meets on a mistake: errors naming the setting, the value and the fix."""

from __future__ import annotations

import errno
import math
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

import dask
import pytest
import zmq

import daskvine_py
from daskvine_py import Manager, RemoteTraceback
from daskvine_py.errors import FULL_TRACEBACK_MARK, BindError
from daskvine_py.options import ManagerOptions

SRC = str(Path(__file__).resolve().parent.parent / "src")


def test_a_port_in_use_names_host_port_and_the_fix():
    with Manager() as first:
        port = int(first.address.rsplit(":", 1)[1])
        with pytest.raises(BindError) as info:
            Manager(port=port)
    error = info.value
    assert isinstance(error, OSError) and error.errno == errno.EADDRINUSE
    assert isinstance(error.__cause__, zmq.ZMQError)
    message = str(error)
    assert f"127.0.0.1:{port}" in message and "already in use" in message
    assert "port=0" in message


@pytest.mark.parametrize("host", ["no-such-host.invalid", "10.255.255.254"])
def test_a_host_not_of_this_machine_names_it_and_the_fix(host):
    with pytest.raises(BindError) as info:
        Manager(host=host, port=45123)
    message = str(info.value)
    assert f"{host}:45123" in message and f"{host!r} is not an address" in message
    assert "'0.0.0.0'" in message and "'127.0.0.1'" in message
    with pytest.raises(OSError, match="cannot listen"):  # any free port: the same
        Manager(host=host)


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("port", "abc", "port must be an integer in [0, 65535] (0 picks a free port), not 'abc'"),
        ("port", 70000, "port must be an integer in [0, 65535] (0 picks a free port), not 70000"),
        (
            "heartbeat_interval",
            math.nan,
            "heartbeat_interval must be a finite number of seconds > 0, not nan",
        ),
        (
            "heartbeat_interval",
            -1.0,
            "heartbeat_interval must be a finite number of seconds > 0, not -1.0",
        ),
        (
            "worker_timeout",
            math.inf,
            "worker_timeout must be a finite number of seconds > 0, not inf",
        ),
        ("worker_timeout", "30", "worker_timeout must be a number of seconds > 0, not '30'"),
        ("host", "", "host must be an address or host name of this machine, not ''"),
        (
            "max_extra_tasks_per_core",
            1.5,
            "max_extra_tasks_per_core must be an integer >= 0, not 1.5",
        ),
    ],
)
def test_bad_settings_are_refused_naming_setting_and_value(setting, value, expected):
    with pytest.raises(ValueError) as info:
        Manager(**{setting: value})
    assert str(info.value) == expected
    with pytest.raises(ValueError, match=setting):
        ManagerOptions(**{setting: value})


@pytest.mark.integration
@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            {"n": 0},
            "start_workers(n=...) takes an integer >= 1 (workers to start, cores of each), not 0",
        ),
        (
            {"n": -1},
            "start_workers(n=...) takes an integer >= 1 (workers to start, cores of each), not -1",
        ),
        (
            {"n": 1, "cores": 0},
            "start_workers(cores=...) takes an integer >= 1 (workers to "
            "start, cores of each), not 0",
        ),
        (
            {"n": 1, "fetch_timeout": -5},
            "start_workers(fetch_timeout=...) must be a finite number of seconds > 0, not -5",
        ),
        (
            {"n": 1, "timeout": math.nan},
            "start_workers(timeout=...) must be a finite number of seconds >= 0, not nan",
        ),
    ],
)
def test_start_workers_refuses_what_starts_nothing(arguments, expected):
    with Manager() as manager:
        with pytest.raises(ValueError) as info:
            manager.start_workers(**arguments)
        assert str(info.value) == expected
        assert manager._local_processes == []
        with pytest.raises(ValueError, match="wait_for_workers"):
            manager.wait_for_workers(1, timeout=-1)


# -- a task's traceback -------------------------------------------------------------

INTERNAL = ("library.py", "fusion.py", "legacy.py", "_task_spec.py", "dask/core.py")


def halve_then_divide(x):
    half = x / 2
    return half / 0  # the user's line


def passthrough(x):
    return x


def _printed(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _assert_printed_once(printed: str) -> None:
    assert printed.count("return half / 0  # the user's line") == 1, printed
    assert printed.count(", in halve_then_divide") == 1, printed
    line = halve_then_divide.__code__.co_firstlineno + 2
    assert printed.count(f'File "{__file__}", line {line}, in halve_then_divide') == 1
    for internal in INTERNAL:
        assert internal not in printed, (internal, printed)
    assert printed.rstrip().splitlines()[-2] == "ZeroDivisionError: float division by zero"
    assert "<dynamic-code>" not in printed


@pytest.mark.integration
@pytest.mark.parametrize(
    "graph",
    [
        {"x": 1, "y": (halve_then_divide, "x")},  # a legacy tuple
        {"x": 1, "y": (halve_then_divide, "x"), "z": (passthrough, "y")},  # one chain
        dict(
            dask.delayed(passthrough)(
                dask.delayed(halve_then_divide)(1), dask_key_name="z"
            ).__dask_graph__()
        ),  # dask's task objects
    ],
    ids=["tuple", "chain", "delayed"],
)
def test_a_tasks_error_prints_once_with_the_users_frames_only(shared_manager, graph):
    outputs = ["z"] if "z" in graph else ["y"]
    with pytest.raises(ZeroDivisionError) as info:
        shared_manager.get(graph, outputs)
    error = info.value
    assert str(error) == "float division by zero"
    _assert_printed_once(_printed(error))
    cause = error.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "library.py" in cause.full and "return half / 0" in cause.full  # for debugging
    try:
        shared_manager.get(graph, outputs)
    except ZeroDivisionError:
        pass


#: Where this package's frames would come from (``manager.py``'s ``get`` aside: the
#: caller's own call of it, in the local half of the traceback).
PACKAGE = os.path.dirname(os.path.abspath(daskvine_py.__file__)) + os.sep


@pytest.mark.integration
@pytest.mark.parametrize(
    "graph",
    [
        {"a": (abs, "missing")},  # a string that names no key is a literal, as in dask
        {"b": (abs, "missing"), "c": (abs, "b"), "a": (abs, "c")},  # one chain
    ],
    ids=["tuple", "chain"],
)
def test_a_builtins_error_shows_no_frame_of_daskvine_py(shared_manager, graph):
    with pytest.raises(TypeError) as expected:
        dask.get(graph, "a")
    with pytest.raises(TypeError) as info:
        shared_manager.get(graph, "a")
    error = info.value
    assert type(error) is type(expected.value) and str(error) == str(expected.value)
    cause = error.__cause__
    assert isinstance(cause, RemoteTraceback)
    # abs has no Python frame: the worker's half is the exception alone, not the machinery
    assert cause.text.strip() == "TypeError: bad operand type for abs(): 'str'"
    assert "legacy.py" in cause.full  # every frame kept, for debugging daskvine_py
    printed = _printed(error)
    for internal in INTERNAL:
        assert internal not in printed, (internal, printed)
    frames = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', printed, re.M)
    ours = [(path, name) for path, name in frames if path.startswith(PACKAGE)]
    assert {name for _, name in ours} <= {"get", "_get"}, printed  # the call of ``get``
    assert all(path.endswith(os.path.join("manager", "manager.py")) for path, _ in ours)
    if "b" in graph:  # the link that raised is named, though the chain is one task
        assert "raised by task 'b', run in one chain with 'a'" in printed


#: A script whose task function lives in ``__main__``: cloudpickle sends it by value.
SCRIPT = """\
from daskvine_py import Manager


def halve_then_divide(x):
    half = x / 2
    return half / 0  # the user's line


if __name__ == "__main__":
    with Manager() as manager:
        manager.start_workers(1)
        manager.get({"x": 1, "y": (halve_then_divide, "x")}, "y")
"""


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_main_modules_function_shows_its_file_and_line(tmp_path):
    script = tmp_path / "analysis.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": SRC},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    printed = done.stderr
    assert done.returncode == 1, printed
    assert printed.count(f'File "{script}", line 6, in halve_then_divide') == 1, printed
    assert printed.count("return half / 0  # the user's line") == 1, printed
    assert "<dynamic-code>" not in printed
    for internal in INTERNAL:
        assert internal not in printed, (internal, printed)
    assert printed.rstrip().splitlines()[-2:] == [
        "ZeroDivisionError: float division by zero",
        "daskvine_py: raised by task 'y' on worker local-0",
    ]


def test_source_lines_a_worker_could_not_read_come_from_this_machine():
    shown = (
        "Traceback (most recent call last):\n"
        f'  File "{__file__}", line {halve_then_divide.__code__.co_firstlineno + 2}, '
        "in halve_then_divide\n"
        "ZeroDivisionError: division by zero\n"
    )
    cause = RemoteTraceback.from_wire(shown + FULL_TRACEBACK_MARK + "full")
    assert "    return half / 0  # the user's line\n" in cause.text
    assert cause.full == "full"


# -- a module the workers cannot import -------------------------------------------------


def _call_twice(func, x):
    return func(func(x))


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_module_only_the_manager_can_import_is_named_with_the_fix(tmp_path):
    import cloudpickle

    from daskvine_py import WorkerImportError

    with Manager() as manager:
        # The workers start with this process's sys.path as it is now: without tmp_path.
        manager.start_workers(1, cores=1)
        (tmp_path / "only_here_mod.py").write_text("def triple(x):\n    return 3 * x\n")
        sys.path.insert(0, str(tmp_path))
        try:
            import only_here_mod

            graph = {"x": 2, "y": (only_here_mod.triple, "x")}
            with pytest.raises(WorkerImportError) as info:
                manager.get(graph, "y")
            error = info.value
            assert isinstance(error, ImportError)
            assert (error.key, error.module, error.worker) == ("y", "only_here_mod", "local-0")
            message = str(error)
            assert message.startswith(
                "task 'y' needs module 'only_here_mod', which worker local-0 cannot import "
                "(ModuleNotFoundError: No module named 'only_here_mod'): install it on the "
                "workers or make it importable there"
            ), message
            assert "cloudpickle.register_pickle_by_value(only_here_mod)" in message
            assert "cannot serialize" not in message
            # The fix it suggests works, in the same process; and as an argument too.
            cloudpickle.register_pickle_by_value(only_here_mod)
            try:
                assert manager.get(graph, "y") == 6
                assert manager.get({"z": (_call_twice, only_here_mod.triple, 1)}, "z") == 9
            finally:
                cloudpickle.unregister_pickle_by_value(only_here_mod)
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("only_here_mod", None)


def test_paths_given_to_the_manager_expand_a_home_directory(monkeypatch, tmp_path):
    """``key_file="~/keys.json"`` means the home directory, as it does in a shell."""
    from daskvine_py.options import ManagerOptions

    monkeypatch.setenv("HOME", str(tmp_path))
    options = ManagerOptions(
        key_file="~/keys.json", connection_file="~/run.json", cache_dir="~/cache"
    )
    assert options.key_file == str(tmp_path / "keys.json")
    assert options.connection_file == str(tmp_path / "run.json")
    assert options.cache_dir == str(tmp_path / "cache")
