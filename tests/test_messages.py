"""What a user meets on a mistake: errors naming the setting, the value and the fix."""

from __future__ import annotations

import errno
import math

import pytest
import zmq

from daskvine_py import Manager
from daskvine_py.errors import BindError
from daskvine_py.options import ManagerOptions


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
        ("heartbeat_interval", math.nan, "heartbeat_interval must be a finite number of "
         "seconds > 0, not nan"),
        ("heartbeat_interval", -1.0, "heartbeat_interval must be a finite number of seconds "
         "> 0, not -1.0"),
        ("worker_timeout", math.inf, "worker_timeout must be a finite number of seconds > 0, "
         "not inf"),
        ("worker_timeout", "30", "worker_timeout must be a number of seconds > 0, not '30'"),
        ("host", "", "host must be an address or host name of this machine, not ''"),
        ("max_extra_tasks_per_core", 1.5, "max_extra_tasks_per_core must be an integer >= 0, "
         "not 1.5"),
    ],
)  # fmt: skip
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
        ({"n": 0}, "start_workers(n=...) takes an integer >= 1 (workers to start, cores of "
         "each), not 0"),
        ({"n": -1}, "start_workers(n=...) takes an integer >= 1 (workers to start, cores of "
         "each), not -1"),
        ({"n": 1, "cores": 0}, "start_workers(cores=...) takes an integer >= 1 (workers to "
         "start, cores of each), not 0"),
        ({"n": 1, "timeout": math.nan}, "start_workers(timeout=...) must be a finite number "
         "of seconds >= 0, not nan"),
    ],
)  # fmt: skip
def test_start_workers_refuses_what_starts_nothing(arguments, expected):
    with Manager() as manager:
        with pytest.raises(ValueError) as info:
            manager.start_workers(**arguments)
        assert str(info.value) == expected
        assert manager._local_processes == []
        with pytest.raises(ValueError, match="wait_for_workers"):
            manager.wait_for_workers(1, timeout=-1)
