"""A worker's fetches of inputs from peers, and the bound on how many are in flight.

Pure bookkeeping, no sockets: ``Fetcher``, a component of ``state.WorkerState``, asks
``TransferSlots.take`` which peer to ask for a fetch (or queues it when no slot is free),
gives the slot back when the reply arrives, the peer times out or nobody waits any more,
and starts queued fetches as slots free up; once no holder answered, it asks the manager
to relay the input.

The peers it may ask are bounded too (``MAX_PEER_LINKS``): each is a socket the shell
holds open (``peers.PeerLinks``), and a worker among thousands must not hold thousands.
A new peer takes the place of the least recently asked one with nothing in flight
(``TransferSlots.evicted`` says whose socket to close); when every linked peer has
something in flight, the fetch waits in the queue until one is free.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence

from daskvine_py.wire import protocol as p
from daskvine_py.worker.messages import AskPeer, ClosePeer, Instruction

logger = logging.getLogger("daskvine_py.worker")

#: Inputs fetched from peers at once, overall and from one peer; the rest wait their turn.
#: More in flight hides network latency for many small results; fewer bounds the memory
#: that arriving data takes at once, and the per-peer bound keeps a popular result's holder
#: from being swamped by one worker while others also need it.
MAX_FETCHES = 32
MAX_FETCHES_PER_PEER = 8
#: Peers a worker holds a socket to at once. Past a few dozen more sockets buy nothing
#: (``MAX_FETCHES`` are in flight at once) and cost a file descriptor and a connection
#: on both sides, which a swarm of thousands multiplies.
MAX_PEER_LINKS = 64
#: Where a fetch goes once no holder answered (``Fetch.current``, and the source of its
#: bytes in ``Transfers``): the manager, which relays it from a holder.
RELAY = "manager"


class Fetch:
    """One input being copied from peers, for the local tasks that wait on it."""

    __slots__ = (
        "dep_id",
        "peers",
        "untried",
        "current",
        "deadline",
        "waiters",
        "replicate",
        "relayed",
        "unreached",
        "started",
    )

    def __init__(
        self, dep_id: int, peers: Sequence[str], replicate: bool = False, now: float = 0.0
    ) -> None:
        self.dep_id = dep_id
        #: when it was wanted (the loop's clock): its bar on the fetch lane begins there
        self.started = now
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
    """Requests in flight, overall and per peer, the peers linked (their sockets open),
    and the fetches waiting for a slot."""

    __slots__ = (
        "total",
        "per_peer",
        "links",
        "in_flight",
        "from_peer",
        "linked",
        "evicted",
        "queue",
        "freed",
    )

    def __init__(
        self,
        total: int = MAX_FETCHES,
        per_peer: int = MAX_FETCHES_PER_PEER,
        links: int = MAX_PEER_LINKS,
    ) -> None:
        self.total = total
        self.per_peer = per_peer
        self.links = links
        self.in_flight = 0
        self.from_peer: dict[str, int] = {}
        #: peers asked whose sockets may be open, least recently asked first
        self.linked: OrderedDict[str, None] = OrderedDict()
        #: peers unlinked to make room: their sockets are closed (``Fetcher.flush``'s
        #: ``ClosePeer``) before any request goes out
        self.evicted: list[str] = []
        #: fetches waiting for a slot, in the order they asked
        self.queue: deque[Fetch] = deque()
        #: a slot was given back since queued fetches were last started
        self.freed = False

    def take(self, fetch: Fetch) -> str | None:
        """The next untried holder with a free slot, now in flight; None if none is free."""
        if self.in_flight >= self.total:
            return None
        busy = self.from_peer
        linked = self.linked
        room: bool | None = None  # whether a peer not linked may be (asked once)
        untried = fetch.untried
        for i in range(len(untried) - 1, -1, -1):
            address = untried[i]
            if busy.get(address, 0) >= self.per_peer:
                continue
            if address in linked:
                break
            if room is None:
                room = len(linked) < self.links or self._idle_link() is not None
            if room:
                break
        else:
            return None
        del untried[i]
        if address not in linked and len(linked) >= self.links:
            idle = self._idle_link()
            assert idle is not None  # (``room`` said so)
            del linked[idle]
            self.evicted.append(idle)
        linked[address] = None
        linked.move_to_end(address)
        fetch.current = address
        self.in_flight += 1
        busy[address] = busy.get(address, 0) + 1
        return address

    def _idle_link(self) -> str | None:
        """The least recently asked linked peer with nothing in flight, if any."""
        busy = self.from_peer
        return next((address for address in self.linked if not busy.get(address)), None)

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
            left = self.from_peer[address] - 1
            if left:
                self.from_peer[address] = left
            else:  # (kept only while busy: a worker may ask thousands of peers in its life)
                del self.from_peer[address]
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


class Fetcher:
    """The worker's copies of inputs from peers: one ``Fetch`` per input for every task
    that waits for it (or none, for a ``Replicate``), within the transfer slots.

    Instructions go to the owner's one list, ``out``: ``Relay`` and ``Transfers``
    records; the ids to ask each peer for gather in ``asks`` until ``flush`` turns them
    into one ``AskPeer`` per peer (after a ``ClosePeer`` for each peer unlinked to make
    room). A fetch no holder could serve goes to ``on_failed`` once out of ``fetches``:
    the owner forgets the tasks that waited for it. An input that arrived is the
    caller's to store.
    """

    __slots__ = (
        "fetches",
        "slots",
        "received_from",
        "timeout",
        "out",
        "asks",
        "on_failed",
    )

    def __init__(
        self,
        timeout: float,
        out: list[Instruction],
        on_failed: Callable[[Fetch], None],
        links: int = MAX_PEER_LINKS,
    ) -> None:
        #: input id -> its copy from peers in progress
        self.fetches: dict[int, Fetch] = {}
        #: requests in flight overall and per peer, and fetches waiting for a free slot
        self.slots = TransferSlots(links=links)
        #: bytes received per peer address since the last ``Transfers`` report
        self.received_from: dict[str, int] = {}
        self.timeout = timeout  #: seconds a peer has to answer
        self.out = out
        #: peer address -> ids to ask it for, until ``flush``
        self.asks: dict[str, list[int]] = {}
        self.on_failed = on_failed

    def want(self, dep_id: int, peers: Sequence[str], task_id: int, now: float) -> None:
        """Task ``task_id`` needs input ``dep_id`` from one of ``peers``."""
        fetch = self.fetches.get(dep_id)
        if fetch is None:
            fetch = self.fetches[dep_id] = Fetch(dep_id, peers, now=now)
            self.request_next(fetch, now)
        fetch.waiters.add(task_id)

    def replicate(self, dep_id: int, peers: Sequence[str], now: float) -> None:
        """Copy ``dep_id`` and keep it, whether or not a task waits for it."""
        fetch = self.fetches.get(dep_id)
        if fetch is not None:
            fetch.replicate = True
        elif peers:
            fetch = self.fetches[dep_id] = Fetch(dep_id, peers, replicate=True, now=now)
            self.request_next(fetch, now)

    def unwait(self, dep_id: int, task_id: int) -> None:
        """A task no longer waits for ``dep_id``: a fetch for nobody is dropped."""
        fetch = self.fetches.get(dep_id)
        if fetch is not None:
            fetch.waiters.discard(task_id)
            if not fetch.waiters and not fetch.replicate:
                del self.fetches[dep_id]
                self.slots.give_back(fetch)  # a late reply finds no fetch and is dropped

    def unwait_all(self, task_id: int) -> None:
        """``unwait`` from every fetch: for a task whose inputs are not known."""
        for fetch in list(self.fetches.values()):
            fetch.waiters.discard(task_id)
            if not fetch.waiters and not fetch.replicate:  # for nobody: a later task would
                del self.fetches[fetch.dep_id]  # wait on it forever, never requested
                self.slots.give_back(fetch)

    def request_next(self, fetch: Fetch, now: float) -> None:
        """Ask the next untried holder, or queue the fetch until a transfer slot is free;
        once every holder failed, ask through the manager (``Relay``), then give up."""
        if not fetch.untried:
            if fetch.relayed or not fetch.unreached:  # (holders that answered "not here")
                self._failed(fetch)
                return
            self.slots.take_relay(fetch, RELAY)
            fetch.deadline = now + self.timeout
            self.out.append(p.Relay((fetch.dep_id,)))
            return
        address = self.slots.take(fetch)
        if address is None:
            fetch.deadline = float("inf")
            self.slots.queue.append(fetch)
        else:
            self._request(fetch, address, now)

    def _request(self, fetch: Fetch, address: str, now: float) -> None:
        fetch.deadline = now + self.timeout
        self.asks.setdefault(address, []).append(fetch.dep_id)

    def _is_live(self, fetch: Fetch) -> bool:
        return self.fetches.get(fetch.dep_id) is fetch

    def _failed(self, fetch: Fetch) -> None:
        self.fetches.pop(fetch.dep_id, None)
        if fetch.replicate and not fetch.waiters:
            logger.debug("could not copy result %d from %s", fetch.dep_id, fetch.peers)
        self.on_failed(fetch)

    def flush(self) -> None:
        """The requests gathered since the last flush: a ``ClosePeer`` for each peer
        unlinked to make room (closed before any new one opens: never more than the
        bound), then one ``AskPeer`` per peer."""
        out = self.out
        evicted = self.slots.evicted
        if evicted:
            out.extend(ClosePeer(address) for address in evicted)
            evicted.clear()
        if self.asks:
            out.extend(AskPeer(address, tuple(ids)) for address, ids in self.asks.items())
            self.asks = {}

    def deadline(self, before: float) -> float:
        """The earliest of ``before`` and the fetches' deadlines."""
        for fetch in self.fetches.values():
            if fetch.deadline < before:
                before = fetch.deadline
        return before

    def on_timers(self, now: float) -> None:
        """Fetches past their deadline go to their next holder; the peers that did not
        answer have their sockets closed (``ClosePeer``), and the other fetches asked of
        them go on at once: their requests went with the socket. (At 600 x 12 one late
        answer so cost a worker 25 more fetch timeouts, one after another, until all its
        inputs went through the manager.)"""
        closed: set[str] = set()
        for fetch in [f for f in self.fetches.values() if f.deadline <= now]:
            if self.fetches.get(fetch.dep_id) is not fetch:
                continue  # dropped with a task that an earlier failure here cancelled
            logger.warning("peer did not serve result %d within %.1f s", fetch.dep_id, self.timeout)
            address = fetch.current
            if address and address not in closed:
                self.out.append(ClosePeer(address))  # (RELAY names no socket: a no-op)
                if address != RELAY:  # (through the manager: no socket, no others on it)
                    closed.add(address)
            self._move_on(fetch, now)
        if closed:
            for fetch in [f for f in self.fetches.values() if f.current in closed]:
                self._move_on(fetch, now)

    def _move_on(self, fetch: Fetch, now: float) -> None:
        """Its holder did not answer (or its request was lost): the next one."""
        fetch.unreached = True
        self.slots.give_back(fetch)
        self.request_next(fetch, now)

    def start_queued(self, now: float) -> None:
        """Once per loop pass: ask for the queued fetches that found a slot."""
        if self.slots.freed and self.slots.queue:
            for fetch, address in self.slots.startable(self._is_live):
                self._request(fetch, address, now)

    def report_received(self) -> None:
        """The bytes received from each peer since the last report, if any (``Transfers``)."""
        if self.received_from:
            self.out.append(p.Transfers(tuple(self.received_from.items())))
            self.received_from = {}

    def relayed(self, dep_id: int) -> bool:
        """Whether ``dep_id`` was asked for through the manager and is still wanted."""
        fetch = self.fetches.get(dep_id)
        return fetch is not None and fetch.current == RELAY

    def on_unreachable(self, address: str, ids: Sequence[int], now: float) -> None:
        """Requests that could not be sent to ``address``: their fetches try the next holder."""
        for dep_id in ids:
            fetch = self.fetches.get(dep_id)
            if fetch is not None and fetch.current == address:
                fetch.unreached = True
                self.slots.give_back(fetch)
                self.request_next(fetch, now)

    def on_data(self, reply: p.Data, now: float) -> Fetch | None:
        """A peer's answer: the fetch, done, when it holds the input (the caller stores it
        and tells the waiters); None, after asking the next holder, when it does not."""
        fetch = self.fetches.get(reply.task_id)
        if fetch is None or fetch.current is None:
            return None  # nobody here waits for it any more, or it was asked elsewhere since
        source = fetch.current
        self.slots.give_back(fetch)
        if reply.value is None:
            self.request_next(fetch, now)
            return None
        del self.fetches[reply.task_id]
        if source != RELAY:  # (the manager counts what it relays)
            received = self.received_from
            received[source] = received.get(source, 0) + reply.value.nbytes
        return fetch

    def on_data_error(self, dep_id: int) -> None:
        """A peer's answer that could not be stored: the tasks that wait give up on it."""
        fetch = self.fetches.get(dep_id)
        if fetch is not None:
            self.slots.give_back(fetch)
            self._failed(fetch)

    def leaks(self) -> Iterator[str]:
        """What still holds something: names, for tests of a quiet worker."""
        if self.fetches:
            yield "fetches"
        if self.slots.in_flight or any(self.slots.from_peer.values()):
            yield "slots"
