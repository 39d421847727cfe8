"""Bounded transfers: slots overall and per peer, queued fetches started in order; the
``Fetcher`` component alone, with literal replies and clocks."""

from __future__ import annotations

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from daskvine_py.worker.fetching import RELAY, Fetch, Fetcher, TransferSlots
from daskvine_py.worker.messages import AskPeer, ClosePeer


def test_per_peer_and_total_bounds_queue_the_rest_and_start_them_as_slots_free():
    slots = TransferSlots(total=3, per_peer=2)
    fetches = [Fetch(i, ["a"]) for i in range(4)] + [Fetch(9, ["b"])]
    asked = [slots.take(f) for f in fetches]
    # Two from "a", then "a" is busy; "b" still has room within the total of 3.
    assert asked == ["a", "a", None, None, "b"]
    assert slots.in_flight == 3 and slots.from_peer == {"a": 2, "b": 1}
    slots.queue.extend(fetches[2:4])
    slots.give_back(fetches[0])
    assert slots.freed and fetches[0].current is None
    started = list(slots.startable(lambda f: True))
    assert started == [(fetches[2], "a")] and list(slots.queue) == [fetches[3]]
    # Giving back twice frees one slot only.
    slots.give_back(fetches[1])
    slots.give_back(fetches[1])
    assert slots.in_flight == 2
    # A dropped fetch is skipped and leaves the queue.
    assert list(slots.startable(lambda f: f is not fetches[3])) == []
    assert not slots.queue and not slots.freed


def test_a_fetch_asks_a_holder_with_a_free_slot_first():
    slots = TransferSlots(total=10, per_peer=1)
    first = Fetch(1, ["a"])
    assert slots.take(first) == "a"
    both = Fetch(2, ["a", "b"])
    assert slots.take(both) == "b" and both.untried == ["a"]
    # When the total is used up, queued fetches stay queued in their order.
    slots.total = 2
    waiting = [Fetch(3, ["c"]), Fetch(4, ["d"])]
    slots.queue.extend(waiting)
    assert list(slots.startable(lambda f: True)) == []
    assert list(slots.queue) == waiting
    slots.give_back(first)
    assert list(slots.startable(lambda f: True)) == [(waiting[0], "c")]
    assert list(slots.queue) == [waiting[1]]


# -- the Fetcher component, alone -------------------------------------------------------


def _fetcher(timeout=5.0):
    """A ``Fetcher``, its instructions and the fetches it gave up on."""
    out, failed = [], []
    return Fetcher(timeout, out, failed.append), out, failed


def _asked(fetcher, out):
    """The ``AskPeer`` instructions of a ``flush``, taken out of ``out``."""
    fetcher.flush()
    asked = [(i.address, list(i.task_ids)) for i in out if type(i) is AskPeer]
    out[:] = [i for i in out if type(i) is not AskPeer]
    return asked


def test_a_fetch_asks_one_holder_and_the_next_when_it_has_nothing():
    fetcher, out, failed = _fetcher()
    fetcher.want(7, ["a", "b"], task_id=1, now=0.0)
    fetcher.want(7, ["a", "b"], task_id=2, now=0.0)  # one fetch for both tasks
    ((first, ids),) = _asked(fetcher, out)
    assert ids == [7] and fetcher.fetches[7].waiters == {1, 2}
    assert fetcher.deadline(100.0) == 5.0
    assert fetcher.on_data(p.Data(7, None), now=1.0) is None  # not there: ask the other
    assert _asked(fetcher, out) == [("b" if first == "a" else "a", [7])]
    fetch = fetcher.on_data(p.Data(7, dumps("seven")), now=2.0)
    assert fetch is not None and fetch.waiters == {1, 2} and not fetcher.fetches
    fetcher.report_received()
    (transfers,) = out
    assert type(transfers) is p.Transfers and transfers.received[0][0] in ("a", "b")
    assert not failed and not list(fetcher.leaks())


def test_holders_that_do_not_answer_pass_the_fetch_to_the_manager_then_it_fails():
    fetcher, out, failed = _fetcher(timeout=1.0)
    fetcher.want(7, ["a"], task_id=1, now=0.0)
    assert _asked(fetcher, out) == [("a", [7])]
    fetcher.on_timers(0.5)
    assert out == []
    fetcher.on_timers(1.0)  # "a" said nothing: its socket closed, the manager asked
    assert out == [ClosePeer("a"), p.Relay((7,))] and fetcher.relayed(7)
    fetcher.on_data(p.Data(7, None), now=1.5)  # the manager found no holder either
    assert [f.dep_id for f in failed] == [7] and not fetcher.fetches
    assert not list(fetcher.leaks())


def test_a_silent_peer_s_socket_closed_sends_its_other_fetches_on_at_once():
    """Closing the socket of a peer that did not answer in time drops every request on
    it: the other fetches asked of it go on now (here: through the manager, their only
    holder silent), not each after a timeout of its own (at 600 x 12 a worker so waited
    out 25 timeouts in a row)."""
    fetcher, out, failed = _fetcher(timeout=1.0)
    fetcher.want(7, ["a"], task_id=1, now=0.0)
    fetcher.want(8, ["a"], task_id=2, now=0.5)
    fetcher.want(9, ["a"], task_id=3, now=0.5)
    assert _asked(fetcher, out) == [("a", [7, 8, 9])]  # one request, one socket
    fetcher.on_timers(1.0)  # 7's deadline (8's and 9's would be 1.5)
    assert out == [ClosePeer("a"), p.Relay((7,)), p.Relay((8,)), p.Relay((9,))]
    assert all(fetcher.relayed(i) for i in (7, 8, 9)) and not failed


def test_a_fetch_nobody_waits_for_is_dropped_unless_it_is_a_replica():
    fetcher, out, _ = _fetcher()
    fetcher.want(7, ["a"], task_id=1, now=0.0)
    fetcher.replicate(8, ["a"], now=0.0)
    fetcher.unwait(7, 1)
    assert list(fetcher.fetches) == [8] and fetcher.slots.in_flight == 1
    fetcher.unwait_all(1)  # (8 waits for no task: kept)
    assert list(fetcher.fetches) == [8] and _asked(fetcher, out) == [("a", [7, 8])]


def test_queued_fetches_start_once_a_slot_is_free_and_unreachable_peers_are_skipped():
    fetcher, out, _ = _fetcher()
    fetcher.slots.total = 1
    fetcher.want(1, ["a"], task_id=10, now=0.0)
    fetcher.want(2, ["b", "c"], task_id=20, now=0.0)
    assert _asked(fetcher, out) == [("a", [1])]
    assert list(fetcher.slots.queue) == [fetcher.fetches[2]]
    fetcher.on_unreachable("a", [1], now=1.0)  # its only holder: through the manager now
    assert fetcher.fetches[1].current == RELAY
    fetcher.unwait(1, 10)
    fetcher.start_queued(now=2.0)
    assert fetcher.fetches[2].current in ("b", "c") and fetcher.fetches[2].deadline == 7.0
