"""Worker liveness for the manager: who fell silent, who is due a heartbeat, whose local
process exited. Pure bookkeeping driven by ``now`` (seconds, any monotonic clock).

The manager's I/O loop tells it what happened (``joined``, ``heard``, ``sent``, ``left``)
and asks, on a timer, what to do (``check``); it does the sending and the losing itself.
Only a message that could be read counts as a sign of life, and only a batch that was
sent postpones the next heartbeat, so an idle connection still carries one per interval
(the cadence never depends on inbound traffic, unlike the zguide's ``ppqueue.py``).
"""

from __future__ import annotations

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

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, worker: Hashable) -> bool:
        return worker in self._peers

    def joined(self, worker: Hashable, now: float, local_pid: int | None = None) -> None:
        """A worker registered; ``local_pid``: its process id if it runs on this host."""
        self._peers[worker] = _Peer(local_pid, now)

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
        """Forget a worker (lost, or it said goodbye)."""
        self._peers.pop(worker, None)

    def check(self, now: float, exited: Mapping[int, int | None] = {}) -> Verdict:
        """Who is lost and who is due a heartbeat at ``now``.

        ``exited`` maps process ids of local workers that exited to their exit codes: such
        a worker is lost at once, before its silence would tell. Lost workers are
        forgotten here; the caller loses them.
        """
        lost: list[Lost] = []
        heartbeat: list[Hashable] = []
        for worker, peer in self._peers.items():
            if peer.pid is not None and peer.pid in exited:
                lost.append(Lost(worker, f"its process exited with code {exited[peer.pid]}", False))
            elif now - peer.last_seen > self.timeout:
                silence = now - peer.last_seen
                reason = f"silent for {silence:.1f} s (timeout {self.timeout} s)"
                lost.append(Lost(worker, reason, True))
            elif now - peer.last_sent > self.interval:
                heartbeat.append(worker)
        for gone in lost:
            del self._peers[gone.worker]
        return Verdict(lost, heartbeat)
