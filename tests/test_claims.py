"""Workers that lie (issue 29, part 2): reports checked against what the manager told each
worker (``scheduler/claims.py``), ``Transfers`` checked before they count
(``manager/transfers.py``), and ``RetireWorker`` limited to what a pool does
(``manager/registry.py``).

The state's side is driven with literal events and with a simulated cluster in which one
worker lies; the manager's with a ``KeyedWorker`` beside real workers running real graphs.
"""

from __future__ import annotations

import logging
import random
import threading

import dask
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py.manager.transfers import MAX_REPORTED_BYTES, credible
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.claims import ABORT_GRACE, EJECT_AFTER, FORGIVE_AFTER
from daskvine_py.scheduler.messages import Eject, RunCache
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from keyed import KeyedWorker
from test_state import SimulatedCluster, expected_value, random_graphs

W1, W2, LIAR = b"w1", b"w2", b"liar"
FALSE = "which the manager never sent or asked it for"


def reads_on(st_: s.SchedulerState, worker: bytes, now: float, run_id: int = 90) -> None:
    """``worker`` is sent a task at ``now`` (one of a new run's, or any other the state
    sends it then) and reports it done: it has read everything the manager sent it
    before (one connection keeps the order)."""
    keys = [f"later-{run_id}-{i}" for i in range(2 * len(st_.workers))]  # some for each
    tasks = [s.NewTask(key, b"", (), (), i) for i, key in enumerate(keys)]
    st_.ctx.next_id = max(st_.ctx.next_id, 100_000)  # (clear of the ids the tests make up)
    out = st_.handle([s.SubmitRun(run_id, tasks, keys, 0)], now)
    execute = sends(out, p.Execute, worker)[0]
    st_.handle(report(worker, p.TaskDone(execute.task_id, 8, 0.1, dumps(0))), now)


def joined(worker: bytes, cores: int = 1) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), cores, f"tcp://{worker.decode()}")


def report(worker: bytes, *messages) -> list[s.FromWorker]:
    return [s.FromWorker(worker, message) for message in messages]


def sends(out, kind=None, worker=None):
    return [
        i.message
        for i in out
        if type(i) is s.Send
        and (kind is None or type(i.message) is kind)
        and (worker is None or i.worker == worker)
    ]


def ejects(out) -> list[Eject]:
    return [i for i in out if type(i) is Eject]


def chain_run(run_id: int = 1, replicas: int = 1) -> s.SubmitRun:
    """a -> b -> c, output c."""
    tasks = [
        s.NewTask("a", b"", (), (), 0),
        s.NewTask("b", b"", (), ("a",), 1),
        s.NewTask("c", b"", (), ("b",), 2),
    ]
    return s.SubmitRun(run_id, tasks, ["c"], 3, replicas=replicas)


def a_read_elsewhere() -> tuple[s.SchedulerState, s.TaskRecord, s.TaskRecord]:
    """``a`` done on w1 (its store then full), ``b`` reading it sent to w2: the state,
    a and b."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, chain_ahead=0)  # (none sent ahead)
    st_.handle([joined(W1), chain_run()])
    st_.handle([*report(W1, p.TaskDone(1, 8, 0.1, None), p.DiskFull(True)), joined(W2)])
    a, b = st_.tasks[1], st_.tasks[2]
    assert b.worker is st_.workers[W2] and a.who_has == {st_.workers[W1]}
    return st_, a, b


# -- the state: what each worker may report on --------------------------------------------


def test_a_worker_claiming_copies_it_was_never_asked_for_holds_none_and_is_ejected(caplog):
    st_, a, b = a_read_elsewhere()
    st_.handle([joined(LIAR)])
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        out = st_.handle(report(LIAR, p.Replicas((a.id,))))
        assert a.who_has == {st_.workers[W1]} and not st_.workers[LIAR].has_what
        assert out == []  # dropped with no answer (no Release: it was never given one)
        out = st_.handle(report(LIAR, p.Replicas(tuple(range(2, 2 + EJECT_AFTER)))))
        assert not ejects(out)  # a burst in one batch: one strike
        assert st_.ctx.claims.told[st_.workers[LIAR]].false == 2
        for task_id in range(2, EJECT_AFTER):  # batch after batch: a liar
            out = st_.handle(report(LIAR, p.Replicas((task_id,))))
    (eject,) = ejects(out)
    assert eject.worker == LIAR and "never given" in eject.reason
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # one line for them all
    assert FALSE in caplog.text and "liar" in caplog.text
    # Told to leave: what else it claims meanwhile is dropped, neither counted nor logged.
    assert not ejects(st_.handle(report(LIAR, *[p.Replicas((a.id,))] * 30)))
    assert len(caplog.records) == 1 and a.who_has == {st_.workers[W1]}


def test_copies_a_worker_was_asked_for_or_fetched_for_its_tasks_count():
    st_, a, b = a_read_elsewhere()
    out = st_.handle(report(W2, p.Replicas((a.id,))))  # the input of b, fetched from w1
    assert a.who_has == {st_.workers[W1], st_.workers[W2]} and not ejects(out)
    # Asked to copy (replicas=2): the copy counts, from the worker asked only.
    st_ = s.SchedulerState()
    st_.handle([joined(W1), joined(W2), chain_run(replicas=2)])
    a = st_.tasks[1]
    where = a.worker
    assert where is not None
    out = st_.handle(report(where.id, p.TaskDone(1, 8, 0.1, None)))
    (asked,) = [i.worker for i in out if type(i) is s.Send and type(i.message) is p.Replicate]
    st_.handle([joined(LIAR), *report(LIAR, p.Replicas((1,))), *report(asked, p.Replicas((1,)))])
    assert {w.id for w in a.who_has} == {where.id, asked}


def test_reports_about_tasks_taken_back_are_stale_harmless_and_never_counted(caplog):
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=4), chain_run()])
    st_.handle([s.CancelRun(1)])  # a, b and c cancelled on w1: any may still report
    stale = [
        p.TaskDone(1, 8, 0.1, None),
        p.TaskErred(2, None, "tb", "boom"),
        p.TaskCrashed(3, "x"),
        p.Started((1, 2, 3)),
        p.FetchFailed(2, 1, ("tcp://w1",)),
        p.Withdrawn((3,)),
    ]
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        out = st_.handle(report(W1, *stale))
        assert sends(out) == [p.Release((1,))]  # a result nothing needs: released there
        for _ in range(EJECT_AFTER + 5):
            assert not ejects(st_.handle(report(W1, *stale)))
        out = st_.handle(report(W1, p.Replicas((1, 2, 3))))  # fetched as the run ended
        assert sends(out) == [p.Release((1, 2, 3))]  # one record, however many
    assert FALSE not in caplog.text
    assert not st_.tasks and not st_.runs and not st_.workers[W1].processing


def test_a_worker_reporting_tasks_it_was_told_to_abort_is_ejected(caplog):
    """Reports in flight as their ``Abort`` went out are harmless and not counted; a
    worker that reports aborted tasks long after ignores ``Abort`` (its tasks ran
    elsewhere meanwhile)."""
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=4)])
    worker = st_.workers[W1]
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        for task_id in range(1, EJECT_AFTER + 2):
            st_.ctx.claims.send(worker, p.Abort((task_id,), "a straggler"))
        crossed = [p.TaskDone(EJECT_AFTER + 1, 8, 0.1, None)]
        out = st_.handle(report(W1, *crossed), now=ABORT_GRACE / 2)
        assert sends(out) == [p.Release((EJECT_AFTER + 1,))] and not ejects(out)
        assert not st_.ctx.claims.told[worker].false  # it crossed the Abort: not counted
        # Past the grace but before it shows it read the Aborts (a lagging loop): harmless.
        out = st_.handle(report(W1, p.TaskErred(2, None, "tb", "x")), now=ABORT_GRACE + 1)
        assert not ejects(out) and not st_.ctx.claims.told[worker].false
        reads_on(st_, W1, ABORT_GRACE + 1)  # it reports on work sent after them
        out = st_.handle(report(W1, p.TaskDone(1, 8, 0.1, None)), now=ABORT_GRACE + 1)
        assert sends(out) == [p.Release((1,))] and not ejects(out)  # harmless, answered
        out = []
        for i in range(2, EJECT_AFTER + 1):  # batch after batch
            out = st_.handle(report(W1, p.TaskErred(i, None, "tb", "x")), now=ABORT_GRACE + 1)
        (eject,) = ejects(out)
    assert eject.worker == W1 and "after it was told to abort it" in eject.reason
    assert "after it was told to abort it" in caplog.text


def test_the_latest_word_about_a_task_counts():
    """A task aborted on a worker, sent there again and cancelled (found by the simulator,
    seed 2023 of its many-faults range): its report after the Cancel is a stale one,
    however long after the first Abort; a second Abort starts the grace again."""
    st_ = s.SchedulerState()
    st_.handle([joined(W1)])
    worker = st_.workers[W1]
    st_.ctx.claims.send(worker, p.Abort((1, 2), "a straggler"))
    st_.ctx.now = 3 * ABORT_GRACE
    st_.ctx.claims.send(worker, p.Cancel((1,)))
    st_.ctx.claims.send(worker, p.Abort((2,), "a straggler again"))
    late = [p.TaskErred(1, None, "tb", "x"), p.TaskErred(2, None, "tb", "x")]
    assert not ejects(st_.handle(report(W1, *late), now=3 * ABORT_GRACE + 1))
    assert not st_.ctx.claims.told[worker].false


def test_a_copy_fetched_for_a_task_taken_back_is_released_not_counted():
    """Found by the simulator (seed 101 of ``--workers 10 --tasks 200``, the result
    cache): a worker fetched an input for a task whose run then ended; the input stayed,
    cached, its reader's record went, and the worker's ``Replicas`` was judged false
    (and the copy stayed there for ever). Within ``ABORT_GRACE`` of the manager taking
    work back from that worker it is a race: released there, not counted."""
    tasks = [s.NewTask("a", b"", (), (), 0), s.NewTask("b", b"", (), ("a",), 1)]
    st_ = s.SchedulerState()
    st_.handle([joined(W1), joined(W2)])
    cache = RunCache({k: k.encode() for k in "ab"})
    st_.handle([s.SubmitRun(1, tasks, ["b"], 3, cache=cache)], now=1.0)
    a = next(t for t in st_.tasks.values() if t.key == "a")
    holder = a.worker.id
    other = W2 if holder == W1 else W1
    st_.handle(report(holder, p.TaskDone(a.id, 2000, 0.1, None)), now=2.0)
    st_.handle([s.CancelRun(1)], now=3.0)  # (its tasks on ``other``, if any, cancelled)
    assert st_.tasks.get(a.id) is a and a.state == "memory"  # kept by the cache
    st_.ctx.claims.send(st_.workers[other], p.Cancel((a.id + 1,)))  # work taken back there
    out = st_.handle(report(other, p.Replicas((a.id,))), now=4.0)
    assert sends(out, p.Release, other) == [p.Release((a.id,))] and not ejects(out)
    assert not st_.ctx.claims.told[st_.workers[other]].false
    assert st_.workers[other] not in a.who_has
    # Past the grace, before it shows it read the Cancel (a lagging loop): a race still.
    out = st_.handle(report(other, p.Replicas((a.id,))), now=4.0 + ABORT_GRACE + 1)
    assert not st_.ctx.claims.told[st_.workers[other]].false
    reads_on(st_, other, 4.0 + ABORT_GRACE + 1)  # it reads what came after the Cancel
    out = st_.handle(report(other, p.Replicas((a.id,))), now=4.0 + ABORT_GRACE + 1)
    assert st_.ctx.claims.told[st_.workers[other]].false == 1 and not sends(out)


def test_a_lagging_worker_s_copy_for_a_reader_taken_back_long_ago_is_no_false_claim():
    """Issue 38's 600 × 12 swarm: a worker whose loop lagged seconds behind was told to
    take back hundreds of tasks; its bounded memory (``REMEMBERED``) forgot the first, and
    the copies it had fetched for them, reported more than ``ABORT_GRACE`` later but sent
    before it read the ``Cancel``, were judged false (840 in one run, five workers
    ejected). Until it reports on work sent after the word, such a copy is a race."""
    st_, a, b = a_read_elsewhere()
    w2 = st_.workers[W2]
    st_.ctx.now = 1.0
    st_.ctx.faults.abort(b, w2, "a straggler", counted=False)  # b taken back from w2
    st_.ctx.claims.told[w2].ids.pop(b.id)  # forgotten, as a bounded memory may
    assert b.worker is not w2
    out = st_.handle(report(W2, p.Replicas((a.id,))), now=1.0 + 3 * ABORT_GRACE)
    assert not ejects(out) and not st_.ctx.claims.told[w2].false
    assert sends(out, p.Release, W2) == [p.Release((a.id,))] and w2 not in a.who_has
    # b went back to w2 then: reported done, it shows w2 read every word before
    assert [m.task_id for m in sends(out, p.Execute, W2)] == [b.id]
    st_.handle(report(W2, p.TaskDone(b.id, 8, 0.1, dumps("b"))), now=40.0)
    st_.handle(report(W2, p.Replicas((a.id,))), now=41.0)  # it read them all: now a lie
    assert st_.ctx.claims.told[w2].false == 1


def test_a_task_given_back_unasked_stays_where_it_is():
    tasks = [s.NewTask(k, b"", (), (), i) for i, k in enumerate("abc")]
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=2)
    st_.handle([joined(W1), s.SubmitRun(1, tasks, list("abc"), 3)])
    c = st_.tasks[3]
    st_.handle(report(W1, p.Withdrawn((c.id,))))  # never asked: it may be running there
    assert c.worker is st_.workers[W1] and st_.ctx.claims.told[st_.workers[W1]].false == 1
    # Asked back for an idle worker, it moves.
    out = st_.handle([joined(W2)])
    (asked,) = sends(out, p.Withdraw, W1)
    out = st_.handle(report(W1, p.Withdrawn(asked.task_ids)))
    moved = [m.task_id for m in sends(out, p.Execute, W2)]
    assert moved == list(asked.task_ids) and st_.ctx.claims.told[st_.workers[W1]].false == 1


def test_only_the_worker_asked_to_upload_a_result_has_it_forwarded():
    st_, a, b = a_read_elsewhere()
    st_.handle([joined(LIAR)])
    out = st_.handle(report(W2, p.Relay((a.id,))))  # w2 cannot reach w1
    assert sends(out, p.Upload, W1) == [p.Upload((a.id,))]
    out = st_.handle(report(LIAR, p.Uploaded(a.id, dumps("forged"))))
    assert sends(out) == []  # nothing reaches w2
    value = dumps("a")
    out = st_.handle(report(W1, p.Uploaded(a.id, value)))
    assert sends(out, p.Relayed, W2) == [p.Relayed(a.id, value)]
    # A relay asked for an input of no task of its own is a false claim, as a copy is.
    st_.handle(report(LIAR, p.Relay((a.id,))))
    assert st_.ctx.claims.told[st_.workers[LIAR]].false == 2


def test_a_result_reported_lost_by_a_worker_that_never_held_it_stays():
    st_, a, b = a_read_elsewhere()
    st_.handle([joined(LIAR)])
    st_.handle(report(LIAR, p.Lost((a.id,))))
    assert a.state == "memory" and a.who_has == {st_.workers[W1]}
    assert st_.ctx.claims.told[st_.workers[LIAR]].false == 1
    st_.handle(report(W1, p.Lost((a.id,))))  # its holder: computed again
    assert a.state != "memory" and not a.who_has


def test_false_claims_are_forgiven_after_a_quiet_while():
    st_ = s.SchedulerState()
    st_.handle([joined(LIAR)])
    never = [p.TaskDone(10_000 + i, 8, 0.1, None) for i in range(EJECT_AFTER - 1)]
    for lie in never:
        assert not ejects(st_.handle(report(LIAR, lie), now=1.0))
    later = 2.0 + FORGIVE_AFTER
    for lie in never:  # counted from 1 again
        assert not ejects(st_.handle(report(LIAR, lie), now=later))
    assert ejects(st_.handle(report(LIAR, never[0]), now=later))


def test_a_burst_of_false_claims_in_one_batch_is_one_strike():
    """Issue 38: twenty reports judged false in one batch ejected an honest worker at
    once. A race makes a burst; a liar lies batch after batch."""
    st_ = s.SchedulerState()
    st_.handle([joined(W1)])
    burst = [p.TaskDone(10_000 + i, 8, 0.1, None) for i in range(5 * EJECT_AFTER)]
    for _ in range(EJECT_AFTER - 1):
        assert not ejects(st_.handle(report(W1, *burst)))
    assert st_.ctx.claims.told[st_.workers[W1]].false == EJECT_AFTER - 1
    assert ejects(st_.handle(report(W1, *burst)))


def test_what_is_remembered_of_a_worker_is_bounded():
    st_ = s.SchedulerState()
    st_.handle([joined(W1)])
    worker = st_.workers[W1]
    for task_id in range(100_000):
        st_.ctx.claims.remember(worker, task_id)
    told = st_.ctx.claims.told[worker]
    assert 0 < len(told.ids) <= told.cap and 99_999 in told.ids and 0 not in told.ids


def test_the_memory_of_a_worker_forgets_tasks_gone_before_live_ones():
    """Past the bound, the ids of tasks whose records are gone go first: a worker asked
    for more copies than the bound (churn at 600 x 12) keeps those asks."""
    st_, a, b = a_read_elsewhere()
    w2 = st_.workers[W2]
    st_.ctx.claims.send(w2, p.Replicate(a.id, ("tcp://w1",)))  # the oldest word, still live
    for task_id in range(50_000, 50_000 + 2 * st_.ctx.claims.told[w2].cap):
        st_.ctx.claims.remember(w2, task_id)  # ids of no task
    assert a.id in st_.ctx.claims.told[w2].ids
    out = st_.handle(report(W2, p.Replicas((a.id,))), now=5 * ABORT_GRACE)
    assert w2 in a.who_has and not st_.ctx.claims.told[w2].false and not ejects(out)


def test_a_transfers_report_is_counted_only_from_peers_that_joined():
    peers = {"tcp://a:1": "a", "tcp://b:1": "b"}
    assert credible(p.Transfers((("tcp://a:1", 10), ("tcp://b:1", 0))), peers, "tcp://c:1")
    for received in [
        (("tcp://x:1", 10),),  # never joined
        (("tcp://c:1", 10),),  # its own address
        (("tcp://a:1", 1), ("tcp://a:1", 1)),  # twice in one report
        (("tcp://a:1", MAX_REPORTED_BYTES + 1),),
        (("tcp://a:1", -1),),
    ]:
        assert not credible(p.Transfers(received), peers, "tcp://c:1"), received
    # The state takes a doubted one as a false claim.
    st_ = s.SchedulerState()
    st_.handle([joined(LIAR)])
    st_.handle(report(LIAR, p.Transfers((("tcp://x:1", 2**62),))))
    assert st_.ctx.claims.told[st_.workers[LIAR]].false == 1


# -- the state: a simulated cluster with a liar in it -----------------------------------------

#: Reports that are always a false claim about a task never sent or asked of their sender.
_OUTCOMES = (
    p.TaskDone,
    p.TaskErred,
    p.TaskCrashed,
    p.FetchFailed,
    p.Withdrawn,
    p.Started,
    p.Uploaded,
)
_LIES = _OUTCOMES + (p.Replicas, p.Lost, p.Relay)


class ClusterWithALiar(SimulatedCluster):
    """Honest simulated workers, and one that runs its own tasks right but lies about
    others (it is never made a holder of a copy it claims)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        #: every task id the liar was sent, or told of, in any message
        self.told: set[int] = set()
        self.ejected: list[Eject] = []
        self.lies = {kind: 0 for kind in _LIES}
        handle = self.state.handle

        def handle_and_eject(events, now=0.0):
            out = handle(events, now)
            self.ejected += ejects(out)
            return out

        self.state.handle = handle_and_eject

    def deliver(self, worker, message):
        if worker == LIAR:
            self.told.update(p.task_ids_named(message))
            if type(message) is p.Execute:
                self.told.update(dep.task_id for dep in message.deps)
        super().deliver(worker, message)

    def lie(self) -> None:
        ids = [i for i in self.state.tasks if i not in self.told]
        ids.append(self.state.ctx.next_id + self.rng.randrange(100))
        task_id = self.rng.choice(ids)
        kind = self.rng.choice(_LIES)
        self.lies[kind] += 1
        if kind is p.TaskDone:
            message = p.TaskDone(task_id, 2**62, 0.1, dumps("forged"))
        elif kind is p.TaskErred:
            message = p.TaskErred(task_id, None, "tb", "forged")
        elif kind is p.TaskCrashed:
            message = p.TaskCrashed(task_id, "forged")
        elif kind is p.FetchFailed:
            message = p.FetchFailed(task_id, self.rng.choice(ids), ("w0", "w1"))
        elif kind is p.Uploaded:
            message = p.Uploaded(task_id, dumps("forged"))
        else:
            message = kind((task_id,))
        self.apply([s.FromWorker(LIAR, message)])
        if kind is p.Replicas and task_id in self.state.tasks:
            assert self.state.workers[LIAR] not in self.state.tasks[task_id].who_has

    def settle(self) -> None:
        """The manager's loop ejects: the liar is lost (its own tasks run elsewhere)."""
        if self.ejected and LIAR in self.stores:
            self.lose(LIAR)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs=st.lists(random_graphs(), min_size=1, max_size=3),
    seed=st.integers(0, 10**6),
    rate=st.sampled_from([0.05, 0.7]),
)
def test_a_liar_beside_honest_workers_changes_no_output_and_is_ejected(graphs, seed, rate):
    cluster = ClusterWithALiar(seed)
    cluster.join(LIAR)  # first: peers would read from it before the others
    cluster.join(b"w0")
    cluster.join(b"w1")
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
        cluster.apply([s.SubmitRun(run_id, tasks, outputs, 100)])
    for _ in range(20_000):
        cluster.settle()
        if not any(cluster.queued.values()) and not cluster.pending:
            break
        if LIAR in cluster.stores and cluster.rng.random() < rate:
            cluster.lie()
        else:
            cluster.step()
    for run_id, (deps, outputs) in enumerate(graphs, start=1):
        assert cluster.done.get(run_id) == "done", cluster.done
        assert cluster.outputs.get(run_id, {}) == {k: expected_value(k, deps) for k in outputs}
    outcomes = sum(cluster.lies[kind] for kind in _OUTCOMES)
    assert len(cluster.ejected) <= 1
    if outcomes >= EJECT_AFTER:  # (these are false claims every time)
        assert cluster.ejected and LIAR not in cluster.state.workers
    if sum(cluster.lies.values()) < EJECT_AFTER:
        assert not cluster.ejected
    assert not cluster.state.tasks and not cluster.state.runs


# -- the manager: a keyed worker beside real workers ------------------------------------------


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def _graph(i: int) -> tuple[dict, list]:
    """Inputs read by two tasks each, summed: some inputs cross between workers."""
    dsk: dict = {("x", i, j): (inc, i + j) for j in range(8)}
    dsk.update({("y", i, j): (add, ("x", i, j), ("x", i, (j + 1) % 8)) for j in range(8)})
    dsk[("z", i)] = (sum, [("y", i, j) for j in range(8)])
    return dsk, [("z", i), ("y", i, 0)]


class Graphs(threading.Thread):
    """Runs ``count`` graphs one after another, each checked against ``dask.get``."""

    def __init__(self, manager, count: int) -> None:
        super().__init__(daemon=True)
        self.manager = manager
        self.count = count
        self.wrong: list = []
        self.error: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        try:
            for i in range(self.count):
                dsk, keys = _graph(i)
                got = self.manager.get(dsk, keys)
                if got != dask.get(dsk, keys):
                    self.wrong.append((i, got))
                self.done += 1
        except BaseException as exc:
            self.error = exc

    def check(self) -> None:
        self.join(120)
        assert not self.is_alive()
        assert self.error is None, self.error
        assert self.done == self.count and not self.wrong, self.wrong


def _told(records: list, told: set[int]) -> None:
    """What a keyed worker was sent or told of (it would not lie about that)."""
    for record in records:
        told.update(p.task_ids_named(record))
        if type(record) is p.Execute:
            told.update(dep.task_id for dep in record.deps)


def _lie_until_ejected(liar: KeyedWorker, lies) -> p.Shutdown:
    """Send ``lies(told, rng)`` every 50 ms until told to leave; that ``Shutdown``."""
    told: set[int] = set()
    rng = random.Random(29)
    _told(liar.receive(p.Execute, 1, timeout=60), told)  # it takes part first
    for _ in range(1200):  # a minute at most
        records = liar.drain(0.05)
        _told(records, told)
        shutdown = [r for r in records if type(r) is p.Shutdown]
        if shutdown:
            return shutdown[0]
        liar.send(*lies(told, rng))
    raise AssertionError("the liar was never ejected")


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.timeout(180)
def test_a_worker_claiming_copies_it_never_had_is_ejected_and_graphs_stay_right(manager, caplog):
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        with KeyedWorker(manager, "liar", cores=1) as liar:
            graphs = Graphs(manager, 60)
            graphs.start()

            def copies(told, rng):  # ~450 ids around the newest it saw, none of them its own
                top = max(told)
                return [
                    p.Replicas(
                        tuple(i for i in range(top - 300, top + 150) if i > 0 and i not in told)
                    )
                ]

            shutdown = _lie_until_ejected(liar, copies)
            assert "ejected" in shutdown.reason
            graphs.check()
    assert "liar" not in manager.workers
    assert len(_warnings(caplog, FALSE)) == 1, caplog.text
    assert len(_warnings(caplog, "ejected worker liar")) == 1, caplog.text
    dsk, keys = _graph(99)
    assert manager.get(dsk, keys) == dask.get(dsk, keys)  # the manager goes on as before


@pytest.mark.timeout(180)
def test_a_flood_of_unsolicited_reports_is_dropped_the_sender_ejected_the_log_short(
    manager, caplog
):
    kinds = [
        p.TaskDone,
        p.TaskErred,
        p.TaskCrashed,
        p.Lost,
        p.FetchFailed,
        p.Uploaded,
        p.Withdrawn,
        p.Started,
    ]

    def flood(told, rng):
        ids = [i for i in (rng.randrange(1, 10**6) for _ in range(60)) if i not in told]
        records = []
        for task_id in ids:
            kind = rng.choice(kinds)
            if kind is p.TaskDone:
                records.append(p.TaskDone(task_id, 2**62, 0.1, None))
            elif kind is p.TaskErred:
                records.append(p.TaskErred(task_id, None, "tb", "forged"))
            elif kind is p.TaskCrashed:
                records.append(p.TaskCrashed(task_id, "forged"))
            elif kind is p.FetchFailed:
                records.append(p.FetchFailed(task_id, rng.randrange(1, 10**6), ("tcp://x:1",)))
            elif kind is p.Uploaded:
                records.append(p.Uploaded(task_id, None))
            else:
                records.append(kind((task_id,)))
        return records

    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        with KeyedWorker(manager, "flood", cores=1) as liar:
            graphs = Graphs(manager, 40)
            graphs.start()
            shutdown = _lie_until_ejected(liar, flood)
            assert "ejected" in shutdown.reason
            rng = random.Random(1)
            for _ in range(20):  # more of it after: dropped as from a stranger
                liar.send(*flood(set(), rng))
            graphs.check()
    assert "flood" not in manager.workers
    assert len(_warnings(caplog, FALSE)) == 1, caplog.text
    # the false claims, the ejection, the loss, what came after: a few lines in all
    assert len(caplog.records) <= 6, caplog.text


# -- the manager: RetireWorker from a status client ---------------------------------------------


@pytest.mark.timeout(120)
def test_a_status_client_retires_only_an_idle_worker_of_a_pool(manager, caplog):
    with caplog.at_level(logging.DEBUG, logger="daskvine_py.manager"):
        with KeyedWorker(manager, "client", register=False) as client:
            # While a run goes on: not a worker the manager started, nor a busy one.
            with KeyedWorker(manager, "busy", cores=1) as busy:
                graphs = Graphs(manager, 20)
                graphs.start()
                busy.receive(p.Execute, 1)
                client.send(
                    p.RetireWorker("local-0", "posing as a pool"),
                    p.RetireWorker("busy", "posing as a pool"),
                )
                _answered(client)
                assert not [r for r in busy.drain() if type(r) is p.Shutdown]
                busy.send(p.Goodbye("giving up"))  # what it held runs elsewhere
                graphs.check()
            # An idle worker of a pool: retired, as a factory does.
            with KeyedWorker(manager, "pool-1", cores=1) as pooled:
                client.send(p.RetireWorker("pool-1", "idle for 60 s"))
                (shutdown,) = pooled.receive(p.Shutdown, 1)
                assert shutdown.reason == "idle for 60 s"
            # Not when asked from an identity that registered as a worker, though.
            with KeyedWorker(manager, "pool-2", cores=1) as pooled:
                with KeyedWorker(manager, "was-a-worker", cores=1) as former:
                    former.send(p.Goodbye("leaving"))
                    _wait_for(lambda: "was-a-worker" not in manager.workers)
                    former.send(p.RetireWorker("pool-2", "idle"))
                    assert "pool-2" in _answered(former)
                assert not [r for r in pooled.drain() if type(r) is p.Shutdown]
    # The workers' goodbyes on leaving are read by the manager's thread, not at once.
    _wait_for(lambda: sorted(manager.workers) == ["local-0", "local-1"])
    assert sorted(manager.workers) == ["local-0", "local-1"]
    refused = [r for r in caplog.records if "refused to retire" in r.getMessage()]
    # one warning; the others within the minute are only counted
    assert [r.levelname for r in refused] == ["WARNING", "DEBUG", "DEBUG"], caplog.text
    first, second, third = (r.getMessage() for r in refused)
    assert "local-0" in first and "client" in first and "started that worker" in first
    assert "busy" in second and "has tasks" in second
    assert "pool-2" in third and "registered as a worker" in third
    dsk, keys = _graph(5)
    assert manager.get(dsk, keys) == dask.get(dsk, keys)


def _answered(client: KeyedWorker) -> list[str]:
    """The workers a status request is told of: its answer comes once what the client
    sent before it was read."""
    client.send(p.StatusRequest(p.PROTOCOL_VERSION, "test"))
    while True:
        assert client.sock.poll(20_000), "no answer"
        for record in p.decode(client.sock.recv_multipart(), p.TO_CLIENT):
            if type(record) is p.StatusReply:
                return [name for name, _, _ in record.workers]


def _wait_for(predicate, timeout: float = 30.0) -> None:
    pause = threading.Event()
    for _ in range(int(timeout * 20)):
        if predicate():
            return
        pause.wait(0.05)
    raise AssertionError("timed out")
