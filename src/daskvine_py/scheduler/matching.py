"""The ready-task structure: priorities, locality targets and soft targeting.

Ready tasks wait in one lane for tasks that may run anywhere and one lane per worker for
tasks that should run where their inputs are. A worker asking for work takes the best of
its own lane and the shared lane; if both are empty it takes the best task targeted at
another worker (soft targeting), so no worker idles while work is queued. Targeted tasks
are also in one more lane of all of them, so that taking one is O(1) however many workers
there are. Removal is lazy:
each push stamps the item with a fresh ticket, and entries whose ticket is stale are
skipped when they reach the front.

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
from itertools import count
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

#: Bits of an entry that hold the ticket: 2^40 pushes before tickets would reach the
#: priority bits.
TICKET_BITS = 40
_TICKET_MASK = (1 << TICKET_BITS) - 1
#: Entries per chunk of a lane (split at twice this). Larger chunks mean fewer bounds to
#: search but longer insertions; around a thousand both stay well under a microsecond.
CHUNK = 1000


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

    __slots__ = ("_shared", "_targeted", "_all", "_ticket_of", "_item_of", "_tickets")

    def __init__(self) -> None:
        self._shared = Lane()
        self._targeted: dict[Hashable, Lane] = {}
        #: every targeted entry once more, for stealing: a worker with no work of its own
        #: takes the front here in O(1) instead of comparing the fronts of every worker's
        #: lane. Built at the first steal and dropped once empty, so that runs that never
        #: steal do not push twice.
        self._all: Lane | None = None
        self._ticket_of: dict[T, int] = {}  #: live items and their current ticket
        self._item_of: dict[int, T] = {}  #: the same, the other way round
        self._tickets = count()

    def __len__(self) -> int:
        return len(self._ticket_of)

    def shrink(self) -> None:
        """Free what an empty queue's tables still hold of their largest size."""
        if not self._ticket_of:
            self._ticket_of.clear()
            self._item_of.clear()

    def __contains__(self, item: T) -> bool:
        return item in self._ticket_of

    def push(self, item: T, priority: int, target: Hashable | None = None) -> None:
        """Queue ``item``; a lower ``priority`` (an int >= 0) pops first; equal ones in push
        order. Re-pushing replaces the old entry."""
        ticket = next(self._tickets)
        old = self._ticket_of.get(item)
        if old is not None:
            del self._item_of[old]
        self._ticket_of[item] = ticket
        self._item_of[ticket] = item
        entry = priority << TICKET_BITS | ticket
        if target is None:
            self._shared.push(entry)
            return
        lane = self._targeted.get(target)
        if lane is None:
            lane = self._targeted[target] = Lane()
        lane.push(entry)
        steal = self._all
        if steal is not None:
            steal.push(entry)
            if steal.size > 2 * len(self._item_of) + 4096:
                self._compact_steal_lane()

    def remove(self, item: T) -> None:
        """Forget ``item`` (no-op if absent); its entry is dropped lazily."""
        ticket = self._ticket_of.pop(item, None)
        if ticket is not None:
            del self._item_of[ticket]

    def forget_target(self, target: Hashable) -> None:
        """Move tasks targeted at ``target`` (a lost worker) to the shared lane."""
        lane = self._targeted.pop(target, None)
        if lane is None:
            return
        item_of = self._item_of
        for entry in lane:
            if entry & _TICKET_MASK in item_of:
                self._shared.push(entry)

    def pop_for(self, worker: Hashable, steal: bool = True) -> T | None:
        """The best item for ``worker``: its own or shared work, else (``steal``) another's."""
        lane = self._lane_for(worker, steal)
        if lane is None:
            return None
        item = self._item_of.pop(lane.pop() & _TICKET_MASK)
        del self._ticket_of[item]
        return item

    def peek_for(self, worker: Hashable, steal: bool = True) -> T | None:
        """What ``pop_for(worker, steal)`` would return, left in the queue."""
        lane = self._lane_for(worker, steal)  # (whose front is live: not empty)
        return None if lane is None else self._item_of[-lane.chunks[-1][-1] & _TICKET_MASK]

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
        item_of = self._item_of
        live = Lane()
        lanes = self._targeted.values() if self._all is None else (self._all,)
        for lane in lanes:
            for entry in lane:
                if entry & _TICKET_MASK in item_of:
                    live.push(entry)
        self._all = live
        return live

    def _front(self, lane: Lane) -> int | None:
        """The live front entry of ``lane``, discarding stale ones."""
        item_of = self._item_of
        while lane.size:
            entry = -lane.chunks[-1][-1]
            if entry & _TICKET_MASK in item_of:
                return entry
            lane.pop()
        return None
