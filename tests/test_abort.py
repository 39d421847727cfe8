"""``Abort`` end to end: a real worker, driven by a manager the test speaks for, kills
the process running an aborted task (a library, or a task process), reports nothing of
that task, and runs the next ``Execute`` right."""

from __future__ import annotations

import contextlib
import operator
import subprocess
import time
from collections.abc import Iterator

import dask
import pytest
import zmq
from dask._task_spec import Task

import procfs
from daskvine_py.manager.launch import spawn
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import TaskEncoder, loads

pytestmark = pytest.mark.integration

REPORTS = (p.TaskDone, p.TaskErred, p.TaskCrashed, p.FetchFailed, p.TaskExhausted)


class FakeManager:
    """A bare ROUTER on 127.0.0.1 the test speaks for, with one real worker joined."""

    def __init__(self, router: zmq.Socket, ident: bytes) -> None:
        self.router = router
        self.ident = ident
        self.encoder = TaskEncoder()
        self.heard: list = []  #: every record the worker sent

    def send(self, *records) -> None:
        self.router.send_multipart([self.ident, *p.encode(list(records))])

    def execute(
        self, task_id: int, node: Task, run_id: int = 0, want: bool = True, **allocation: int
    ) -> None:
        """Send a task (``want``: its value back, as for an output; else kept here), with
        ``allocation`` (``cores``, ``memory`` in bytes)."""
        payload, function_ids = self.encoder.encode(node)
        functions = [p.Function(fid, self.encoder.functions[fid]) for fid in function_ids]
        execute = p.Execute(task_id, node.key, payload, (), want, run_id)
        self.send(*functions, execute._replace(**allocation))

    def wait_for(self, predicate, timeout: float = 60.0):
        """The first record heard, or read from now on, for which ``predicate`` holds."""
        for record in self.heard:
            if predicate(record):
                return record
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.router.poll(max(1, int(left * 1000))), self.heard
            _, *frames = self.router.recv_multipart()
            records = p.decode(frames, p.TO_MANAGER)
            self.heard += records
            for record in records:
                if predicate(record):
                    return record

    def report(self, task_id: int):
        """The report of a task (done, erred, crashed, exhausted), heard or to come."""
        return self.wait_for(lambda r: type(r) in REPORTS and r.task_id == task_id)


@contextlib.contextmanager
def fake_manager_with_a_worker(
    name: str = "aborted", heartbeat: float = 0.5, *args: str
) -> Iterator[tuple[FakeManager, subprocess.Popen]]:
    """A ``FakeManager`` with one real one-core worker ``name`` joined (its command line
    given ``args`` too), told to beat every ``heartbeat`` seconds; both gone on exit."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proc = spawn(
        f"tcp://127.0.0.1:{port}",
        cores=1,
        name=name,
        extra_args=["--manager-timeout", "120", *args],
    )
    try:
        assert router.poll(60_000)
        ident, *frames = router.recv_multipart()
        (register,) = p.decode(frames, p.TO_MANAGER)
        assert type(register) is p.Register
        manager = FakeManager(router, ident)
        manager.send(p.Welcome(name, heartbeat))
        yield manager, proc
    finally:
        proc.kill()
        proc.wait()
        context.destroy(linger=0)


def _libraries(pid: int) -> list[int]:
    """The library processes of worker ``pid`` (multiprocessing's spawned children)."""
    return [child for child, cmd in procfs.children(pid).items() if "spawn_main" in cmd]


def _wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _the_next_task_runs_right(manager: FakeManager, task_id: int, run_id: int = 0) -> None:
    manager.execute(task_id, Task("answer", operator.add, 20, 22), run_id)
    manager.wait_for(lambda r: type(r) in REPORTS and r.task_id == task_id)
    (report,) = [r for r in manager.heard if type(r) in REPORTS and r.task_id == task_id]
    assert type(report) is p.TaskDone
    assert loads(report.value) == dask.get({"answer": (operator.add, 20, 22)}, "answer")


@pytest.mark.timeout(120)
def test_an_aborted_task_has_its_library_killed_and_the_worker_goes_on():
    with fake_manager_with_a_worker() as (manager, proc):
        (library,) = _libraries(proc.pid)
        manager.execute(1, Task("kept", bytes, 1_000_000), want=False)  # live in the library
        manager.wait_for(lambda r: type(r) is p.TaskDone and r.task_id == 1)
        manager.execute(2, Task("sleepy", time.sleep, 30))
        manager.wait_for(lambda r: type(r) is p.Started and 2 in r.task_ids)
        manager.send(p.Abort((2,), "a straggler"))
        # The task sleeps 30 s: its library is gone long before, killed.
        _wait_until(lambda: not procfs.alive(library))
        _wait_until(lambda: len(_libraries(proc.pid)) == 1)  # its replacement
        manager.wait_for(lambda r: type(r) is p.Lost)
        assert [r for r in manager.heard if type(r) is p.Lost] == [p.Lost((1,))]
        _the_next_task_runs_right(manager, 3)
        assert not [r for r in manager.heard if type(r) in REPORTS and r.task_id == 2]
        assert proc.poll() is None


@pytest.mark.timeout(120)
def test_an_aborted_task_process_is_killed_and_the_worker_goes_on():
    with fake_manager_with_a_worker() as (manager, proc):
        (library,) = _libraries(proc.pid)
        manager.send(p.RunConfig(5, "tasks", "direct", (), (), True))
        manager.execute(1, Task("sleepy", time.sleep, 30), run_id=5)
        manager.wait_for(lambda r: type(r) is p.Started and 1 in r.task_ids)

        # Started is sent after the process was started: it is there to be found, though
        # its command line may read empty for a moment (the kernel still setting up the
        # new program after the exec that Popen waited for; seen under load).
        def task_processes() -> list[int]:
            return [pid for pid, cmd in procfs.children(proc.pid).items() if "task_process" in cmd]

        _wait_until(task_processes)
        (process,) = task_processes()
        manager.send(p.Abort((1,), "a straggler"))
        _wait_until(lambda: not procfs.alive(process))
        _the_next_task_runs_right(manager, 2, run_id=5)
        assert not [r for r in manager.heard if type(r) in REPORTS and r.task_id == 1]
        assert _libraries(proc.pid) == [library]  # the library had nothing to do with it
