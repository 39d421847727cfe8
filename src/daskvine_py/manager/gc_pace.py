"""The garbage collector's pace while runs go on: fewer, cheaper collections.

A run keeps a record per task alive for its whole length (hundreds of thousands of them
for a large graph), and CPython's collector walks every tracked object on each full
collection: measured on the swarm benchmark (``benchmarks/swarm.py``, 57,146 tasks), the
default thresholds cost the manager's process about a third of its CPU per task in
collections that found almost nothing (the records die with their run, by reference
counting). While at least one ``get`` is running, the first threshold (allocations
between young collections) is raised to ``YOUNG`` and the others so that full collections
are rare; when the last run ends, the thresholds the process had are put back.

Thresholds already higher are kept, and a process that turned the collector off keeps it
off: the user's settings win over ours. Cyclic garbage is still collected during a run,
only in larger batches.
"""

from __future__ import annotations

import gc
import threading

#: Allocations between young collections while a run goes on (CPython's default: 700).
YOUNG = 50_000
#: Young collections per middle one, and middle ones per full one (defaults: 10 and 10).
MIDDLE = 20
OLD = 100

_lock = threading.Lock()
_active = 0
_saved: tuple[int, int, int] | None = None


def run_started() -> None:
    """A run began: pace the collector for runs, if none was running."""
    global _active, _saved
    with _lock:
        _active += 1
        if _active > 1 or not gc.isenabled():
            return
        _saved = gc.get_threshold()
        young, middle, old = _saved
        if young == 0:  # (0: collections are off)
            _saved = None
            return
        gc.set_threshold(max(young, YOUNG), max(middle, MIDDLE), max(old, OLD))


def run_ended() -> None:
    """A run ended: the process's own thresholds again once none is running."""
    global _active, _saved
    with _lock:
        _active = max(0, _active - 1)
        if _active or _saved is None:
            return
        if gc.get_threshold() == (
            max(_saved[0], YOUNG),
            max(_saved[1], MIDDLE),
            max(_saved[2], OLD),
        ):
            gc.set_threshold(*_saved)  # (unless someone set their own since)
        _saved = None
