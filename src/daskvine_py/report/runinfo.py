"""What is known about one ``get`` call after it ended: ``Manager.last_run``.

Filled by the manager's I/O thread while the run goes on and handed to the caller when it
ends. It is the source of the performance report and of the accounting of bytes moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daskvine_py.scheduler.categories import Category

#: The name the manager goes by in ``RunInfo.transfers``.
MANAGER = "manager"


@dataclass
class RunInfo:
    """One run: its options, its size, its outcome, the bytes it moved, and the time its
    tasks spent running and (de)serializing."""

    run_id: int
    #: the options of the ``get`` call (``RunOptions`` as a dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: tasks in the plan after culling, rewriting and fusing chains (a chain is one task)
    tasks: int = 0
    #: ``time.time()`` when ``get`` was called and when it returned
    started: float = 0.0
    finished: float = 0.0
    #: "done", "failed" or "cancelled"
    outcome: str = ""
    #: bytes moved per (source, destination) worker name; ``MANAGER`` names the manager
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)
    #: [holder, reader, bytes] for results that went through the manager because the
    #: reader could not reach the holder (both legs are in ``transfers`` too)
    relayed: list[list[Any]] = field(default_factory=list)
    #: seconds the run's tasks ran (their functions' calls), summed over the tasks that
    #: finished (a task run twice counts twice), and seconds their library processes spent
    #: unpickling their inputs and pickling their results besides (not in ``run_seconds``;
    #: inputs and results that stayed live cost none); 0 for a cancelled run and for one
    #: the manager failed itself (``SchedulerError``)
    run_seconds: float = 0.0
    serialization_seconds: float = 0.0
    #: what the tasks that finished took, by category (their keys' prefix, dask's
    #: ``key_split``): ``tasks``, ``wall_s``, ``cpu_s``, ``peak_memory_mb`` (MiB, a float:
    #: the most one task grew its process above its size as the task began; a small task's
    #: is often 0 or a fraction), ``allocated_memory_mb`` and ``exhausted`` (0: no
    #: allocations yet), ``input_bytes`` and ``output_bytes`` (results read and made),
    #: ``failed`` (tasks that raised or crashed), and ``file_bytes_from_storage``,
    #: ``_from_cache`` and ``_from_peers`` (the remote files obtained through the nodes'
    #: input cache, ``cache_inputs``); empty like ``run_seconds``. The event
    #: log's "categories" record and the report's table are these figures
    categories: dict[str, Category] = field(default_factory=dict)
    #: tasks whose result matched, byte for byte, a re-run's on another worker
    #: (``get(..., verify=f)``)
    verified: int = 0
    #: top-level modules the run's functions come from or use (third-party only): what
    #: ``import_modules`` could import once per library instead of once per task
    hoisting_candidates: list[str] = field(default_factory=list)
    #: the result cache's numbers for a run with ``cache=True``: ``hits`` (cacheable tasks
    #: that did not run: their result, or that of every task reading them, was reused),
    #: ``misses`` (cacheable tasks that ran), ``uncached`` (tasks without a cache key),
    #: ``tasks_run``, ``bytes_reused`` and ``seconds_saved`` (what the reused tasks took
    #: when they ran); None without the cache
    cache: dict[str, Any] | None = None
    #: the run's ``events.EventLog`` when it kept one (``report=`` or ``event_log=``)
    events: Any = field(default=None, repr=False)

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)

    @property
    def serialization_share(self) -> float:
        """Serialization's share of the time the run's tasks held library processes
        (``serialization_seconds / (run_seconds + serialization_seconds)``; 0 if none)."""
        busy = self.run_seconds + self.serialization_seconds
        return self.serialization_seconds / busy if busy > 0 else 0.0
