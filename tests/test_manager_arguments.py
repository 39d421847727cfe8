"""``Manager(...)`` and ``start_workers(...)`` fed random values (issue 27): a clear error
that names the setting, or a manager that works and closes; never a traceback from deep
inside, and never a hang."""

from __future__ import annotations

import math
import numbers

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from daskvine_py import BindError, Manager
from daskvine_py.wire import security

#: Values of every kind a user might pass by mistake.
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "abc", "1", "-1", "nan", "0.5"]),
    st.lists(st.integers(), max_size=2),
)
#: The numeric settings of ``Manager(...)``.
NUMERIC = [
    "port",
    "heartbeat_interval",
    "worker_timeout",
    "max_extra_tasks_per_core",
    "fixed_extra_tasks_per_core",
    "cache_dir_limit",
    "cache_worker_bytes",
]


@pytest.fixture(autouse=True)
def connection_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(security.CONNECTION_DIR_ENV, str(tmp_path / "connections"))


@pytest.mark.timeout(120)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.sampled_from(NUMERIC), value=ANYTHING)
def test_a_setting_is_refused_naming_it_or_the_manager_works(name, value):
    try:
        manager = Manager(**{name: value})
    except BindError as exc:  # a random port may be taken: said so, naming it
        assert name == "port" and str(value) in str(exc), exc
        return
    except (ValueError, TypeError) as exc:
        assert name in str(exc), f"{name}={value!r}: {exc}"
        return
    try:
        got = getattr(manager.options, name)
        assert got == value or (name == "port" and value in (0, None) and got == 0), got
        if isinstance(value, float):
            assert math.isfinite(value), f"{name}={value!r} was accepted"
        assert manager.workers == {}  # its I/O thread answers
    finally:
        manager.close()


@pytest.mark.timeout(120)
@settings(max_examples=30, deadline=None)
@given(n=ANYTHING, cores=ANYTHING)
def test_start_workers_refuses_what_is_not_a_count_of_workers(n, cores):
    def a_count(value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1

    assume(not (a_count(n) and a_count(cores)))
    with Manager(security=False) as manager:
        with pytest.raises((ValueError, TypeError), match="start_workers"):
            manager.start_workers(n, cores=cores)
        assert manager.workers == {} or not manager.workers
