"""The ready-task structure: priorities, locality targets and soft targeting.

Ready tasks wait in one lane for tasks that may run anywhere and one lane per worker for
tasks that should run where their inputs are. A worker asking for work takes the best of
its own lane and the shared lane; if both are empty it takes the best task targeted at
another worker (soft targeting), so no worker idles while work is queued. Targeted tasks
are also in one more lane of all of them, so that taking one is O(1) however many workers
there are. Removal is lazy:
each push stamps the item with a fresh ticket, and entries whose ticket is stale are
skipped when they reach the front. A ticket indexes a list of the items it was given to
(``None`` once stale): 8 bytes per push, not a dict entry; the list and the lanes are
renumbered when stale tickets outnumber live ones (``STALE_SLACK``), and emptied with the
queue's other tables when no run is left (``shrink``).

An entry is one integer, ``priority << TICKET_BITS | ticket``: it compares in C, and the
ticket breaks ties in push order. A lane is a list of sorted chunks of at most
``2 * CHUNK`` entries, not a binary heap: the best entry is the last of the last chunk
(taking it is O(1)), and a push is a binary search over the chunks' bounds plus one
insertion into a short list (O(log n) comparisons and a small ``memmove``). At 10^6 queued
tasks a heap's pop walks twenty levels of a list much larger than the CPU caches; the
chunks keep each operation within a few cache lines.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

#: Bits of an entry that hold the ticket (tickets are renumbered long before 2^40).
TICKET_BITS = 40
_TICKET_MASK = (1 << TICKET_BITS) - 1
#: Entries per chunk of a lane (split at twice this). Larger chunks mean fewer bounds to
#: search but longer insertions; around a thousand both stay well under a microsecond.
CHUNK = 1000
#: Stale entries a lane or the list of tickets may hold beyond twice the live items,
#: before they are rebuilt without them.
STALE_SLACK = 4096


class Lane:
    """Integers, smallest taken first, in chunks by range (see the module docstring).

    Entries are stored negated, so that the smallest is at the end of the last chunk,
    where ``list.pop()`` is O(1). Chunk ``i`` holds the values up to ``maxes[i]`` (its
    largest) and above ``maxes[i - 1]``. Only the last chunk, where pops happen, is kept
    sorted; the others are sorted when they become the last, so a push into them is an
    append and the sorting is done in C, once per chunk.
    """

    __slots__ = ("chunks", "maxes", "size")

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.maxes: list[int] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def push(self, entry: int) -> None:
        value = -entry
        maxes = self.maxes
        chunks = self.chunks
        self.size += 1
        if not maxes:
            chunks.append([value])
            maxes.append(value)
            return
        i = bisect_left(maxes, value)
        last = len(maxes) - 1
        if i > last:  # the best yet: it goes at the very end
            i = last
            chunk = chunks[i]
            chunk.append(value)
            maxes[i] = value
        elif i == last:
            chunk = chunks[i]
            insort(chunk, value)
        else:
            chunk = chunks[i]
            chunk.append(value)
        if len(chunk) > 2 * CHUNK:
            self._split(i, i == last)

    def _split(self, i: int, is_last: bool) -> None:
        """Cut chunk ``i`` in two around its median (the last chunk stays sorted)."""
        chunk = self.chunks[i]
        if is_last:
            low, high = chunk[:CHUNK], chunk[CHUNK:]
            low_max, high_max = low[-1], high[-1]
        else:
            # A linear partition around the median of a sample: no full sort of a chunk
            # that may never reach the front.
            sample = sorted(chunk[:: max(1, len(chunk) // 15)])
            pivot = sample[len(sample) // 2]
            low = [v for v in chunk if v <= pivot]
            high = [v for v in chunk if v > pivot]
            if not high:  # a sample of equal values: fall back on sorting
                chunk.sort()
                low, high = chunk[:CHUNK], chunk[CHUNK:]
            low_max, high_max = max(low), self.maxes[i]
        self.chunks[i : i + 1] = [low, high]
        self.maxes[i : i + 1] = [low_max, high_max]

    def first(self) -> int | None:
        """The smallest entry, left in place."""
        return -self.chunks[-1][-1] if self.size else None

    def pop(self) -> int:
        """Take the smallest entry (``IndexError`` when empty)."""
        chunks = self.chunks
        chunk = chunks[-1]
        value = chunk.pop()
        self.size -= 1
        if chunk:
            self.maxes[-1] = chunk[-1]
        else:
            chunks.pop()
            self.maxes.pop()
            if chunks:
                chunks[-1].sort()
        return -value

    def __iter__(self) -> Iterator[int]:
        for chunk in self.chunks:
            for value in chunk:
                yield -value


class ReadyQueue(Generic[T]):
    """Priority queue of ready items with optional per-worker targets."""

    __slots__ = ("_shared", "_targeted", "_all", "_ticket_of", "_items")

    def __init__(self) -> None:
        self._shared = Lane()
        self._targeted: dict[Hashable, Lane] = {}
        #: every targeted entry once more, for stealing: a worker with no work of its own
        #: takes the front here in O(1) instead of comparing the fronts of every worker's
        #: lane. Built at the first steal and dropped once empty, so that runs that never
        #: steal do not push twice.
        self._all: Lane | None = None
        self._ticket_of: dict[T, int] = {}  #: live items and their current ticket
        #: by ticket, the item it was given to; None: stale (taken, removed, re-pushed)
        self._items: list[T | None] = []

    def __len__(self) -> int:
        return len(self._ticket_of)

    def shrink(self) -> None:
        """Free what an empty queue's tables still hold of their largest size."""
        if not self._ticket_of:
            self._ticket_of.clear()
            self._restart()

    def __contains__(self, item: T) -> bool:
        return item in self._ticket_of

    def push(self, item: T, priority: int, target: Hashable | None = None) -> None:
        """Queue ``item``; a lower ``priority`` (an int >= 0) pops first; equal ones in push
        order. Re-pushing replaces the old entry."""
        items = self._items
        ticket = len(items)
        old = self._ticket_of.get(item)
        if old is not None:
            items[old] = None
        self._ticket_of[item] = ticket
        items.append(item)
        entry = priority << TICKET_BITS | ticket
        if target is None:
            self._shared.push(entry)
        else:
            lane = self._targeted.get(target)
            if lane is None:
                lane = self._targeted[target] = Lane()
            lane.push(entry)
            steal = self._all
            if steal is not None:
                steal.push(entry)
                if steal.size > 2 * len(self._ticket_of) + STALE_SLACK:
                    self._compact_steal_lane()
        if ticket > 2 * len(self._ticket_of) + STALE_SLACK:
            self._renumber()

    def remove(self, item: T) -> None:
        """Forget ``item`` (no-op if absent); its entry is dropped lazily."""
        ticket = self._ticket_of.pop(item, None)
        if ticket is not None:
            self._items[ticket] = None

    def _restart(self) -> None:
        """Tickets from 0 again: with no item left, every entry of every lane is stale."""
        self._items = []
        self._shared = Lane()
        self._targeted.clear()
        self._all = None

    def _renumber(self) -> None:
        """Tickets 0, 1, ... for the live items, in their order: the list of items stays
        within twice their number while the queue never empties."""
        items = self._items
        new_ticket: dict[int, int] = {}
        renumbered: list[T | None] = []
        ticket_of = self._ticket_of
        for ticket, item in enumerate(items):
            if item is not None:
                new_ticket[ticket] = ticket_of[item] = len(renumbered)
                renumbered.append(item)
        self._items = renumbered
        mask = _TICKET_MASK
        self._shared = _relabelled(self._shared, new_ticket, mask)
        for target, lane in self._targeted.items():
            self._targeted[target] = _relabelled(lane, new_ticket, mask)
        self._all = None  # (rebuilt from the targeted lanes at the next steal)

    def forget_target(self, target: Hashable) -> None:
        """Move tasks targeted at ``target`` (a lost worker) to the shared lane."""
        lane = self._targeted.pop(target, None)
        if lane is None:
            return
        items = self._items
        for entry in lane:
            if items[entry & _TICKET_MASK] is not None:
                self._shared.push(entry)

    def pop_for(self, worker: Hashable, steal: bool = True) -> T | None:
        """The best item for ``worker``: its own or shared work, else (``steal``) another's."""
        lane = self._lane_for(worker, steal)
        if lane is None:
            return None
        ticket = lane.pop() & _TICKET_MASK
        items = self._items
        item = items[ticket]
        items[ticket] = None
        del self._ticket_of[item]  # type: ignore[arg-type]  # (live: not None)
        return item

    def peek_for(self, worker: Hashable, steal: bool = True) -> T | None:
        """What ``pop_for(worker, steal)`` would return, left in the queue."""
        lane = self._lane_for(worker, steal)  # (whose front is live: not empty)
        return None if lane is None else self._items[-lane.chunks[-1][-1] & _TICKET_MASK]

    def _lane_for(self, worker: Hashable, steal: bool = True) -> Lane | None:
        """The lane whose live front is the best item for ``worker``, if any."""
        own = self._targeted.get(worker)
        own_top = self._front(own) if own is not None else None
        shared_top = self._front(self._shared)
        if own_top is not None and (shared_top is None or own_top < shared_top):
            return own
        if shared_top is not None:
            return self._shared
        return self._lane_to_steal_from() if steal else None

    def _lane_to_steal_from(self) -> Lane | None:
        """The lane of every targeted entry, if any is live (own and shared are empty)."""
        steal = self._all
        if steal is None:
            if not self._targeted:
                return None
            steal = self._compact_steal_lane()
        if self._front(steal) is not None:
            return steal
        self._all = None  # nothing left to steal: stop keeping it
        return None

    def _compact_steal_lane(self) -> Lane:
        """(Re)build the steal lane from the live targeted entries."""
        items = self._items
        live = Lane()
        lanes = self._targeted.values() if self._all is None else (self._all,)
        for lane in lanes:
            for entry in lane:
                if items[entry & _TICKET_MASK] is not None:
                    live.push(entry)
        self._all = live
        return live

    def _front(self, lane: Lane) -> int | None:
        """The live front entry of ``lane``, discarding stale ones."""
        items = self._items
        while lane.size:
            entry = -lane.chunks[-1][-1]
            if items[entry & _TICKET_MASK] is not None:
                return entry
            lane.pop()
        return None


def _relabelled(lane: Lane, new_ticket: dict[int, int], mask: int) -> Lane:
    """``lane``'s live entries (those ``new_ticket`` maps) with their new tickets."""
    fresh = Lane()
    for entry in lane:
        ticket = new_ticket.get(entry & mask)
        if ticket is not None:
            fresh.push(entry & ~mask | ticket)
    return fresh
