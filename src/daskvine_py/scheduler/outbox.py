"""What the manager sends a worker, held back when it can wait: a batch of ``Release``
records alone waits for the next batch to that worker, or ``RELEASE_HOLD`` seconds.

``dv3-large`` on 200 workers (tasks of 1 to 10 s, finishing one by one) sent 13,018 batches
that held only ``Release`` records, 47% of all its batches, each a send, a CurveZMQ
encryption and a wake-up of the worker, for results nothing reads again. Held, most of
them go with the worker's next ``Execute``. A worker keeps a released result a moment
longer; nothing of the manager reads it meanwhile (the state forgot it already) and the
records reach the worker in the order they were made: a held ``Release`` goes before
whatever follows it to that worker, as it would have.

Pure bookkeeping, used by the manager's loop and by the simulator's manager node alike.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from daskvine_py.wire import protocol as p

#: Seconds a batch of only ``Release`` records may wait for company. Tasks that finish
#: within it on a worker take its releases along; an idle worker gets them this late.
RELEASE_HOLD = 0.5

Ident = TypeVar("Ident", bound=Hashable)
#: what the manager sends (the loop's records, or the simulator's subset of them)
Message = TypeVar("Message")


def only_releases(messages: Sequence[object]) -> bool:
    for message in messages:
        if type(message) is not p.Release:
            return False
    return True


class ReleaseHold(Generic[Ident, Message]):
    """Batches of only ``Release`` records, by worker, and when each falls due."""

    __slots__ = ("held", "hold")

    def __init__(self, hold: float = RELEASE_HOLD) -> None:
        self.hold = hold
        #: worker -> (when its held batch is due, the records)
        self.held: dict[Ident, tuple[float, list[Message]]] = {}

    def __bool__(self) -> bool:
        return bool(self.held)

    def take(self, ident: Ident, messages: list[Message], now: float) -> list[Message]:
        """The records to send ``ident`` now: those held for it first, then ``messages``;
        none while they are all ``Release`` records and not due (they are held)."""
        waiting = self.held.pop(ident, None)
        if waiting is not None:
            due, earlier = waiting
            messages = earlier + messages
        else:
            due = now + self.hold
        if due > now and only_releases(messages):
            self.held[ident] = (due, messages)
            return []
        return messages

    def batches(
        self, outboxes: Mapping[Ident, list[Message]], now: float
    ) -> list[tuple[Ident, list[Message]]]:
        """What to send now: each outbox after what was held for its worker (unless it
        is held in turn), then the held batches due by ``now``, all taken out of the
        hold (sending may lose a worker, which drops what is held for it)."""
        sending = []
        for ident, messages in outboxes.items():
            messages = self.take(ident, messages, now)
            if messages:
                sending.append((ident, messages))
        if self.held:
            sending.extend(self.due(now))
        return sending

    def due(self, now: float) -> list[tuple[Ident, list[Message]]]:
        """Held batches due by ``now``, taken out of the hold."""
        held = self.held
        return [
            (ident, held.pop(ident)[1]) for ident in [i for i, (d, _) in held.items() if d <= now]
        ]

    def drop(self, ident: Ident) -> None:
        """A worker gone: what was held for it goes nowhere."""
        self.held.pop(ident, None)
