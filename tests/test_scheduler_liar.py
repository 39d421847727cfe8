"""A worker that answers wrong (issue 38), in the scheduler state: literal events in,
instructions out. A failure caused by an input implicates the input's producer, not the
worker where it surfaced; honest work is never struck for it.

The workers are played by ``Cluster``: each answers the ``Execute``s it was sent in the
order sent. The liar answers every task with ``0.0``; an honest worker computes ``x``
(``1.0``) and raises in ``y`` when its input is the liar's (as a division by it would),
else returns ``2.0``. Which worker made which result is the cluster's own bookkeeping.
"""

from __future__ import annotations

import pytest

from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.faults import STRIKES
from daskvine_py.scheduler.messages import Quarantined
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps, loads

pytestmark = pytest.mark.timeout(30)

W1, W2, W3, W4, LIAR = b"w1", b"w2", b"w3", b"w4", b"liar"
RAISED = "ZeroDivisionError: float division by zero"


def joined(worker: bytes) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), 1, f"tcp://{worker.decode()}")


def x_then_y(run_id: int) -> s.SubmitRun:
    """x, then y reading x; the output is y."""
    x, y = ("x", run_id), ("y", run_id)
    tasks = [s.NewTask(x, b"", (), (), 0, "x"), s.NewTask(y, b"", (), (x,), 1, "y")]
    return s.SubmitRun(run_id, tasks, [("y", run_id)], 3)


class Cluster:
    """The state and the workers around it; see the module docstring."""

    def __init__(self, workers: tuple[bytes, ...], liars: tuple[bytes, ...] = (LIAR,)) -> None:
        self.st = s.SchedulerState(fixed_extra_tasks_per_core=0, chain_ahead=0)
        self.liars = liars
        self.now = 0.0
        #: Executes sent and not yet answered: (worker, task id, key)
        self.pending: list[tuple[bytes, int, object]] = []
        #: the worker that computed each key's result last
        self.made: dict[object, bytes] = {}
        #: every worker a task raised on, by key
        self.raised: dict[object, list[bytes]] = {}
        #: fails(worker, key) -> True: an honest worker raises in that task (a task's own
        #: error, whatever its inputs)
        self.fails = lambda worker, key: False
        self.outputs: dict[int, object] = {}
        self.ended: dict[int, s.RunDone | s.RunFailed] = {}
        self.quarantined: list[Quarantined] = []
        self.handle([joined(w) for w in workers])

    def handle(self, events: list) -> list:
        self.now += 0.1
        out = self.st.handle(events, self.now)
        for i in out:
            if type(i) is s.Send and type(i.message) is p.Execute:
                self.pending.append((i.worker, i.message.task_id, i.message.key))
            elif type(i) is s.Send and type(i.message) in (p.Cancel, p.Abort):
                ids = set(i.message.task_ids)
                self.pending = [e for e in self.pending if not (e[0] == i.worker and e[1] in ids)]
            elif type(i) is s.RunOutput:
                self.outputs[i.run_id] = loads(i.value)
            elif type(i) in (s.RunDone, s.RunFailed):
                self.ended[i.run_id] = i
            elif type(i) is Quarantined:
                self.quarantined.append(i)
        return out

    def answer(self, worker: bytes, task_id: int, key: object) -> p.TaskDone | p.TaskErred:
        kind, run_id = key  # type: ignore[misc]
        if worker in self.liars:
            self.made[key] = worker
            return p.TaskDone(task_id, 8, 0.01, dumps(0.0))
        bad_input = kind == "y" and self.made.get(("x", run_id)) in self.liars
        if bad_input or self.fails(worker, key):
            self.raised.setdefault(key, []).append(worker)
            return p.TaskErred(task_id, None, "tb", RAISED, "builtins.ZeroDivisionError")
        self.made[key] = worker
        return p.TaskDone(task_id, 8, 0.01, dumps(1.0 if kind == "x" else 2.0))

    def settle(self, run_id: int) -> s.RunDone | s.RunFailed:
        """Answer every Execute in the order sent until run ``run_id`` ends."""
        for _ in range(100):
            if run_id in self.ended:
                return self.ended[run_id]
            assert self.pending, "nothing runs and the run has not ended"
            worker, task_id, key = self.pending.pop(0)
            self.handle([s.FromWorker(worker, self.answer(worker, task_id, key))])
        raise AssertionError("the run never ended")

    def run_x_on(self, run_id: int, producer: bytes, others: tuple[bytes, ...]) -> None:
        """Submit x -> y with x computed on ``producer`` and y sent to one of ``others``
        (the rest are full meanwhile, as ``DiskFull`` makes them), then let every worker
        take tasks again."""
        full = [w for w in self.st.workers if w != producer]
        self.handle([s.FromWorker(w, p.DiskFull(True)) for w in full] + [x_then_y(run_id)])
        ((worker, task_id, key),) = self.pending
        assert worker == producer
        self.pending.clear()
        self.handle(
            [s.FromWorker(producer, self.answer(producer, task_id, key))]
            + [s.FromWorker(producer, p.DiskFull(True))]
            + [s.FromWorker(w, p.DiskFull(False)) for w in others]
        )
        ((worker, _, key),) = self.pending
        assert worker in others and key == ("y", run_id)
        self.handle([s.FromWorker(w, p.DiskFull(False)) for w in self.st.workers])

    def strikes(self, worker: bytes) -> float:
        faults = self.st.faults
        record = self.st.workers[worker]
        return faults.strikes.get(record, 0.0) + faults.suspected.get(record, 0)


def test_a_liar_whose_zeros_fail_honest_workers_is_the_suspect_and_they_are_not():
    """Issue 38: y reads the liar's x, raises on the honest workers and "succeeds" on the
    liar. The honest ones were struck and quarantined; the run was done with the liar's
    zero. Now the liar's input is implicated: the run fails with the error the honest
    workers raised, the liar is struck, then quarantined, and the runs after are right."""
    cluster = Cluster((LIAR, W1, W2))
    for run_id in range(1, 9):
        if cluster.st.workers[LIAR].quarantined is None:
            cluster.run_x_on(run_id, LIAR, (W1, W2))
        else:
            cluster.handle([x_then_y(run_id)])
        ended = cluster.settle(run_id)
        if type(ended) is s.RunFailed:
            assert ended.type_name == "builtins.ZeroDivisionError"
            assert sorted(cluster.raised[("y", run_id)]) == [W1, W2]  # then the liar
            assert "liar" in ended.message and "suspect" in ended.message
        else:
            assert cluster.outputs[run_id] == 2.0  # x and y on honest workers
        assert cluster.outputs.get(run_id) != 0.0  # never the liar's answer
        for honest in (W1, W2):
            assert cluster.strikes(honest) == 0, run_id
    assert [q.worker for q in cluster.quarantined] == [LIAR]
    assert "suspect" in (cluster.quarantined[0].reason or "")
    assert type(cluster.ended[8]) is s.RunDone


def test_with_two_workers_a_failure_then_a_success_on_the_inputs_producer_strikes_no_one():
    """y reads the liar's x, raises on w1 and succeeds on the liar: nothing settles which
    is wrong (a black hole, or a liar), so neither is struck."""
    cluster = Cluster((LIAR, W1))
    for run_id in range(1, 2 * int(STRIKES) + 2):
        cluster.run_x_on(run_id, LIAR, (W1,))
        cluster.settle(run_id)
        assert cluster.strikes(W1) == 0 and cluster.strikes(LIAR) == 0
    assert cluster.quarantined == []


def test_an_error_raised_everywhere_on_an_honest_input_strikes_no_one():
    """y's own error: it raises on w2, on w3 (a witness that did not make its input),
    then on w1 (its input's producer, which settles it): the run fails with it."""
    cluster = Cluster((W1, W2, W3), liars=())
    cluster.fails = lambda worker, key: key[0] == "y"
    for run_id in range(1, 5):
        cluster.run_x_on(run_id, W1, (W2,))
        ended = cluster.settle(run_id)
        assert type(ended) is s.RunFailed and ended.type_name == "builtins.ZeroDivisionError"
        assert "suspect" not in ended.message
        assert cluster.raised[("y", run_id)] == [W2, W3, W1]
    assert all(cluster.strikes(w) == 0 for w in (W1, W2, W3))
    assert cluster.quarantined == []


def test_a_worker_failing_tasks_whose_inputs_succeed_elsewhere_is_struck_not_their_producer():
    """A black hole (w2) fails y, whose input w1 made; w3 and w4 (no producers of it)
    run it fine, in turn: once two witnesses saw its failures succeed, w2 is struck at
    each, and quarantined at three; w1 never."""
    cluster = Cluster((W1, W2, W3, W4), liars=())
    cluster.fails = lambda worker, key: worker == W2
    for run_id in range(1, int(STRIKES) + 2):
        cluster.run_x_on(run_id, W1, (W2,))
        ended = cluster.settle(run_id)
        assert type(ended) is s.RunDone and cluster.outputs[run_id] == 2.0
        assert cluster.made[("y", run_id)] in (W3, W4)
        assert cluster.strikes(W1) == 0 and cluster.strikes(W3) == cluster.strikes(W4) == 0
    assert {cluster.made[("y", 1)], cluster.made[("y", 2)]} == {W3, W4}
    assert [q.worker for q in cluster.quarantined] == [W2]


def test_a_liar_succeeding_at_a_task_that_raises_everywhere_strikes_no_one():
    """A task that raises wherever it runs (no inputs), failed on w1, then "succeeded" on
    the liar: one witness, which may be a liar, is no strike."""
    cluster = Cluster((W1, LIAR), liars=(LIAR,))
    cluster.fails = lambda worker, key: True
    for run_id in range(1, 2 * int(STRIKES) + 2):
        cluster.handle([s.FromWorker(LIAR, p.DiskFull(True)), x_then_y(run_id)])
        cluster.handle([s.FromWorker(LIAR, p.DiskFull(False))])
        cluster.settle(run_id)
        assert cluster.strikes(W1) == 0
    assert cluster.quarantined == []


def test_a_flaky_failure_is_one_forgiven_strike_and_never_its_inputs_producers():
    cluster = Cluster((W1, W2, W3), liars=())
    flaked: set = set()

    def once(worker: bytes, key: object) -> bool:
        if key == ("y", 1) and key not in flaked:
            flaked.add(key)
            return True
        return False

    cluster.fails = once
    cluster.run_x_on(1, W1, (W2,))
    assert type(cluster.settle(1)) is s.RunDone and cluster.outputs[1] == 2.0
    assert cluster.strikes(W2) <= 1.0 and cluster.strikes(W1) == 0
    for run_id in range(2, 5):  # work done forgives it
        cluster.run_x_on(run_id, W1, (W2,))
        cluster.settle(run_id)
    assert cluster.strikes(W2) == 0 and cluster.quarantined == []
