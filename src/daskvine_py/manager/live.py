"""A running manager's live snapshot: what ``Manager.live()``, ``Manager.metrics()`` and
``python -m daskvine_py status`` show (docs/live.md).

``LiveView`` lives in the manager's I/O thread and builds the snapshot there, from what the
loop keeps anyway: the registry's workers and their last heartbeats, the scheduler state's
``waiting()``, ``load()`` and ``worker_loads()``, its runs' categories, and the bytes
``Watching`` counted. It is built only when asked (a caller's ``Snapshot`` command, a
status client's ``LiveRequest``), at most once a second (a run ending makes the next one
fresh), and costs a walk over workers, runs and categories: nothing per task, no walk
while nobody asks (a run that ends adds its categories to the totals). The snapshot is plain data
(dicts, lists, text and numbers) that travels as msgpack and prints as JSON.

The manager-life totals (``tasks_done``, ``tasks_failed``, ``categories``) add the runs that
ended to the runs in progress. A run's figures count once it ends, from what the state
summed; a cancelled run's only if a snapshot saw it in progress (what it held then).
"""

from __future__ import annotations

import copy
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from daskvine_py.manager.registry import Registry
from daskvine_py.manager.watching import Run, Watching
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.categories import Category
from daskvine_py.scheduler.liveness import Liveness

#: The shortest time between two snapshots: a request sooner gets the last one.
MIN_INTERVAL = 1.0

#: What each category shows (``Category``'s own fields by these names).
CATEGORY_FIELDS = (
    "tasks",
    "failed",
    "wall_s",
    "cpu_s",
    "peak_memory_mb",
    "allocated_memory_mb",
    "exhausted",
    "input_bytes",
    "output_bytes",
    "file_bytes_from_storage",
    "file_bytes_from_cache",
    "file_bytes_from_peers",
)


#: Failed runs the dashboard lists, the most recent.
MAX_FAILURES = 50


class Snapshot(NamedTuple):
    """The command a caller's ``Manager.live()`` queues (``commands``): the I/O thread
    puts the snapshot in ``reply`` and sets ``done``. A dashboard's (``dashboard``) gets
    more: see ``LiveView.dashboard``."""

    reply: list[dict[str, Any]]
    done: threading.Event
    dashboard: bool = False


class LiveView:
    """The snapshot's source in the I/O thread; see the module docstring."""

    def __init__(
        self, state: s.SchedulerState, registry: Registry, watching: Watching, liveness: Liveness
    ) -> None:
        self._state = state
        self._registry = registry
        self._watching = watching
        self._liveness = liveness
        self._started = time.monotonic()
        self._built_at = -math.inf
        self._last: dict[str, Any] = {}
        #: totals of the runs that ended
        self._done = 0
        self._failed = 0
        self._ended: dict[str, Category] = {}
        #: the state's categories of each run the last snapshot saw in progress (the same
        #: objects: a cancelled run's keep what it did)
        self._seen: dict[int, Mapping[str, Category]] = {}
        #: the failed runs, most recent last (a dashboard's "failures")
        self._failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        registry.live = self.snapshot
        watching.settled = self._settled

    def answer(self, command: Snapshot) -> None:
        command.reply.append(self.dashboard() if command.dashboard else self.snapshot())
        command.done.set()

    def dashboard(self) -> dict[str, Any]:
        """What a dashboard's page needs besides the snapshot (``live``), all handed over
        (the I/O thread keeps no reference but to the snapshot, which nobody changes):
        the heartbeats heard since its last request (``beats``; the first request starts
        keeping them), the bytes moved per pair since the start (``transfers``) and the
        failed runs (``failures``). Per heartbeat an append; nothing per task."""
        beats = self._watching.beats
        self._watching.beats = []
        return {
            "live": self.snapshot(),
            "beats": beats or [],
            "transfers": dict(self._watching.transfers),
            "failures": list(self._failures),
        }

    def snapshot(self) -> dict[str, Any]:
        """The snapshot, built now unless the last one is under ``MIN_INTERVAL`` old."""
        now = time.monotonic()
        if now - self._built_at >= MIN_INTERVAL:
            self._last = self._build(now)
            self._built_at = now
        return self._last

    def _settled(self, run: Run) -> None:
        """A run ended: its figures join the manager-life totals."""
        seen = self._seen.pop(run.id, None)
        self._tally(run.info.categories or seen or {})
        if run.failure is not None:
            self._failures.append(_failure(run))
        self._built_at = -math.inf  # the next request sees it ended

    def _tally(self, categories: Mapping[str, Category]) -> None:
        for name, category in categories.items():
            self._done += category.tasks
            self._failed += category.failed
            _add(self._ended.setdefault(name, Category()), category)

    def _build(self, now: float) -> dict[str, Any]:
        in_progress = self._watching.runs  # the callers' (the state may still hold ended ones)
        for run_id in [run_id for run_id in self._seen if run_id not in in_progress]:
            self._tally(self._seen.pop(run_id))  # cancelled: it never settled
        categories = {name: _copy(category) for name, category in self._ended.items()}
        done, failed = self._done, self._failed
        runs = []
        state_runs = self._state.runs
        for run_id, run in in_progress.items():
            record = state_runs.get(run_id)
            if record is None:
                continue  # submitted, not handled yet
            self._seen[run_id] = record.categories
            run_done = run_failed = 0
            progress = {
                name: {"planned": n, "done": 0, "failed": 0}
                for name, n in dict(run.planned).items()
            }
            for name, category in record.categories.items():
                run_done += category.tasks
                run_failed += category.failed
                _add(categories.setdefault(name, Category()), category)
                counts = progress.setdefault(name, {"planned": 0, "done": 0, "failed": 0})
                counts["done"], counts["failed"] = category.tasks, category.failed
            done += run_done
            failed += run_failed
            runs.append(
                {
                    "id": run_id,
                    "tasks": run.info.tasks,
                    "done": run_done,
                    "failed": run_failed,
                    "started": run.info.started,
                    "categories": progress,
                }
            )
        workers = self._workers(now)
        ready, processing, running = self._state.load()
        cpu = os.times()
        return {
            "t": time.time(),
            "manager": {"cpu_s": cpu.user + cpu.system, "uptime_s": now - self._started},
            "totals": {
                "workers": len(workers),
                "cores": sum(w["cores"] for w in workers),
                "waiting": self._state.waiting(),
                "ready": ready,
                "processing": processing,
                "running": running,
                "tasks_done": done,
                "tasks_failed": failed,
                "bytes_moved": self._watching.moved,
                "stored_bytes": sum(w["stored_bytes"] for w in workers),
                "spilled_bytes": sum(w["spilled_bytes"] for w in workers),
            },
            "runs": runs,
            "categories": {
                name: {field: getattr(category, field) for field in CATEGORY_FIELDS}
                for name, category in categories.items()
            },
            "workers": workers,
        }

    def _workers(self, now: float) -> list[dict[str, Any]]:
        loads = self._state.worker_loads()
        workers = []
        for ident, info in self._registry.workers.items():
            status = info.status
            heard = self._liveness.last_heard(ident)
            workers.append(
                {
                    "name": info.name,
                    "hostname": info.hostname,
                    "cores": info.cores,
                    "gpus": info.gpus,
                    "tasks": loads.get(ident, (0, 0))[1],
                    "memory": info.memory,
                    "resident": status.resident,
                    "stored_bytes": status.stored_bytes,
                    "spilled_bytes": status.spilled_bytes,
                    "last_heard_s": 0.0 if heard is None else max(0.0, now - heard),
                    "quarantined": info.quarantined or "",
                }
            )
        return workers


def ask(
    command: Callable[[Snapshot], None], raise_if_dead: Callable[[], None], timeout: float
) -> dict[str, Any]:
    """The snapshot, asked of the I/O thread with ``command`` (``Manager.live``): a copy,
    the caller's to change; ``TimeoutError`` after ``timeout`` seconds without it."""
    return copy.deepcopy(_answer(_request(command, False), raise_if_dead, timeout))


def _failure(run: Run) -> dict[str, Any]:
    """A failed run as the dashboard lists it: its key, worker and message with the
    task's traceback (a ``RunFailed``), or the manager's own error."""
    failure = run.failure
    t = time.time()
    if type(failure) is s.RunFailed:
        short = failure.type_name.rpartition(".")[2]
        text = failure.message  # (it names the exception's type, mostly)
        if not short or not text.startswith(short):
            text = f"{failure.type_name or 'error'}: {text}"
        if failure.traceback:
            text += "\n" + failure.traceback
        kind = "crashed" if failure.crashed else "erred"
        return {
            "t": t,
            "run": run.id,
            "kind": kind,
            "key": failure.key,
            "worker": failure.worker,
            "message": text,
        }
    return {
        "t": t,
        "run": run.id,
        "kind": "erred",
        "key": None,
        "worker": "",
        "message": f"{type(failure).__name__}: {failure}",
    }


def request_dashboard(command: Callable[[Snapshot], None]) -> Snapshot:
    """Ask the I/O thread for ``LiveView.dashboard``'s answer with ``command``, without
    waiting: it is in the request's ``reply`` once its ``done`` is set (not a copy: read
    it, do not change it)."""
    return _request(command, True)


def ask_dashboard(
    command: Callable[[Snapshot], None], raise_if_dead: Callable[[], None], timeout: float
) -> dict[str, Any]:
    """``request_dashboard``, waited for."""
    return _answer(_request(command, True), raise_if_dead, timeout)


def _request(command: Callable[[Snapshot], None], dashboard: bool) -> Snapshot:
    request = Snapshot([], threading.Event(), dashboard)
    command(request)
    return request


def _answer(request: Snapshot, raise_if_dead: Callable[[], None], timeout: float) -> dict[str, Any]:
    """The request's answer once the I/O thread gave it; the loop's own error if it died
    meanwhile, ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not request.done.wait(0.1):
        raise_if_dead()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the manager's I/O thread did not answer in {timeout:g} s")
    return request.reply[0]


def _add(into: Category, other: Category) -> None:
    """``other``'s figures added to ``into``'s (peaks and allotments: the larger)."""
    into.tasks += other.tasks
    into.failed += other.failed
    into.wall_s += other.wall_s
    into.cpu_s += other.cpu_s
    into.exhausted += other.exhausted
    into.input_bytes += other.input_bytes
    into.output_bytes += other.output_bytes
    into.file_bytes_from_storage += other.file_bytes_from_storage
    into.file_bytes_from_cache += other.file_bytes_from_cache
    into.file_bytes_from_peers += other.file_bytes_from_peers
    into.peak_memory_mb = max(into.peak_memory_mb, other.peak_memory_mb)
    into.allocated_memory_mb = max(into.allocated_memory_mb, other.allocated_memory_mb)


def _copy(category: Category) -> Category:
    copy = Category()
    _add(copy, category)
    return copy
