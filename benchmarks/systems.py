"""The systems ``harness.py`` compares: daskvine_py and its peers, each started once.

A system is a context manager yielding a ``Running``: a name, a Dask ``get`` and the cores
its tasks run on. It is started (and warmed up with one tiny graph) on entry and fully
stopped on exit, also when the body raised or the user pressed Ctrl-C, so no worker
process outlives it.

- ``daskvine_py``: a ``Manager`` with ``workers`` local one-core workers; the queue of each
  worker sized from measured durations (EMA), or ``daskvine_py[prefetch=K]``: a fixed ``K``
  extra tasks per core (``Manager(fixed_extra_tasks_per_core=K)``), or with what watching
  a run costs: ``daskvine_py[progress]`` draws a progress bar on every call
  (``get(..., progress=True)``), ``daskvine_py[event-log]`` records and writes each run's
  event log (``get(..., event_log=...)``, into a temporary directory), or
  ``daskvine_py[insecure]``: ``Manager(security=False)``, no CurveZMQ, to measure what
  security costs (the default ``daskvine_py`` has it on, as users get it), or
  ``daskvine_py[cache]``: ``get(..., cache=True)`` with the cache emptied before every run,
  to measure what hashing every task costs a first run, or ``daskvine_py[verify=F]``:
  ``get(..., verify=F)``, that share of the tasks re-run on another worker and compared.
- ``distributed``: ``LocalCluster(n_workers=workers, threads_per_worker=1, processes=True)``.
- ``sync``, ``threads``, ``processes``: Dask's synchronous, threaded and multiprocessing
  schedulers, the last two with ``workers`` threads or spawned processes (a pool kept warm).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workloads import inc

SYSTEMS = ("daskvine_py", "distributed", "sync", "threads", "processes")
#: Variants of daskvine_py that watch every run (see the module docstring).
WATCHING = ("progress", "event-log")
#: daskvine_py without CurveZMQ: what security costs.
INSECURE = "daskvine_py[insecure]"
#: daskvine_py with the result cache on (``get(cache=True)``), emptied before every run: what
#: hashing every task costs a first run.
CACHE = "daskvine_py[cache]"


@dataclass
class Running:
    """A started system."""

    name: str
    get: Callable[..., Any]
    #: cores its tasks run on, for efficiency
    cores: int
    #: seconds it took to start (and warm up)
    startup: float = 0.0
    #: the daskvine_py ``Manager``, for the harness's probes
    manager: Any = None
    #: waits (untimed) until the previous run is forgotten, before the next one
    settle: Callable[[], None] = lambda: None


def parse(name: str) -> tuple[str, int | None]:
    """``"daskvine_py[prefetch=4]"`` -> ``("daskvine_py", 4)``; other names unchanged."""
    match = re.fullmatch(r"daskvine_py\[prefetch=(\d+)\]", name)
    if match:
        return "daskvine_py", int(match.group(1))
    if verify_share(name) is not None:
        return "daskvine_py", None
    if name in (watching_name(w) for w in WATCHING) or name in (INSECURE, CACHE):
        return "daskvine_py", None
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
    return name, None


def verify_share(name: str) -> float | None:
    """``"daskvine_py[verify=0.05]"`` -> 0.05; None for any other name."""
    match = re.fullmatch(r"daskvine_py\[verify=([0-9.]+)\]", name)
    return float(match.group(1)) if match else None


def prefetch_name(extra: int) -> str:
    return f"daskvine_py[prefetch={extra}]"


def watching_name(what: str) -> str:
    return f"daskvine_py[{what}]"


@contextlib.contextmanager
def start(name: str, workers: int, start_timeout: float = 300.0) -> Iterator[Running]:
    """Start system ``name`` with ``workers`` one-core workers; stop it on exit."""
    kind, prefetch = parse(name)
    begun = time.perf_counter()
    before = descendants()
    stack = contextlib.ExitStack()
    try:
        starter = _STARTERS[kind]
        if name == INSECURE:
            starter = functools.partial(_daskvine, security=False)
        running = stack.enter_context(starter(workers, prefetch, start_timeout))
        running.name = name
        if name == watching_name("progress"):
            running.get = functools.partial(running.get, progress=True)
        elif verify_share(name) is not None:
            running.get = functools.partial(running.get, verify=verify_share(name))
        elif name == CACHE:
            running.get = functools.partial(running.get, cache=True)
            running.settle = running.manager.cache.clear  # every timed run is a first run
        elif name == watching_name("event-log"):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="daskvine-log-"))
            log = os.path.join(folder, "run.jsonl")
            running.get = functools.partial(running.get, event_log=log)
        # A few tasks per worker: every process has started and imported the functions.
        warm_up = {("warm-up", i): (inc, i) for i in range(4 * workers)}
        got = running.get(warm_up, list(warm_up))
        if list(got) != [i + 1 for i in range(4 * workers)]:
            raise AssertionError(f"{name} computed {got!r} while warming up")
        running.settle()
        running.startup = time.perf_counter() - begun
        yield running
    finally:
        with sigint_ignored():  # a second Ctrl-C must not leave workers half-stopped
            started = {
                pid: t
                for pid, t in descendants().items()
                if pid not in before and not _is_our_resource_tracker(pid)
            }
            try:
                stack.close()
            finally:
                left = reap(started)
                if left:
                    print(f"{name} left processes {left} behind; killed them", file=sys.stderr)


def descendants(root: int | None = None) -> dict[int, str]:
    """Every live process below ``root`` (this one): pid -> its start time, from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # After the command name: state, ppid, ..., starttime is the 20th.
        children.setdefault(int(fields[1]), []).append(int(entry))
        started[int(entry)] = fields[19]
    found: dict[int, str] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found[pid] = started[pid]
        stack.extend(children.get(pid, []))
    return found


def _is_our_resource_tracker(pid: int) -> bool:
    """multiprocessing's helper of this process: it lives as long as we do, by design."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return parent == os.getpid() and b"multiprocessing.resource_tracker" in command


def _alive(pid: int, started: str) -> bool:
    """``pid`` still runs the process that started at ``started`` (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def reap(processes: dict[int, str], grace: float = 10.0) -> list[int]:
    """Wait up to ``grace`` s for ``processes`` to end, then kill the rest; return those."""
    deadline = time.monotonic() + grace
    alive = [pid for pid, started in processes.items() if _alive(pid, started)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _alive(pid, processes[pid])]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C in the block (main thread only), for cleanup that must finish."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _daskvine(
    workers: int, prefetch: int | None, start_timeout: float, security: bool = True
) -> Iterator[Running]:
    from daskvine_py import Manager

    settings: dict[str, Any] = {"security": security}
    if prefetch is not None:
        settings["fixed_extra_tasks_per_core"] = prefetch
    with Manager(**settings) as manager:
        manager.start_workers(workers, cores=1, timeout=start_timeout)
        yield Running("daskvine_py", manager.get, workers, manager=manager)


@contextlib.contextmanager
def _distributed(workers: int, prefetch: int | None, start_timeout: float) -> Iterator[Running]:
    from distributed import Client, LocalCluster

    # Its per-graph size warnings and worker chatter would drown the table.
    warnings.filterwarnings("ignore", module="distributed")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
            timeout=start_timeout,
        ) as cluster,
        Client(cluster, timeout=start_timeout) as client,
    ):
        client.wait_for_workers(workers, timeout=start_timeout)

        def settle() -> None:
            # The client releases a run's keys asynchronously: a run that comes too soon
            # with the same keys (every repeat of a workload) gets stale results for free.
            deadline = time.monotonic() + 30.0
            while client.run_on_scheduler(_scheduler_tasks) and time.monotonic() < deadline:
                time.sleep(0.005)

        yield Running("distributed", client.get, workers, settle=settle)


def _scheduler_tasks(dask_scheduler: Any) -> int:
    return len(dask_scheduler.tasks)


@contextlib.contextmanager
def _sync(workers: int, prefetch: int | None, start_timeout: float) -> Iterator[Running]:
    from dask.local import get_sync

    # One thread runs every task, but efficiency counts the same cores for every system.
    yield Running("sync", get_sync, workers)


@contextlib.contextmanager
def _threads(workers: int, prefetch: int | None, start_timeout: float) -> Iterator[Running]:
    import dask.threaded

    yield Running("threads", functools.partial(dask.threaded.get, num_workers=workers), workers)


@contextlib.contextmanager
def _processes(workers: int, prefetch: int | None, start_timeout: float) -> Iterator[Running]:
    import multiprocessing

    import dask.multiprocessing

    # A pool of our own, kept across runs: Dask's default starts one per call.
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        get = functools.partial(dask.multiprocessing.get, pool=pool, num_workers=workers)
        yield Running("processes", get, workers)
    finally:
        pool.terminate()  # kills its processes even if a task hangs
        pool.join()


_STARTERS: dict[str, Callable[[int, int | None, float], contextlib.AbstractContextManager]] = {
    "daskvine_py": _daskvine,
    "distributed": _distributed,
    "sync": _sync,
    "threads": _threads,
    "processes": _processes,
}


class FirstDispatch:
    """When a daskvine_py manager first sent a task to a worker, seen from outside.

    Every batch to a worker leaves through one method of the manager's I/O loop,
    ``manager._io._send_now(ident, messages)``, on the I/O thread (``manager/loop.py``).
    The probe wraps it in an instance attribute, without changing the package: the first
    batch holding an ``Execute`` after ``reset`` stamps ``first``. No public hook says when
    a task left without watching the run (callbacks and event logs do, at a cost per task
    that would be measured too), so this reaches into a private: should it move, the probe
    fails at once (``biggraph.py --smoke`` runs it) rather than report nothing.
    """

    def __init__(self, manager: Any) -> None:
        from daskvine_py.wire.protocol import Execute

        loop = getattr(manager, "_io", None)
        send = getattr(loop, "_send_now", None)
        if send is None:
            raise AttributeError(
                "FirstDispatch: the manager's I/O loop has no _send_now any more; "
                "find where batches to workers are sent now (manager/loop.py)"
            )
        self._execute = Execute
        self._send_now = send
        self.first: float | None = None
        loop._send_now = self._wrapped

    def reset(self) -> None:
        self.first = None

    def _wrapped(self, ident: bytes, messages: list) -> bool:
        if self.first is None and any(type(m) is self._execute for m in messages):
            self.first = time.perf_counter()
        return self._send_now(ident, messages)
