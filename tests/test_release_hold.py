"""A batch of only ``Release`` records waits for the next batch to its worker, or
``RELEASE_HOLD`` seconds (``scheduler.outbox``): fewer sends, the same order."""

from __future__ import annotations

from daskvine_py.scheduler.outbox import RELEASE_HOLD, ReleaseHold
from daskvine_py.wire import protocol as p

EXECUTE = p.Execute(9, "k9", b"payload", (), False, 0, True)


def test_releases_alone_wait_and_go_first_with_the_next_batch_to_their_worker():
    hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold()
    assert hold.take(b"w1", [p.Release((1,))], 10.0) == []
    assert hold.take(b"w1", [p.Release((2,))], 10.1) == []  # still waiting, together
    assert hold.take(b"w2", [p.Release((3,))], 10.1) == []
    sent = hold.take(b"w1", [EXECUTE], 10.2)
    assert sent == [p.Release((1,)), p.Release((2,)), EXECUTE]  # the order they were made
    assert list(hold.due(10.2)) == [] and set(hold.held) == {b"w2"}


def test_releases_nothing_follows_go_alone_once_due():
    hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold()
    hold.take(b"w1", [p.Release((1,))], 10.0)
    hold.take(b"w1", [p.Release((2,))], 10.0 + RELEASE_HOLD / 2)  # (no later deadline)
    assert list(hold.due(10.0 + RELEASE_HOLD / 2)) == []
    due = list(hold.due(10.0 + RELEASE_HOLD))
    assert due == [(b"w1", [p.Release((1,)), p.Release((2,))])] and not hold
    # the first batch after its deadline passed goes at once, whatever it holds
    hold.take(b"w1", [p.Release((3,))], 20.0)
    assert hold.take(b"w1", [p.Release((4,))], 20.0 + RELEASE_HOLD) == [
        p.Release((3,)),
        p.Release((4,)),
    ]


def test_a_batch_with_anything_but_releases_goes_at_once_and_a_lost_worker_gets_nothing():
    hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold()
    assert hold.take(b"w1", [p.Release((1,)), EXECUTE], 0.0) == [p.Release((1,)), EXECUTE]
    assert hold.take(b"w1", [p.Heartbeat()], 0.0) == [p.Heartbeat()]
    hold.take(b"w2", [p.Release((2,))], 0.0)
    hold.drop(b"w2")
    assert not hold and list(hold.due(100.0)) == []


def test_no_hold_sends_every_batch_at_once():
    hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold(0.0)
    assert hold.take(b"w1", [p.Release((1,))], 0.0) == [p.Release((1,))]


def test_batches_are_the_outboxes_after_what_was_held_then_what_fell_due():
    hold: ReleaseHold[bytes, p.FromManager] = ReleaseHold()
    hold.take(b"w1", [p.Release((1,))], 0.0)
    hold.take(b"w2", [p.Release((2,))], 0.0)
    outboxes = {b"w1": [EXECUTE], b"w3": [p.Release((3,))]}
    assert hold.batches(outboxes, RELEASE_HOLD / 2) == [(b"w1", [p.Release((1,)), EXECUTE])]
    assert hold.batches({}, RELEASE_HOLD) == [(b"w2", [p.Release((2,))])]  # w3's: not yet
    assert hold.batches({}, 2 * RELEASE_HOLD) == [(b"w3", [p.Release((3,))])] and not hold
