"""Stragglers, stuck workers and black holes in the scheduler state (``scheduler.faults``):
literal events in, instructions out; time is the ``now`` of each ``handle`` call."""

from __future__ import annotations

import pytest

from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.faults import FETCH_ALLOWANCE, MAX_ABORTS
from daskvine_py.scheduler.messages import Eject, Quarantined, RunOutput, Tick
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps

pytestmark = pytest.mark.timeout(30)

W1, W2, W3 = b"w1", b"w2", b"w3"
VALUE = dumps(1)


def joined(worker: bytes, cores: int = 1) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), cores, f"tcp://{worker.decode()}")


def flat(n: int, run_id: int = 1, **options: object) -> s.SubmitRun:
    """``n`` independent outputs of one kind, "t"."""
    tasks = [s.NewTask(("t", i), b"", (), (), i, "t") for i in range(n)]
    return s.SubmitRun(run_id, tasks, [t.key for t in tasks], 3, **options)  # type: ignore[arg-type]


def executes(out: list, worker: bytes | None = None) -> list[int]:
    return [
        i.message.task_id
        for i in out
        if type(i) is s.Send and type(i.message) is p.Execute and worker in (None, i.worker)
    ]


def of(out: list, kind: type) -> list:
    return [i for i in out if type(i) is kind]


def holding(st_: s.SchedulerState, worker: bytes) -> list[int]:
    return [t.id for t in st_.workers[worker].processing]


def finish(st_: s.SchedulerState, worker: bytes, now: float, seconds: float = 1.0) -> list:
    """Every task ``worker`` holds is done, each in ``seconds``."""
    events = [s.FromWorker(worker, p.TaskDone(t, 8, seconds, VALUE)) for t in holding(st_, worker)]
    return st_.handle(events, now)


def warmed(workers: tuple[bytes, ...] = (W1, W2), n: int = 40, **options: object):
    """A state whose kind "t" has ``MIN_SAMPLES`` tasks done in 1 s each, on every worker;
    W1's pace is then forgotten, as if it had finished none (a straggler finishes none)."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(w) for w in workers] + [flat(n, **options)], 0.0)
    now = 0.0
    while st_.faults.categories.get("t") is None or st_.faults.categories["t"].count < 12:
        now += 1.0
        for worker in workers:
            finish(st_, worker, now)
    st_.faults.pace.pop(st_.workers[W1], None)
    return st_, now


def test_a_task_running_past_its_kinds_limit_is_aborted_and_runs_on_another_worker():
    st_, now = warmed()
    (task_id,) = holding(st_, W1)
    st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
    assert of(st_.handle([Tick()], now + 2.5), s.Send) == []  # within 3x the mean
    out = st_.handle([Tick()], now + 3.5)
    aborts = [i for i in of(out, s.Send) if type(i.message) is p.Abort]
    assert [(a.worker, a.message.task_ids) for a in aborts] == [(W1, (task_id,))]
    assert "past 3.0 s" in aborts[0].message.reason
    assert executes(out, W2) == [task_id]  # never back to the straggler while W2 can take it
    task = st_.tasks[task_id]
    assert task.attempts == 0  # not against its retries
    assert st_.faults.aborts[task] == 1


def test_a_task_is_aborted_at_most_twice_then_let_run():
    st_, now = warmed()
    (task_id,) = holding(st_, W1)
    where = W1
    for _ in range(MAX_ABORTS):
        st_.handle([s.FromWorker(where, p.Started((task_id,)))], now)
        now += 10.0
        out = st_.handle([Tick()], now)
        moved = st_.tasks[task_id].worker.id
        assert moved != where and task_id in executes(out, moved)
        where = moved
    st_.handle([s.FromWorker(where, p.Started((task_id,)))], now)
    assert task_id not in executes(st_.handle([Tick()], now + 1000.0))
    assert st_.tasks[task_id].worker.id == where


@pytest.mark.parametrize("manager, run", [(3.0, 0), (0.0, None)])
def test_fast_abort_can_be_turned_off_per_run_or_for_the_manager(manager, run):
    st_, now = warmed(fast_abort=run)
    st_.faults.factor = manager
    (task_id,) = holding(st_, W1)
    st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
    assert executes(st_.handle([Tick()], now + 100.0)) == []


def test_a_long_task_on_a_worker_of_good_pace_runs_longer_before_it_is_aborted():
    st_, now = warmed()
    (task_id,) = holding(st_, W2)  # W2 ran its tasks in the usual time
    st_.handle([s.FromWorker(W2, p.Started((task_id,)))], now)
    assert executes(st_.handle([Tick()], now + 8.5)) == []  # past 3 s, within 3 x 3 s
    assert task_id in executes(st_.handle([Tick()], now + 9.5), W1)


def test_a_kind_whose_durations_spread_is_not_cut_at_its_tail():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), joined(W2), flat(60)], 0.0)
    now = 0.0
    for i in range(20):  # 1 s and 9 s in turn: mean 5, deviation 4
        now += 10.0
        finish(st_, W1, now, 1.0 if i % 2 else 9.0)
    (task_id,) = holding(st_, W2)
    st_.handle([s.FromWorker(W2, p.Started((task_id,)))], now)  # (W2's pace: unknown)
    assert executes(st_.handle([Tick()], now + 16.0)) == []  # 3x the mean: legitimately long
    assert task_id in executes(st_.handle([Tick()], now + 22.0), W1)  # past mean + 4 deviations


def test_a_worker_of_ordinary_speed_beside_a_faster_one_is_not_quarantined():
    """Found by the simulator (seeds 49 and 230): tasks aborted on a worker that then ran
    a little faster on a faster worker do not make it a straggler."""
    st_, now = warmed((W1, W2, W3))
    quarantined = []
    for _ in range(5):
        (task_id,) = holding(st_, W1)
        st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
        now += 10.0
        st_.handle([Tick()], now)
        elsewhere = st_.tasks[task_id].worker.id
        out = st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 6.0, VALUE))], now)
        quarantined += of(out, Quarantined)
    assert quarantined == [] and st_.workers[W1].quarantined is None


def test_a_worker_whose_aborted_tasks_run_faster_elsewhere_is_quarantined_as_slow():
    st_, now = warmed((W1, W2, W3))
    quarantined = []
    for _ in range(3):
        # Its report on the task sent after the last Abort: it read that Abort first,
        # with no word of the aborted task done: that ran as long as the manager saw.
        (task_id,) = holding(st_, W1)
        quarantined += of(st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now), Quarantined)
        now += 10.0
        out = st_.handle([Tick()], now)
        elsewhere = st_.tasks[task_id].worker.id
        assert elsewhere != W1
        out = st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
        quarantined += of(out, Quarantined)
    assert quarantined == []  # the last Abort: not yet known read
    (task_id,) = holding(st_, W1)
    quarantined += of(st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now), Quarantined)
    assert [
        (q.worker, q.reason is not None and q.reason.startswith("slow")) for q in quarantined
    ] == [(W1, True)]
    assert st_.workers[W1].quarantined is not None
    assert holding(st_, W1) == []  # what it held was taken back
    for worker in (W2, W3):
        out = finish(st_, worker, now)
        assert executes(out, W1) == []  # and it gets no new tasks


def test_aborted_tasks_whose_results_crossed_the_abort_over_a_slow_link_show_no_slowness():
    """Found by the simulator (``--delay 0.05``, seed 67; ``--delay 0.3``, seed 1): a
    stall on the link held a worker's ``TaskDone`` up for seconds; to the manager's clock
    the task ran on, past its limit, and was aborted; it then took 1 s elsewhere, and
    three such quarantined an honest worker as slow. Its late ``TaskDone`` tells how long
    it really ran (the worker's own clock): no longer than elsewhere."""
    st_, now = warmed((W1, W2, W3))
    quarantined = []
    for _ in range(4):
        (task_id,) = holding(st_, W1)
        st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
        now += 10.0
        st_.handle([Tick()], now)  # its TaskDone is still on the way
        elsewhere = st_.tasks[task_id].worker.id
        out = st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
        late = p.TaskDone(task_id, 8, 1.2, VALUE)  # sent before the Abort reached it
        out += st_.handle([s.FromWorker(W1, late)], now + 0.5)
        quarantined += of(out, Quarantined)
    (task_id,) = holding(st_, W1)
    out = st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now + 1.0)
    assert quarantined + of(out, Quarantined) == [] and st_.workers[W1].quarantined is None
    assert st_.faults.slow.get(st_.workers[W1], 0) == 0


def test_a_late_result_within_its_kinds_limit_shows_no_slowness_however_fast_elsewhere():
    """Found by the simulator (``--delay 0.3``, seed 534, with the fix above): the late
    ``TaskDone``s of a kind whose durations spread from 1 ms to 2 s took 0.19 s and
    1.2 s there, 0.07 s and 0.6 s elsewhere: over twice as fast, and noise. Within its
    limit by the worker's own clock, a task was no straggler: the link made it late."""
    st_, now = warmed((W1, W2, W3))
    quarantined = []
    for _ in range(4):
        (task_id,) = holding(st_, W1)
        quarantined += of(st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now), Quarantined)
        now += 10.0
        st_.handle([Tick()], now)
        elsewhere = st_.tasks[task_id].worker.id
        out = st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 0.1, VALUE))], now)
        out += st_.handle([s.FromWorker(W1, p.TaskDone(task_id, 8, 1.5, VALUE))], now + 0.5)
        quarantined += of(out, Quarantined)
    assert quarantined == [] and st_.faults.slow.get(st_.workers[W1], 0) == 0


def test_a_late_result_slower_by_the_workers_own_clock_still_shows_it_slow():
    """A late ``TaskDone`` is the worker's own word: a run there over ``SLOW_RATIO``
    times what it took elsewhere counts as slowness, link or no link."""
    st_, now = warmed((W1, W2, W3))
    quarantined = []
    for _ in range(3):
        (task_id,) = holding(st_, W1)
        st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
        now += 10.0
        st_.handle([Tick()], now)
        elsewhere = st_.tasks[task_id].worker.id
        out = st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
        out += st_.handle([s.FromWorker(W1, p.TaskDone(task_id, 8, 9.0, VALUE))], now + 0.5)
        quarantined += of(out, Quarantined)
    assert [q.worker for q in quarantined] == [W1]


def test_a_worker_gone_silent_is_not_quarantined_as_slow():
    """Found by the simulator (``--delay 0.05``, seed 67): a worker preempted without a
    word ran nothing more; its three running tasks were aborted (rightly: they run
    elsewhere) and then took 1 s elsewhere, and it was quarantined as slow. Silence is
    no proof that they ran on (the link may be stalled): liveness judges silence."""
    st_, now = warmed((W1, W2), n=80)
    st_.handle([joined(W3, cores=3)], now)
    finish(st_, W3, now + 1.0)  # it finished some: the rule is "slower than elsewhere"
    now += 1.0
    started = holding(st_, W3)
    st_.handle([s.FromWorker(W3, p.Started(tuple(started)))], now)  # then silence
    out = st_.handle([Tick()], now + 10.0)
    assert len([i for i in of(out, s.Send) if type(i.message) is p.Abort]) == 3
    for task_id in started:
        elsewhere = st_.tasks[task_id].worker.id
        assert elsewhere != W3
        out += st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
    out += st_.handle([Tick()], now + 20.0)
    assert of(out, Quarantined) == [] and st_.workers[W3].quarantined is None


def _fresh_worker_with_three_aborted(st_: s.SchedulerState, now: float) -> tuple[list, float]:
    """W3 (3 cores) joins a warmed state, starts three tasks, finishes none: aborted."""
    st_.handle([joined(W3, cores=3)], now)
    started = holding(st_, W3)
    assert len(started) == 3
    st_.handle([s.FromWorker(W3, p.Started(tuple(started)))], now)
    out = st_.handle([Tick()], now + 10.0)
    aborted = [i.message.task_ids[0] for i in of(out, s.Send) if type(i.message) is p.Abort]
    assert sorted(aborted) == sorted(started)
    return started, now + 10.0


def test_a_fresh_worker_whose_results_are_late_is_not_quarantined_as_slow():
    """Found by the simulator (``--delay 0.3``, seed 81): a new worker's first three
    ``TaskDone`` were held up on the link; fast abort took the tasks back and, as it had
    finished none, it was quarantined as slow at once. Its results then came."""
    st_, now = warmed((W1, W2), n=60)
    started, now = _fresh_worker_with_three_aborted(st_, now)
    assert of(st_.handle([], now), Quarantined) == []
    done = [s.FromWorker(W3, p.TaskDone(t, 8, 1.0, VALUE)) for t in started]
    out = st_.handle(done, now + 0.5)
    later = holding(st_, W3)  # sent after the Aborts
    assert later
    out += st_.handle([s.FromWorker(W3, p.Started(tuple(later)))], now + 1.0)
    assert of(out, Quarantined) == [] and st_.workers[W3].quarantined is None


def test_a_fresh_worker_that_runs_past_every_limit_is_quarantined_once_it_read_the_aborts():
    """A straggler that finished none: once it reports on work sent after the Aborts,
    with no word of the aborted tasks done, they ran as long as the manager saw."""
    st_, now = warmed((W1, W2), n=60)
    _, now = _fresh_worker_with_three_aborted(st_, now)
    later = holding(st_, W3)
    assert later
    out = st_.handle([s.FromWorker(W3, p.Started(tuple(later)))], now + 1.0)
    (q,) = of(out, Quarantined)
    assert q.worker == W3 and q.reason is not None and "finished none" in q.reason


@pytest.mark.parametrize("confirmed", [False, True])
def test_a_black_hole_is_quarantined_and_its_errors_are_absorbed(confirmed):
    """Quarantined once its failed tasks succeed elsewhere (three strikes), or after a
    burst of failures in a row of a kind that succeeds elsewhere (8, then a strike each)."""
    st_, now = warmed((W1, W2, W3), n=200)
    quarantined = []
    for _ in range(10):
        (task_id,) = holding(st_, W1)
        erred = p.TaskErred(task_id, None, "tb", "ImportError: no module named numpy")
        out = st_.handle([s.FromWorker(W1, erred)], now)
        assert of(out, s.RunFailed) == []
        elsewhere = st_.tasks[task_id].worker.id
        assert elsewhere in (W2, W3)  # retried elsewhere
        quarantined += of(out, Quarantined)
        if confirmed:
            done = p.TaskDone(task_id, 8, 1.0, VALUE)
            quarantined += of(st_.handle([s.FromWorker(elsewhere, done)], now), Quarantined)
        if st_.workers[W1].quarantined:
            break
    assert [q.worker for q in quarantined] == [W1]
    assert ("then succeeded on" if confirmed else "failed in a row") in quarantined[0].reason
    out = finish(st_, W2, now) + finish(st_, W3, now)
    assert executes(out, W1) == []


def test_errors_that_fail_on_every_worker_strike_none():
    """A data-dependent error (its kind succeeds elsewhere) fails on its second worker
    too: the run fails and neither worker is struck."""
    st_, now = warmed((W1, W2))
    for _ in range(4):
        (task_id,) = holding(st_, W1)
        bad = p.TaskErred(task_id, None, "tb", "ValueError: 5")
        st_.handle([s.FromWorker(W1, bad)], now)
        out = st_.handle([s.FromWorker(W2, bad)], now)
        assert [f.worker for f in of(out, s.RunFailed)] == ["w2"]
        st_.handle([flat(40, run_id=max(st_.runs, default=1) + 1)], now)
        now += 1.0
    assert st_.faults.strikes == {} and st_.faults.quarantined == {}


def test_a_run_of_errors_that_fail_on_every_worker_strikes_none():
    """Found by the simulator (seed 6033 of two workers and runs that keep failing): each
    run fails on a task's own error before anything else succeeds there, and errors in
    a row piled up on one worker until it was struck and quarantined as a black hole.
    An error its second worker confirms is the task's own: no worker's count."""
    st_, now = warmed((W1, W2))
    for _ in range(3 * 8):
        (task_id,) = holding(st_, W1)
        bad = p.TaskErred(task_id, None, "tb", "ValueError: 5")
        st_.handle([s.FromWorker(W1, bad)], now)
        out = st_.handle([s.FromWorker(W2, bad)], now)
        assert [f.worker for f in of(out, s.RunFailed)] == ["w2"]
        st_.handle([flat(40, run_id=max(st_.runs, default=1) + 1)], now)
        now += 1.0
    assert st_.faults.strikes == {} and st_.faults.quarantined == {}
    assert st_.workers[W1].errors == 0 and st_.workers[W2].errors == 0


def test_a_graph_whose_tasks_all_raise_strikes_no_worker():
    """Found by the simulator's hypothesis graphs: eleven of thirteen tasks raise; one
    worker fails ten in a row of a kind nothing ran elsewhere yet, and was quarantined
    as a black hole. Failures of one run alone are no sign of a broken worker."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    tasks = [s.NewTask(("x", i), b"", (), (), i, "x") for i in range(40)]
    st_.handle([joined(W1), joined(W2), s.SubmitRun(1, tasks, [t.key for t in tasks], 3)])
    for now in range(1, 13):
        (task_id,) = holding(st_, W1)
        bad = p.TaskErred(task_id, None, "tb", "ValueError: x")
        out = st_.handle([s.FromWorker(W1, bad)], float(now))
        assert of(out, Quarantined) == []
    assert st_.workers[W1].errors == 12
    assert st_.faults.strikes == {} and st_.faults.quarantined == {}


def test_a_deterministic_error_fails_the_run_on_its_second_worker():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), joined(W2), flat(2)], 0.0)
    (task_id,) = holding(st_, W1)
    out = st_.handle([s.FromWorker(W1, p.TaskErred(task_id, None, "tb", "ValueError: 1"))], 1.0)
    assert of(out, s.RunFailed) == [] and executes(out, W2) == [task_id]
    out = st_.handle([s.FromWorker(W2, p.TaskErred(task_id, None, "tb", "ValueError: 2"))], 2.0)
    (failed,) = of(out, s.RunFailed)
    assert (failed.worker, failed.message, failed.crashed) == ("w2", "ValueError: 2", False)


def test_an_error_with_no_other_worker_fails_the_run_at_once():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(W1), flat(2)], 0.0)
    (task_id,) = holding(st_, W1)
    out = st_.handle([s.FromWorker(W1, p.TaskErred(task_id, None, "tb", "ValueError: 1"))], 1.0)
    assert [f.worker for f in of(out, s.RunFailed)] == ["w1"]


def test_when_every_worker_is_quarantined_the_least_struck_is_released():
    st_, now = warmed((W1, W2))
    st_.faults.quarantine(st_.workers[W1], "a test said so")
    st_.faults.quarantine(st_.workers[W2], "a test said so")
    st_.faults.strikes[st_.workers[W1]] = 5.0
    out = finish(st_, W1, now) + finish(st_, W2, now)
    assert executes(out) == []  # quarantined: nothing new for either
    out = st_.handle([Tick()], now + 1.0)
    released = of(out, Quarantined)
    assert [(q.worker, q.reason) for q in released] == [(W2, None)]
    assert executes(out, W2) != []


def test_a_worker_holding_tasks_with_no_progress_is_ejected():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.faults.stall = 5.0
    st_.handle([joined(W1, cores=100), joined(W2), flat(20)], 0.0)
    finish(st_, W2, 1.0, seconds=0.1)
    assert of(st_.handle([Tick()], 4.0), Eject) == []
    (eject,) = of(st_.handle([Tick()], 10.0), Eject)
    assert eject.worker == W1 and "no progress" in eject.reason
    assert of(st_.handle([Tick()], 11.0), Eject) == []  # once


def test_a_worker_fetching_an_input_from_silent_holders_is_not_ejected_as_stuck():
    """Found by the simulator (30 workers, DV3, seed 4015): an input's holders were
    preempted without a word; the worker tried each for its fetch timeout and was ejected
    as stuck just as it asked the manager to relay the input. It is given the time its
    fetches may take (``FETCH_ALLOWANCE`` a holder, and one through the manager)."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, chain_ahead=0)
    st_.faults.stall = 5.0
    tasks = [
        s.NewTask("a", b"", (), (), 0, "t"),
        s.NewTask("b", b"", (), ("a",), 1, "t"),
        s.NewTask("c", b"", (), ("b",), 2, "t"),
    ]
    st_.handle([joined(W2), s.SubmitRun(1, tasks, ["c"], 3)], 0.0)
    a, b = st_.tasks[1], st_.tasks[2]
    st_.handle(
        [
            s.FromWorker(W2, p.TaskDone(a.id, 8, 0.1, None)),
            s.FromWorker(W2, p.DiskFull(True)),
            joined(W1),
        ],
        1.0,
    )
    assert b.worker is st_.workers[W1] and a.who_has == {st_.workers[W2]}
    allowance = 2 * FETCH_ALLOWANCE  # its one holder, then the manager
    assert of(st_.handle([Tick()], 1.0 + 5.0 + allowance - 1.0), Eject) == []
    (eject,) = of(st_.handle([Tick()], 1.0 + 5.0 + allowance + 1.0), Eject)
    assert eject.worker == W1


def test_a_silent_worker_holding_a_chain_sent_ahead_gets_no_fetch_allowance():
    """A reader sent ahead waits for an input its own worker computes: nothing is fetched
    for it. The probe of issue 29 (it takes tasks and never answers) held such chains and
    was given 10 s of fetch allowance on top of the stall for inputs it was to make."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.faults.stall = 5.0
    tasks = [
        s.NewTask("a", b"", (), (), 0, "t"),
        s.NewTask("b", b"", (), ("a",), 1, "t"),
        s.NewTask("c", b"", (), ("b",), 2, "t"),
    ]
    st_.handle([joined(W2), flat(1, run_id=2)], 0.0)
    finish(st_, W2, 0.5, seconds=0.1)  # the kind's duration is known
    st_.handle([s.FromWorker(W2, p.DiskFull(True)), joined(W1)], 1.0)  # W2 takes no more
    st_.handle([s.SubmitRun(1, tasks, ["c"], 3)], 1.0)
    a, b, c = (st_.tasks[t.id] for t in st_.workers[W1].processing)
    assert (a.key, b.key, c.key) == ("a", "b", "c")  # the chain, all sent ahead to W1
    assert of(st_.handle([Tick()], 1.0 + 5.0 - 0.5), Eject) == []
    (eject,) = of(st_.handle([Tick()], 1.0 + 5.0 + 0.5), Eject)
    assert eject.worker == W1 and "no progress" in eject.reason


def test_a_worker_asking_the_manager_to_relay_an_input_is_not_stuck():
    """The swarm at 600 x 12, its clock three times faster: a worker whose fetches from
    peers failed asked the manager to relay the input (``Relay``) and was ejected as
    stuck while the relay, slowed by the load, was on its way. A relay asked, or an
    input arrived (``Replicas``), is progress at its tasks."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0, chain_ahead=0)
    st_.faults.stall = 5.0
    tasks = [s.NewTask("a", b"", (), (), 0, "t"), s.NewTask("b", b"", (), ("a",), 1, "t")]
    st_.handle([joined(W2), s.SubmitRun(1, tasks, ["b"], 3)], 0.0)
    a, b = st_.tasks[1], st_.tasks[2]
    st_.handle(
        [s.FromWorker(W2, p.TaskDone(a.id, 8, 0.1, None)), s.FromWorker(W2, p.DiskFull(True))]
        + [joined(W1)],
        1.0,
    )
    assert b.worker is st_.workers[W1]
    allowance = 2 * FETCH_ALLOWANCE
    st_.handle([s.FromWorker(W1, p.Relay((a.id,)))], 1.0 + allowance)  # its holder failed it
    assert of(st_.handle([Tick()], 1.0 + 5.0 + allowance + 1.0), Eject) == []
    (eject,) = of(st_.handle([Tick()], 1.0 + allowance + 5.0 + allowance + 1.0), Eject)
    assert eject.worker == W1  # nothing since: stuck after all


def test_a_worker_running_a_started_task_is_not_ejected_for_silence():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.faults.stall = 5.0
    st_.handle([joined(W1), joined(W2), flat(20, fast_abort=0)], 0.0)
    finish(st_, W2, 1.0, seconds=0.1)
    st_.handle([s.FromWorker(w, p.Started(tuple(holding(st_, w)))) for w in (W1, W2)], 1.0)
    assert of(st_.handle([Tick()], 100.0), Eject) == []


def test_a_worker_that_leaves_withdraw_unanswered_is_ejected():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=4)
    st_.faults.patience = 5.0
    st_.handle([joined(W1), flat(5)], 0.0)
    out = st_.handle([joined(W2)], 1.0)
    asked = [i for i in of(out, s.Send) if type(i.message) is p.Withdraw]
    assert asked and asked[0].worker == W1
    st_.handle([Tick()], 2.0)
    # Nothing heard of W1 since: a slow link delays its answer and its other reports
    # alike, so the clock alone ejects no one (the simulator at 0.3 s delays did).
    assert of(st_.handle([Tick()], 30.0), Eject) == []
    # Work sent to it after the Withdraw, reported: it read the Withdraw, never answered.
    st_.handle([flat(6, run_id=2)], 31.0)
    first = holding(st_, W1)[0]
    out = st_.handle([s.FromWorker(W1, p.TaskDone(first, 8, 0.1, VALUE))], 32.0)
    (later,) = executes(out, W1)
    st_.handle([s.FromWorker(W1, p.TaskDone(later, 8, 0.1, VALUE))], 33.0)
    (eject,) = of(st_.handle([Tick()], 34.0), Eject)
    assert eject.worker == W1 and "Withdraw" in eject.reason


def test_a_withdraw_answered_late_over_a_slow_link_ejects_no_one():
    """The answer comes first on the connection, however late: the tasks kept there
    (running, or committed to a library) are asked back no more, the others move."""
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=4)
    st_.faults.patience = 5.0
    st_.handle([joined(W1), flat(5)], 0.0)
    out = st_.handle([joined(W2)], 1.0)
    (withdraw,) = [i.message for i in of(out, s.Send) if type(i.message) is p.Withdraw]
    st_.handle([Tick()], 2.0)
    dropped, kept = withdraw.task_ids[:-1], withdraw.task_ids[-1:]
    answer = p.Withdrawn(dropped, kept)
    st_.handle([s.FromWorker(W1, answer)], 40.0)  # 39 s later: a slow link
    assert not {t.id for t in st_.ctx.stealing.withdrawing} & set(withdraw.task_ids)
    assert not of(st_.handle([Tick()], 41.0) + st_.handle([Tick()], 90.0), Eject)
    assert set(holding(st_, W1)) >= set(kept) and not set(holding(st_, W1)) & set(dropped)


@pytest.mark.parametrize("value", [0.5, -1, float("nan"), float("inf"), True, "3"])
def test_fast_abort_refuses_what_is_not_a_multiplier(value):
    from daskvine_py.options import ManagerOptions, RunOptions

    with pytest.raises(ValueError, match="fast_abort"):
        RunOptions(fast_abort=value)
    with pytest.raises(ValueError, match="fast_abort"):
        ManagerOptions(fast_abort=value)


def test_fast_abort_goes_from_the_options_to_the_state():
    import dask

    from daskvine_py import Manager
    from daskvine_py.config import run_options
    from daskvine_py.manager.streaming import opening_of

    assert opening_of(1, ["x"], run_options({"fast_abort": 0}), False).fast_abort == 0
    assert opening_of(1, ["x"], run_options({}), False).fast_abort is None  # the manager's
    with dask.config.set({"daskvine_py.get.fast_abort": 4}):
        assert opening_of(1, ["x"], run_options({}), False).fast_abort == 4
    st_ = s.SchedulerState()
    assert st_.faults.factor_of(s.RunRecord.of(flat(1))) == 3.0  # on by default
    assert st_.faults.factor_of(s.RunRecord.of(flat(1, fast_abort=0))) == 0
    with dask.config.set({"daskvine_py.manager.fast_abort": 5.0}), Manager() as manager:
        assert manager._state.faults.factor == 5.0
    with Manager(fast_abort=None) as manager:
        assert manager._state.faults.factor == 0.0


def test_a_result_whose_report_quarantines_its_worker_stands_and_its_moved_copy_is_cancelled():
    """Found by the simulator (hypothesis, seed 2504): the report that proved a worker
    slow was itself a task's result. Quarantined, the worker had what it held taken back
    (that task too, sent elsewhere), and the result was then taken all the same. The
    worker it was moved to ran it again, and its ``Started`` of it was judged a false
    claim: it is now told to cancel it, and what it says of it is stale."""
    st_, now = warmed((W1, W2, W3))
    for _ in range(3):  # as above: three tasks aborted on W1 ran faster elsewhere
        (task_id,) = holding(st_, W1)
        st_.handle([s.FromWorker(W1, p.Started((task_id,)))], now)
        now += 10.0
        st_.handle([Tick()], now)
        elsewhere = st_.tasks[task_id].worker.id
        st_.handle([s.FromWorker(elsewhere, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
    (task_id,) = holding(st_, W1)
    out = st_.handle([s.FromWorker(W1, p.TaskDone(task_id, 8, 1.0, VALUE))], now)
    assert [q.worker for q in of(out, Quarantined)] == [W1]
    task = st_.tasks[task_id]
    assert task.state != "processing" and task.worker is None  # the result stands:
    assert [o.key for o in of(out, RunOutput)] == [task.key]  # delivered, once
    (moved,) = [
        i.worker
        for i in out
        if type(i) is s.Send and type(i.message) is p.Execute and i.message.task_id == task_id
    ]
    assert moved != W1
    cancels = [i.worker for i in out if type(i) is s.Send and type(i.message) is p.Cancel]
    assert cancels == [moved] and task_id not in holding(st_, moved)
    for late in (p.Started((task_id,)), p.TaskDone(task_id, 8, 1.0, VALUE)):
        st_.handle([s.FromWorker(moved, late)], now)
    assert st_.ctx.claims.told[st_.workers[moved]].false == 0
