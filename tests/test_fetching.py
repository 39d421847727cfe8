"""Bounded transfers: slots overall and per peer, queued fetches started in order."""

from __future__ import annotations

from daskvine_py.worker.fetching import Fetch, TransferSlots


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
