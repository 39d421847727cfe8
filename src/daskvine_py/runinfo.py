"""What is known about one ``get`` call after it ended: ``Manager.last_run``.

Filled by the manager's I/O thread while the run goes on and handed to the caller when it
ends. It is the source of the performance report and of the accounting of bytes moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The name the manager goes by in ``RunInfo.transfers``.
MANAGER = "manager"


@dataclass
class RunInfo:
    """One run: its options, its size, its outcome, and the bytes it moved."""

    run_id: int
    #: the options of the ``get`` call (``RunOptions`` as a dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: tasks in the plan after culling and rewriting
    tasks: int = 0
    #: ``time.time()`` when ``get`` was called and when it returned
    started: float = 0.0
    finished: float = 0.0
    #: "done", "failed" or "cancelled"
    outcome: str = ""
    #: bytes moved per (source, destination) worker name; ``MANAGER`` names the manager
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)
    #: top-level modules the run's functions come from or use (third-party only): what
    #: ``import_modules`` could import once per library instead of once per task
    hoisting_candidates: list[str] = field(default_factory=list)
    #: the run's ``events.EventLog`` when it kept one (``report=`` or ``event_log=``)
    events: Any = field(default=None, repr=False)

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)
