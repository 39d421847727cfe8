"""The live task stream's data: a worker's ``Activity`` merging what it ran, fetched and
spilled into bars, and the bars reaching a dashboard in the heartbeats of real workers."""

from __future__ import annotations

import time

import dask
import pytest
from dask.utils import key_split
from hypothesis import given
from hypothesis import strategies as st

from daskvine_py.manager.live import ask_dashboard
from daskvine_py.wire import protocol as p
from daskvine_py.wire.keys import key_prefix
from daskvine_py.wire.serialize import dumps
from daskvine_py.worker import pipe
from daskvine_py.worker.activity import (
    MAX_BARS,
    PROCESS_LANE,
    RESOLUTION,
    Activity,
)
from daskvine_py.worker.messages import (
    AskPeer,
    Boot,
    FromLibrary,
    ProcessExited,
    ProcessStarted,
    StartProcess,
    ToLibrary,
)
from daskvine_py.worker.records import LibraryRecord
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

# -- prefixes -------------------------------------------------------------------------

TYPICAL_KEYS = [
    "x",
    "x-1",
    "x-1-2-3",
    ("x-2", 1),
    "('x-2', 1)",
    "('x', 1)",
    "hello-world-1",
    b"hello-world-1",
    "ae05086432ca935f6eba409a8ecd4896",
    "x-abcdefab",
    "_(x)",
    "<module.submodule.myclass object at 0xdaf372",
    None,
    5,
    3.5,
    "",
    "-x",
    "_-abc",
    "<>",
    "inc-5f1c2e9a8b7d6e5f4a3b2c1d0e9f8a7b",
    ("sum-aggregate-1a2b3c4d", 0, 3),
    ("rechunk-merge-deadbeef", 2),
    "finalize-hlgfinalizecompute-0123abcd",
    ((("a-1", 1), 2), 3),
    ("getitem-4e8f0a1b2c3d4e5f6a7b8c9d0e1f2a3b", 7),
    "from-delayed-2",
    "sum-aggregate",
    "x-fedcbaxy-z",
    "Évé-1",
    "a,b-c",
]


@pytest.mark.parametrize("key", TYPICAL_KEYS)
def test_a_prefix_is_dask_key_split_of_the_key(key):
    assert key_prefix(key) == key_split(key)


@given(st.text(alphabet="abcdefxyz0129-_,'()<>. \"", max_size=40), st.integers(0, 2))
def test_prefixes_agree_with_dask_on_any_name(name, depth):
    key = name
    for i in range(depth):
        key = (key, i)
    assert key_prefix(key) == key_split(key)


# -- merging --------------------------------------------------------------------------


def test_back_to_back_tasks_of_one_prefix_are_one_bar_per_lane():
    activity = Activity()
    for i in range(100):
        start = 10.0 + i * 0.01
        activity.add_task(1, ("inc-abc123", i), start, start + 0.009, 0.001)
        activity.add_task(2, f"double-{i}", start, start + 0.01, 0.0)
    bars = activity.take()
    assert [(lane, prefix, tasks) for lane, prefix, *_, tasks in bars] == [
        (1, "inc", 100),
        (2, "double", 100),
    ]
    lane, prefix, start, end, seconds, tasks = bars[0]
    assert start == 10.0 and end == pytest.approx(10.0 + 99 * 0.01 + 0.009)
    assert seconds == pytest.approx(0.1)


def test_a_pause_or_another_prefix_starts_a_new_bar():
    activity = Activity()
    activity.add_task(1, ("a-1", 0), 0.0, 1.0, 0.0)
    activity.add_task(1, ("a-1", 1), 1.0 + 2 * RESOLUTION, 2.0, 0.0)  # after a pause
    activity.add_task(1, ("b-1", 0), 2.0, 2.001, 0.0)  # another prefix
    # Another prefix, starting right after that bar began: counted in it.
    activity.add_task(1, ("c-1", 0), 2.0 + RESOLUTION / 5, 2.5, 0.0)
    activity.add_task(1, ("b-1", 1), 2.5, 3.0, 0.0)  # its prefix: it goes on
    activity.add_task(1, ("c-1", 1), 3.0, 3.1, 0.0)  # later: a bar of its own
    bars = [(prefix, start, end, tasks) for _, prefix, start, end, _, tasks in activity.take()]
    assert bars == [
        ("a", 0.0, 1.0, 1),
        ("a", 1.0 + 2 * RESOLUTION, 2.0, 1),
        ("b", 2.0, 3.0, 3),
        ("c", 3.0, 3.1, 1),
    ]


def test_alternating_prefixes_make_a_bar_per_resolution_at_most():
    activity = Activity()
    n = 10_000
    for i in range(n):
        start = i * 0.0005  # 5 s of tasks of half a millisecond, two prefixes in turn
        activity.add_task(3, ("even" if i % 2 == 0 else "odd", i), start, start + 0.0005, 0.0)
    bars = activity.take()
    assert sum(bar[5] for bar in bars) == n
    assert len(bars) <= 5.0 / RESOLUTION + 1
    starts = [bar[2] for bar in bars]
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= RESOLUTION
    assert {bar[1] for bar in bars} <= {"even", "odd"}
    assert bars[-1][3] == pytest.approx(n * 0.0005)


def test_bars_are_bounded_whatever_happens_between_heartbeats():
    activity = Activity()
    for i in range(MAX_BARS + 500):
        activity.add_task(1, ("x", i), i * 1.0, i * 1.0 + 0.5, 0.0)
    assert len(activity) == MAX_BARS
    bars = activity.take()
    assert sum(bar[5] for bar in bars) == MAX_BARS + 500
    assert bars[-1][3] == MAX_BARS + 499.5


def test_take_gives_the_bars_once_then_starts_afresh():
    activity = Activity()
    activity.add_task(1, "x-1", 5.0, 6.0, 0.0)
    assert activity.take() == ((1, "x", 5.0, 6.0, 0.0, 1),)
    assert activity.take() == () and len(activity) == 0
    activity.add_task(1, "x-2", 6.0, 7.0, 0.0)  # a new bar, not the taken one extended
    assert activity.take() == ((1, "x", 6.0, 7.0, 0.0, 1),)


def test_fetches_and_spills_have_lanes_of_their_own_moved_onto_the_wall_clock():
    activity = Activity()
    activity.add_interval(p.FETCH_LANE, 1.0, 1.5)
    activity.add_interval(p.FETCH_LANE, 1.2, 1.6)  # overlapping: one bar
    activity.add_interval(p.FETCH_LANE, 3.0, 3.1)
    activity.add_spills(2.0, 2.2, 3)
    activity.add_task(1, "x-1", 1000.0, 1001.0, 0.0)  # the wall clock already
    bars = activity.take(clock_offset=1000.0)
    assert bars == (
        (p.FETCH_LANE, "fetch", 1001.0, 1001.6, 0.0, 2),
        (p.FETCH_LANE, "fetch", 1003.0, pytest.approx(1003.1), 0.0, 1),
        (p.SPILL_LANE, "spill", 1002.0, 1002.2, 0.0, 3),
        (1, "x", 1000.0, 1001.0, 0.0, 1),
    )
    status = p.Status(1, 2, 3, 4, 5, bars)
    p.check_fields(status)  # what the manager accepts
    assert p.decode(p.encode([status]), p.TO_MANAGER) == [status]


# -- in the worker's state ------------------------------------------------------------


def _state(store: Store | None = None) -> tuple[WorkerState, LibraryRecord]:
    """A worker of one library (id 1), ready."""
    state = WorkerState(Store() if store is None else store, name="w", peer_address="tcp://me:1")
    register = p.Register(p.PROTOCOL_VERSION, "w", 1, 0, "host", "tcp://me:1", 1)
    state.handle([Boot(register, 1)], 0.0)
    state.handle([FromLibrary(1, pipe.Ready(), 0.0)], 0.0)
    return state, state.dispatch.libraries[1]


def _runs(out: list) -> list[pipe.Run]:
    return [i.request for i in out if type(i) is ToLibrary and type(i.request) is pipe.Run]


def test_a_task_done_in_a_library_is_a_bar_on_its_lane():
    state, lib = _state()
    for task_id, duration, serialization, wall in ((1, 0.25, 0.05, 100.0), (2, 0.5, 0.1, 100.6)):
        key = ("total-a1b2c3", task_id)
        out = state.handle([p.Execute(task_id, key, b"f", (), False, 0, True)], 0.0)
        (run,) = _runs(out)
        assert [call.task_id for call in run.calls] == [task_id]
        done = pipe.Done(task_id, dumps(1), duration, 8, serialization=serialization)
        state.handle([FromLibrary(lib.id, done, wall)], 0.0)
    (bar,) = state.activity.take()
    lane, prefix, start, end, seconds, tasks = bar
    assert (lane, prefix, tasks) == (1, "total", 2)
    assert start == pytest.approx(100.0 - 0.25 - 0.05) and end == 100.6
    assert seconds == pytest.approx(0.15)


def test_a_task_process_runs_on_its_own_lane():
    state, _ = _state()
    config = p.RunConfig(6, "tasks", "direct", (), (), False)
    (start,) = state.handle([config, p.Execute(1, "alone-1", b"f", (), False, 6, True)], 0.0)
    assert type(start) is StartProcess
    state.handle([ProcessStarted(start.task)], 0.0)
    state.handle([ProcessExited(start.task, pipe.Done(1, dumps(1), 1.0, 8), 50.0)], 0.0)
    assert state.activity.take() == ((PROCESS_LANE, "alone", 49.0, 50.0, 0.0, 1),)


def test_an_input_fetched_from_a_peer_is_a_bar_on_the_fetch_lane():
    state, _ = _state()
    dep = p.DepLocation(7, "big-1", ("tcp://peer:1",))
    out = state.handle([p.Execute(1, "use-1", b"f", (dep,), False, 0, True)], 10.0)
    assert out == [AskPeer("tcp://peer:1", (7,))]
    state.handle([p.Data(7, dumps(b"x" * 5000))], 12.5)
    bars = state.activity.take(clock_offset=100.0)
    assert bars == ((p.FETCH_LANE, "fetch", 110.0, 112.5, 0.0, 1),)


def test_results_written_to_spill_files_are_bars_on_the_spill_lane(tmp_path):
    state, lib = _state(Store(memory_limit=12_000, spill_dir=str(tmp_path)))
    for task_id in (1, 2, 3):
        out = state.handle([p.Execute(task_id, f"k-{task_id}", b"f", (), False, 0, True)], 0.0)
        assert len(_runs(out)) == 1
        done = pipe.Done(task_id, dumps(b"x" * 5000), 0.001, 5000)
        state.handle([FromLibrary(lib.id, done, 9.0)], 0.0)
    assert state.store.spilled == 1
    bars = state.activity.take()
    (spill,) = [bar for bar in bars if bar[0] == p.SPILL_LANE]
    assert spill[1] == "spill" and spill[5] == 1 and spill[3] >= spill[2]
    assert sum(bar[5] for bar in bars if bar[0] == 1) == 3


# -- in the manager -------------------------------------------------------------------


def big(i: int) -> bytes:
    return bytes(50_000 + i)


def add_one(i: int) -> int:
    return i + 1


def slow_sum(parts: list[int]) -> int:
    """Longer than ``RESOLUTION``: what starts after it on its worker cannot join its bar,
    nor, by causality, the bars of its inputs (each of the graph's prefixes shows)."""
    time.sleep(RESOLUTION * 1.2)
    return sum(parts)


class _Dashboard:
    """What a dashboard hears of the workers' heartbeats: from its first request on, the
    bars, kept here by worker (``LiveView.dashboard``)."""

    def __init__(self, manager) -> None:
        self.manager = manager
        self.bars: dict[str, list[p.Bar]] = {}
        self.statuses: list[p.Status] = []
        self.ask()

    def ask(self) -> dict[str, list[p.Bar]]:
        data = ask_dashboard(self.manager._command, self.manager._raise_if_dead, 10.0)
        for name, _, status in data["beats"]:
            self.bars.setdefault(name, []).extend(status.activity)
            self.statuses.append(status)
        return self.bars

    def until(self, done, timeout: float = 60.0) -> dict[str, list[p.Bar]]:
        deadline = time.monotonic() + timeout
        while not done(self.ask()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.bars


@pytest.mark.timeout(180)
def test_real_workers_send_bars_of_every_task_they_ran(manager):
    dsk: dict = {("add-one", i): (add_one, i) for i in range(300)}
    dsk.update(
        {
            ("sum-parts", j): (slow_sum, [("add-one", i) for i in range(j * 30, j * 30 + 30)])
            for j in range(10)
        }
    )
    dsk["final"] = (sum, [("sum-parts", j) for j in range(10)])
    keys = ["final", ("sum-parts", 3)]
    dashboard = _Dashboard(manager)
    assert manager.get(dsk, keys) == dask.get(dsk, keys)
    assert manager.last_run.tasks == len(dsk)  # nothing fused: one bar's task per key
    ran = lambda bars: sum(bar[5] for lane in bars.values() for bar in lane if bar[0] >= 0)
    bars = dashboard.until(lambda bars: ran(bars) >= len(dsk))
    assert ran(bars) == len(dsk)
    assert {bar[1] for lane in bars.values() for bar in lane if bar[0] >= 0} == {
        key_split(key) for key in dsk
    }
    for name, lane in bars.items():
        assert all(0 < bar[2] <= bar[3] <= time.time() for bar in lane), name
    assert "activity" not in next(iter(manager.workers.values()))


@pytest.mark.timeout(180)
def test_an_input_from_another_worker_shows_on_the_fetch_lane(manager):
    dashboard = _Dashboard(manager)
    with dask.annotate(workers=["local-0"]):
        source = dask.delayed(big)(7, dask_key_name="big-source")
    with dask.annotate(workers=["local-1"]):
        used = dask.delayed(len)(source, dask_key_name="use-it")
    (result,) = dask.compute(used, scheduler=manager.get)
    assert result == 50_007
    fetched = lambda bars: [bar for bar in bars.get("local-1", []) if bar[0] == p.FETCH_LANE]
    ran = lambda bars: sum(bar[5] for lane in bars.values() for bar in lane if bar[0] >= 0)
    bars = dashboard.until(lambda bars: bool(fetched(bars)) and ran(bars) >= 2)
    (bar,) = fetched(bars)
    assert bar[1] == "fetch" and bar[5] == 1 and 0 < bar[2] <= bar[3]
    assert not [bar for bar in bars["local-0"] if bar[0] == p.FETCH_LANE]
    prefixes = {name: {bar[1] for bar in lane if bar[0] >= 0} for name, lane in bars.items()}
    assert prefixes == {"local-0": {"big-source"}, "local-1": {"use-it"}}
    assert ran(bars) == 2
