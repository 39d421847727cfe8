"""Worker liveness with a fake clock in milliseconds: no sockets, no sleeps (issue 14)."""

from __future__ import annotations

from daskvine_py.scheduler.liveness import Liveness, Lost, Verdict


def ms(n: int) -> float:
    return n / 1000


def test_a_quiet_worker_gets_a_heartbeat_each_interval_and_is_lost_past_the_timeout():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"w1", ms(0))
    assert live.check(ms(100)) == Verdict([], [])  # not *past* the interval yet
    assert live.check(ms(101)) == Verdict([], [b"w1"])
    live.sent(b"w1", ms(101))
    assert live.check(ms(150)) == Verdict([], [])
    live.sent(b"w1", ms(250))
    verdict = live.check(ms(301))
    assert verdict == Verdict([Lost(b"w1", "silent for 0.3 s (timeout 0.3 s)", True)], [])
    assert b"w1" not in live and len(live) == 0
    assert live.check(ms(1000)) == Verdict([], [])  # lost once


def test_hearing_from_a_worker_postpones_its_loss_but_not_its_heartbeat():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"w1", ms(0))
    for t in range(50, 1000, 50):
        live.heard(b"w1", ms(t))
    verdict = live.check(ms(1000))
    assert verdict.lost == [] and verdict.heartbeat == [b"w1"]


def test_a_local_worker_whose_process_exited_is_lost_at_once():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"local", ms(0), local_pid=41)
    live.joined(b"remote", ms(0))  # no pid: an exit elsewhere with the same pid is not its
    verdict = live.check(ms(10), exited={41: -9})
    assert verdict.lost == [Lost(b"local", "its process exited with code -9", False)]
    assert b"remote" in live and b"local" not in live


def test_a_worker_that_left_is_forgotten_and_unknown_ones_are_ignored():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"w1", ms(0))
    live.left(b"w1")
    live.heard(b"w1", ms(5))
    live.sent(b"nobody", ms(5))
    live.left(b"nobody")
    assert live.check(ms(10_000)) == Verdict([], [])


def test_each_worker_keeps_its_own_deadlines():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"a", ms(0))
    live.joined(b"b", ms(200))
    verdict = live.check(ms(350))
    assert [gone.worker for gone in verdict.lost] == [b"a"] and verdict.heartbeat == [b"b"]


def test_between_deadlines_nothing_is_walked_and_a_join_or_an_exit_is_still_seen():
    live = Liveness(timeout=ms(300), interval=ms(100))
    live.joined(b"a", ms(0))
    live.sent(b"a", ms(90))
    assert live.check(ms(95)) == Verdict([], [])  # its next deadline: 190
    live.joined(b"b", ms(100), local_pid=7)  # due at 200, before the bound the walk saw
    assert live.check(ms(150), exited={7: 1}).lost == [
        Lost(b"b", "its process exited with code 1", False)
    ]
    assert live.check(ms(191)) == Verdict([], [b"a"])
    live.joined(b"c", ms(195))
    assert live.check(ms(296)) == Verdict([], [b"a", b"c"])  # a: 191 + 100; c: 195 + 100
    verdict = live.check(ms(301))
    assert [gone.worker for gone in verdict.lost] == [b"a"] and b"c" in live
