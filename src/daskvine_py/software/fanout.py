"""Who sends an archive to whom: the manager's host seeds it, the nodes that hold it spread it.

An environment archive is hundreds of megabytes, and every node of a run needs it at
once, when the run starts. Sent from the manager's host alone, fifty nodes are fifty
copies up one link. ``FanOut`` is the manager's side of the answer (pure: no sockets, no
clock; ``transfer.ArchiveServer`` asks it): a node that wants an archive is sent to a node
that already holds it, or served by the manager, or asked to wait.

State, per archive key:

- ``holders``: the archive servers of nodes that hold the complete archive (they said
  ``have``), in the order they came;
- ``transfers``: who fetches what from whom, since when (``(key, requester) -> Transfer``),
  oldest first;
- ``load``: transfers in flight per peer source (all keys: a node's link carries them all),
  ``manager_load``: the manager's own, per key;
- ``copies``: the manager's transfers of a key, less those that failed.

The policy (``want``): a holder with fewer than ``PEER_FANOUT`` transfers in flight, the
least loaded first, never the requester itself; else the manager, while it has fewer
than ``MANAGER_FANOUT`` in flight for that key and either it has sent fewer than
``MANAGER_COPIES`` copies or no copy is left or coming elsewhere; else wait and ask
again. Every holder serves two at a time and goes on serving, so the holders about
triple every round of transfers: a swarm of N nodes takes some log3(N) rounds, and the
manager's host sends ``MANAGER_COPIES`` copies, not N, when nothing fails.

A failed transfer from a peer (``done(..., ok=False)``: a wrong checksum, a peer that
stopped answering) drops that holder for that key; a transfer nobody reports ends after
``STALE`` seconds (its requester may have died), freeing its source's slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

#: Transfers one peer serves at once (all keys together). Two: the holders triple every
#: round, and each transfer still gets half a node's uplink; more would split the link
#: further and make every round longer for a few more holders per round.
PEER_FANOUT = 2
#: Transfers of one key the manager serves at once.
MANAGER_FANOUT = 2
#: Copies of a key the manager sends while other copies exist or are on their way: past
#: them, a requester waits for a peer. It still serves when no copy is left anywhere
#: (every holder gone), so the run cannot starve.
MANAGER_COPIES = 4
#: Seconds after which a transfer nobody reported ends (its requester may be gone): a
#: slot is then freed for another. Long enough for hundreds of MB over a slow link; a
#: transfer still running past it only means one more transfer at its source.
STALE = 300.0
#: Seconds a requester is told to wait before it asks again, when every source is busy.
WAIT = 0.5

#: The ``source`` of a transfer the manager serves itself.
MANAGER = ""


class FromPeer(NamedTuple):
    """Fetch it from the peer at ``address``."""

    kind: Literal["peer"]
    address: str


class FromManager(NamedTuple):
    """The manager serves it itself."""

    kind: Literal["self"]


class Wait(NamedTuple):
    """Every source is busy: ask again after ``seconds``."""

    kind: Literal["wait"]
    seconds: float


#: ``want``'s answer; each compares equal to its tuple (``("peer", address)``, ``("self",)``,
#: ``("wait", seconds)``).
Decision = FromPeer | FromManager | Wait


@dataclass(slots=True)
class Transfer:
    source: str  #: a peer's address, or ``MANAGER``
    started: float


class FanOut:
    """The manager's bookkeeping of archive transfers; see the module's docstring.

    Its methods are called by one thread (the manager's archive server); its counters may
    be read from any.
    """

    def __init__(
        self,
        peer_fanout: int = PEER_FANOUT,
        manager_fanout: int = MANAGER_FANOUT,
        manager_copies: int = MANAGER_COPIES,
        stale: float = STALE,
        wait: float = WAIT,
    ) -> None:
        self.peer_fanout = peer_fanout
        self.manager_fanout = manager_fanout
        self.manager_copies = manager_copies
        self.stale = stale
        self.wait = wait
        #: key -> addresses of the archive servers that hold it complete (ordered)
        self.holders: dict[str, dict[str, None]] = {}
        #: (key, requester) -> the transfer in flight, oldest first
        self.transfers: dict[tuple[str, str], Transfer] = {}
        #: peer address -> its transfers in flight (every key)
        self.load: dict[str, int] = {}
        #: key -> the manager's transfers of it in flight
        self.manager_load: dict[str, int] = {}
        #: key -> transfers of it in flight from peers
        self.peer_transfers: dict[str, int] = {}
        #: key -> the manager's transfers of it started, less those that failed
        self.copies: dict[str, int] = {}
        #: transfers reported done and whole, by source kind ("self", "peer")
        self.finished = {"self": 0, "peer": 0}
        #: transfers reported failed, by source kind
        self.failed = {"self": 0, "peer": 0}
        #: transfers ended for being older than ``stale``, unreported
        self.expired = 0
        #: ``Wait`` answers given
        self.waits = 0

    def want(self, key: str, requester: str, now: float) -> Decision:
        """Where ``requester`` (the address of its own archive server, or another name
        unique to it) fetches ``key`` from; the transfer counts as in flight until
        ``done``, another ``want`` of the same requester and key, or ``stale`` seconds."""
        self.expire(now)
        previous = self.transfers.pop((key, requester), None)
        if previous is not None:  # it starts over: that one ended
            self._free(key, previous.source)
        holders = self.holders.get(key)
        if holders:
            holders.pop(requester, None)  # one that asks for it does not hold it
        best = None
        for address in holders or ():
            load = self.load.get(address, 0)
            if load < self.peer_fanout and (best is None or load < self.load.get(best, 0)):
                best = address
        if best is not None:
            self._start(key, requester, best, now)
            return FromPeer("peer", best)
        if self.manager_load.get(key, 0) < self.manager_fanout and (
            self.copies.get(key, 0) < self.manager_copies
            or not (holders or self.peer_transfers.get(key, 0))
        ):
            self._start(key, requester, MANAGER, now)
            self.copies[key] = self.copies.get(key, 0) + 1
            return FromManager("self")
        self.waits += 1
        return Wait("wait", self.wait)

    def done(self, key: str, requester: str, source: str, ok: bool) -> None:
        """``requester``'s transfer of ``key`` from ``source`` ended, whole (``ok``) or not.
        A failed one from a peer drops that peer as a holder of ``key``: it may be gone,
        or hold a damaged copy."""
        transfer = self.transfers.pop((key, requester), None)
        if transfer is not None:
            self._free(key, transfer.source)
            source = transfer.source
        kind = "self" if source == MANAGER else "peer"
        if ok:
            self.finished[kind] += 1
            return
        self.failed[kind] += 1
        if kind == "peer":
            holders = self.holders.get(key)
            if holders is not None:
                holders.pop(source, None)
        elif transfer is not None:
            self.copies[key] -= 1

    def have(self, key: str, address: str) -> None:
        """The archive server at ``address`` holds ``key`` complete: it may serve it."""
        if address != MANAGER:
            self.holders.setdefault(key, {})[address] = None

    def gone(self, address: str) -> None:
        """The node whose archive server is at ``address`` left: it holds nothing now,
        and its transfers, to it or from it, end."""
        for holders in self.holders.values():
            holders.pop(address, None)
        for (key, requester), transfer in list(self.transfers.items()):
            if address in (requester, transfer.source):
                del self.transfers[key, requester]
                self._free(key, transfer.source)

    def expire(self, now: float) -> None:
        """End the transfers started more than ``stale`` seconds before ``now``."""
        while self.transfers:
            (key, requester), transfer = next(iter(self.transfers.items()))
            if now - transfer.started <= self.stale:
                return
            del self.transfers[key, requester]
            self._free(key, transfer.source)
            self.expired += 1

    def in_flight(self, key: str) -> int:
        """Transfers of ``key`` in flight, from every source."""
        return self.manager_load.get(key, 0) + self.peer_transfers.get(key, 0)

    def _start(self, key: str, requester: str, source: str, now: float) -> None:
        self.transfers[key, requester] = Transfer(source, now)
        if source == MANAGER:
            self.manager_load[key] = self.manager_load.get(key, 0) + 1
        else:
            self.load[source] = self.load.get(source, 0) + 1
            self.peer_transfers[key] = self.peer_transfers.get(key, 0) + 1

    def _free(self, key: str, source: str) -> None:
        if source == MANAGER:
            _decrement(self.manager_load, key)
        else:
            _decrement(self.load, source)
            _decrement(self.peer_transfers, key)


def _decrement(counts: dict[str, int], name: str) -> None:
    left = counts.get(name, 0) - 1
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)
