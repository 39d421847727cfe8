"""Worker liveness for the manager: who fell silent, who is due a heartbeat, whose local
process exited. Pure bookkeeping driven by ``now`` (seconds, any monotonic clock).

The manager's I/O loop tells it what happened (``joined``, ``heard``, ``sent``, ``left``)
and asks, on a timer, what to do (``check``); it does the sending and the losing itself.
Only a message that could be read counts as a sign of life, and only a batch that was
sent postpones the next heartbeat, so an idle connection still carries one per interval
(the cadence never depends on inbound traffic, unlike the zguide's ``ppqueue.py``).

Its cost grows with the workers only per interval: ``heard`` and ``sent`` (per message)
set a field; ``check`` (on the loop's timer, every 0.1 s) finds local workers whose
process exited by pid, and walks the workers only once the earliest deadline it saw on
its last walk has come (deadlines only move later, so nothing can be due before). While
the manager sends to every worker (a busy cluster), that is once per heartbeat interval;
idle workers, whose heartbeats fall due at spread-out times, are walked on every pass
(0.2 ms at 2,000 workers). A heap of deadlines would look at fewer workers, but measured
slower than these walks in Python.
"""

from __future__ import annotations

import math
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
        #: no deadline comes before this (the earliest one the last walk saw, or a join's)
        self._next_due = -math.inf

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, worker: Hashable) -> bool:
        return worker in self._peers

    def joined(self, worker: Hashable, now: float, local_pid: int | None = None) -> None:
        """A worker registered; ``local_pid``: its process id if it runs on this host."""
        self.left(worker)
        self._peers[worker] = _Peer(local_pid, now)
        if local_pid is not None:
            self._by_pid[local_pid] = worker
        self._next_due = min(self._next_due, now + min(self.interval, self.timeout))

    def heard(self, worker: Hashable, now: float) -> None:
        """A readable message came from ``worker``."""
        peer = self._peers.get(worker)
        if peer is not None:
            peer.last_seen = now

    def last_heard(self, worker: Hashable) -> float | None:
        """When ``worker`` was last heard from (None: not a worker here)."""
        peer = self._peers.get(worker)
        return None if peer is None else peer.last_seen

    def sent(self, worker: Hashable, now: float) -> None:
        """A batch went to ``worker``."""
        peer = self._peers.get(worker)
        if peer is not None:
            peer.last_sent = now

    def left(self, worker: Hashable) -> None:
        """Forget a worker (lost, or it said goodbye)."""
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
        if now <= self._next_due:
            return Verdict(lost, heartbeat)
        timeout, interval = self.timeout, self.interval
        earliest = math.inf
        silent = []
        for worker, peer in self._peers.items():
            silent_at = peer.last_seen + timeout
            if now > silent_at:
                reason = f"silent for {now - peer.last_seen:.1f} s (timeout {timeout} s)"
                silent.append(Lost(worker, reason, True))
                continue
            beat_at = peer.last_sent + interval
            if now > beat_at:
                heartbeat.append(worker)
                peer.last_sent = now
                beat_at = now + interval
            if beat_at < earliest:
                earliest = beat_at
            if silent_at < earliest:
                earliest = silent_at
        for gone in silent:
            self.left(gone.worker)
        self._next_due = earliest
        return Verdict(lost + silent, heartbeat)
