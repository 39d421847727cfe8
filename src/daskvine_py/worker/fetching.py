"""A worker's fetches of inputs from peers, and the bound on how many are in flight.

Pure bookkeeping, no sockets: the worker asks ``TransferSlots.take`` which peer to ask for
a fetch (or queues it when no slot is free), gives the slot back when the reply arrives,
the peer times out or nobody waits any more, and starts queued fetches as slots free up.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence

#: Inputs fetched from peers at once, overall and from one peer; the rest wait their turn.
#: More in flight hides network latency for many small results; fewer bounds the memory
#: that arriving data takes at once, and the per-peer bound keeps a popular result's holder
#: from being swamped by one worker while others also need it.
MAX_FETCHES = 32
MAX_FETCHES_PER_PEER = 8


class Fetch:
    """One input being copied from peers, for the local tasks that wait on it."""

    __slots__ = (
        "dep_id", "peers", "untried", "current", "deadline", "waiters", "replicate", "relayed",
        "unreached",
    )  # fmt: skip

    def __init__(self, dep_id: int, peers: Sequence[str], replicate: bool = False) -> None:
        self.dep_id = dep_id
        self.peers = tuple(peers)
        self.untried = list(peers)
        random.shuffle(self.untried)  # spread readers of a popular result over its holders
        self.current: str | None = None  #: the peer asked, while the request is in flight
        self.deadline = float("inf")  #: while queued for a free transfer slot: none
        self.waiters: set[int] = set()
        #: the manager asked for a copy (``Replicate``): kept even when no task waits
        self.replicate = replicate
        #: a holder could not be reached (no answer in time, or no connection): once all
        #: have failed, the fetch is asked through the manager (``protocol.Relay``)
        self.unreached = False
        self.relayed = False


class TransferSlots:
    """Requests in flight, overall and per peer, and the fetches waiting for a slot."""

    __slots__ = ("total", "per_peer", "in_flight", "from_peer", "queue", "freed")

    def __init__(self, total: int = MAX_FETCHES, per_peer: int = MAX_FETCHES_PER_PEER) -> None:
        self.total = total
        self.per_peer = per_peer
        self.in_flight = 0
        self.from_peer: dict[str, int] = {}
        #: fetches waiting for a slot, in the order they asked
        self.queue: deque[Fetch] = deque()
        #: a slot was given back since queued fetches were last started
        self.freed = False

    def take(self, fetch: Fetch) -> str | None:
        """The next untried holder with a free slot, now in flight; None if none is free."""
        if self.in_flight >= self.total:
            return None
        busy = self.from_peer
        untried = fetch.untried
        for i in range(len(untried) - 1, -1, -1):
            address = untried[i]
            if busy.get(address, 0) < self.per_peer:
                break
        else:
            return None
        del untried[i]
        fetch.current = address
        self.in_flight += 1
        busy[address] = busy.get(address, 0) + 1
        return address

    def take_relay(self, fetch: Fetch, relay: str) -> None:
        """The fetch goes through the manager (named ``relay``): in flight, beyond the
        bounds (the manager paces what it forwards)."""
        fetch.relayed = True
        fetch.current = relay
        self.in_flight += 1
        self.from_peer[relay] = self.from_peer.get(relay, 0) + 1

    def give_back(self, fetch: Fetch) -> None:
        """The fetch's request is answered or abandoned: free its slot (if it has one)."""
        address = fetch.current
        if address is not None:
            fetch.current = None
            self.in_flight -= 1
            self.from_peer[address] -= 1
            self.freed = True

    def startable(self, live: Callable[[Fetch], bool]) -> Iterator[tuple[Fetch, str]]:
        """Queued fetches that ``live`` still wants and that have a slot now, in queue order;
        each comes with the peer to ask. The others keep their place."""
        self.freed = False
        waiting, self.queue = self.queue, deque()
        while waiting:
            fetch = waiting.popleft()
            if not live(fetch) or fetch.current is not None:
                continue  # dropped, or already asked
            if self.in_flight >= self.total:
                self.queue.append(fetch)
                self.queue.extend(waiting)
                return
            address = self.take(fetch)
            if address is None:
                self.queue.append(fetch)  # its peers are all busy: keep its place
            else:
                yield fetch, address
