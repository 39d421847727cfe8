"""Optional verification (``get(..., verify=f)``): a share of the tasks run again on
another worker and their results are compared by content hash; a mismatch fails the run
naming both workers."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import pytest

from daskvine_py import Manager
from daskvine_py.errors import TaskFailed
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.messages import Quarantined
from daskvine_py.scheduler.verify import chosen
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from keyed import KeyedWorker

W1, W2 = b"w1", b"w2"


def joined(worker: bytes) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), 1, f"tcp://{worker.decode()}")


def executes(out: list, worker: bytes) -> list[p.Execute]:
    return [
        i.message
        for i in out
        if type(i) is s.Send and i.worker == worker and type(i.message) is p.Execute
    ]


def two_step(verify: float) -> s.SubmitRun:
    """x, then y reading x; the output is y."""
    tasks = [s.NewTask("x", b"px", (), (), 0), s.NewTask("y", b"py", (), ("x",), 1)]
    return s.SubmitRun(1, tasks, ["y"], 3, verify=verify)


def test_the_sample_is_the_share_asked_for_spread_over_the_ids():
    picked = [i for i in range(1, 100_001) if chosen(i, 0.05)]
    assert 4_500 < len(picked) < 5_500
    assert not [i for i in range(1, 1000) if chosen(i, 0.0)]
    assert all(chosen(i, 1.0) for i in range(1, 1000))


def by_key(out: list) -> dict:
    """The ``Execute``s in ``out`` by key: [(worker, record), ...]."""
    found: dict = {}
    for worker in (W1, W2):
        for e in executes(out, worker):
            found.setdefault(e.key, []).append((worker, e))
    return found


def test_a_chosen_task_runs_again_on_the_other_worker_and_matching_results_count():
    st_ = s.SchedulerState(chain_ahead=0)
    out = st_.handle([joined(W1), two_step(verify=1.0)])
    [(_, x)] = by_key(out)["x"]
    assert x.want_result  # its value comes back to be hashed
    st_.handle([joined(W2)])
    out = st_.handle([s.FromWorker(W1, p.TaskDone(x.task_id, 8, 0.01, dumps(41)))])
    sent = by_key(out)
    [(where, shadow)] = sent["x"]
    assert where == W2 and shadow.payload == b"px" and shadow.keep is False
    assert shadow.task_id != x.task_id and shadow.want_result
    assert st_.tasks[x.task_id].state == "memory"  # held for the re-run (and for y)
    out = st_.handle([s.FromWorker(W2, p.TaskDone(shadow.task_id, 8, 0.01, dumps(41)))])
    assert st_.runs[1].verified == 1
    assert not [i for i in out if type(i) is s.RunDone]  # y is not done yet


def test_results_that_differ_fail_the_run_naming_both_workers():
    st_ = s.SchedulerState(chain_ahead=0)
    out = st_.handle([joined(W1), joined(W2), two_step(verify=1.0)])
    [(worker, x)] = by_key(out)["x"]
    other = W2 if worker == W1 else W1
    out = st_.handle([s.FromWorker(worker, p.TaskDone(x.task_id, 8, 0.01, dumps(41)))])
    [(where, shadow)] = by_key(out)["x"]
    assert where == other
    out = st_.handle([s.FromWorker(other, p.TaskDone(shadow.task_id, 8, 0.01, dumps(40)))])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "x" and "verification failed" in failed.message
    assert worker.decode() in failed.message and other.decode() in failed.message
    assert not st_.runs and not st_.tasks  # the run and every record of it are gone


W3 = b"w3"


def disagreement(third: bool = True) -> tuple[s.SchedulerState, list, bytes, bytes, int]:
    """x's first run and its re-run differ (41 and 40); ``third``: a third worker, w3,
    is there to settle it. The state, the instructions of the re-run's result, the
    workers of the first run and of the re-run, and the id of x."""
    st_ = s.SchedulerState(chain_ahead=0)
    workers = [joined(W1), joined(W2)] + ([joined(W3)] if third else [])
    out = st_.handle([*workers, two_step(verify=1.0)])
    ((first, x),) = [
        (i.worker, i.message)
        for i in out
        if type(i) is s.Send and type(i.message) is p.Execute and i.message.key == "x"
    ]
    out = st_.handle([s.FromWorker(first, p.TaskDone(x.task_id, 8, 0.01, dumps(41)))])
    ((second, shadow),) = [
        (i.worker, i.message)
        for i in out
        if type(i) is s.Send and type(i.message) is p.Execute and i.message.key == "x"
    ]
    assert second != first
    out = st_.handle([s.FromWorker(second, p.TaskDone(shadow.task_id, 8, 0.01, dumps(40)))])
    return st_, out, first, second, x.task_id


def referee(out: list) -> tuple[bytes, p.Execute]:
    ((worker, execute),) = [
        (i.worker, i.message)
        for i in out
        if type(i) is s.Send and type(i.message) is p.Execute and i.message.key == "x"
    ]
    return worker, execute


def suspected(st_: s.SchedulerState) -> dict[str, int]:
    return {w.name: n for w, n in st_.faults.suspected.items()}


def test_a_disagreement_is_settled_by_a_third_worker_and_the_odd_re_run_is_the_suspect():
    st_, out, first, second, _ = disagreement()
    assert not [i for i in out if type(i) is s.RunFailed]
    where, third = referee(out)
    assert where not in (first, second) and third.want_result and third.keep is False
    out = st_.handle([s.FromWorker(where, p.TaskDone(third.task_id, 8, 0.01, dumps(41)))])
    assert not [i for i in out if type(i) is s.RunFailed]
    assert st_.runs[1].verified == 1
    assert suspected(st_) == {second.decode(): 1}  # once: not quarantined yet
    assert st_.workers[second].quarantined is None


def test_a_third_worker_agreeing_with_the_re_run_fails_the_run_naming_the_first_worker():
    st_, out, first, second, _ = disagreement()
    where, third = referee(out)
    out = st_.handle([s.FromWorker(where, p.TaskDone(third.task_id, 8, 0.01, dumps(40)))])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "x" and "verification failed" in failed.message
    assert f"worker {first.decode()} computed it wrong" in failed.message
    assert suspected(st_) == {first.decode(): 1}
    assert not st_.runs and not st_.tasks


def test_three_different_results_fail_the_run_and_strike_no_one():
    st_, out, first, second, _ = disagreement()
    where, third = referee(out)
    out = st_.handle([s.FromWorker(where, p.TaskDone(third.task_id, 8, 0.01, dumps(39)))])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert "matches neither" in failed.message
    assert suspected(st_) == {} and not st_.runs and not st_.tasks


def test_a_disagreement_with_no_third_worker_fails_the_run_naming_both():
    st_, out, first, second, _ = disagreement(third=False)
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "x" and "no third worker" in failed.message
    assert first.decode() in failed.message and second.decode() in failed.message
    assert suspected(st_) == {} and not st_.runs and not st_.tasks


def test_a_worker_caught_twice_by_referees_is_quarantined():
    st_ = s.SchedulerState(chain_ahead=0)
    st_.handle([joined(W1), joined(W2), joined(W3)])
    quarantined = []
    for run_id in (1, 2):
        tasks = [s.NewTask("x", b"px", (), (), 0), s.NewTask("y", b"py", (), ("x",), 1)]
        out = st_.handle([s.SubmitRun(run_id, tasks, ["y"], 3, verify=1.0)])
        for _ in range(20):  # every worker answers 41 for x, 42 for y; w2 answers 0
            sent = [
                (i.worker, i.message)
                for i in out
                if type(i) is s.Send and type(i.message) is p.Execute
            ]
            if not sent:
                break
            events = [
                s.FromWorker(
                    w,
                    p.TaskDone(
                        e.task_id, 8, 0.01, dumps(0 if w == W2 else 41 if e.key == "x" else 42)
                    ),
                )
                for w, e in sent
            ]
            out = st_.handle(events)
            quarantined += [i for i in out if type(i) is Quarantined]
    assert [q.worker for q in quarantined] == [W2]


def test_one_worker_verifies_nothing_and_releases_what_it_held():
    st_ = s.SchedulerState(chain_ahead=0)
    out = st_.handle([joined(W1), two_step(verify=1.0)])
    sent = by_key(out)
    [(_, x)] = sent["x"]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(x.task_id, 8, 0.01, dumps(41)))])
    [(_, y)] = sent.get("y") or by_key(out)["y"]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(y.task_id, 8, 0.01, dumps(42)))])
    assert [i for i in out if type(i) is s.RunDone] and not st_.tasks


def _double(x):
    return 2 * x


@pytest.mark.timeout(120)
def test_a_verified_run_computes_what_dask_computes(shared_manager):
    manager = shared_manager
    x = da.arange(2000, chunks=50)
    total = ((x + 1) * 3).sum()
    expected = dask.compute(total, scheduler="sync")[0]
    (got,) = dask.compute(total, scheduler=manager.get, verify=0.5)
    assert got == expected
    assert manager.last_run.verified > 0  # some re-runs ran elsewhere and matched


class _Liar(threading.Thread):
    """A registered worker that answers every task it is sent with 0."""

    def __init__(self, manager: Manager) -> None:
        super().__init__(daemon=True)
        self.worker = KeyedWorker(manager, "liar", cores=4)
        self.stop = threading.Event()

    def run(self) -> None:
        sock = self.worker.sock
        while not self.stop.is_set():
            if not sock.poll(50):
                continue
            for record in p.decode(sock.recv_multipart(), p.TO_WORKER):
                if type(record) is p.Execute:
                    self.worker.send(p.TaskDone(record.task_id, 8, 0.001, dumps(0)))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_worker_that_answers_wrong_is_caught_by_verification():
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        liar = _Liar(manager)
        liar.start()
        try:
            dsk = {("x", i): (_double, i + 1) for i in range(40)}
            dsk["total"] = (sum, [("x", i) for i in range(40)])
            with pytest.raises(TaskFailed, match="verification failed") as info:
                manager.get(dsk, "total", verify=1.0)
            assert "liar" in str(info.value)
        finally:
            liar.stop.set()
            liar.join(5)
            liar.worker.close()


def _drive(st_: s.SchedulerState, out: list, rounds: int = 20) -> list:
    """Answer every ``Execute`` with its key's value until nothing more is sent."""
    everything = list(out)
    for _ in range(rounds):
        sent = [(i.worker, i.message) for i in out if type(i) is s.Send]
        sent = [(w, m) for w, m in sent if type(m) is p.Execute]
        if not sent:
            break
        out = st_.handle(
            [s.FromWorker(w, p.TaskDone(m.task_id, 8, 0.01, dumps(m.key))) for w, m in sent]
        )
        everything += out
    return everything


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_verified_run_whose_only_other_worker_is_quarantined_ends(when):
    """Verification needs a second usable worker: with none (the other one quarantined
    before the re-run was placed, or after), the task goes unverified and the run ends;
    it never waits for ever on a worker that takes no new tasks."""
    st_ = s.SchedulerState(chain_ahead=0)
    out = st_.handle([joined(W1), joined(W2)])
    other = st_.workers[W2]
    if when == "before":
        st_.ctx.faults.quarantine(other, "struck: a test")
    out = st_.handle([two_step(verify=1.0)])
    [(first, x)] = by_key(out)["x"]
    if when == "after":  # the re-run is sent to the other worker, then it is quarantined
        out = [i for i in out if not (type(i) is s.Send and i.message == x)]
        out += st_.handle([s.FromWorker(first, p.TaskDone(x.task_id, 8, 0.01, dumps("x")))])
        st_.ctx.faults.quarantine(st_.workers[W2 if first == W1 else W1], "struck: a test")
        out += st_.handle([s.Tick()], 1.0)
    everything = _drive(st_, out)
    assert [i for i in everything if type(i) is s.RunDone], everything
