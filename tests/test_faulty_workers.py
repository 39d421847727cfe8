"""Faulty workers next to real ones (issue 29): a black hole, a worker that takes tasks
and never answers, a straggler. Each plays a keyed worker (``keyed.KeyedWorker``) that a
thread of the test speaks for; runs must end right, compared with ``dask.get``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from operator import add
from typing import Any

import dask
import pytest
import zmq

from daskvine_py import Manager
from daskvine_py.wire import protocol as p
from keyed import KeyedWorker


def inc(x: int) -> int:
    return x + 1


def graph(n: int = 40, seed: int = 0) -> tuple[dict, list]:
    """``n`` incs of one kind, summed in pairs: ``n`` tasks to spread, a tree to finish."""
    dsk: dict[Any, Any] = {("inc", i): (inc, seed + i) for i in range(n)}
    level = [("inc", i) for i in range(n)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level), 2):
            key = ("add", depth, j)
            dsk[key] = (add, level[j], level[j + 1]) if j + 1 < len(level) else (inc, level[j])
            nxt.append(key)
        level, depth = nxt, depth + 1
    return dsk, level


class Playing:
    """A thread answering what the manager sends a keyed worker (``answer(record)``: the
    records to send back), heartbeating with ``Status`` every ``beat`` seconds."""

    def __init__(
        self, keyed: KeyedWorker, answer: Callable[[Any], list[Any]], beat: float = 0.2
    ) -> None:
        self.keyed = keyed
        self.answer = answer
        self.beat = beat
        self.received: list[Any] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sock = self.keyed.sock
        next_beat = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self.keyed.send(p.Status(0, 0, 0))
                next_beat = now + self.beat
            try:
                if not sock.poll(20):
                    continue
                records = p.decode(sock.recv_multipart(), p.TO_WORKER)
            except zmq.ZMQError:
                return
            replies = []
            for record in records:
                self.received.append(record)
                replies += self.answer(record)
            if replies:
                self.keyed.send(*replies)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.keyed.close()

    def __enter__(self) -> Playing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def named(manager: Manager, prefix: str) -> dict[str, Any] | None:
    """``manager.workers``' entry of the worker whose name starts with ``prefix``."""
    found = [info for name, info in manager.workers.items() if name.startswith(prefix)]
    return found[0] if found else None


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_black_hole_is_quarantined_and_runs_end_right(tmp_path, caplog):
    """Every task it is given fails at once; the runs succeed anyway (each error is tried
    on another worker) and it is quarantined: no new tasks, one WARNING, shown in
    ``manager.workers`` and in the report of the run that saw it."""

    def fail_everything(record: Any) -> list[Any]:
        if type(record) is p.Execute:
            return [p.TaskErred(record.task_id, None, "", "ImportError: a broken install")]
        return []

    with Manager() as manager:
        manager.start_workers(2, cores=1)
        manager.wait_for_workers(2, timeout=60)
        with Playing(KeyedWorker(manager, "hole", cores=4), fail_everything) as hole:
            reports = []
            with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
                for seed in range(5):
                    dsk, keys = graph(seed=seed * 100)
                    reports.append(tmp_path / f"run-{seed}.html")
                    assert manager.get(dsk, keys, report=reports[-1]) == dask.get(dsk, keys)
            info = named(manager, "hole")
            assert info is not None and info["quarantined"]
            warned = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
            assert len(warned) == 1 and "worker hole" in warned[0]
            assert any("quarantined" in path.read_text() for path in reports)
            executes = sum(type(r) is p.Execute for r in hole.received)
            dsk, keys = graph(seed=1000)
            assert manager.get(dsk, keys) == dask.get(dsk, keys)
            assert sum(type(r) is p.Execute for r in hole.received) == executes  # nothing new
        # The hole's goodbye is handled on the manager's thread: wait for it, then no honest
        # worker may have been quarantined beside it.
        deadline = time.monotonic() + 20
        while named(manager, "hole") is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert named(manager, "hole") is None
        assert len(manager.workers) == 2
        assert all(info["quarantined"] is None for info in manager.workers.values())


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_worker_that_takes_tasks_and_never_answers_is_ejected(caplog):
    """The probe of issue 29: it claims 1,000 cores, heartbeats, ignores everything else;
    the run used to hang for as long as it stayed. It is ejected and the run ends right."""
    with Manager(worker_timeout=3.0, heartbeat_interval=0.5) as manager:
        manager.start_workers(2, cores=1)
        manager.wait_for_workers(2, timeout=60)
        with Playing(KeyedWorker(manager, "sink", cores=1000), lambda record: []) as sink:
            dsk, keys = graph()
            with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
                assert manager.get(dsk, keys) == dask.get(dsk, keys)
            assert any(type(r) is p.Execute for r in sink.received)  # it did take tasks
            assert any("ejected worker sink" in r.getMessage() for r in caplog.records)
            assert any(type(r) is p.Shutdown for r in sink.received)
            assert named(manager, "sink") is None


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_straggler_s_tasks_are_aborted_and_run_elsewhere():
    """It starts every task it is given (``Started``) and never finishes one; once the
    kind's usual duration is known its tasks are taken back (``Abort``), and run
    elsewhere, and it is quarantined as slow."""

    def start_and_stall(record: Any) -> list[Any]:
        if type(record) is p.Execute:
            return [p.Started((record.task_id,))]
        return []

    with Manager() as manager:
        manager.start_workers(2, cores=1)
        manager.wait_for_workers(2, timeout=60)
        # The kind's durations: known from a run without the straggler.
        dsk, keys = graph(seed=-100)
        assert manager.get(dsk, keys) == dask.get(dsk, keys)
        with Playing(KeyedWorker(manager, "slow", cores=4), start_and_stall) as slow:
            for seed in range(3):
                dsk, keys = graph(seed=seed * 100)
                assert manager.get(dsk, keys) == dask.get(dsk, keys)
            aborted = [r for r in slow.received if type(r) is p.Abort]
            assert aborted and all("past" in r.reason or "quarantined" in r.reason for r in aborted)
            info = named(manager, "slow")
            assert info is not None and str(info["quarantined"]).startswith("slow")


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_deterministic_error_still_fails_the_run_with_its_own_exception():
    def boom(x: int) -> int:
        raise ValueError(f"bad input {x}")

    with Manager() as manager:
        manager.start_workers(2, cores=1)
        manager.wait_for_workers(2, timeout=60)
        dsk = {"a": 1, "b": (boom, "a"), "c": (inc, "b")}
        with pytest.raises(ValueError, match="bad input 1"):
            manager.get(dsk, "c")
        assert all(info["quarantined"] is None for info in manager.workers.values())
