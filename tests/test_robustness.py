"""Issue 13, part 4: every run ends.

An error anywhere in a loop fails the runs it concerns and nothing else; a malformed record
in any direction is dropped with one warning, never fatal; a manager whose I/O thread died
anyway fails every caller at once. The fuzz tests at the end drive the decoders, the
scheduler state and the worker's handlers with random and inconsistent input.

Tests that send raw bytes to a port use ``Manager(security=False)``: with CurveZMQ an
unauthenticated socket never reaches a decoder (``test_security.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import threading
import time
from unittest import mock

import dask
import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beacon import Beacon, ping_then_sleep
from daskvine_py import Manager, ManagerDied, ProtocolError, SchedulerError, TaskFailed
from daskvine_py.scheduler import dispatch
from daskvine_py.scheduler import state as s
from daskvine_py.wire import plain, validation
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, dumps, loads
from daskvine_py.worker.messages import Boot
from daskvine_py.worker.shell import Worker
from sockets import dealer
from test_state import SimulatedCluster, random_graphs

W1, W2 = b"w1", b"w2"


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def nap(seconds):
    time.sleep(seconds)
    return seconds


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


class Crafted:
    """Unpickles as ``Serialized(header, buffers)`` whatever they hold: what a broken or
    hostile sender could put on the wire (``Serialized`` itself refuses to pickle an int
    as a buffer)."""

    def __init__(self, header, buffers):
        self.header = header
        self.buffers = buffers

    def __reduce__(self):
        return (Serialized, (self.header, self.buffers))


def raw_plain(*records, buffers=()):
    """A plain batch of ``(record type, fields)`` written out by hand, as a broken or
    hostile sender could: fields of any plain type, any number of them."""
    flat = [x for kind, fields in records for x in (plain.CODES[kind], tuple(fields))]
    return [p.PLAIN_MAGIC + msgpack.packb(flat), *buffers]


class Background:
    """A call in a thread, so that a test fails, rather than hangs, when it never returns."""

    def __init__(self, func, *args, **kwargs):
        self.value = self.exception = None

        def run():
            try:
                self.value = func(*args, **kwargs)
            except BaseException as exc:
                self.exception = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=60.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call never returned"

    def result(self, timeout=60.0):
        self.join(timeout)
        if self.exception is not None:
            raise self.exception
        return self.value

    def error(self, timeout=60.0):
        self.join(timeout)
        assert self.exception is not None, f"no error; returned {self.value!r}"
        return self.exception


class FakeWorker:
    """A registered worker the test speaks for, on an insecure manager's port."""

    def __init__(self, manager, name="impostor", cores=2):
        self.name = name
        self.context = zmq.Context()
        self.sock = dealer(self.context, manager.address, name.encode())
        self.send(p.Register(p.PROTOCOL_VERSION, name, cores, 0, "h", "tcp://127.0.0.1:1", 1))
        assert type(self.receive(p.Welcome, 1)[0]) is p.Welcome

    def send(self, *records):
        self.sock.send_multipart(p.encode(list(records)))

    def receive(self, kind, n, timeout=20.0):
        found = []
        deadline = time.monotonic() + timeout
        while len(found) < n:
            assert self.sock.poll(max(1, int((deadline - time.monotonic()) * 1000))), found
            records = p.decode(self.sock.recv_multipart(), p.TO_WORKER)
            found += [r for r in records if type(r) is kind]
        return found

    def close(self):
        with contextlib.suppress(zmq.ZMQError):
            self.send(p.Goodbye("done"))
        self.context.destroy(linger=100)


@contextlib.contextmanager
def offline_worker():
    """A ``Worker`` that never runs its loop: its handlers are called directly."""
    worker = Worker("tcp://127.0.0.1:1", manager_timeout=30.0)
    try:
        yield worker
    finally:
        worker.outbox.clear()
        worker.events.clear()
        worker.manager_gone = True  # nothing waits for its unsendable messages
        worker._close()


@pytest.fixture
def worker():
    with offline_worker() as worker:
        yield worker


# -- 1. one bad event never takes the events beside it down ---------------------------------


def _two_runs():
    st_ = s.SchedulerState()
    st_.handle([s.WorkerJoined(W1, "w1", 2, "tcp://w1:1")])
    out = st_.handle(
        [
            s.SubmitRun(1, [s.NewTask("a", b"", (), (), 0)], ["a"], 3),
            s.SubmitRun(2, [s.NewTask("b", b"", (), (), 0)], ["b"], 3),
        ]
    )
    ids = {i.message.key: i.message.task_id for i in out if type(i.message) is p.Execute}
    return st_, ids


def test_a_report_that_raises_fails_its_run_and_the_events_beside_it_count():
    st_, ids = _two_runs()
    # An output's TaskDone without its value raises in the handler; the next one is fine.
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(ids["a"], 8, 0.1, None)),
            s.FromWorker(W1, p.TaskDone(ids["b"], 8, 0.1, dumps(7))),
        ]
    )
    (aborted,) = [i for i in out if type(i) is s.RunAborted]
    assert aborted.run_id == 1 and isinstance(aborted.error, ValueError)
    assert "TaskDone about task 'a'" in aborted.what and "worker w1" in aborted.what
    assert [i.run_id for i in out if type(i) is s.RunDone] == [2]
    assert [loads(i.value) for i in out if type(i) is s.RunOutput] == [7]
    # The failed run went the usual way: cancelled on its worker, forgotten here.
    assert p.Cancel((ids["a"],)) in [i.message for i in out if type(i) is s.Send]
    assert not st_.tasks and not st_.runs and not st_.workers[W1].processing


def test_a_submission_that_raises_fails_only_its_run():
    st_, ids = _two_runs()
    broken = s.SubmitRun(3, [s.NewTask("c", b"", (), ("nowhere",), 0)], ["c"], 3)
    out = st_.handle([broken, s.FromWorker(W1, p.TaskDone(ids["b"], 8, 0.1, dumps(1)))])
    assert [(i.run_id, type(i.error)) for i in out if type(i) is s.RunAborted] == [(3, KeyError)]
    assert [i.run_id for i in out if type(i) is s.RunDone] == [2]
    assert 3 not in st_.runs and all(t.run.id == 1 for t in st_.tasks.values())


def test_an_event_that_concerns_no_run_is_dropped_and_handle_never_raises():
    st_, ids = _two_runs()
    out = st_.handle([s.FromWorker(W1, p.Status(1, 2, 3, 4)), "not an event"])
    assert [type(i) for i in out] == [s.EventDropped, s.EventDropped]
    assert "Status" in out[0].what and set(st_.runs) == {1, 2}


def test_a_half_applied_transition_still_drops_its_run_cleanly():
    st_, ids = _two_runs()
    task = st_.tasks[ids["a"]]

    def half(self, task, worker):  # records the copy, then fails before the rest
        task.hold(worker)
        worker.has_what.add(task)
        raise OSError("disk on fire")

    with mock.patch.dict(s.SchedulerState._TRANSITIONS, {("processing", "memory"): half}):
        out = st_.handle([s.FromWorker(W1, p.TaskDone(ids["a"], 8, 0.1, dumps(1)))])
    (aborted,) = [i for i in out if type(i) is s.RunAborted]
    assert aborted.run_id == 1 and isinstance(aborted.error, OSError)
    # The state said "memory" while its worker still listed it as processing: the drop
    # found it in both places, released the copy and cancelled it there.
    assert task.state == "forgotten"
    sent = [i.message for i in out if type(i) is s.Send]
    assert p.Release((ids["a"],)) in sent and p.Cancel((ids["a"],)) in sent
    assert not st_.workers[W1].has_what
    assert list(st_.workers[W1].processing) == [st_.tasks[ids["b"]]]
    assert set(st_.runs) == {2} and set(st_.tasks) == {ids["b"]}


def test_a_malformed_report_fails_the_runs_of_the_tasks_it_names_that_run_there():
    st_, ids = _two_runs()
    error = ProtocolError("TaskDone.value: a buffer is a int")
    out = st_.handle(
        [
            s.BadReport(W1, "TaskDone", (ids["a"], 999), error),
            s.BadReport(W2, "TaskDone", (ids["b"],), error),
        ]
    )
    (aborted,) = [i for i in out if type(i) is s.RunAborted]
    assert aborted.run_id == 1 and aborted.error is error
    assert "malformed TaskDone about task 'a'" in aborted.what and "w1" in aborted.what
    assert set(st_.runs) == {2}


def test_a_task_given_back_before_its_input_exists_waits_for_it():
    """Found by the fuzzing below: a task sent ahead of its input, then given back, was
    queued as ready and sent where nobody computes that input."""
    st_ = s.SchedulerState()
    tasks = [s.NewTask("a", b"", (), (), 0), s.NewTask("b", b"", (), ("a",), 1)]
    st_.handle([s.WorkerJoined(W1, "w1", 1, "tcp://w1:1"), s.SubmitRun(1, tasks, ["b"], 3)])
    a, b = st_.tasks[1], st_.tasks[2]
    assert b.state == "processing" and b.missing == 1  # sent ahead behind a
    st_.handle([s.FromWorker(W1, p.TaskCrashed(b.id, "library exited"))])
    assert b.state == "waiting" and b not in st_.queue
    out = st_.handle([s.FromWorker(W1, p.TaskDone(a.id, 8, 0.1, None))])
    (execute,) = [i.message for i in out if type(i) is s.Send and type(i.message) is p.Execute]
    assert execute.task_id == b.id and execute.deps == (p.DepLocation(a.id, "a", ()),)


def test_a_worker_that_cannot_run_a_task_it_reported_done_does_not_hold_it():
    """A false TaskDone (b had not run) and then the truth from the same worker (b lacks
    its input): c, sent there to wait for b, would wait forever."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), ("a",), 1),
        s.NewTask("c", b"", (), ("b",), 2),
    ]
    st_.handle([s.WorkerJoined(W1, "w1", 1, "tcp://w1:1"), s.SubmitRun(1, tasks, ["c"], 3)])
    a, b, c = (st_.tasks[i] for i in (1, 2, 3))
    assert {t.state for t in (a, b, c)} == {"processing"}  # b and c sent ahead
    st_.handle([s.FromWorker(W1, p.TaskDone(b.id, 8, 0.1, None))])
    assert b.state == "memory" and c.state == "processing" and c.missing == 0
    out = st_.handle(
        [
            s.FromWorker(W1, p.TaskDone(a.id, 8, 0.1, None)),
            s.FromWorker(W1, p.FetchFailed(b.id, a.id, ("tcp://w1:1",))),
        ]
    )
    # The copy of b is forgotten: c is called back, and b's lineage runs again (sent
    # ahead as before, so c follows b again).
    sent = [i.message for i in out if type(i) is s.Send]
    cancel = sent.index(p.Cancel((c.id,)))
    assert [m.task_id for m in sent[cancel:] if type(m) is p.Execute] == [a.id, b.id, c.id]
    assert not b.who_has and b.state == "processing"


@pytest.mark.integration
def test_a_failing_report_fails_its_run_over_the_real_manager_and_the_batch_counts():
    """Problem 1: the manager used to drop the whole batch, and both gets waited forever."""
    with Manager(security=False, heartbeat_interval=0.2, worker_timeout=30.0) as manager:
        fake = FakeWorker(manager, cores=2)
        try:
            dsk1, dsk2 = {"a": (inc, 1)}, {"b": (inc, 2)}
            first = Background(manager.get, dsk1, "a")
            second = Background(manager.get, dsk2, "b")
            executes = {m.key: m for m in fake.receive(p.Execute, 2)}
            expected = dask.get(dsk2, "b")
            # One batch: an output's TaskDone without its value, then a good one.
            fake.send(
                p.TaskDone(executes["a"].task_id, 8, 0.01, None, 0.0),
                p.TaskDone(executes["b"].task_id, 8, 0.01, dumps(expected), 0.0),
            )
            assert second.result(30) == expected
            error = first.error(30)
            assert isinstance(error, SchedulerError) and isinstance(error.__cause__, ValueError)
            assert "TaskDone about task 'a'" in str(error) and "impostor" in str(error)
        finally:
            fake.close()
        wait_until(lambda: "impostor" not in manager.workers)
        manager.start_workers(1)
        dsk = {"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}
        assert manager.get(dsk, "z") == dask.get(dsk, "z")


@pytest.mark.integration
def test_a_worker_whose_message_cannot_be_read_is_lost_and_its_tasks_run_elsewhere():
    """Its reports in that message are lost: waiting for them would wait forever."""
    with Manager(security=False, heartbeat_interval=0.2, worker_timeout=30.0) as manager:
        fake = FakeWorker(manager, cores=1)
        try:
            dsk = {"a": 1, "b": (inc, "a")}
            getter = Background(manager.get, dsk, "b")
            fake.receive(p.Execute, 1)
            manager.start_workers(1)
            fake.sock.send_multipart([p.MAGIC + b"\x80\x05 not a pickle"])
            (shutdown,) = fake.receive(p.Shutdown, 1)
            assert "could not be read" in shutdown.reason
            assert getter.result(60) == dask.get(dsk, "b")
            assert "impostor" not in manager.workers
        finally:
            fake.close()


# -- 2. what the manager cannot read fails what it concerns; a dead loop fails everyone ------


def test_a_taskdone_whose_value_is_not_a_value_is_dropped(insecure_manager, caplog):
    """Problem 2: a value holding an int for a buffer passed validation, then killed the
    I/O thread; every get hung. Plain data cannot say that any more: a value that is
    not an extension is the nearest, and is dropped the same way."""
    manager = insecure_manager
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        fake = FakeWorker(manager, cores=1)
        done = (10**6, 1, 0.1, (b"x", (5,)), 0.0, 0.0, 0.0, 0, ())
        fake.sock.send_multipart(raw_plain((p.TaskDone, done)))
        fake.close()
        wait_until(lambda: "impostor" not in manager.workers)
    assert manager._thread.is_alive()
    warnings = [r.getMessage() for r in caplog.records if "impostor" in r.getMessage()]
    assert any("TaskDone.value is a tuple" in w for w in warnings), warnings
    dsk = {"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}
    assert Background(manager.get, dsk, "z").result(60) == dask.get(dsk, "z")


def test_a_malformed_report_about_a_task_fails_its_run_naming_it():
    with Manager(security=False, heartbeat_interval=0.2, worker_timeout=30.0) as manager:
        fake = FakeWorker(manager, cores=1)
        try:
            getter = Background(manager.get, {"a": (inc, 1)}, "a")
            (execute,) = fake.receive(p.Execute, 1)
            done = (execute.task_id, 8, 0.01, (b"x", (5,)), 0.0, 0.0, 0.0, 0, ())
            fake.sock.send_multipart(raw_plain((p.TaskDone, done)))
            error = getter.error(30)
        finally:
            fake.close()
    assert isinstance(error, SchedulerError) and isinstance(error.__cause__, ProtocolError)
    assert "malformed TaskDone about task 'a'" in str(error) and "impostor" in str(error)
    assert "TaskDone.value is a tuple" in str(error)


class Fatal(BaseException):
    """Escapes every guard of the loop, as nothing else should."""


@pytest.mark.integration
def test_if_the_io_thread_dies_every_get_raises_at_once_and_close_returns():
    manager = Manager()
    try:
        procs = manager.start_workers(1)
        with Beacon() as beacon:
            pending = Background(manager.get, {"n": (ping_then_sleep, 0, beacon.address, 3.0)}, "n")
            beacon.wait(1)  # the task runs

        def boom(now):
            raise Fatal("injected into the loop")

        manager._io._check_timers = boom
        error = pending.error(30)
        assert isinstance(error, ManagerDied) and isinstance(error.__cause__, Fatal)
        assert "I/O thread died" in str(error) and "injected" in str(error)
        with pytest.raises(ManagerDied) as info:
            manager.get({"y": (inc, 1)}, "y")
        assert isinstance(info.value.__cause__, Fatal)
        with pytest.raises(ManagerDied):
            manager.wait_for_workers(2, timeout=600)
    finally:
        manager.close()
    assert all(proc.poll() is not None for proc in procs)


def test_an_error_in_a_step_of_the_loop_fails_only_the_runs_it_concerns(insecure_manager):
    """A bug outside the state (here: counting a worker's transfers) costs that run only."""
    manager = insecure_manager
    real = manager._io.watching.task_finished
    poisoned = {}

    def flaky(finished, now):
        if finished.key == "bad":
            poisoned["run"] = finished.run_id
            raise RuntimeError("a bug in the loop")
        return real(finished, now)

    manager._io.watching.task_finished = flaky
    bad = Background(manager.get, {"bad": (inc, 1)}, "bad", progress=True)
    error = bad.error(60)
    assert isinstance(error, SchedulerError) and isinstance(error.__cause__, RuntimeError)
    assert "TaskDone from worker local-" in str(error)
    dsk = {"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}
    assert manager.get(dsk, "z", progress=True) == dask.get(dsk, "z")


# -- 3. a worker's peer port -----------------------------------------------------------------


def test_garbage_on_a_workers_peer_port_never_kills_it(insecure_manager):
    """Problem 3: GetData(5), GetData(None), GetData(([1],)) each killed the worker."""
    import dask.bag as db

    manager = insecure_manager
    peers = [info["peer_address"] for info in manager.workers.values()]
    assert len(peers) == 2
    context = zmq.Context()
    try:
        for address in peers:
            sock = dealer(context, address)
            for request in (
                p.GetData(5),
                p.GetData(None),
                p.GetData(([1],)),
                p.GetData(("1",)),
                p.GetData((-1, 2.5)),
                p.Data(1, None),
            ):
                sock.send_multipart(p.encode([request]))
            sock.send_multipart([b"not ours"])
            sock.send_multipart([p.MAGIC + b"\x80\x05garbage"])
            sock.send_multipart(p.encode([p.GetData((123456789,))]))
            assert sock.poll(10_000)  # only the valid request is answered
            assert p.decode(sock.recv_multipart(), p.FROM_PEER) == [p.Data(123456789, None)]
    finally:
        context.destroy(linger=0)
    assert all(proc.poll() is None for proc in manager._local_processes)
    assert len(manager.workers) == 2
    bag = db.from_sequence(range(200), npartitions=20).map(inc).sum()
    assert bag.compute(scheduler=manager.get) == bag.compute(scheduler="sync")


def test_bad_peer_requests_get_no_answer_and_one_warning(worker, caplog):
    worker.store.put(3, dumps("three"))
    bad = [
        p.encode([p.GetData(5)]),
        p.encode([p.GetData(None)]),
        p.encode([p.GetData(([1],))]),
        [b"garbage"],
        p.encode([p.Data(3, None)]),
    ]
    with caplog.at_level(logging.WARNING, logger="daskvine_py.worker"):
        for _ in range(50):
            for frames in bad:
                assert worker.peers.replies(b"peer", frames) is None
    assert len(caplog.records) == 1 and "malformed request" in caplog.records[0].getMessage()
    (reply,) = worker.peers.replies(b"peer", p.encode([p.GetData((3,))]))
    assert reply.task_id == 3 and loads(reply.value) == "three"


def test_a_result_that_cannot_be_read_back_is_answered_as_not_held(worker):
    with mock.patch.object(type(worker.store), "get", side_effect=OSError("spill file gone")):
        assert worker.peers.replies(b"peer", p.encode([p.GetData((3,))])) == [p.Data(3, None)]


def test_a_malformed_reply_from_a_peer_is_dropped_and_the_fetch_goes_on(worker):
    deps = (p.DepLocation(1, "x", ("tcp://127.0.0.1:2",)),)
    worker._on_manager_frames(p.encode([p.Execute(5, "y", b"", deps, False)]))
    worker._handle(0.0)
    assert 1 in worker.state.fetcher.fetches
    worker.peers.on_frames(raw_plain((p.Data, (1, (b"x", (5,))))), worker.events)
    worker._handle(0.0)
    # It waits for a valid answer.
    assert 1 in worker.state.fetcher.fetches and 1 not in worker.store
    worker.peers.on_frames(p.encode([p.Data(1, dumps(41))]), worker.events)
    worker._handle(0.0)
    assert 1 not in worker.state.fetcher.fetches and loads(worker.store.get(1)) == 41


# -- 4. what the worker hears from the manager ------------------------------------------------


def test_only_valid_messages_from_the_manager_count_as_contact(worker):
    """Problem 4: any bytes from the manager's socket used to reset the silence timer."""
    before = worker.state.last_contact
    for frames in (
        [b"junk"],
        [p.MAGIC + b"junk"],
        p.encode([p.Welcome("w", math.nan)]),
        p.encode([p.Release(("1",))]),
        p.encode([p.GetData((1,))]),
    ):
        worker._on_manager_frames(frames)
        worker._handle(before + 100.0)
        assert worker.state.last_contact == before
    worker._on_manager_frames(p.encode([p.Heartbeat()]))
    worker._handle(before + 100.0)
    assert worker.state.last_contact == before + 100.0


def test_a_worker_fed_garbage_by_its_manager_still_notices_the_silence():
    """Over real sockets: a stream of garbage no longer keeps a 1 s timeout from firing."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    worker = Worker(f"tcp://127.0.0.1:{port}", manager_timeout=1.0)
    try:
        worker.events.append(Boot(worker._registration(), libraries=0))  # (none to wait for)
        worker._handle(time.monotonic())
        worker._flush()  # the manager's silence counts from now
        assert router.poll(5000)
        ident = router.recv_multipart()[0]
        deadline = time.monotonic() + 20.0
        while worker.running and time.monotonic() < deadline:
            router.send_multipart([ident, p.MAGIC + b"garbage"])
            worker._loop_once()
            time.sleep(0.05)
        assert not worker.running and worker.manager_gone
    finally:
        worker.manager_gone = True
        worker._close()
        context.destroy(linger=0)


def test_a_task_the_worker_cannot_read_is_reported_crashed(worker, caplog):
    bad = p.Execute(7, "k", b"", ("not a DepLocation",), False)
    good = p.Execute(8, "j", b"", (), False)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.worker"):
        worker._on_manager_frames(p.encode([bad, good, p.Cancel(("x",))]))
        worker._handle(0.0)
    (crashed,) = worker.outbox
    assert type(crashed) is p.TaskCrashed and crashed.task_id == 7
    assert "could not read" in crashed.reason and "Execute.deps" in crashed.reason
    assert 7 not in worker.state.tasks and 8 in worker.state.tasks
    assert len(caplog.records) == 1  # two bad records, one warning


def test_a_task_whose_execute_no_worker_can_read_fails_its_run_saying_why(manager):
    """The manager's side of it: the crash report comes back, the task is retried, and
    the run fails naming the task and what the worker could not read."""
    real = dispatch._location

    def broken(dep, worker):
        return real(dep, worker)._replace(task_id=str(dep.id))

    dsk = {"x": 1, "y": (inc, "x")}
    with mock.patch.object(dispatch, "_location", broken):
        with pytest.raises(TaskFailed, match=r"'y'.*could not read the task.*Execute.deps"):
            manager.get(dsk, "y", retries=1, fuse=False)  # (fused, y would read no input)
    assert manager.get(dsk, "y") == dask.get(dsk, "y")


def test_a_task_the_worker_fails_to_take_is_reported_crashed(worker):
    deps = (p.DepLocation(1, "x", None), p.DepLocation(2, "z", ("tcp://127.0.0.1:2",)))
    fetcher = type(worker.state.fetcher)
    with mock.patch.object(fetcher, "request_next", side_effect=RuntimeError("a bug")):
        worker._on_manager_frames(p.encode([p.Execute(9, "y", b"", deps, False)]))
        worker._handle(0.0)
    (crashed,) = worker.outbox
    assert type(crashed) is p.TaskCrashed and crashed.task_id == 9
    assert "could not take the task" in crashed.reason and "a bug" in crashed.reason
    # What the handler had kept before it failed is gone with it.
    assert (
        9 not in worker.state.tasks
        and not worker.state.local_waiters
        and not worker.state.fetcher.fetches
    )
    _check_worker_consistent(worker)


def test_an_address_zeromq_refuses_moves_the_fetch_to_the_next_holder(worker):
    deps = (p.DepLocation(1, "x", ("tcp://a b:1", "tcp://127.0.0.1:2")),)
    worker._on_manager_frames(p.encode([p.Execute(5, "y", b"", deps, False)]))
    worker._handle(0.0)  # (an address that cannot be asked: the next holder at once)
    fetch = worker.state.fetcher.fetches.get(1)
    if fetch is not None:  # the good holder was asked (first or after the bad one)
        assert fetch.current == "tcp://127.0.0.1:2"
    else:  # the bad one was the last to try: the manager is told
        assert any(type(m) is p.FetchFailed for m in worker.outbox)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record, problem",
    [
        (p.TaskDone(1, 1, 0.1, Serialized(b"x", [5])), "TaskDone.value: a buffer is a int"),
        (p.TaskDone(1, 1, 0.1, Serialized(memoryview(b"x"), [])), "header is a memoryview"),
        (p.TaskDone(1, 1, math.nan, None), "TaskDone.duration"),
        (p.TaskDone(1, -1, 0.1, None), "TaskDone.nbytes: negative"),
        (p.TaskDone(1, 1, 0.1, None, 0.0, 0.0, -1.0), "TaskDone.cpu"),
        (p.TaskDone(1, 1, 0.1, None, 0.0, 0.0, 0.0, -1), "TaskDone.peak_memory: negative"),
        (p.Replicas((1, "2")), "task id is a str"),
        (p.Transfers((("tcp://x:1", "many"),)), "Transfers.received"),
        (p.Register(4, "w", 0, 0, "h", "tcp://x:1", 1), "Register.cores"),
        (p.Register(4, "w", 1, 0, "h", "nowhere", 1), "Register.peer_address"),
        (p.Register(4, "w\nx", 1, 0, "h", "tcp://x:1", 1), "Register.name: 'w\\\\nx' holds"),
        (p.Register(4, "w", 1, 0, "h\x1b[2J", "tcp://x:1", 1), "Register.hostname"),
        (p.Welcome("w", math.inf), "Welcome.heartbeat_interval"),
        (p.Execute(1, ["k"], b"", (), False), "Execute.key"),
        (p.Execute(1, "k", b"", (p.DepLocation("1", "x", ()),), False), "Execute.deps"),
        (p.Execute(1, "k", b"", (p.DepLocation(1, "x", "tcp://x:1"),), False), "Execute.deps"),
        (p.Execute(1, (("k",) * 1,) * 1 + (object(),), b"", (), False), "Execute.key"),
        (p.RunConfig(1, "threads", "direct", (), (), False), "RunConfig.task_mode"),
        (p.RunConfig(1, "tasks", "direct", (), (("A", 1),), False), "RunConfig.env_vars"),
        (p.GetData(([1],)), "GetData.task_ids"),
        (p.Data(1, "value"), "Data.value"),
        (tuple.__new__(p.TaskDone, (1, 2)), "TaskDone has 2 fields"),
    ],
)
def test_fields_are_checked_inside_records(record, problem):
    with pytest.raises(ProtocolError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        p.check_fields(record)


def test_a_key_nested_too_deep_is_refused_without_recursing_forever():
    key = "k"
    for _ in range(10_000):
        key = (key,)
    with pytest.raises(ProtocolError, match="nested"):
        p.check_fields(p.Execute(1, key, b"", (), False))


def test_what_the_wire_yields_passes():
    import numpy as np

    value = dumps(np.arange(100_000))
    deps = (
        p.DepLocation(1, ("x", 1), ("tcp://h:1",)),
        p.DepLocation(2, "y", None),
        p.DepLocation(3, ("z", 0, 1.5), (), dumps(3)),
    )
    batch = [
        p.TaskDone(1, 8, 0.5, value, time.time()),
        p.Execute(2, ("k", 0), b"pl", deps, True),
        p.Function(b"f" * 16, pickle.PickleBuffer(bytes(100_000))),
        p.Data(4, value),
        p.RunConfig(3, "tasks", "fork", ("numpy",), (("A", "1"),), True),
    ]
    for direction in (p.TO_MANAGER, p.TO_WORKER, p.TO_PEER, p.FROM_PEER):
        records = [r for r in batch if type(r) in direction]
        frames = p.encode(records)
        for convert in (bytes, memoryview, lambda f: f):
            decoded = p.decode([convert(f) for f in frames], direction)
            assert [type(r) for r in decoded] == [type(r) for r in records]


def test_drop_log_warns_once_per_kind_per_interval(caplog):
    log = logging.getLogger("daskvine_py.test")
    drops = p.DropLog(log, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.test"):
        for i in range(100):
            drops.warn("a", 0.0 + i * 0.01, "dropped %d", i)
        drops.warn("b", 0.5, "other %d", 0)
        drops.warn("a", 20.0, "dropped %d", 100)
    assert [r.getMessage() for r in caplog.records] == [
        "dropped 0",
        "other 0",
        "dropped 100 (and 99 more like it in the last 20 s)",
    ]


# -- fuzzing: decoders -----------------------------------------------------------------------

_ID = st.integers(0, 2**40)
_IDS = st.lists(_ID, max_size=4).map(tuple)
_TEXT = st.text(max_size=8)
_TEXTS = st.lists(_TEXT, max_size=3).map(tuple)
#: a worker's name or host: printable, as ``str.isprintable`` says (else it is refused)
_PRINTABLE = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")),
    max_size=8,
)
_ADDRESS = st.builds(
    "tcp://{}:{}".format, st.sampled_from(["127.0.0.1", "node7", "[::1]"]), st.integers(1, 65535)
)
_SECONDS = st.floats(0, 1e9)
_SIZE = st.integers(0, 2**40)
_URL = st.builds("root://eos//store/{}.root".format, st.integers(0, 99))
_KEY = st.recursive(
    st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False)),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)
_BUFFER = st.one_of(st.binary(max_size=8), st.binary(max_size=8).map(bytearray))
_SERIALIZED = st.builds(Serialized, st.binary(max_size=16), st.lists(_BUFFER, max_size=2))
_VALUE = st.none() | _SERIALIZED
_DEP = st.builds(
    p.DepLocation, _ID, _KEY, st.none() | st.lists(_ADDRESS, max_size=2).map(tuple), _VALUE
)

#: What each field of each record may hold, written apart from protocol.py's own rules.
VALID = {
    p.Register: (_ID, _PRINTABLE, st.integers(1, 64), _SIZE, _PRINTABLE, _ADDRESS, _ID, _SIZE),
    p.TaskDone: (
        _ID,
        _SIZE,
        _SECONDS,
        _VALUE,
        _SECONDS,
        _SECONDS,
        _SECONDS,
        _SIZE,
        st.lists(st.tuples(_URL, _SIZE, st.integers(0, 2), _PRINTABLE), max_size=2).map(tuple),
    ),
    p.InputServer: (_ADDRESS, _PRINTABLE),
    p.InputsDropped: (st.lists(st.tuples(_URL, _PRINTABLE), max_size=2).map(tuple),),
    p.TaskErred: (_ID, _VALUE, _TEXT, _TEXT, _TEXT),
    p.TaskCrashed: (_ID, _TEXT),
    p.TaskExhausted: (_ID, st.just("memory"), _SIZE, _SIZE),
    p.FetchFailed: (_ID, _ID, st.lists(_ADDRESS, max_size=2).map(tuple)),
    p.Replicas: (_IDS,),
    p.Lost: (_IDS,),
    p.Relay: (_IDS,),
    p.Uploaded: (_ID, _VALUE),
    p.Upload: (_IDS,),
    p.Relayed: (_ID, _VALUE),
    p.Withdrawn: (_IDS,),
    p.Started: (_IDS,),
    p.Transfers: (st.lists(st.tuples(_ADDRESS, _SIZE), max_size=2).map(tuple),),
    p.DiskFull: (st.booleans(),),
    p.Status: (
        _SIZE,
        _SIZE,
        _SIZE,
        _SIZE,
        _SIZE,
        st.lists(
            st.tuples(
                st.integers(p.SPILL_LANE, 64),
                _TEXT,
                _SECONDS,
                _SECONDS,
                _SECONDS,
                st.integers(0, 10**6),
            ),
            max_size=3,
        ).map(tuple),
    ),
    p.Goodbye: (_TEXT,),
    p.Welcome: (_TEXT, st.floats(0.001, 100)),
    p.Rejected: (_TEXT,),
    p.Function: (st.binary(max_size=16), st.binary(max_size=16)),
    p.RunConfig: (
        _ID,
        st.sampled_from(["function-calls", "tasks"]),
        st.sampled_from(["direct", "fork"]),
        _TEXTS,
        st.lists(st.tuples(_TEXT, _TEXT), max_size=2).map(tuple),
        st.booleans(),
        st.none(),
        st.just(()),
        st.sampled_from(["", "run", "worker", "forever"]),
    ),
    p.RunEnded: (_ID,),
    p.FetchInputs: (
        _ID,
        st.sampled_from(["run", "worker", "forever"]),
        st.lists(
            st.tuples(_URL, _SIZE, _PRINTABLE, st.lists(_ADDRESS, max_size=2).map(tuple)),
            max_size=2,
        ).map(tuple),
    ),
    p.Execute: (
        _ID,
        _KEY,
        st.binary(max_size=8),
        st.lists(_DEP, max_size=3).map(tuple),
        st.booleans(),
        _ID,
        st.booleans(),
        st.integers(1, 64),
        _SIZE,
        _SIZE,
    ),
    p.Release: (_IDS,),
    p.Cancel: (_IDS,),
    p.Withdraw: (_IDS,),
    p.Abort: (_IDS, _TEXT),
    p.Replicate: (_ID, st.lists(_ADDRESS, max_size=2).map(tuple)),
    p.Heartbeat: (),
    p.Shutdown: (_TEXT,),
    p.GetData: (_IDS,),
    p.Data: (_ID, _VALUE),
    p.StatusRequest: (_ID, _TEXT),
    p.RetireWorker: (_TEXT, _TEXT),
    p.StatusReply: (
        _SIZE,
        st.lists(st.tuples(_TEXT, st.integers(1, 64), _SECONDS), max_size=3).map(tuple),
    ),
    p.LiveRequest: (_ID,),
    p.LiveReply: (_ID, st.dictionaries(_TEXT, st.integers(0, 9), max_size=3)),
}
DIRECTIONS = {
    "TO_MANAGER": p.TO_MANAGER,
    "TO_WORKER": p.TO_WORKER,
    "TO_PEER": p.TO_PEER,
    "FROM_PEER": p.FROM_PEER,
    "FROM_CLIENT": p.FROM_CLIENT,
    "TO_CLIENT": p.TO_CLIENT,
}

_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=6),
    st.binary(max_size=6),
)
_ANY = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.builds(Crafted, inner, inner),
        st.builds(Crafted, st.binary(max_size=4), st.lists(inner, max_size=2)),
        st.builds(lambda *f: tuple.__new__(p.DepLocation, f), inner, inner, inner, inner),
        st.dictionaries(_TEXT, inner, max_size=2),
    ),
    max_leaves=6,
)


@st.composite
def records(draw, kinds):
    """A record of one of ``kinds``: valid, or with some fields replaced by anything at
    all, and now and then too few or too many fields."""
    kind = draw(st.sampled_from(sorted(kinds, key=lambda k: k.__name__)))
    corrupt = draw(st.booleans())  # half of them valid throughout
    fields = [draw(_ANY if corrupt and draw(st.booleans()) else valid) for valid in VALID[kind]]
    if draw(st.integers(0, 9)) == 0:
        fields = fields[: draw(st.integers(0, len(fields)))] + draw(st.lists(_ANY, max_size=2))
        return tuple.__new__(kind, fields)
    return kind(*fields)


def _usable(record):
    """What code does with a record that passed: re-encode it, size its values."""
    p.encode([record])
    for value in record:
        if type(value) is Serialized:
            assert value.nbytes >= 0
    if type(record) is p.Execute:
        hash(record.key)
        assert all(d.value is None or d.value.nbytes >= 0 for d in record.deps)


def _decode_or_protocol_error(frames, allowed):
    try:
        decoded = p.decode(frames, allowed)
    except ProtocolError:
        return None
    for record in decoded:
        _usable(record)
    return decoded


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@_FUZZ
@given(direction=st.sampled_from(sorted(DIRECTIONS)), data=st.data())
def test_fuzz_records_decode_valid_or_raise_protocol_error(direction, data):
    allowed = DIRECTIONS[direction]
    kinds = allowed if data.draw(st.integers(0, 4)) else set(VALID)  # now and then any kind
    batch = data.draw(st.lists(records(kinds), min_size=1, max_size=3))
    try:
        frames = p.encode(batch)
    except (TypeError, ValueError, pickle.PicklingError):
        frames = [p.MAGIC + pickle.dumps(batch, protocol=5)]  # Serialized refuses an int buffer
    for convert in (bytes, memoryview):
        _decode_or_protocol_error([convert(f) for f in frames], allowed)
    if len(batch) == 1 and type(batch[0]) in validation._FAST:
        # The hand-written predicate never accepts what the rules refuse.
        with mock.patch.dict(validation._FAST, clear=True):
            try:
                p.check_fields(batch[0])
                by_rules = True
            except ProtocolError:
                by_rules = False
        assert by_rules or not validation._FAST[type(batch[0])](batch[0])


@_FUZZ
@given(
    direction=st.sampled_from(sorted(DIRECTIONS)),
    frames=st.one_of(
        st.lists(st.binary(max_size=64), max_size=4),
        st.lists(st.binary(max_size=64), min_size=1, max_size=3).map(
            lambda f: [p.MAGIC + f[0], *f[1:]]
        ),
        st.lists(_ANY, max_size=4).map(lambda v: [p.MAGIC + pickle.dumps(v, protocol=5)]),
        _ANY.map(lambda v: [p.MAGIC + pickle.dumps(v, protocol=5), b"\x00" * 8]),
        st.lists(st.binary(max_size=64), min_size=1, max_size=3).map(
            lambda f: [p.PLAIN_MAGIC + f[0], *f[1:]]
        ),
    ),
)
def test_fuzz_frames_decode_valid_or_raise_protocol_error(direction, frames):
    _decode_or_protocol_error(frames, DIRECTIONS[direction])


# -- fuzzing: the scheduler state under inconsistent reports ---------------------------------

_REPORTS = (
    p.TaskDone,
    p.TaskErred,
    p.TaskCrashed,
    p.FetchFailed,
    p.Replicas,
    p.Lost,
    p.Withdrawn,
    p.Started,
    p.DiskFull,
    p.Relay,
    p.Uploaded,
    p.TaskExhausted,
)


#: The raw material of a false report, drawn before the run: which values it takes is
#: decided against the state when it is sent (see ``bogus_report``), so that the draws never
#: depend on the state (whose set iteration order varies between runs).
_BOGUS = st.tuples(
    st.booleans(),  # aimed at a task processing now, from its own worker
    st.integers(0, 2**16),  # which one
    st.sampled_from([b"w0", b"w1", b"w2", b"nobody"]),  # else: from whom
    st.integers(0, 2**16),  # and about which task id
    st.sampled_from(_REPORTS + (p.Status,)),
    st.integers(0, 2**16),  # a second task id (FetchFailed's input), a count, a flag
    st.integers(0, 9),  # 0: a malformed record (BadReport)
)


def bogus_report(spec, state):
    """A report no worker should send now: stale, unknown or simply false."""
    aimed, pick, worker, offset, kind, other, malformed = spec
    max_id = state.ctx.next_id + 3
    processing = sorted((t.id, t.worker.id) for t in state.tasks.values() if t.worker)
    if aimed and processing:
        task_id, worker = processing[pick % len(processing)]
    else:
        task_id = 1 + offset % max_id
    if kind is p.TaskDone:
        message = p.TaskDone(task_id, other, other / 7, dumps("bogus") if other % 2 else None)
    elif kind is p.TaskErred:
        message = p.TaskErred(task_id, None, "tb", "bogus error")
    elif kind is p.TaskCrashed:
        message = p.TaskCrashed(task_id, "bogus crash")
    elif kind is p.TaskExhausted:
        message = p.TaskExhausted(task_id, "memory", other * 2**20, (other % 3) * 2**20)
    elif kind is p.FetchFailed:
        peers = [(), ("w0",), ("w1", "w2")][other % 3]
        message = p.FetchFailed(task_id, 1 + other % max_id, peers)
    elif kind in (p.Replicas, p.Withdrawn, p.Started, p.Lost, p.Relay):
        message = kind((task_id, 1 + other % max_id)[: other % 3])
    elif kind is p.Uploaded:
        message = p.Uploaded(task_id, dumps("bogus") if other % 2 else None)
    elif kind is p.DiskFull:
        message = p.DiskFull(bool(other % 2))
    else:
        message = p.Status(1, 2, 3, 4)  # not a report the state takes: dropped
    if malformed == 0:
        return s.BadReport(worker, kind.__name__, p.task_ids_named(message), ProtocolError("x"))
    return s.FromWorker(worker, message)


class HonestCluster(SimulatedCluster):
    """The simulated cluster, closer to a real worker where false reports lead: a task
    waiting here for an input computed here, whose result is released before it starts,
    is reported as a failed fetch when it would start (a real worker's ``_next_runnable``)."""

    def deliver(self, worker, message):
        super().deliver(worker, message)
        if type(message) is not p.Release or worker not in self.stores:
            return
        released = set(message.task_ids)
        for msg in list(self.queued[worker]):
            for dep in msg.deps:
                if dep.peers is None and dep.task_id in released:
                    self.queued[worker].remove(msg)
                    failed = p.FetchFailed(msg.task_id, dep.task_id, (worker.decode(),))
                    self.pending.append(s.FromWorker(worker, failed))
                    break


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=2),
    seed=st.integers(0, 10**6),
    data=st.data(),
)
def test_fuzz_inconsistent_reports_never_break_the_state_and_every_run_ends(graphs, seed, data):
    cluster = HonestCluster(seed)
    aborted, dropped = {}, []
    state_handle = cluster.state.handle

    def handle(events, now=0.0):
        out = state_handle(events, now)  # never raises: that is the point
        for instruction in out:
            if type(instruction) is s.RunAborted:
                aborted[instruction.run_id] = instruction
                cluster.done[instruction.run_id] = "aborted"
            elif type(instruction) is s.EventDropped:
                dropped.append(instruction)
        return out

    cluster.state.handle = handle
    cluster.join(b"w0")
    cluster.join(b"w1")
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 3)])
    bogus = iter(data.draw(st.lists(_BOGUS, max_size=40)))
    for _ in range(5_000):
        if not cluster.pending and not any(
            cluster.startable(w, m) for w, queue in cluster.queued.items() for m in queue
        ):
            break  # what is left waits for inputs a false report made the state drop
        if cluster.rng.random() < 0.15:
            spec = next(bogus, None)
            if spec is not None:
                cluster.apply([bogus_report(spec, cluster.state)])
                continue
        cluster.step()
    # Every run ended: done, failed or aborted; none is left waiting.
    assert set(cluster.done) == set(range(1, len(graphs) + 1)), (cluster.done, cluster.queued)
    for run_id, (_, outputs) in enumerate(graphs, start=1):
        if cluster.done[run_id] == "done":
            assert set(cluster.outputs.get(run_id, {})) == set(outputs)
    # Only a report the state cannot make sense of aborts a run: an output's TaskDone
    # without its value. Nothing else (no InvalidTransition) may surface.
    for instruction in aborted.values():
        assert isinstance(instruction.error, (ValueError, ProtocolError)), instruction
    assert not [d for d in dropped if "Status" not in d.what], dropped
    # And nothing was left behind.
    assert not cluster.state.tasks and not cluster.state.runs
    assert all(not w.has_what and not w.processing for w in cluster.state.workers.values())


# -- fuzzing: the worker's handlers ----------------------------------------------------------


def _check_worker_consistent(worker):
    tasks = worker.state.tasks
    for dep_id, fetch in worker.state.fetcher.fetches.items():
        assert fetch.dep_id == dep_id and fetch.waiters <= set(tasks), (dep_id, fetch.waiters)
    for dep_id, waiters in worker.state.local_waiters.items():
        assert waiters and waiters <= set(tasks), (dep_id, waiters)
    for task in tasks.values():
        for dep_id in task.missing:
            fetch = worker.state.fetcher.fetches.get(dep_id)
            assert (fetch is not None and task.id in fetch.waiters) or task.id in (
                worker.state.local_waiters.get(dep_id, ())
            ), (task.id, dep_id)
    in_flight = sum(1 for f in worker.state.fetcher.fetches.values() if f.current is not None)
    assert worker.state.fetcher.slots.in_flight == in_flight


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batches=st.lists(
        st.one_of(
            st.lists(records(p.TO_WORKER), min_size=1, max_size=3).map(lambda b: ("manager", b)),
            st.lists(records(p.TO_PEER | p.FROM_PEER), min_size=1, max_size=2).map(
                lambda b: ("peer", b)
            ),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_fuzz_the_workers_handlers_never_raise_and_stay_consistent(batches):
    with offline_worker() as worker:
        worker.store.put(1, dumps("held"))
        for source, batch in batches:
            try:
                frames = p.encode(batch)
            except (TypeError, ValueError, pickle.PicklingError):
                frames = [p.MAGIC + pickle.dumps(batch, protocol=5)]
            before = worker.state.last_contact
            if source == "manager":
                worker._on_manager_frames(frames)
                worker._handle(before + 1.0)
                if worker.state.last_contact != before:  # only a valid record counts as contact
                    # judged on what arrived: a crafted object may unpickle as a valid value
                    assert any(_valid(r) for r in p.unpack(frames, p.TO_WORKER))
            else:
                replies = worker.peers.replies(b"peer", frames)
                assert replies is None or all(type(r) is p.Data for r in replies)
                worker.peers.on_frames(frames, worker.events)
                worker._handle(before)
            _check_worker_consistent(worker)
            worker.outbox.clear()


def _valid(record):
    try:
        p.check_fields(record)
    except ProtocolError:
        return False
    return True


def test_the_fuzz_suite_leaves_no_worker_directory_behind():
    with offline_worker() as worker:
        directory = worker.workdir
    assert not os.path.exists(directory)
