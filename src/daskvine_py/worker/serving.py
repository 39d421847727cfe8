"""What a worker's peer server answers, and how much per request and per loop turn.

No sockets here: ``peers.PeerLinks`` reads requests and sends answers; ``PeerRequests``
holds the ids asked for and not yet answered, and hands out at most ``TURN_IDS`` answers
per call (fewer when their values pass ``TURN_BYTES``), taking peers in turn; a loop pass
calls it twice at most (as requests arrive, and before it flushes). A request past
``REQUEST_IDS`` ids (a real fetch asks for a handful: ``fetching.MAX_FETCHES_PER_PEER``)
keeps its first ids and drops the rest, as does a peer that already has that many
waiting: a worker that floods its peers' port costs them a bounded answer, never a
stalled loop or memory that stays. ``answer`` is one id's answer, from the store; a
result a library keeps live is the state's to export first: its ids go to the state as
a ``messages.PeerAsked`` event, and the answer comes back as ``AnswerPeer``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from daskvine_py.wire import protocol as p
from daskvine_py.worker.live_results import LiveResults
from daskvine_py.worker.messages import Event, PeerAsked
from daskvine_py.worker.store import Store

#: Ids one peer may have waiting for an answer: hundreds of times what a fetch asks.
REQUEST_IDS = 4096
#: Answers made per loop turn, over all peers; the rest wait for the next turns, so the
#: loop goes back to its manager and libraries between them.
TURN_IDS = 4096
#: Bytes of values answered per loop turn (values are sent without a copy; the bound
#: keeps one turn from pinning a spill directory's worth of mapped files at once).
TURN_BYTES = 256 * 1024 * 1024
#: Bytes of values in one answer message: past it, the next values go in another.
MESSAGE_BYTES = 64 * 1024 * 1024

#: Told (task id, exception) when a stored result cannot be read back.
_OnError = Callable[[int, Exception], None]


class PeerRequests:
    """Ids asked for by each peer (by identity), oldest peer first; an id asked for again
    before it is answered is answered once."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: OrderedDict[bytes, OrderedDict[int, None]] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def take(self, ident: bytes, task_ids: Sequence[int]) -> int:
        """Queue a peer's request; how many of its ids were dropped (past the bound)."""
        queue = self.waiting.get(ident)
        room = REQUEST_IDS - (0 if queue is None else len(queue))
        kept = task_ids if len(task_ids) <= room else task_ids[: max(room, 0)]
        if kept:
            if queue is None:
                queue = self.waiting[ident] = OrderedDict()
            queue.update(dict.fromkeys(kept))
        return len(task_ids) - len(kept)

    def answers(
        self,
        store: Store,
        live: LiveResults | None,
        on_error: _OnError,
        asked: list[Event] | None = None,
    ) -> list[tuple[bytes, list[p.Data]]]:
        """This turn's answers: (peer identity, records of one message), at most
        ``TURN_IDS`` records and about ``TURN_BYTES`` of values in all. The ids whose
        results a library keeps live go to ``asked``, one ``PeerAsked`` per peer, for the
        state to export and answer later."""
        messages: list[tuple[bytes, list[p.Data]]] = []
        ids_left = TURN_IDS
        bytes_left = TURN_BYTES
        waiting = self.waiting
        for ident in list(waiting):
            if ids_left <= 0 or bytes_left <= 0:
                break
            queue = waiting[ident]
            records: list[p.Data] = []
            deferred: list[int] = []
            size = 0
            while queue and ids_left > 0 and bytes_left > 0:
                task_id = queue.popitem(last=False)[0]
                ids_left -= 1
                data = answer(store, live, task_id, on_error)
                if data is None:
                    deferred.append(task_id)
                    continue
                nbytes = 0 if data.value is None else data.value.nbytes
                if records and size + nbytes > MESSAGE_BYTES:
                    messages.append((ident, records))
                    records, size = [], 0
                records.append(data)
                size += nbytes
                bytes_left -= nbytes
            if records:
                messages.append((ident, records))
            if deferred and asked is not None:
                asked.append(PeerAsked(ident, tuple(deferred)))
            if queue:  # its turn is over: behind the others
                waiting.move_to_end(ident)
            else:
                del waiting[ident]
        return messages


def answer(
    store: Store, live: LiveResults | None, task_id: int, on_error: _OnError
) -> p.Data | None:
    """A peer's answer for one id: the stored value, or ``Data(task_id, None)`` when it is
    not held here; None when a library keeps it live, for the state to export first
    (``PeerAsked``; a result that cannot be serialized, ``stuck``, is not held here)."""
    try:
        value = store.get(task_id, use=False)
    except Exception as exc:  # a spill file that cannot be read back
        on_error(task_id, exc)
        value = None  # "not held here": the peer asks the next holder
    if value is None and live is not None:
        entry = live.entries.get(task_id)
        if entry is not None and not entry.stuck:
            return None
    return p.Data(task_id, value)
