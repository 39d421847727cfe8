"""The public ``Manager``: the caller's API over one I/O thread.

The manager is in four parts, one job each:

- ``manager.Manager`` (this module): the caller's side. It binds the ROUTER (and the
  CurveZMQ gate), writes the connection file and starts local workers. ``get`` is a
  pipeline: the graph read once into a ``Plan``, the plan's passes (``plan.graph``), and
  submission of its tasks in parts (``SUBMIT_PART`` tasks each), queued to the I/O thread
  as typed commands (a big graph's first parts go while it is read: ``streaming``);
  then it waits on the run and unpickles the results in the caller's thread, so
  dispatch goes on meanwhile.
- ``loop.IOLoop``: the I/O thread. It drains the ROUTER, checks and decodes what workers
  send, feeds the scheduler state (``scheduler.state.SchedulerState``), which it owns,
  routes its instructions and flushes one batch per worker per iteration.
- ``scheduler.liveness.Liveness``: who is silent past the timeout, who is due a
  heartbeat, whose local process exited; pure, driven by ``now``.
- ``watching.Watching``: the runs in progress, the bytes moved, and what watched runs
  (progress, report, event log) see, fed by the state's instructions.

Callers never touch sockets, the state or the loop's dicts: they queue commands, wait on
their run's event, and read what the loop publishes: the workers' snapshot
(``wait_for_workers`` waits on its condition) and the cache's index (``Cache``). Every
run ends: should the I/O thread die, every waiting and later ``get`` raises
``ManagerDied`` at once.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import numbers
import os
import socket
import subprocess
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from daskvine_py import config
from daskvine_py.batch.planner import Demand
from daskvine_py.cache.result_cache import Cache, CachedRun
from daskvine_py.manager import callbacks, connection, gc_pace, launch, lifecycle, results
from daskvine_py.manager.commands import Cancel, Close, Command, Extend, Retire, StateEvent, Submit
from daskvine_py.manager.loop import IOLoop
from daskvine_py.manager.progress import default_enabled
from daskvine_py.manager.shipping import NOTHING, Shipped, Shipping
from daskvine_py.manager.streaming import Stream, deferred_payload, encode_task, opening_of
from daskvine_py.manager.views import LiveViews
from daskvine_py.manager.watching import Run
from daskvine_py.options import ManagerOptions, RunOptions, check_seconds
from daskvine_py.plan import graph
from daskvine_py.plan.graph import Plan, pack_results
from daskvine_py.report.events import EventLog, summary_records, write_events
from daskvine_py.report.page import write_report
from daskvine_py.report.runinfo import RunInfo
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.messages import CacheWrite
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.keys import key_prefix
from daskvine_py.wire.serialize import TaskEncoder, urls_in

if TYPE_CHECKING:
    from daskvine_py.batch.pool import WorkerPool

logger = logging.getLogger("daskvine_py.manager")

#: Tasks per part when a graph is submitted: the workers start on the first part while
#: the caller's thread prepares the next. Smaller starts sooner; larger wakes the I/O
#: thread less often.
SUBMIT_PART = 4096
#: Seconds between looks, while waiting to send a part, at whether the run or the manager
#: ended meanwhile.
PART_WAIT = 0.1

#: What a deferred task (``RunCache.deferred``) is submitted with: no payload, no functions.
_DEFERRED: tuple[bytes, tuple[bytes, ...]] = (b"", ())


class Manager:
    """A daskvine_py manager: workers connect to it, ``get`` runs Dask graphs on them.

    Parameters
    ----------
    host, port
        Where to listen; ``port=0`` picks a free port. See ``address``.
    heartbeat_interval, worker_timeout, max_extra_tasks_per_core
        See ``ManagerOptions``. A setting not given (``host`` and ``port`` included) is
        ``dask.config``'s ``daskvine_py.manager.<setting>`` (see ``config``).

    Examples
    --------
    >>> with Manager() as manager:                           # doctest: +SKIP
    ...     manager.start_workers(2, cores=1)
    ...     dask.compute(x, scheduler=manager.get)
    """

    def __init__(self, host: str | None = None, port: int | None = None, **settings: Any) -> None:
        self.options = config.manager_options(host, port, settings)
        host, port = self.options.host, self.options.port
        self._keys = connection.manager_keys(self.options)
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
            bound = connection.bind(self._router, host, port)
        except BaseException:
            self._close_sockets()
            raise
        self.address = f"tcp://{host}:{bound}"
        if self._keys is None and not connection.is_loopback(host):
            logger.warning(
                "manager listening on %s without security: anyone who can reach it can "
                "run code as this user (use security=True outside trusted benchmarks)",
                self.address,
            )
        #: the JSON file workers join with (``--connection-file``); see ``security``
        self.connection_file, self._cleanup_paths = connection.write_connection_file(
            self.options.connection_file, connection.reachable(host, bound), self._keys
        )
        #: the software and files runs ship (``environment=``, ``env_files=``)
        self._shipping = Shipping(
            connection.split_host(connection.reachable(host, bound)), self._keys
        )
        self._state = s.SchedulerState(
            self.options.max_extra_tasks_per_core,
            self.options.fixed_extra_tasks_per_core,
            sizing=self.options.sizing,
            sizing_categories=self.options.sizing_categories,
        )
        self._local_processes: list[subprocess.Popen[bytes]] = []
        #: worker pools on batch systems (``scale``), closed with the manager
        self._pools: list[WorkerPool] = []
        self._io = IOLoop(
            self._router,
            self._state,
            self.options,
            self._local_processes,
            connection_file=self.connection_file,
        )
        #: the result cache (``get(cache=True)``): ``clear()``, ``info()``
        self.cache = Cache(
            self._io.cache_index,
            lambda event, handled: self._command(StateEvent(event, handled)),
            self._raise_if_dead,
            self.options.cache_dir,
            self.options.cache_dir_limit,
        )
        self._io.on(CacheWrite, self.cache.write)
        #: the live snapshot, metrics, dashboard and notebook view (``views``)
        self._views = LiveViews(self._command, self._raise_if_dead, self.address)
        self._run_ids = itertools.count(1)
        #: the most recent ``get`` call that ended (see ``RunInfo``); None before any
        self.last_run: RunInfo | None = None
        #: what the latest ``get`` shipped (``environment=``): its environment's and code's
        #: keys and sizes; None when it shipped no software
        self.last_run_software: p.Software | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._io.run, name="daskvine-manager", daemon=True)
        self._thread.start()
        # A manager never closed must not leave local workers behind at interpreter exit,
        # nor its keys on disk.
        weakref.finalize(self, launch.kill_all, self._local_processes)
        weakref.finalize(self, connection.remove_paths, self._cleanup_paths)
        # SIGTERM and SIGHUP (``kill``, ``timeout``, a batch job's end) close it too.
        lifecycle.watch(self)
        try:
            self._views.start_dashboard(self.options.dashboard_address)
        except BaseException:
            self.close()
            raise

    # -- public API -------------------------------------------------------------------

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Manager {self.address} workers={len(self.workers)}>"

    def _repr_html_(self) -> str:
        """A notebook's view: the address, the dashboard's link, the workers and the runs
        in progress."""
        return self._views.html()

    @property
    def dashboard_link(self) -> str | None:
        """The live dashboard's address, its token included (None: no dashboard)."""
        return self._views.dashboard_link

    def live(self, timeout: float = 10.0) -> dict[str, Any]:
        """What the manager is doing now, as plain data (docs/live.md): workers, tasks by
        state, runs in progress, categories. The I/O thread builds it at most once a
        second (a sooner call gets the last one); ``TimeoutError`` if it does not answer."""
        return self._views.live(timeout)

    def metrics(self) -> str:
        """``live()`` in Prometheus's text format, what ``/metrics`` serves (docs/live.md)."""
        return self._views.metrics()

    @property
    def workers(self) -> dict[str, dict[str, Any]]:
        """The connected workers by name: hostname, cores, memory, pid, peer address, why it
        gets no new tasks (``quarantined``, docs/faults.md) and, from its last heartbeat,
        the bytes of results it holds and its peak memory (a snapshot)."""
        with self._io.changed:
            published = list(self._io.snapshot.values())
        return {info["name"]: {k: v for k, v in info.items() if k != "name"} for info in published}

    @property
    def transfers(self) -> dict[tuple[str, str], int]:
        """Bytes moved per (source, destination) worker name since the manager started;
        ``runinfo.MANAGER`` names the manager. Per run: ``last_run.transfers``."""
        return dict(self._io.watching.transfers)

    @property
    def received_bytes(self) -> int:
        """Bytes of every message workers sent this manager: outputs, not intermediates."""
        return self._io.received_bytes

    @property
    def sent_bytes(self) -> int:
        """Bytes of every message this manager sent workers: tasks, functions, control."""
        return self._io.sent_bytes

    @property
    def sent_batches(self) -> int:
        """Batches this manager sent workers (each one send, however many records)."""
        return self._io.sent_batches

    # For tests and tools: the loop's records (read them only while it is quiet).
    @property
    def _watched(self) -> dict[int, Run]:
        return self._io.watching.watched

    @property
    def _names_by_peer(self) -> dict[str, str]:
        return self._io.watching.names_by_peer

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
        fetch_timeout: float | None = None,
    ) -> list[subprocess.Popen[bytes]]:
        """Start ``n`` local worker processes of ``cores`` cores; stopped by ``close``.

        ``memory`` and ``disk`` (MB), ``workdir`` and ``fetch_timeout`` (s) are the
        worker's ``--memory``, ``--disk``, ``--workdir`` and ``--fetch-timeout``.
        ``lib_resources={"cores": c, "slots": s}``: each worker runs ``cores // c``
        library processes of ``s`` concurrent tasks each (``--lib-cores``/``--lib-slots``).
        With ``wait``, return once all of them have registered (or raise ``TimeoutError``).
        """
        if self._closed:
            raise RuntimeError("the manager is closed")
        for name, value in (("n", n), ("cores", cores)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"start_workers({name}=...) takes an integer >= 1 (workers to start, "
                    f"cores of each), not {value!r}"
                )
        check_seconds("start_workers(timeout=...)", timeout, zero=True)
        if fetch_timeout is not None:
            check_seconds("start_workers(fetch_timeout=...)", fetch_timeout)
        command = launch.worker_command(memory, disk, workdir, fetch_timeout, lib_resources or {})
        start = len(self._local_processes)
        procs = [
            launch.spawn(
                self.address,
                cores=cores,
                name=f"local-{start + i}",
                connection_file=self.connection_file,
                command=command,
            )
            for i in range(n)
        ]
        self._local_processes.extend(procs)
        if wait:
            self._wait_for_processes(procs, timeout)
        return procs

    def wait_for_workers(
        self, n: int, timeout: float = 60.0, processes: list[subprocess.Popen[bytes]] | None = None
    ) -> None:
        """Block until at least ``n`` workers are connected.

        ``processes``: local worker processes to watch meanwhile; one that exits fails
        the wait at once (``start_workers`` passes the ones it started).
        """
        check_seconds("wait_for_workers(timeout=...)", timeout, zero=True)
        self._wait_until(lambda: len(self._io.snapshot), n, timeout, processes or ())

    def _wait_for_processes(self, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
        """Block until each of ``procs`` (local workers) has registered, found by its
        pid on this host: not by a count of workers, which still holds one killed
        beside them until the manager notices (``TimeoutError``, or ``RuntimeError`` as
        soon as one of them exits)."""
        host, pids = socket.gethostname(), {proc.pid for proc in procs}

        def registered() -> int:
            return sum(
                1
                for info in self._io.snapshot.values()
                if info["pid"] in pids and info["hostname"] == host
            )

        self._wait_until(registered, len(procs), timeout, procs, "of the workers started")

    def _wait_until(
        self,
        count: Callable[[], int],
        n: int,
        timeout: float,
        processes: Sequence[subprocess.Popen[bytes]],
        which: str = "",
    ) -> None:
        """Block until ``count()`` (read under the loop's lock) reaches ``n``: woken when
        a worker joins or the loop dies; local ``processes`` are polled every 0.1 s
        meanwhile, since nothing wakes us when one exits (one that did fails the wait)."""
        deadline = time.monotonic() + timeout
        changed = self._io.changed
        while True:
            with changed:
                changed.wait_for(
                    lambda: count() >= n or self._io.error is not None,
                    timeout=max(0.0, min(0.1, deadline - time.monotonic())),
                )
                connected = count()
            self._raise_if_dead()
            if connected >= n:
                return
            if time.monotonic() > deadline:
                workers = "worker" if n == 1 else "workers"
                raise TimeoutError(
                    f"{connected} of {n} {workers}{' ' + which if which else ''} connected "
                    f"after {timeout} s"
                )
            dead = [proc for proc in processes if proc.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"local worker process {dead[0].pid} exited with code {dead[0].returncode}"
                    f"{launch.exit_meaning(dead[0].returncode)}"
                )

    def get(self, dsk: Any, keys: Any, **options: Any) -> Any:
        """Compute ``keys`` of the Dask graph ``dsk`` on the workers (Dask's get protocol).

        ``dsk`` is anything Dask hands a scheduler: a task mapping, a ``HighLevelGraph``
        or an expression. ``keys`` is a key or nested lists of keys; lists come back as
        tuples. Options (see ``RunOptions``) apply to this call only: ``progress``,
        ``report`` and ``event_log`` among them (see ``report``); an option not given is
        ``dask.config``'s ``daskvine_py.get.<option>`` (see ``config``). Dask's callbacks
        are called (see ``callbacks``): the active ones, or ``callbacks=[...]``.
        """
        hooks = callbacks.take(options.pop("callbacks", None))
        gc_pace.run_started()  # fewer collections while the run's records live
        try:
            return self._get(dsk, keys, options, hooks)
        finally:
            gc_pace.run_ended()
            if hooks is not None:
                hooks.release()

    def _get(
        self, dsk: Any, keys: Any, options: dict[str, Any], hooks: callbacks.Hooks | None
    ) -> Any:
        run_options = config.run_options(options)
        self._raise_if_dead()
        started = time.time(), time.monotonic()
        progress = default_enabled() if run_options.progress is None else run_options.progress
        watch = progress or hooks is not None
        shipped = self._shipping.resolve(run_options, self.options)
        self.last_run_software = shipped.software
        stream, run = self._stream(keys, run_options, hooks, watch, started, shipped)
        opened = False
        # A big graph's plan and records are millions of objects, none garbage before the
        # run ends: the cyclic collector would walk them again and again meanwhile.
        collecting = gc.isenabled()
        gc.disable()
        try:
            try:
                plan = self._plan(dsk, keys, run_options, stream)
                if not plan.outputs:
                    return pack_results(plan.structure, {})
                run = self._open_run(run, plan, run_options, started)
                opened = True
                structure, cached = plan.structure, plan.cache
                if hooks is not None:
                    hooks.start(plan, run)
                self._submit(run, plan, run_options, watch, stream)
                # The plan's dicts (several entries per task) go now, not as the run
                # ends: the state has the tasks (a rerun's deferred payloads keep it).
                del plan
            finally:
                if collecting:
                    gc.enable()
            callbacks.wait(run, hooks, progress)
        except BaseException:  # Ctrl-C or a task that cannot be pickled: cancel the rest
            if opened or (stream is not None and stream.opened):
                self._command(Cancel(run))
                self._end_run(run, "cancelled", run_options, hooks)
            raise
        if cached is not None:
            run.info.cache = cached.info.stats
        self._end_run(run, "done" if run.failure is None else "failed", run_options, hooks)
        if run.failure is not None:
            raise results.run_error(run.failure, self.options.unpickle_remote_exceptions)
        return pack_results(structure, results.values_of(run, hooks))

    def _plan(self, dsk: Any, keys: Any, options: RunOptions, stream: Stream | None) -> Plan:
        """``dsk`` read once into a plan (``stream`` submitting the first tasks of a big
        graph meanwhile), then the plan's passes in their order: ``graph.build_plan``, as
        tests and tools call it, with this run's options and the manager's cache."""
        cache = None
        if _uses_cache(options, self.options):
            cache = functools.partial(self.cache.prepare, cache_dir=options.cache_dir)
        return graph.build_plan(
            dsk,
            keys,
            early=None if stream is None else stream.early,
            reduction_arity=options.reduction_arity,
            reduction_threshold=options.reduction_threshold,
            fuse=options.fuse,
            unfusable=frozenset() if stream is None else stream.keys,  # filled by ``early``
            cache=cache,
        )

    def _stream(
        self,
        keys: Any,
        options: RunOptions,
        hooks: callbacks.Hooks | None,
        watch: bool,
        started: tuple[float, float],
        shipped: Shipped = NOTHING,
    ) -> tuple[Stream | None, Run]:
        """The run, and what submits its first tasks while a big graph is read
        (``streaming``): none for a run with callbacks, a report, an event log or the
        cache, which need the whole plan first."""
        run = Run(next(self._run_ids))
        run.shipped = shipped
        run.info = RunInfo(run.id, options.as_dict(), 0, started[0])
        if hooks is not None or options.report is not None or options.event_log is not None:
            return None, run
        if _uses_cache(options, self.options):
            return None, run
        outputs = list(dict.fromkeys(graph.flatten_keys(keys)))
        opening = opening_of(run.id, outputs, options, watch, shipped=shipped)
        send = functools.partial(self._send_part, run)
        return Stream(opening, send, run.done.is_set, key_prefix), run

    def _open_run(
        self, run: Run, plan: Plan, options: RunOptions, started: tuple[float, float]
    ) -> Run:
        """``run`` (``_stream``'s) with its size, known now, and its event log if asked."""
        run.info.tasks = len(plan.nodes)
        if options.report is not None or options.event_log is not None:
            run.log = EventLog(run.id, *started, len(plan.nodes), run.info.options)
        return run

    def _end_run(
        self, run: Run, outcome: str, options: RunOptions, hooks: callbacks.Hooks | None
    ) -> None:
        """Record the run's end (``last_run``), write its event log and report, and
        tell the callbacks."""
        run.info.finished = time.time()
        run.info.outcome = outcome
        self.last_run = run.info
        if run.log is not None:
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
        if hooks is not None:
            hooks.finish(failed=outcome != "done")

    def report(self, path: str | os.PathLike[str]) -> None:
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

    def _submit(
        self, run: Run, plan: Plan, options: RunOptions, watch: bool, stream: Stream | None = None
    ) -> None:
        """Pickle and submit the plan's tasks in its order, ``SUBMIT_PART`` at a time.

        The workers start on the first part while this thread pickles the next, so a big
        graph does not wait for all of it to be prepared. The plan's order puts every
        task after its dependencies; each task carries its dependents count, so a result
        is not released before dependents still to come have arrived (with the cache,
        only the tasks that will run count: the cache's pass set ``plan.dependents``). After
        a ``stream``, the rest of an arriving run: readers counted by the state, a last part.
        """
        cached: CachedRun | None = plan.cache
        arriving = stream is not None and stream.opened
        if stream is not None:
            encoder = stream.encoder
        else:
            encoder = TaskEncoder() if cached is None else cached.encoder
        add_key = cached.add_key if cached is not None and cached.keyed_on_submission else None
        deferred = frozenset() if cached is None else cached.info.deferred
        if cached is not None and deferred:  # hits' payloads: made only if lineage needs them
            cached.info.encode = functools.partial(deferred_payload, TaskEncoder(), plan)
        watched = watch or run.log is not None
        run.annotated = plan.settings.categories if plan.settings is not None else {}
        opening: s.SubmitRun | None = opening_of(
            run.id,
            plan.outputs,
            options,
            watched,
            plan.settings,
            None if cached is None else cached.info,
            shipped=run.shipped,
        )
        nodes, dependencies, priorities = plan.nodes, plan.dependencies, plan.priorities
        dependents: dict[graph.Key, int] | None = None if arriving else plan.dependents
        sent: set[bytes] = set() if stream is None else stream.sent
        done = frozenset() if stream is None else stream.keys
        if arriving:
            opening = None
        # Without the cache nothing reads the plan after this: it shrinks as the state grows
        # (its tables are compacted as they halve: a dict keeps its size as it empties).
        keep = cached is not None
        take = nodes.__getitem__ if keep else nodes.pop
        take_deps = dependencies.__getitem__ if keep else dependencies.pop
        take_priority = priorities.__getitem__ if keep else priorities.pop
        take_readers = None if dependents is None else dependents.get if keep else dependents.pop
        tables = () if keep else (nodes, dependencies, priorities, plan.dependents)
        compact_at = len(nodes) // 2
        shared: dict[Any, Any] = {}  # one prefix string, one function tuple per kind of task
        prefixes: dict[Any, str] = {}  # a tuple key's name -> its prefix
        part: list[s.NewTask] = []
        find_files = bool(options.cache_inputs)  # the files each task reads: placed by them
        for key in plan.order:
            if key in done:
                continue
            node = take(key)
            if add_key is not None:
                add_key(key, node)
            payload, functions = _DEFERRED if key in deferred else encode_task(encoder, key, node)
            functions = shared.setdefault(functions, functions)
            deps = tuple(take_deps(key))
            readers = None if take_readers is None else take_readers(key, 0)
            name = key[0] if type(key) is tuple and key else None  # (shared by a collection)
            prefix = None if name is None else prefixes.get(name)
            if prefix is None:
                prefix = key_prefix(key)
                prefix = shared.setdefault(prefix, prefix)
                if name is not None:
                    prefixes[name] = prefix
            files = urls_in(payload) if find_files else ()
            part.append(
                s.NewTask(key, payload, functions, deps, take_priority(key), prefix, readers, files)
            )
            if len(part) >= SUBMIT_PART:
                self._send_part(run, part, encoder, sent, opening)
                opening, part = None, []
                if run.done.is_set():
                    return  # it failed already: stop preparing the rest
                if tables and len(nodes) < compact_at:
                    _compact(tables)
                    compact_at = len(nodes) // 2
        if not keep:  # the plan's tables go before the state has built every record
            for table in (nodes, dependencies, priorities, plan.dependents, plan.order):
                table.clear()
        self._send_part(run, part, encoder, sent, opening, last=arriving)
        run.info.hoisting_candidates = sorted(encoder.modules)

    def _send_part(
        self,
        run: Run,
        part: list[s.NewTask],
        encoder: TaskEncoder,
        sent: set[bytes],
        opening: s.SubmitRun | None,
        last: bool = False,
    ) -> None:
        """Send one part and the functions not sent yet: the first part (``opening``)
        opens the run, the others extend it (``last``: an arriving run's last part)."""
        functions = {f: c for f, c in encoder.functions.items() if f not in sent}
        sent.update(functions)
        annotated, planned = run.annotated, run.planned  # (the live view's progress)
        for name, count in Counter(
            annotated.get(t.key, t.prefix) if annotated else t.prefix for t in part
        ).items():
            planned[name] = planned.get(name, 0) + count
        # Wait for the I/O thread to take an earlier part (``Run.parts_ahead``); a dead
        # thread or a run that ended already takes none, and ``_command`` says why.
        while not run.parts_ahead.acquire(timeout=PART_WAIT):
            if run.done.is_set() or self._io.error is not None or self._closed:
                break
        if opening is not None:
            event = opening._replace(tasks=part, functions=functions)
            self._command(Submit(run, event, event.watched))
        else:
            self._command(Extend(run, s.ExtendRun(run.id, part, functions, last)))

    def scale(self, provider: Any, **pool_options: Any) -> WorkerPool:
        """Keep workers on a batch system, sized to the work, through a Parsl provider.

        ``pool_options`` are ``WorkerPool``'s: ``min_workers``, ``max_workers``, ``cores``,
        ``memory``, ``disk``, ``idle_timeout``, ``poll_interval``, ``python`` and
        ``manager_timeout`` (the workers' ``--manager-timeout``, s). The pool runs until
        its ``close()`` or the manager's, which cancel its jobs.
        """
        from daskvine_py.batch.pool import WorkerPool

        if self._closed:
            raise RuntimeError("the manager is closed")
        pool = WorkerPool(self, provider, **pool_options)
        self._pools.append(pool)
        return pool

    def demand(self) -> Demand:
        """The cores the work could use now and each worker's idle time (updated every
        0.1 s by the I/O thread, from the first call on): what worker pools size
        themselves on."""
        self._io.registry.wants_demand = True
        return self._io.registry.demand

    def retire(self, name: str, reason: str = "retired") -> None:
        """Tell the worker ``name`` to leave (it finishes nothing more; idle workers only)."""
        self._command(Retire(name, reason))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers this manager started, tell the others to leave, and stop."""
        if self._closed:
            return
        check_seconds("close(timeout=...)", timeout, zero=True)
        for pool in self._pools:
            pool.close()
        self._closed = True
        self._views.close()
        self._command(Close())
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
        self._shipping.close()
        self._io.close_pipe()
        self.cache.close()
        connection.remove_paths(self._cleanup_paths)
        lifecycle.unwatch(self)

    def _close_sockets(self) -> None:
        self._router.close(linger=0)
        if self._gate is not None:
            self._gate.stop()
        self._context.term()

    # -- caller side of the command queue -----------------------------------------------

    def _command(self, command: Command) -> None:
        if self._closed and type(command) is not Close:
            raise RuntimeError("the manager is closed")
        self._io.command(command)

    def _raise_if_dead(self) -> None:
        if self._io.error is not None:
            raise self._io.dead_error()


def _compact(tables: Iterable[dict[Any, Any]]) -> None:
    """Each table rebuilt at the size of what it holds now, in place."""
    for table in tables:
        held = dict(table)
        table.clear()  # (frees the table it grew to)
        table.update(held)


def _uses_cache(run: RunOptions, manager: ManagerOptions) -> bool:
    """``get(cache=...)``, else the manager's ``cache``; a cache directory implies it."""
    if run.cache is not None:
        return run.cache
    return manager.cache or run.cache_dir is not None or manager.cache_dir is not None
