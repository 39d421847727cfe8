"""Worker liveness for the manager: who fell silent, who is due a heartbeat, whose local
process exited. Pure bookkeeping driven by ``now`` (seconds, any monotonic clock).

The manager's I/O loop tells it what happened (``joined``, ``heard``, ``sent``, ``left``)
and asks, on a timer, what to do (``check``); it does the sending and the losing itself.
Only a message that could be read counts as a sign of life, and only a batch that was
sent postpones the next heartbeat, so an idle connection still carries one per interval
(the cadence never depends on inbound traffic, unlike the zguide's ``ppqueue.py``).

Its cost grows with the workers only per interval: ``heard`` and ``sent`` (per message)
set a field; ``check`` (on the loop's timer) looks only at workers whose deadline may
have come, kept in a heap with one entry per worker, which a postponed deadline pushes
back when it comes up (about once per interval per worker), and at local workers whose
process exited, by pid.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Mapping
from typing import NamedTuple


class Lost(NamedTuple):
    """A worker to declare lost."""

    worker: Hashable
    reason: str
    silent: bool  #: True: it fell silent (tell it to leave); False: its process exited


class Verdict(NamedTuple):
    lost: list[Lost]
    heartbeat: list[Hashable]  #: workers sent nothing for a heartbeat interval


class _Peer:
    __slots__ = ("pid", "last_seen", "last_sent")

    def __init__(self, pid: int | None, now: float) -> None:
        #: its process id when it runs on this host (its exit is seen without waiting)
        self.pid = pid
        self.last_seen = now
        self.last_sent = now


class Liveness:
    """Silence and heartbeat deadlines of the registered workers.

    Parameters
    ----------
    timeout
        Seconds of silence after which a worker is lost (``worker_timeout``).
    interval
        Seconds without sending anything after which a worker is sent a heartbeat.
    """

    def __init__(self, timeout: float, interval: float) -> None:
        self.timeout = timeout
        self.interval = interval
        self._peers: dict[Hashable, _Peer] = {}
        #: local workers by process id
        self._by_pid: dict[int, Hashable] = {}
        #: (when a deadline may come, tie-breaker, worker, its record): one live entry per
        #: worker, never later than its deadlines (they only move later); stale entries
        #: (a worker that left, or joined again) are dropped when they come up
        self._due: list[tuple[float, int, Hashable, _Peer]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, worker: Hashable) -> bool:
        return worker in self._peers

    def joined(self, worker: Hashable, now: float, local_pid: int | None = None) -> None:
        """A worker registered; ``local_pid``: its process id if it runs on this host."""
        self.left(worker)
        peer = _Peer(local_pid, now)
        self._peers[worker] = peer
        if local_pid is not None:
            self._by_pid[local_pid] = worker
        self._schedule(worker, peer)

    def heard(self, worker: Hashable, now: float) -> None:
        """A readable message came from ``worker``."""
        peer = self._peers.get(worker)
        if peer is not None:
            peer.last_seen = now

    def sent(self, worker: Hashable, now: float) -> None:
        """A batch went to ``worker``."""
        peer = self._peers.get(worker)
        if peer is not None:
            peer.last_sent = now

    def left(self, worker: Hashable) -> None:
        """Forget a worker (lost, or it said goodbye); its heap entry goes stale."""
        peer = self._peers.pop(worker, None)
        if peer is not None and peer.pid is not None:
            self._by_pid.pop(peer.pid, None)

    def check(self, now: float, exited: Mapping[int, int | None] = {}) -> Verdict:
        """Who is lost and who is due a heartbeat at ``now``.

        ``exited`` maps process ids of local workers that exited to their exit codes: such
        a worker is lost at once, before its silence would tell. Lost workers are
        forgotten here; the caller loses them. A worker due a heartbeat is taken to be
        sent it now: its next one is due an interval later unless ``sent`` says otherwise.
        """
        lost: list[Lost] = []
        heartbeat: list[Hashable] = []
        by_pid = self._by_pid
        for pid, code in exited.items():
            worker = by_pid.get(pid)
            if worker is not None:
                lost.append(Lost(worker, f"its process exited with code {code}", False))
                self.left(worker)
        due = self._due
        peers = self._peers
        while due and due[0][0] < now:
            _, _, worker, peer = heapq.heappop(due)
            if peers.get(worker) is not peer:
                continue  # it left, or joined again (a newer entry stands for it)
            if now - peer.last_seen > self.timeout:
                silence = now - peer.last_seen
                reason = f"silent for {silence:.1f} s (timeout {self.timeout} s)"
                lost.append(Lost(worker, reason, True))
                self.left(worker)
                continue
            if now - peer.last_sent > self.interval:
                heartbeat.append(worker)
                peer.last_sent = now
            self._schedule(worker, peer)
        return Verdict(lost, heartbeat)

    def _schedule(self, worker: Hashable, peer: _Peer) -> None:
        """The worker's entry, at the earlier of its two deadlines."""
        when = min(peer.last_seen + self.timeout, peer.last_sent + self.interval)
        heapq.heappush(self._due, (when, next(self._order), worker, peer))
