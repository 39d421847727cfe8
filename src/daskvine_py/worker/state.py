"""The worker's bookkeeping as a sans-I/O state machine: events in, instructions out.

``shell.Worker`` is the I/O shell (ZeroMQ, pipes, processes, the filesystem); this is
everything it decides. It never reads a clock (``now`` is passed in), never touches a
socket, a pipe or a process. Its one collaborator is the ``Store`` of results (which may
spill to disk, as distributed's ``WorkerState.data`` may): membership, put, release.

``WorkerState`` holds the tasks, their transitions and the manager's liveness, and owns
three components, each with its own state, which the shell never sees:

- ``fetcher`` (``fetching.Fetcher``): copies of inputs from peers, and relays;
- ``live_tasks`` (``live_tasks.LiveTasks``): the results libraries keep live, exports;
- ``dispatch`` (``dispatch.Dispatch``): the libraries, the queues of tasks ready to run,
  the requests to send them, chains and stealing.

Events are the methods named ``on_*`` (a record from the manager, a reply from a peer, a
library's reply or death, a task process's exit, a timer pass). Instructions accumulate
where the shell takes them each loop pass (the components write into them):

- ``outbox``: records for the manager (``TaskDone``, ``FetchFailed``, ``Withdrawn``...;
  ``Started`` once per pass for the tasks sent to run, before any report of them);
- ``peer_outbox``: peer address -> ids of results to ask it for (``GetData``);
- ``library_outbox``: (library id, ``Export`` or ``Forget``) to write to library pipes;
- ``peer_replies``: (peer identity, ``Data``) for peers that waited for an export;
- ``activity``: bars of what ran, was fetched and spilled, taken by each heartbeat;
- ``start_runnable`` returns the requests to write to library pipes, and
  ``next_process_task`` the next task to start in a fresh interpreter.

A task moves through these states; every legal edge is in ``_TRANSITIONS`` and any other
raises ``InvalidTransition``::

    new ──► waiting ──► queued ──► running ──► forgotten
     │        │           ▲ │         │
     │        │           │ └─────────┼──► forgotten  (cancelled, input lost, cannot start)
     │        │           └───────────┘    (its library died before it started)
     │        └──► forgotten                (cancelled, withdrawn, no peer could serve)
     └──► queued / forgotten                (inputs all here / one input held nowhere)

``waiting``: some inputs are not in the store yet (fetched from peers, or computed here);
``queued``: every input is here, it waits for a library slot (or a task process slot);
``running``: sent to a library or a task process; ``forgotten``: out of ``tasks``, with
nothing left of it in any other container.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from daskvine_py.errors import InvalidTransition, SerializationError
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps_exception, type_name
from daskvine_py.worker import pipe
from daskvine_py.worker.activity import PROCESS_LANE, Activity
from daskvine_py.worker.dispatch import Dispatch
from daskvine_py.worker.fetching import Fetch, Fetcher
from daskvine_py.worker.live_tasks import MANAGER_IDENT, LiveTasks
from daskvine_py.worker.records import LibraryRecord, TaskStateName, WorkerTask
from daskvine_py.worker.store import Store
from daskvine_py.worker.transitions import TRANSITIONS as _TRANSITIONS
from daskvine_py.worker.transitions import bind
from daskvine_py.worker.transitions import illegal as _illegal

logger = logging.getLogger("daskvine_py.worker")

#: Run configurations kept for runs that may still send tasks; older ones are forgotten.
MAX_RUN_CONFIGS = 256
#: A worker connected to its manager (the connection up, the handshake done) waits this
#: many ``manager_timeout``s for the answer to its registration (10 minutes by default):
#: a manager busy welcoming a storm of workers is not a dead one. Unconnected, it gives
#: up after one ``manager_timeout``, counted from the registration or the disconnection.
REGISTRATION_PATIENCE = 20


class WorkerState:
    """The worker's tasks and manager liveness, and its components; see the module
    docstring. ``peer_address`` names this worker in ``FetchFailed``; ``name`` in
    crash reasons."""

    def __init__(
        self,
        store: Store,
        name: str = "worker",
        peer_address: str = "",
        manager_timeout: float = 30.0,
        fetch_timeout: float = 10.0,
        now: float = 0.0,
    ) -> None:
        self.store = store
        self.name = name
        self.peer_address = peer_address
        self.manager_timeout = manager_timeout
        self.heartbeat_interval = 1.0
        #: task id -> its record, from ``Execute`` until it is forgotten
        self.tasks: dict[int, WorkerTask] = {}
        #: input being computed here -> tasks sent ahead that wait for it
        self.local_waiters: dict[int, set[int]] = {}
        #: run id -> how its tasks run, for runs that do not use the defaults
        self.run_configs: dict[int, p.RunConfig] = {}
        self.disk_full = False
        #: instructions for the shell; see the module docstring
        self.outbox: list[p.ToManager] = []
        self.peer_outbox: dict[str, list[int]] = {}
        self.library_outbox: list[tuple[int, pipe.Export | pipe.Forget]] = []
        self.peer_replies: list[tuple[bytes, p.Data]] = []
        #: tasks that went running since the last ``Started`` (one record per loop pass)
        self.started: list[WorkerTask] = []
        #: running tasks stopped by ``Abort``, whose process the shell kills (their
        #: library: ``task.lib``, or their task process), and the libraries so killed
        self.aborted: list[WorkerTask] = []
        self.aborting: set[int] = set()
        #: what ran, was fetched and spilled here since the last heartbeat (its bars)
        self.activity = Activity()
        store.on_spill = self.activity.add_spills
        self.fetcher = Fetcher(fetch_timeout, self.outbox, self.peer_outbox, self._fetch_failed)
        self.live_tasks = LiveTasks(store, self.outbox, self.library_outbox, self.peer_replies)
        #: the results the libraries keep live (``live_tasks``'s), read here and by the shell
        self.live = self.live_tasks.live
        self.dispatch = Dispatch(
            self.tasks, self.local_waiters, self.live_tasks, store, self._transition,
            self._input_lost,
        )  # fmt: skip
        #: legal edges -> what each does besides setting the state (``transitions``); the
        #: dispatch's queues called directly, with no call of ours in between
        self._steps = bind(_TRANSITIONS, {
            "enqueue": self.dispatch.enqueue, "start": self.started.append,  # (``Started``)
            "requeue": self._requeue, "forget": self._forget,
            "forget_running": self._running_to_forgotten,
        })  # fmt: skip
        #: the manager welcomed us; when we last heard from it and sent it a heartbeat
        self.registered = False
        self.last_contact = now
        self.last_sent = 0.0
        #: when the registration went out (None: not yet, its libraries still starting):
        #: the manager's silence counts from then, not from the worker's start
        self.registration_sent: float | None = None
        #: the connection to the manager is up (the shell's ``HandshakeWatch`` says)
        self.manager_connected = False
        #: what answers there sent something unreadable: not a busy manager, no patience
        self.manager_garbled = False
        #: the one warning that it still waits for its welcome, connected, has been given
        self.warned_waiting = False

    @property
    def functions(self) -> dict[bytes, bytes]:
        """Function id -> cloudpickle bytes, for task processes."""
        return self.dispatch.functions

    @property
    def process_runnable(self) -> Collection[int]:
        """Tasks queued for task processes (some may have been forgotten since)."""
        return self.dispatch.process_runnable

    # -- timers -----------------------------------------------------------------------

    def poll_timeout(self, now: float) -> float:
        """Seconds until the next deadline: the manager's silence, the next heartbeat, a
        fetch's timeout; 0 while records wait to be sent."""
        if self.outbox or self.peer_replies:
            return 0.0
        if self.registration_sent is None and not self.registered:
            deadline = now + self.manager_timeout  # no clock runs until it goes out
        elif self._waits_connected():
            sent = self.registration_sent or now
            patience = REGISTRATION_PATIENCE if self.warned_waiting else 1
            deadline = sent + patience * self.manager_timeout
        else:
            deadline = self.last_contact + self.manager_timeout
        if self.registered:  # heartbeats start with registration; until then, nothing is due
            deadline = min(deadline, self.last_sent + self.heartbeat_interval)
        return max(0.0, self.fetcher.deadline(deadline) - now)

    def manager_silent(self, now: float) -> bool:
        if self.registration_sent is None and not self.registered:
            return False  # nothing asked of the manager yet: its silence means nothing
        if self._waits_connected():
            waited = now - (self.registration_sent or now)
            return waited > REGISTRATION_PATIENCE * self.manager_timeout
        return now - self.last_contact > self.manager_timeout

    def _waits_connected(self) -> bool:
        return not self.registered and self.manager_connected and not self.manager_garbled

    def waiting_warning_due(self, now: float) -> bool:
        """Once: the registration has waited ``manager_timeout`` for an answer over a
        connection that is up, and the worker waits on (the shell says so)."""
        if self.warned_waiting or not self._waits_connected() or self.registration_sent is None:
            return False
        if now - self.registration_sent <= self.manager_timeout:
            return False
        self.warned_waiting = True
        return True

    def on_manager_connection(self, connected: bool, now: float) -> None:
        """The connection to the manager went up or down. Down, an unanswered registration
        has one ``manager_timeout`` from now for the connection to come back."""
        if connected is self.manager_connected:
            return
        self.manager_connected = connected
        if not connected and not self.registered:
            self.last_contact = now

    def on_registration_sent(self, now: float) -> None:
        """The registration went out: the manager has ``manager_timeout`` to answer."""
        if self.registration_sent is None:
            self.registration_sent = now
            self.last_contact = now

    def heartbeat_due(self, now: float) -> bool:
        return self.registered and now - self.last_sent > self.heartbeat_interval

    def on_timers(self, now: float) -> list[str]:
        """Fetches past their deadline go to their next holder; the peers that did not
        answer, whose sockets the shell resets."""
        return self.fetcher.on_timers(now)

    def end_pass(self, now: float) -> None:
        """Once per loop pass: report the tasks that started, start fetches that found a
        slot, report a change of the store's fullness and the bytes received from peers,
        spill live results past the memory limit."""
        if self.started:
            self._report_started()
        fetcher = self.fetcher
        if fetcher.slots.freed:  # (most passes: no call)
            fetcher.start_queued(now)
        if self.store.full is not self.disk_full:
            self.disk_full = self.store.full
            logger.warning("worker %s disk full: %s", self.name, self.disk_full)
            self.outbox.append(p.DiskFull(self.disk_full))
        if fetcher.received_from:
            fetcher.report_received()
        store = self.store
        live = self.live
        if store.memory_limit is not None and live.nbytes:  # (running tasks' room counts too)
            excess = live.nbytes - live.leaving_bytes + store.memory_bytes + store.allocated
            excess -= store.memory_limit
            if excess > 0:
                self.live_tasks.evict(excess)

    # -- the manager ------------------------------------------------------------------

    def on_manager_message(self, msg: Any, now: float) -> None:
        """A valid record from the manager (``Rejected`` and ``Shutdown`` are the shell's).

        ``msg`` is one of ``p.TO_WORKER``, told apart by its type once (``Any``: a type
        checker cannot narrow a union through that one ``type()``)."""
        self.last_contact = now
        kind = type(msg)
        if kind is p.Execute:
            self._on_execute(msg, now)
        elif kind is p.RunConfig:
            if len(self.run_configs) >= MAX_RUN_CONFIGS:
                del self.run_configs[next(iter(self.run_configs))]
            self.run_configs[msg.run_id] = msg
        elif kind is p.Function:
            self.dispatch.add_function(msg.function_id, bytes(msg.code))
        elif kind is p.Release:
            for task_id in msg.task_ids:
                self.store.release(task_id)
            self.live_tasks.forget(msg.task_ids)
        elif kind is p.Cancel:
            for task_id in msg.task_ids:
                self._cancel(task_id)
        elif kind is p.Abort:
            self._abort(msg.task_ids)
        elif kind is p.Withdraw:
            dropped = tuple(task_id for task_id in msg.task_ids if self._cancel(task_id))
            if dropped:
                self.outbox.append(p.Withdrawn(dropped))
        elif kind is p.Replicate:
            if msg.task_id in self.store or msg.task_id in self.live:
                self.outbox.append(p.Replicas((msg.task_id,)))
            else:
                self.fetcher.replicate(msg.task_id, msg.peers, now)
        elif kind is p.Upload:
            for task_id in msg.task_ids:
                value = self.store.get(task_id, use=False)
                if value is None and self.live_tasks.serve_peer(task_id, MANAGER_IDENT):
                    continue  # uploaded once its library has exported it
                self.outbox.append(p.Uploaded(task_id, value))
        elif kind is p.Relayed:
            if self.fetcher.relayed(msg.task_id):
                self.on_data(p.Data(msg.task_id, msg.value), now)
        elif kind is p.Welcome:
            self.registered = True
            self.heartbeat_interval = msg.heartbeat_interval

    def cannot_take(self, message: Any, why: str) -> None:
        """An ``Execute`` that was dropped (``message``: whatever arrived, perhaps
        malformed): forget what was kept of its task, and tell the manager, which would
        otherwise wait for it forever."""
        if type(message) is not p.Execute or len(message) < 1 or type(message[0]) is not int:
            return
        task_id = message[0]
        task = self.tasks.get(task_id)
        if task is not None and task.state == "running":
            return  # an earlier Execute of it runs: its own report will come
        if task is not None:
            self._transition(task, "forgotten")
        # What a handler that failed half-way kept of it, found by id.
        for dep_id in [d for d, waiters in self.local_waiters.items() if task_id in waiters]:
            self.local_waiters[dep_id].discard(task_id)
            if not self.local_waiters[dep_id]:
                del self.local_waiters[dep_id]
        self.fetcher.unwait_all(task_id)
        self.outbox.append(p.TaskCrashed(task_id, f"worker {self.name}: {why}"))

    def _on_execute(self, msg: p.Execute, now: float) -> None:
        if msg.task_id in self.tasks:
            return  # re-sent after a cancel while it was running: its result is coming
        task = WorkerTask(msg, self.run_configs.get(msg.run_id))
        for dep in msg.deps:
            if dep.value is not None or dep.task_id in self.store or dep.task_id in self.live:
                continue
            if dep.peers is None:  # being computed here: start when it is done
                task.missing.add(dep.task_id)
                self.local_waiters.setdefault(dep.task_id, set()).add(task.id)
                continue
            if not dep.peers:  # the manager thinks we hold it, but we do not
                self._input_lost(task, dep.task_id)
                return
            task.missing.add(dep.task_id)
            self.fetcher.want(dep.task_id, dep.peers, task.id, now)
        self.tasks[task.id] = task
        if task.missing:
            self._transition(task, "waiting")
            self.dispatch.follow(task)
        else:
            self.dispatch.queue(task)

    def _cancel(self, task_id: int) -> bool:
        """Drop a task that has not started; whether it was dropped."""
        task = self.tasks.get(task_id)
        if task is not None and task.state != "running":
            self._transition(task, "forgotten")
            return True
        return False

    def _abort(self, task_ids: Sequence[int]) -> None:
        """Stop these tasks with no report (the manager gave them to another worker):
        dropped if unstarted, else what runs them is killed (``aborted``)."""
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            if task.state == "running":
                self.aborted.append(task)
                if task.lib is not None:
                    self.aborting.add(task.lib)
            self._transition(task, "forgotten")  # a late reply finds no task to report

    def take_aborted(self) -> list[WorkerTask]:
        """The running tasks aborted since the last call, for the shell to kill."""
        aborted = self.aborted[:]
        self.aborted.clear()
        return aborted

    def _input_lost(self, task: WorkerTask, dep_id: int) -> None:
        """An input of ``task`` is held nowhere here: the manager decides (``FetchFailed``)."""
        self.outbox.append(p.FetchFailed(task.id, dep_id, (self.peer_address,)))
        self._transition(task, "forgotten")

    # -- peers ------------------------------------------------------------------------

    def _fetch_failed(self, fetch: Fetch) -> None:
        """No holder could serve ``fetch``: the tasks that waited for it are reported."""
        for task_id in fetch.waiters:
            task = self.tasks.get(task_id)
            if task is not None:
                self.outbox.append(p.FetchFailed(task_id, fetch.dep_id, fetch.peers))
                task.missing.discard(fetch.dep_id)
                self._transition(task, "forgotten")

    def on_peer_unreachable(self, address: str, ids: list[int], now: float) -> None:
        """Requests that could not be sent to ``address``: their fetches try the next holder."""
        self.fetcher.on_unreachable(address, ids, now)

    def on_data(self, reply: p.Data, now: float) -> None:
        """A peer's answer: the input (stored, its tasks queued) or None (ask the next)."""
        fetch = self.fetcher.on_data(reply, now)
        value = reply.value
        if fetch is None or value is None:  # (a fetch is done only with a value)
            return
        self.store.put(reply.task_id, value)
        self.activity.add_interval(p.FETCH_LANE, fetch.started, now)
        self.outbox.append(p.Replicas((reply.task_id,)))
        self._input_arrived(reply.task_id, fetch.waiters)

    def _input_arrived(self, dep_id: int, waiters: set[int]) -> None:
        for task_id in waiters:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            task.missing.discard(dep_id)
            if not task.missing and task.state == "waiting":  # (else queued already)
                self.dispatch.queue(task)

    # -- libraries --------------------------------------------------------------------

    def add_library(self, library_id: int, slots: int) -> LibraryRecord:
        """A library process started: it will be sent every function known so far."""
        return self.dispatch.add_library(library_id, slots)

    def start_runnable(self) -> Sequence[tuple[LibraryRecord, pipe.Run]]:
        """The requests to write to library pipes (``Dispatch.start_runnable``)."""
        return self.dispatch.start_runnable()

    def call(self, task: WorkerTask) -> pipe.Call:
        """What a task process runs: the task with its inputs' values."""
        return self.dispatch.call(task)

    def on_library_ready(self, lib: LibraryRecord) -> bool:
        """A library finished starting; whether every library is now ready."""
        return self.dispatch.on_ready(lib)

    def on_library_reply(
        self, lib: LibraryRecord, reply: pipe.Reply | pipe.Exported, wall: float
    ) -> None:
        """A task's outcome from a library (``wall``: the clock for ``TaskDone.finished``),
        or a result it exported."""
        if isinstance(reply, pipe.Exported):
            self.on_exported(reply)
            return
        sent = lib.sent
        if sent and sent[0] == reply.task_id:
            sent.popleft()
        else:
            sent.remove(reply.task_id)
        self.on_reply(reply, wall, lib.id)

    def on_exported(self, reply: pipe.Exported) -> None:
        """A live result, serialized: into the store (the copy every later reader gets),
        then to the tasks and peers that waited for it."""
        wait = self.live_tasks.on_exported(reply)
        if wait is None:
            return
        task_id = reply.task_id
        if reply.value is not None and task_id in self.store:
            self._input_arrived(task_id, wait.tasks)
            return
        for waiter in wait.tasks:  # it could not be serialized: they cannot run elsewhere
            task = self.tasks.get(waiter)
            if task is None:
                continue
            dep_key = next((d.key for d in task.deps if d.task_id == task_id), task_id)
            error = SerializationError(
                dep_key, "an input", f"{reply.error} (moving it out of its library process "
                f"on worker {self.name})",
            )  # fmt: skip
            exception, text = dumps_exception(error)
            self.outbox.append(p.TaskErred(waiter, exception, text, str(error), type_name(error)))
            task.missing.discard(task_id)
            self._transition(task, "forgotten")

    def on_library_death(
        self, lib: LibraryRecord, how: str, running: Collection[int] | None = None
    ) -> None:
        """A library process died (``how``: its exit): the tasks it was ``running`` (by
        default the first ones sent) crashed; the others sent to it, finished or not
        (their replies may have been held), go back to the front of the queue; the
        results it kept live are lost (the manager recomputes those still needed). One
        killed to abort a task crashed none: the others it ran go back to the queue too."""
        self.dispatch.drop_library(lib.id)  # its chained calls are in ``lib.sent``: requeued
        if lib.id in self.aborting:
            self.aborting.discard(lib.id)
            running = ()
        elif running is None:
            running = list(lib.sent)[: lib.slots]
        for task_id in running:
            task = self.tasks.get(task_id)
            if task is not None and task.state == "running" and task_id in lib.sent:
                lib.sent.remove(task_id)
                reason = f"library process {how} on worker {self.name}"
                logger.warning("task %r: %s", task.key, reason)
                self._transition(task, "forgotten")
                self.outbox.append(p.TaskCrashed(task.id, reason))
        for task_id in reversed(lib.sent):
            queued = self.tasks.get(task_id)
            if queued is not None:
                self._transition(queued, "queued")
        lib.sent.clear()
        self.dispatch.unhome(lib.id)
        lost = self.live_tasks.lose(lib.id, self.store)
        for task_id, wait in self.live_tasks.abandon(lib.id):
            self.live_tasks.answer_peers(task_id, wait.peers, None)
            for waiter in wait.tasks:
                task = self.tasks.get(waiter)
                if task is not None:
                    task.missing.discard(task_id)
                    self._input_lost(task, task_id)
        if lost:
            logger.warning(
                "worker %s lost %d results kept live by its library process", self.name, len(lost)
            )
            self.outbox.append(p.Lost(tuple(lost)))

    def on_exhausted(
        self, lib: LibraryRecord, task_id: int, peak: int, limit: int, kind: str = "memory"
    ) -> None:
        """A task's library was stopped for memory (``kind``: its own use, "memory", or
        the worker's budget, "budget"): reported so (its library's death follows)."""
        task = self.tasks.get(task_id)
        if task is not None and task.state == "running" and task_id in lib.sent:
            lib.sent.remove(task_id)
            self._transition(task, "forgotten")
            self.outbox.append(p.TaskExhausted(task_id, kind, peak, limit))

    def on_reply(self, reply: pipe.Reply, wall: float, lib: int | None = None) -> None:
        """A task's outcome, from a library (``lib``) or a task process."""
        task = self.tasks.get(reply.task_id)
        if task is None or (lib is not None and task.lib != lib):
            return  # forgotten (aborted), or sent again since to another library
        self._transition(task, "forgotten")
        if isinstance(reply, pipe.Done):
            task_id, value, duration, nbytes, live, serialization, cpu, peak = reply
            self.dispatch.recent_duration.observe(duration)
            start = wall - duration - serialization  # (``wall``: ``TaskDone.finished``)
            self.activity.add_task(lib or PROCESS_LANE, task.key, start, wall, serialization)
            keep = task.keep
            if keep is None:  # (the cache's outputs) kept when too large to travel inline
                keep = value is not None and not p.inlinable(value)
                live = False  # (the library kept nothing: ``Call.keep`` was None)
            if keep:
                if live and lib is not None:
                    self.live.add(task_id, lib, nbytes)
                if value is not None:
                    self.store.put(task_id, value)
            waiters = self.local_waiters.pop(task_id, None)
            if waiters:
                self._input_arrived(task_id, waiters)
            if value is not None and not task.want_result and not p.inlinable(value):
                value = None
            done = p.TaskDone(task_id, nbytes, duration, value, wall, serialization, cpu, peak)
            self.outbox.append(done)
        elif isinstance(reply, pipe.Erred):
            self.outbox.append(p.TaskErred(*reply))
        elif isinstance(reply, pipe.Missing):  # its producer failed: the manager decides
            self.outbox.append(p.FetchFailed(task.id, reply.dep_id, (self.peer_address,)))
        else:  # Crashed: the process running it died (fork and tasks modes)
            logger.warning("task %r: %s", task.key, reply.reason)
            self.outbox.append(p.TaskCrashed(reply.task_id, reply.reason))

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def next_process_task(self) -> WorkerTask | None:
        """The next task to start in a fresh interpreter, if any."""
        return self.dispatch.next_process_task()

    def on_process_started(self, task: WorkerTask) -> None:
        self._transition(task, "running")

    def on_process_failed(self, task: WorkerTask, why: str) -> None:
        """Its process could not be started."""
        self._transition(task, "forgotten")
        reason = f"cannot start a task process on worker {self.name}: {why}"
        self.outbox.append(p.TaskCrashed(task.id, reason))

    # -- transitions ------------------------------------------------------------------

    def _transition(self, task: WorkerTask, finish: TaskStateName) -> None:
        step = self._steps.get((task.state, finish), _illegal)
        if step is _illegal:
            raise InvalidTransition(task.key, task.state, finish, [])
        task.state = finish
        if step is not None:  # three transitions per task: skip the empty calls
            step(task)

    def _forget(self, task: WorkerTask) -> None:
        """Out of ``tasks``, and out of the fetches, local waits and exports it was in."""
        self.tasks.pop(task.id, None)
        for dep_id in task.missing:
            waiters = self.local_waiters.get(dep_id)
            if waiters is not None:
                waiters.discard(task.id)
                if not waiters:
                    del self.local_waiters[dep_id]
            self.fetcher.unwait(dep_id, task.id)
            self.live_tasks.unwait(dep_id, task.id)  # the export still arrives, into the store

    def _running_to_forgotten(self, task: WorkerTask) -> None:
        if self.started:  # its report follows the news that it started
            self._report_started()
        self.tasks.pop(task.id, None)  # running: nothing missing, nothing fetched for it

    def _requeue(self, task: WorkerTask) -> None:
        if self.started:
            self._report_started()
        self.dispatch.requeue(task)

    def _report_started(self) -> None:
        self.outbox.append(p.Started(tuple(task.id for task in self.started)))
        self.started.clear()

    def leaks(self) -> Iterator[str]:
        """Containers that still hold something: names, for tests of a quiet worker."""
        for name in ("tasks", "local_waiters", "peer_outbox", "aborted", "aborting"):
            if getattr(self, name):
                yield name
        yield from self.fetcher.leaks()
        yield from self.live_tasks.leaks()
        yield from self.dispatch.leaks()
