"""The public ``Manager``: a ZeroMQ ROUTER, one I/O thread, and Dask's ``get``.

Data flow::

    caller threads            I/O thread (one loop)                     workers
    ──────────────            ─────────────────────                     ───────
    get(dsk, keys)
      build_plan, pickle ──► commands + waker pipe ─┐
                                                    ▼
                                  poll(ROUTER, waker) ─► decode, check ◄── batches
                                                    │
                                                    ▼
                              SchedulerState.handle(events) ─► instructions
                                                    │
                    ┌── RunOutput/RunDone/RunFailed ┴─ Send ─► outbox per worker
                    ▼                                          flushed once per loop ──►
    _Run (values, event) ─► unpickle outputs, pack, return

- Callers never touch sockets or the scheduler state: they queue commands and wait on
  their run. Results are unpickled in the caller's thread, so dispatch goes on meanwhile.
- The loop drains every readable message, feeds the whole batch to the state, and sends
  one multipart message per worker per iteration: batching by loop iteration, no sleeps.
- Timers (heartbeats, silent workers, local worker processes that died) run on the
  loop's own clock, ``time.monotonic``.
- Watching a run costs nothing unless the call asks for it: a run with a progress bar,
  a report or an event log is "watched", and only then does the loop count its finished
  tasks (read by the waiting caller ten times a second) and, for a report or event log,
  append its task, worker and sample events to an ``events.EventLog``.
- Bytes moved are counted per (source, destination) name: workers report what they
  fetched from peers (``Transfers``), and outputs count from their worker to ``MANAGER``.
- Every run ends. Each step of the loop is guarded: an exception fails the runs it
  concerns (``SchedulerError``, the exception as its cause) and the loop goes on; one
  that concerns no run is logged and dropped. A malformed record from a worker fails the
  runs of the tasks it names (``state.BadReport``); the good records beside it count.
  Should the thread die all the same, every waiting and later ``get`` raises
  ``ManagerDied`` at once.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import logging
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from queue import SimpleQueue
from typing import Any

import zmq
from dask.utils import key_split

from . import protocol as p
from . import security
from . import state as s
from .errors import (
    ManagerDied,
    ProtocolError,
    RunCancelled,
    SchedulerError,
    SerializationError,
    TaskFailed,
    VersionMismatch,
    attach_remote_traceback,
)
from .events import EventLog, summary_records, write_events
from .graph import Plan, build_plan, pack_results
from .launch import spawn
from .options import ManagerOptions, RunOptions
from .progress import default_enabled, wait_with_progress
from .report import write_report
from .rewrite import rewrite_reductions
from .runinfo import MANAGER, RunInfo
from .serialize import TaskEncoder, loads
from .transport import has_more, send_batch

logger = logging.getLogger("daskvine_py.manager")

#: Messages drained from the ROUTER per loop iteration, so timers and commands still run
#: under a flood.
DRAIN_LIMIT = 10_000
#: Tasks per part when a graph is submitted: the workers start on the first part while
#: the caller's thread prepares the next. Smaller starts sooner; larger wakes the I/O
#: thread less often.
SUBMIT_PART = 4096
#: Seconds between timer checks (silent workers, dead local processes, heartbeats).
TIMER_PERIOD = 0.1
#: Samples of task counts in an event log: every 5 ms at first, then spaced to keep about
#: this many per run length (a few thousand for an hour), so short and long runs both
#: draw a smooth tasks-over-time chart from a small log.
SAMPLES_PER_RUN = 1000
#: Worker reports the scheduler state takes (``state.FromWorker``).
_STATE_REPORTS = frozenset(
    {p.TaskDone, p.TaskErred, p.TaskCrashed, p.FetchFailed, p.Replicas, p.Withdrawn, p.DiskFull}
)


class _Run:
    """What a caller of ``get`` waits on; filled by the I/O thread."""

    __slots__ = (
        "id", "values", "done", "failure", "info", "finished_tasks", "log", "next_sample",
        "transfers_before",
    )  # fmt: skip

    def __init__(self, run_id: int) -> None:
        self.id = run_id
        self.info: RunInfo  # set by ``get`` with the run's options and size
        #: the manager's transfer counts when the run started (I/O thread only)
        self.transfers_before: dict[tuple[str, str], int] = {}
        self.values: dict[Any, Any] = {}
        self.done = threading.Event()
        self.failure: s.RunFailed | BaseException | None = None
        #: tasks finished so far, counted by the I/O thread for watched runs only
        self.finished_tasks = 0
        #: the run's event log, when it keeps one, and when it takes its next sample
        self.log: EventLog | None = None
        self.next_sample = 0.0


class _WorkerInfo:
    __slots__ = (
        "name", "hostname", "cores", "memory", "pid", "last_seen", "last_sent", "status"
    )  # fmt: skip

    def __init__(self, reg: p.Register, now: float) -> None:
        self.name = reg.name
        self.hostname = reg.hostname
        self.cores = reg.cores
        self.memory = reg.memory
        self.pid = reg.pid
        self.last_seen = now
        self.last_sent = now
        self.status = p.Status(0, 0, 0)


class Manager:
    """A daskvine_py manager: workers connect to it, ``get`` runs Dask graphs on them.

    Parameters
    ----------
    host, port
        Where to listen; ``port=0`` picks a free port. See ``address``.
    heartbeat_interval, worker_timeout, max_extra_tasks_per_core
        See ``ManagerOptions``.

    Examples
    --------
    >>> with Manager() as manager:                           # doctest: +SKIP
    ...     manager.start_workers(2, cores=1)
    ...     dask.compute(x, scheduler=manager.get)
    """

    #: what killed the I/O thread, once it has died (see ``ManagerDied``)
    _io_error: BaseException | None = None

    @functools.cached_property
    def _drops(self) -> p.DropLog:
        """Warnings about dropped messages and loop errors, rate-limited (I/O thread)."""
        return p.DropLog(logger)

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **settings: Any) -> None:
        self.options = ManagerOptions(host=host, port=port, **settings)
        self._keys = _manager_keys(self.options)
        self._context = zmq.Context()
        #: the ZAP handler admitting workers (None without security)
        self._gate: security.Gate | None = None
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.setsockopt(zmq.RCVHWM, 0)
        self._router.setsockopt(zmq.LINGER, 1000)
        try:
            if self._keys is not None:
                # The gate must listen before the ROUTER binds: a CurveZMQ server with no
                # ZAP handler would admit any key.
                self._gate = security.Gate(self._context, self._keys.worker_public, "manager")
                self._gate.start()
                assert self._keys.manager_secret is not None
                security.serve(self._router, self._keys.manager_public, self._keys.manager_secret)
            if port:
                self._router.bind(f"tcp://{host}:{port}")
                bound = port
            else:
                bound = self._router.bind_to_random_port(f"tcp://{host}")
        except BaseException:
            self._close_sockets()
            raise
        self.address = f"tcp://{host}:{bound}"
        if self._keys is None and not _is_loopback(host):
            logger.warning(
                "manager listening on %s without security: anyone who can reach it can "
                "run code as this user (use security=True outside trusted benchmarks)",
                self.address,
            )
        #: the JSON file workers join with (``--connection-file``); see ``security``
        # A wildcard bind is reached at this host's name.
        reachable = self.address
        if host in ("0.0.0.0", "::", "*"):
            reachable = f"tcp://{_HOSTNAME}:{bound}"
        self.connection_file, self._cleanup_paths = _write_connection_file(
            self.options.connection_file, reachable, self._keys
        )
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._commands: SimpleQueue = SimpleQueue()
        self._state = s.SchedulerState(
            self.options.max_extra_tasks_per_core, self.options.fixed_extra_tasks_per_core
        )
        self._runs: dict[int, _Run] = {}
        #: runs with a progress bar or an event log (see the module docstring)
        self._watched: dict[int, _Run] = {}
        self._workers: dict[bytes, _WorkerInfo] = {}
        self._outboxes: dict[bytes, list[Any]] = {}
        self._events: list[Any] = []
        self._local_processes: list[subprocess.Popen] = []
        self._run_ids = itertools.count(1)
        #: bytes of every message workers sent this manager: outputs, not intermediates
        self.received_bytes = 0
        #: bytes of every message this manager sent workers: tasks, functions, control
        self.sent_bytes = 0
        #: the most recent ``get`` call that ended (see ``RunInfo``); None before any
        self.last_run: RunInfo | None = None
        #: bytes moved per (source, destination) name since the start (I/O thread writes)
        self._transfers: dict[tuple[str, str], int] = {}
        #: worker names by peer address, kept after they leave for late reports
        self._names_by_peer: dict[str, str] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="daskvine-manager", daemon=True)
        self._thread.start()
        # A manager never closed must not leave local workers behind at interpreter exit,
        # nor its keys on disk.
        weakref.finalize(self, _kill_all, self._local_processes)
        weakref.finalize(self, _remove_paths, self._cleanup_paths)

    # -- public API -------------------------------------------------------------------

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Manager {self.address} workers={len(self._workers)}>"

    @property
    def workers(self) -> dict[str, dict[str, Any]]:
        """The connected workers by name: hostname, cores, memory, pid, and from their last
        heartbeat the bytes of results they hold and their peak memory (a snapshot)."""
        return {
            info.name: {
                "hostname": info.hostname,
                "cores": info.cores,
                "memory": info.memory,
                "pid": info.pid,
                **info.status._asdict(),
            }
            for info in list(self._workers.values())
        }

    @property
    def transfers(self) -> dict[tuple[str, str], int]:
        """Bytes moved per (source, destination) worker name since the manager started;
        ``runinfo.MANAGER`` names the manager. Per run: ``last_run.transfers``."""
        return dict(self._transfers)

    def start_workers(
        self,
        n: int,
        cores: int = 1,
        wait: bool = True,
        timeout: float = 60.0,
        memory: int | None = None,
        disk: int | None = None,
        workdir: str | None = None,
        lib_resources: dict[str, int] | None = None,
    ) -> list[subprocess.Popen]:
        """Start ``n`` local worker processes of ``cores`` cores; stopped by ``close``.

        ``memory`` and ``disk`` (MB) and ``workdir`` are the worker's ``--memory``,
        ``--disk`` and ``--workdir``. ``lib_resources={"cores": c, "slots": s}``: each
        worker runs ``cores // c`` library processes of ``s`` concurrent tasks each
        (``--lib-cores``/``--lib-slots``). With ``wait``, return once all of them have
        registered (or raise ``TimeoutError``).
        """
        if self._closed:
            raise RuntimeError("the manager is closed")
        extra = _lib_resources_args(lib_resources or {})
        for flag, value in (("--memory", memory), ("--disk", disk), ("--workdir", workdir)):
            if value is not None:
                extra += [flag, str(value)]
        before = len(self._workers)
        start = len(self._local_processes)
        procs = [
            spawn(
                self.address,
                cores=cores,
                name=f"local-{start + i}",
                extra_args=extra,
                connection_file=self.connection_file,
            )
            for i in range(n)
        ]
        self._local_processes.extend(procs)
        if wait:
            self.wait_for_workers(before + n, timeout=timeout, processes=procs)
        return procs

    def wait_for_workers(
        self, n: int, timeout: float = 60.0, processes: list[subprocess.Popen] | None = None
    ) -> None:
        """Block until at least ``n`` workers are connected.

        ``processes``: local worker processes to watch meanwhile; one that exits fails
        the wait at once (``start_workers`` passes the ones it started).
        """
        deadline = time.monotonic() + timeout
        while len(self._workers) < n:
            self._raise_if_dead()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(self._workers)} of {n} workers connected after {timeout} s"
                )
            dead = [proc for proc in processes or () if proc.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"local worker process {dead[0].pid} exited with code {dead[0].returncode}"
                    f"{_exit_meaning(dead[0].returncode)}"
                )
            time.sleep(0.01)

    def get(self, dsk: Any, keys: Any, **options: Any) -> Any:
        """Compute ``keys`` of the Dask graph ``dsk`` on the workers (Dask's get protocol).

        ``dsk`` is anything Dask hands a scheduler: a task mapping, a ``HighLevelGraph``
        or an expression. ``keys`` is a key or nested lists of keys; lists come back as
        tuples. Options (see ``RunOptions``) apply to this call only: ``progress``,
        ``report`` and ``event_log`` among them (see ``report``).
        """
        run_options = RunOptions.from_kwargs(options)
        self._raise_if_dead()
        rewrite = None
        if run_options.reduction_arity is not None:
            rewrite = functools.partial(
                rewrite_reductions,
                arity=run_options.reduction_arity,
                threshold=run_options.reduction_threshold,
            )
        started, mono_started = time.time(), time.monotonic()
        plan = build_plan(dsk, keys, rewrite)
        if not plan.outputs:
            return pack_results(plan.structure, {})
        run = _Run(next(self._run_ids))
        run.info = RunInfo(run.id, run_options.as_dict(), len(plan.nodes), started)
        if run_options.report is not None or run_options.event_log is not None:
            run.log = EventLog(run.id, started, mono_started, len(plan.nodes), run.info.options)
        progress = default_enabled() if run_options.progress is None else run_options.progress
        structure, ntasks = plan.structure, len(plan.nodes)
        try:
            self._submit_in_parts(run, plan, run_options, watch=progress)
            # The scheduler has what it needs: the graph need not live through the run.
            del plan
            if progress:
                wait_with_progress(run.done, lambda: run.finished_tasks, ntasks)
            else:
                run.done.wait()
        except BaseException:  # Ctrl-C or a task that cannot be pickled: cancel the rest
            self._command(("cancel", run))
            self._end_run(run, "cancelled", run_options)
            raise
        self._end_run(run, "done" if run.failure is None else "failed", run_options)
        if run.failure is not None:
            raise _run_error(run.failure)
        values = {}
        for key, serialized in run.values.items():
            try:
                values[key] = loads(serialized)
            except Exception as exc:
                raise SerializationError(key, "the result", f"{exc!r} (on the client)") from exc
        return pack_results(structure, values)

    def _end_run(self, run: _Run, outcome: str, options: RunOptions) -> None:
        run.info.finished = time.time()
        run.info.outcome = outcome
        self.last_run = run.info
        if run.log is None:
            return
        run.log.end(time.monotonic(), outcome, run.info)
        run.info.events = run.log
        try:
            if options.event_log is not None:
                write_events(run.log.records(), options.event_log)
            if options.report is not None:
                write_report(run.log.records(), options.report)
        except Exception:
            if outcome == "done":
                raise
            # The run's own error matters more; the report of a failed run is a bonus.
            logger.exception("could not write the report or event log of run %d", run.id)

    def report(self, path: str | os.PathLike) -> None:
        """Write the performance report of the last run that ended to ``path`` (HTML).

        A run called with ``report=`` or ``event_log=`` kept its event log, and the report
        shows its tasks over time, per-worker timelines, transfers, durations per function
        and slowest tasks; any other run gets a summary of its options, outcome and
        transfers only. ``get(..., report=path)`` does the same as the run ends.
        """
        info = self.last_run
        if info is None:
            raise RuntimeError("no run has ended yet: there is nothing to report")
        records = info.events.records() if info.events is not None else summary_records(info)
        write_report(records, path)

    def _submit_in_parts(self, run: _Run, plan: Plan, options: RunOptions, watch: bool) -> None:
        """Pickle and submit the plan's tasks in priority order, ``SUBMIT_PART`` at a time.

        The workers start on the first part while this thread pickles the next, so a big
        graph does not wait for all of it to be prepared. Priority order puts every task
        after its dependencies; each task carries its dependents count, so a result is not
        released before dependents still to come have arrived.
        """
        encoder = TaskEncoder()
        config = None if options.default_execution else _run_config(run.id, options)
        submit = functools.partial(self._submit_part, run, plan, options, config, watch=watch)
        sent_functions: set[bytes] = set()
        part: list[s.NewTask] = []
        first = True
        dependents = plan.dependents
        for key in plan.order:
            payload, functions = _encode_task(encoder, key, plan.nodes[key])
            deps = tuple(plan.dependencies[key])
            prefix, readers = key_split(key), dependents.get(key, 0)
            part.append(
                s.NewTask(key, payload, functions, deps, plan.priorities[key], prefix, readers)
            )
            if len(part) >= SUBMIT_PART:
                submit(part, encoder, sent_functions, first)
                first = False
                part = []
                if run.done.is_set():
                    return  # it failed already: stop preparing the rest
        submit(part, encoder, sent_functions, first)
        run.info.hoisting_candidates = sorted(encoder.modules)

    def _submit_part(self, run: _Run, plan: Plan, options: RunOptions,
                     config: p.RunConfig | None, part: list, encoder: TaskEncoder,
                     sent_functions: set[bytes], first: bool,
                     watch: bool) -> None:  # fmt: skip
        """Send one part: the first opens the run, the others extend it."""
        functions = {f: c for f, c in encoder.functions.items() if f not in sent_functions}
        sent_functions.update(functions)
        if first:
            watched = watch or run.log is not None
            event: Any = s.SubmitRun(
                run.id, part, plan.outputs, options.retries, functions, options.replicas, config,
                watched,
            )  # fmt: skip
            self._command(("submit", run, event, watched))
        else:
            self._command(("extend", run, s.ExtendRun(run.id, part, functions)))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers this manager started, tell the others to leave, and stop."""
        if self._closed:
            return
        self._closed = True
        self._command(("close", None))
        self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        for proc in self._local_processes:
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning(
                    "local worker %d did not stop in %.0f s; killing it", proc.pid, timeout
                )
                proc.kill()
                proc.wait()
        self._close_sockets()
        os.close(self._wake_read)
        os.close(self._wake_write)
        _remove_paths(self._cleanup_paths)

    def _close_sockets(self) -> None:
        self._router.close(linger=0)
        if self._gate is not None:
            self._gate.stop()
        self._context.term()

    # -- caller side of the command queue -----------------------------------------------

    def _command(self, command: tuple) -> None:
        if self._closed and command[0] != "close":
            raise RuntimeError("the manager is closed")
        self._commands.put(command)
        os.write(self._wake_write, b"x")
        if self._io_error is not None and command[1] is not None:
            # Queued after the dying thread failed what it found: nobody will read it.
            self._fail_dead(command[1])

    def _raise_if_dead(self) -> None:
        if self._io_error is not None:
            raise self._dead_error()

    def _dead_error(self) -> ManagerDied:
        cause = self._io_error
        error = ManagerDied(f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause
        return error

    def _fail_dead(self, run: _Run) -> None:
        if not run.done.is_set():
            run.failure = self._dead_error()
            run.done.set()

    # -- the I/O thread -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
            self._shutdown_workers()
        except BaseException as exc:
            self._died(exc)

    def _serve(self) -> None:
        """The loop: each step guarded, so that an error fails only the runs it concerns."""
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        next_timer = 0.0
        running = True
        while running:
            busy = self._outboxes or self._events
            timeout = 0 if busy else max(0.0, next_timer - time.monotonic())
            # Whole milliseconds, rounded up: a fraction would be cut to 0 and spin.
            for sock, _ in poller.poll(math.ceil(timeout * 1000)):
                if sock is self._router:
                    self._drain_router()
                else:
                    running = self._drain_commands()
            now = time.monotonic()
            if now >= next_timer:
                try:
                    self._check_timers(now)
                except Exception as exc:
                    self._loop_error(exc, "checking the workers' timers")
                next_timer = now + TIMER_PERIOD
            self._apply_events()
            if self._watched:
                try:
                    self._sample_due(time.monotonic())
                except Exception as exc:
                    self._loop_error(exc, "sampling watched runs", run_ids=list(self._watched))
            self._flush()

    def _loop_error(
        self,
        exc: Exception,
        what: str,
        task_ids: Any = (),
        run_ids: Any = (),
    ) -> None:
        """An exception in a step of the loop: fail the runs it concerns (those of
        ``run_ids`` and of the tasks ``task_ids``), or, concerning none, log and go on."""
        runs = {run_id: None for run_id in run_ids if run_id in self._runs}
        for run_id in self._state.runs_of(task_ids):
            if run_id in self._runs:
                runs[run_id] = None
        if not runs:
            self._drops.warn(
                ("loop", what), time.monotonic(), "the manager dropped %s: it raised %r", what,
                exc, exc_info=exc,
            )  # fmt: skip
        for run_id in runs:
            self._events.append(s.AbortRun(run_id, exc, what))

    def _died(self, exc: BaseException) -> None:
        """The I/O thread is dying: fail every run, waiting or queued, and tell the
        workers to leave, so that nothing waits on a loop that is gone."""
        self._io_error = exc
        logger.error("the manager's I/O thread died; every run fails", exc_info=exc)
        for run in list(self._runs.values()):
            self._fail_dead(run)
        self._runs.clear()
        self._watched.clear()
        while not self._commands.empty():
            _, run, *_ = self._commands.get()
            if run is not None:
                self._fail_dead(run)
        for ident in list(self._workers):
            try:
                self._send_now(ident, [p.Shutdown("the manager's I/O thread died")])
            except BaseException:
                logger.warning("could not tell a worker to leave", exc_info=True)

    def _drain_commands(self) -> bool:
        try:
            os.read(self._wake_read, 65536)
        except BlockingIOError:
            pass
        while not self._commands.empty():
            kind, run, *rest = self._commands.get()
            try:
                if kind == "submit":
                    self._runs[run.id] = run
                    run.transfers_before = dict(self._transfers)
                    self._events.append(rest[0])
                    if rest[1]:
                        self._watch_run(run)
                elif kind == "extend":
                    if run.id in self._runs:
                        self._events.append(rest[0])
                elif kind == "cancel":
                    if self._pop_run(run.id) is not None:
                        self._events.append(s.CancelRun(run.id))
                elif kind == "close":
                    return False
            except Exception as exc:
                self._loop_error(exc, f"the {kind} command of run {run.id}", run_ids=(run.id,))
        return True

    def _drain_router(self) -> None:
        router = self._router
        now = time.monotonic()
        for _ in range(DRAIN_LIMIT):
            try:
                ident, *frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = ident.bytes
            buffers = [f.buffer for f in frames]
            self.received_bytes += sum(b.nbytes for b in buffers)
            info = self._workers.get(ident)
            try:
                messages = p.unpack(buffers, p.TO_MANAGER)
            except ProtocolError as exc:
                if info is not None:
                    self._unreadable(ident, info, exc)
                    continue
                self._drops.warn(
                    ("malformed", "unregistered peers"), now, "dropped a malformed message "
                    "from unregistered peers (%r): %s", ident[:32], exc,
                )  # fmt: skip
                continue
            if info is None:
                self._on_stranger(ident, messages, now)
            else:
                self._on_worker_batch(ident, info, messages, now)
            if not has_more(router):
                return

    def _unreadable(self, ident: bytes, info: _WorkerInfo, exc: ProtocolError) -> None:
        """A registered worker sent a batch that is not one: the reports in it are lost,
        and the tasks they were about would wait forever. The worker is lost (its tasks
        run elsewhere) and told to leave."""
        reason = f"it sent a message that could not be read ({exc})"
        self._lose_worker(ident, reason)
        self._send_now(ident, [p.Shutdown(reason)])

    def _on_worker_batch(self, ident: bytes, info: _WorkerInfo, messages: list, now: float) -> None:
        """The records of one batch from a registered worker, each checked on its own: a
        malformed one fails the runs of the tasks it names, the others count."""
        valid = False
        for message in messages:
            kind = type(message)
            try:
                p.check_fields(message)
            except ProtocolError as exc:
                self._drops.warn(
                    ("malformed", info.name), now, "dropped a malformed record from worker %s: %s",
                    info.name, exc,
                )  # fmt: skip
                named = p.task_ids_named(message)
                self._events.append(s.BadReport(ident, kind.__name__, named, exc))
                continue
            if not valid:
                valid = True
                info.last_seen = now  # only what we can read shows that it is alive
            try:
                if kind is p.TaskDone:
                    if message.value is not None:
                        self._count(info.name, MANAGER, message.value.nbytes)
                elif kind is p.Transfers:
                    self._on_transfers(info.name, message)
                    continue
                elif kind is p.Status:
                    info.status = message
                    continue
                if kind is p.Goodbye:
                    self._lose_worker(ident, f"it left: {message.reason}")
                    return
                if kind is p.Register:
                    continue
            except Exception as exc:
                what = f"a {kind.__name__} from worker {info.name}"
                self._loop_error(exc, what, task_ids=p.task_ids_named(message))
                if kind not in _STATE_REPORTS:
                    continue
            self._events.append(s.FromWorker(ident, message))

    def _count(self, source: str, destination: str, nbytes: int) -> None:
        pair = (source, destination)
        self._transfers[pair] = self._transfers.get(pair, 0) + nbytes

    def _on_transfers(self, destination: str, message: p.Transfers) -> None:
        for address, nbytes in message.received:  # checked: (str, int) pairs
            self._count(self._names_by_peer.get(address, address), destination, nbytes)

    def _on_stranger(self, ident: bytes, messages: list, now: float) -> None:
        """Messages from an identity that has not registered: only ``Register`` counts.

        Its version is read first, before its other fields are checked: another version
        may mean other fields, and deserves a clear mismatch rather than a malformed one.
        """
        reg = next((m for m in messages if type(m) is p.Register), None)
        if reg is None:
            self._drops.warn(
                ("unregistered",), now, "dropped %d record(s) from unregistered peer %r",
                len(messages), ident[:32],
            )  # fmt: skip
            return
        version = reg[0] if len(reg) else None
        if type(version) is int and version != p.PROTOCOL_VERSION:
            name = reg.name if len(reg) > 1 and type(reg.name) is str else repr(ident[:32])
            error = VersionMismatch(p.PROTOCOL_VERSION, version, name)
            logger.warning("rejected worker %s: %s", name, error)
            self._outboxes.setdefault(ident, []).append(p.Rejected(str(error)))
            return
        try:
            p.check_fields(reg)
        except ProtocolError as exc:
            self._drops.warn(
                ("unregistered",), now, "rejected a malformed registration from %r: %s",
                ident[:32], exc,
            )  # fmt: skip
            rejected = p.Rejected(f"malformed registration: {exc}")
            self._outboxes.setdefault(ident, []).append(rejected)
            return
        info = _WorkerInfo(reg, now)
        self._workers[ident] = info
        self._names_by_peer[reg.peer_address] = reg.name
        logger.info("worker %s joined from %s with %d cores", reg.name, reg.hostname, reg.cores)
        self._outboxes.setdefault(ident, []).append(
            p.Welcome(reg.name, self.options.heartbeat_interval)
        )
        self._events.append(s.WorkerJoined(ident, reg.name, reg.cores, reg.peer_address))
        for run in self._watched.values():
            if run.log is not None:
                run.log.worker(now, reg.name, reg.cores, reg.hostname)

    def _lose_worker(self, ident: bytes, reason: str) -> None:
        info = self._workers.pop(ident, None)
        if info is None:
            return
        logger.warning("worker %s lost: %s", info.name, reason)
        for run in self._watched.values():
            if run.log is not None:
                run.log.worker_lost(time.monotonic(), info.name, reason)
        self._outboxes.pop(ident, None)
        self._events.append(s.WorkerLost(ident, reason))

    def _check_timers(self, now: float) -> None:
        timeout = self.options.worker_timeout
        interval = self.options.heartbeat_interval
        exited = {
            proc.pid: proc.returncode for proc in self._local_processes if proc.poll() is not None
        }
        for ident, info in list(self._workers.items()):
            if info.pid in exited and info.hostname == _HOSTNAME:
                self._lose_worker(ident, f"its process exited with code {exited[info.pid]}")
            elif now - info.last_seen > timeout:
                self._lose_worker(
                    ident, f"silent for {now - info.last_seen:.1f} s (timeout {timeout} s)"
                )
                self._send_now(ident, [p.Shutdown("declared lost after silence")])
            elif now - info.last_sent > interval and ident not in self._outboxes:
                self._outboxes[ident] = [p.Heartbeat()]

    def _apply_events(self) -> None:
        if not self._events:
            return
        events, self._events = self._events, []
        try:
            instructions = self._state.handle(events, time.monotonic())
        except Exception as exc:  # handle never raises; if it does, no run can trust it
            logger.error("the scheduler failed on %d events; every run fails", len(events),
                         exc_info=exc)  # fmt: skip
            for run_id in list(self._runs):
                self._end_failed(run_id, exc, f"a batch of {len(events)} events")
            return
        for instruction in instructions:
            kind = type(instruction)
            try:
                if kind is s.Send:
                    self._outboxes.setdefault(instruction.worker, []).append(instruction.message)
                elif kind is s.TaskFinished:
                    self._on_task_finished(instruction)
                elif kind is s.Dispatched:
                    self._on_dispatched(instruction)
                elif kind is s.BytesInlined:
                    self._count(MANAGER, instruction.name, instruction.nbytes)
                elif kind is s.RunOutput:
                    run = self._runs.get(instruction.run_id)
                    if run is not None:
                        run.values[instruction.key] = instruction.value
                elif kind is s.RunDone:
                    run = self._pop_run(instruction.run_id)
                    if run is not None:
                        self._settle_transfers(run)
                        run.done.set()
                elif kind is s.RunFailed:
                    run = self._pop_run(instruction.run_id)
                    if run is not None:
                        run.failure = instruction
                        self._settle_transfers(run)
                        run.done.set()
                elif kind is s.RunAborted:
                    self._end_failed(instruction.run_id, instruction.error, instruction.what)
                elif kind is s.EventDropped:
                    error = instruction.error
                    self._drops.warn(
                        ("scheduler", instruction.what), time.monotonic(),
                        "the scheduler dropped %s: handling it raised %r", instruction.what,
                        error, exc_info=error,
                    )  # fmt: skip
            except Exception as exc:
                run_id = getattr(instruction, "run_id", None)
                task_ids = p.task_ids_named(instruction.message) if kind is s.Send else ()
                what = f"a {kind.__name__} instruction"
                if kind is s.TaskFinished:
                    what = f"a {type(instruction.report).__name__} from worker {instruction.worker}"
                self._loop_error(exc, what, task_ids, () if run_id is None else (run_id,))
                if run_id is not None:  # now: its RunDone may follow in this very list
                    self._end_failed(run_id, exc, what)

    def _end_failed(self, run_id: int, cause: BaseException, what: str) -> None:
        """A run failed by an exception of the manager's own: ``get`` raises
        ``SchedulerError``, naming ``what``, with the exception as its cause."""
        run = self._pop_run(run_id)
        if run is None:
            return
        logger.error("run %d failed: the manager could not handle %s", run_id, what,
                     exc_info=cause)  # fmt: skip
        error = SchedulerError(run_id, what, f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause
        run.failure = error
        try:
            self._settle_transfers(run)
        finally:
            run.done.set()

    # -- watched runs (progress, event logs) -------------------------------------------

    def _watch_run(self, run: _Run) -> None:
        self._watched[run.id] = run
        if run.log is not None:
            now = time.monotonic()
            for info in self._workers.values():
                run.log.worker(now, info.name, info.cores, info.hostname)
            self._sample(now, [run])

    def _pop_run(self, run_id: int) -> _Run | None:
        """Forget a run that ended; a watched one gets its last sample first."""
        run = self._watched.pop(run_id, None)
        if run is not None and run.log is not None:
            self._sample(time.monotonic(), [run])
        return self._runs.pop(run_id, None)

    def _on_task_finished(self, finished: s.TaskFinished) -> None:
        """Count and log a task's end (the state reports only those of watched runs)."""
        run = self._watched.get(finished.run_id)
        if run is None:
            return
        message, worker = finished.report, finished.worker
        kind = type(message)
        if kind is p.TaskDone:
            run.finished_tasks += 1
        if run.log is None:
            return
        now = time.monotonic()
        if kind is p.TaskDone:
            run.log.done(
                now, message.task_id, worker, message.duration, message.finished, message.nbytes
            )
        elif kind is p.TaskErred:
            run.log.erred(now, message.task_id, worker, message.message)
        else:
            run.log.crashed(now, message.task_id, worker, message.reason)

    def _on_dispatched(self, sent: s.Dispatched) -> None:
        run = self._watched.get(sent.run_id)
        if run is not None and run.log is not None:
            run.log.dispatch(time.monotonic(), sent.task_id, sent.key, sent.prefix, sent.worker)

    def _sample_due(self, now: float) -> None:
        due = [
            run for run in self._watched.values() if run.log is not None and now >= run.next_sample
        ]
        if due:
            self._sample(now, due)

    def _sample(self, now: float, runs: Any) -> None:
        """Task counts for the tasks-over-time chart. Ready, processing and running count
        every run's tasks (they are one queue); waiting is this run's remainder."""
        ready, processing, running = self._state.load()
        for run in runs:
            if run.log is not None:
                done = run.finished_tasks
                waiting = max(0, run.info.tasks - done - ready - processing)
                run.log.sample(now, waiting, ready, processing, running, done)
                run.next_sample = now + max(0.005, (now - run.log.mono_start) / SAMPLES_PER_RUN)

    def _settle_transfers(self, run: _Run) -> None:
        """The bytes moved while ``run`` went on (runs at the same time share them)."""
        before = run.transfers_before
        moved = {
            pair: nbytes - before.get(pair, 0)
            for pair, nbytes in self._transfers.items()
            if nbytes != before.get(pair, 0)
        }
        run.info.transfers = moved

    def _flush(self) -> None:
        outboxes, self._outboxes = self._outboxes, {}
        now = time.monotonic()
        for ident, messages in outboxes.items():
            if self._send_now(ident, messages):
                info = self._workers.get(ident)
                if info is not None:
                    info.last_sent = now

    def _send_now(self, ident: bytes, messages: list) -> bool:
        try:
            frames = p.encode(messages)
        except Exception:
            frames = self._encode_what_can_be(ident, messages)
            if frames is None:
                return False
        try:
            self.sent_bytes += sum(memoryview(frame).nbytes for frame in frames)
            send_batch(self._router, frames, ident)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: its connection is gone
            self._lose_worker(ident, f"unreachable ({exc})")
            return False

    def _encode_what_can_be(self, ident: bytes, messages: list) -> list | None:
        """A batch that would not encode: the frames of the messages that do (None if
        none does); the runs of the tasks the others name fail, since their worker will
        never hear of them."""
        info = self._workers.get(ident)
        name = info.name if info is not None else repr(ident[:32])
        good = []
        for message in messages:
            try:
                p.encode([message])
            except Exception as exc:
                what = f"a {type(message).__name__} for worker {name}"
                self._loop_error(exc, what, p.task_ids_named(message))
            else:
                good.append(message)
        return p.encode(good) if good else None

    def _shutdown_workers(self) -> None:
        for ident in list(self._workers):
            self._send_now(ident, [p.Shutdown("the manager is closing")])
        for run in self._runs.values():
            run.failure = RunCancelled("the manager was closed before the run finished")
            run.done.set()
        self._runs.clear()
        self._watched.clear()


_HOSTNAME = socket.gethostname()


def _manager_keys(options: ManagerOptions) -> security.Keys | None:
    """The run's keys: none without security, else from ``key_file`` (made if missing)."""
    if not options.security:
        return None
    if options.key_file is None:
        return security.Keys.generate()
    path = os.fspath(options.key_file)
    if os.path.exists(path):
        return security.read_key_file(path, need_manager_secret=True)
    keys = security.Keys.generate()
    security.write_key_file(path, keys)
    return keys


def _write_connection_file(
    path: str | os.PathLike | None, address: str, keys: security.Keys | None
) -> tuple[str, str | None]:
    """Write the connection file; its path, and what to remove when the manager closes
    (nothing when the caller chose the path: with ``key_file`` it outlives the manager)."""
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        security.write_connection_file(path, address, keys)
        return path, []
    port = address.rsplit(":", 1)[1]
    name = f"manager-{_HOSTNAME}-{os.getpid()}-{port}.json"
    try:
        directory = security.private_dir(security.default_connection_dir())
        path = os.path.join(directory, name)
        security.write_connection_file(path, address, keys)
        return path, [path]
    except OSError:  # no writable home directory: a private temporary one
        directory = tempfile.mkdtemp(prefix="daskvine-py-")
        path = os.path.join(directory, name)
        security.write_connection_file(path, address, keys)
        return path, [path, directory]


def _remove_paths(paths: list[str]) -> None:
    """Remove files, then the (empty) directories made for them."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path) if os.path.isfile(path) else os.rmdir(path)


def _exit_meaning(code: int | None) -> str:
    from .worker import EXIT_MEANINGS  # the worker module imports no more than we do

    meaning = EXIT_MEANINGS.get(code)
    return f" ({meaning})" if meaning else ""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _kill_all(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lib_resources_args(lib_resources: dict[str, int]) -> list[str]:
    unknown = set(lib_resources) - {"cores", "slots"}
    if unknown:
        raise ValueError(f"lib_resources takes 'cores' and 'slots', not {sorted(unknown)}")
    args = []
    for name, value in lib_resources.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"lib_resources[{name!r}] must be an integer >= 1, not {value!r}")
        args += [f"--lib-{name}", str(value)]
    return args


def _run_config(run_id: int, options: RunOptions) -> p.RunConfig:
    return p.RunConfig(
        run_id,
        options.task_mode,
        options.exec_mode,
        options.import_modules,
        tuple(options.env_vars.items()),
        options.task_sandbox,
    )


def _encode_task(encoder: TaskEncoder, key: Any, node: Any) -> tuple[bytes, tuple[bytes, ...]]:
    try:
        return encoder.encode(node)
    except Exception as exc:
        raise SerializationError(key, "the function or arguments", repr(exc)) from exc


def _run_error(failure: s.RunFailed | BaseException) -> BaseException:
    """The exception ``get`` raises for a failed run."""
    if isinstance(failure, BaseException):
        return failure
    note = f"daskvine_py: raised by task {failure.key!r} on worker {failure.worker}"
    if failure.exception is not None:
        try:
            exc = loads(failure.exception)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            return attach_remote_traceback(exc, failure.traceback, note)
    error = TaskFailed(failure.key, failure.message, failure.worker)
    if failure.traceback:
        attach_remote_traceback(error, failure.traceback, None)
    return error
