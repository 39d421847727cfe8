"""The worker's bookkeeping as a sans-I/O state machine: events in, instructions out.

``worker.Worker`` is the I/O shell (ZeroMQ, pipes, processes, the filesystem); this is
everything it decides. It never reads a clock (``now`` is passed in), never touches a
socket, a pipe or a process. Its one collaborator is the ``Store`` of results (which may
spill to disk, as distributed's ``WorkerState.data`` may): membership, put, release.

Events are the methods named ``on_*`` (a record from the manager, a reply from a peer, a
library's reply or death, a task process's exit, a timer pass). Instructions accumulate
where the shell takes them each loop pass:

- ``outbox``: records for the manager (``TaskDone``, ``FetchFailed``, ``Withdrawn``...);
- ``peer_outbox``: peer address -> ids of results to ask it for (``GetData``);
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
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from daskvine_py.ema import Ema
from daskvine_py.errors import InvalidTransition
from daskvine_py.wire import protocol as p
from daskvine_py.worker import pipe
from daskvine_py.worker.fetching import Fetch, TransferSlots
from daskvine_py.worker.live_results import ExportWait, LiveResults
from daskvine_py.worker.live_tasks import MANAGER_IDENT, QUEUED_REQUEST_BYTES, RELAY, LiveHandling
from daskvine_py.worker.records import LibraryRecord, TaskStateName, WorkerTask
from daskvine_py.worker.store import Store

logger = logging.getLogger("daskvine_py.worker")

#: Tasks a library may be sent at once when tasks are tiny (recent runs under
#: ``TINY_TASK`` seconds). More saves pipe round trips; each queued task is committed to
#: that library, so longer tasks go one at a time and idle libraries are never starved.
LIBRARY_BATCH = 8
TINY_TASK = 0.001
#: Tasks shorter than this (recent runs) get the next task queued in their library's
#: pipe while they run, saving the library a wait for the worker between tasks. Longer
#: tasks do not: a queued task is committed to its library, and another might free up.
SHORT_TASK = 0.05
#: Run configurations kept for runs that may still send tasks; older ones are forgotten.
MAX_RUN_CONFIGS = 256


#: ``start_runnable``'s answer when nothing is runnable: no list made per loop pass.
_NO_REQUESTS: tuple = ()

class WorkerState(LiveHandling):
    """The worker's tasks, fetches, libraries and manager liveness; see the module
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
        self.fetch_timeout = fetch_timeout
        self.heartbeat_interval = 1.0
        #: task id -> its record, from ``Execute`` until it is forgotten
        self.tasks: dict[int, WorkerTask] = {}
        #: queued tasks for any library, for one library (``homed``: their inputs are
        #: live there only), and for task processes (``task_mode="tasks"``), in order; ids
        #: of tasks forgotten or started meanwhile are skipped when popped
        self.runnable: deque[int] = deque()
        self.homed: dict[int, deque[int]] = {}
        self.process_runnable: deque[int] = deque()
        #: results the libraries keep live, and exports of them under way
        self.live = LiveResults(store)
        #: library id -> calls to send it behind the task they wait for (``_follow``)
        self.chained: dict[int, list[pipe.Call]] = {}
        self.exports: dict[int, ExportWait] = {}
        #: input id -> its copy from peers in progress
        self.fetches: dict[int, Fetch] = {}
        #: requests in flight overall and per peer, and fetches waiting for a free slot
        self.slots = TransferSlots()
        #: input being computed here -> tasks sent ahead that wait for it
        self.local_waiters: dict[int, set[int]] = {}
        #: library id -> its record, in start order
        self.libraries: dict[int, LibraryRecord] = {}
        #: run id -> how its tasks run, for runs that do not use the defaults
        self.run_configs: dict[int, p.RunConfig] = {}
        #: function id -> cloudpickle bytes: resident for the worker's life
        self.functions: dict[bytes, bytes] = {}
        #: recent task run times, to decide whether to batch tasks to libraries
        self.recent_duration = Ema()
        #: bytes received per peer address since the last ``Transfers`` report
        self.received_from: dict[str, int] = {}
        self.disk_full = False
        #: instructions: records for the manager, result ids to ask each peer for,
        #: (library id, ``Export``/``Forget``) for libraries, answers to peers (identity,
        #: ``Data``) that waited for an export
        self.outbox: list[Any] = []
        self.peer_outbox: dict[str, list[int]] = {}
        self.library_outbox: list[tuple[int, Any]] = []
        self.peer_replies: list[tuple[bytes, p.Data]] = []
        #: the manager welcomed us; when we last heard from it and last sent to it
        self.registered = False
        self.last_contact = now
        self.last_sent = 0.0

    # -- timers -----------------------------------------------------------------------

    def poll_timeout(self, now: float) -> float:
        """Seconds until the next deadline: the manager's silence, the next heartbeat, a
        fetch's timeout; 0 while records wait to be sent."""
        if self.outbox or self.peer_replies:
            return 0.0
        deadline = self.last_contact + self.manager_timeout
        if self.registered:  # heartbeats start with registration; until then, nothing is due
            deadline = min(deadline, self.last_sent + self.heartbeat_interval)
        for fetch in self.fetches.values():
            if fetch.deadline < deadline:
                deadline = fetch.deadline
        return max(0.0, deadline - now)

    def manager_silent(self, now: float) -> bool:
        return now - self.last_contact > self.manager_timeout

    def heartbeat_due(self, now: float) -> bool:
        return self.registered and now - self.last_sent > self.heartbeat_interval

    def on_timers(self, now: float) -> list[str]:
        """Fetches past their deadline go to their next holder; the peers that did not
        answer, whose sockets the shell resets."""
        silent = []
        for fetch in [f for f in self.fetches.values() if f.deadline <= now]:
            if self.fetches.get(fetch.dep_id) is not fetch:
                continue  # dropped with a task that an earlier failure here cancelled
            logger.warning(
                "peer did not serve result %d within %.1f s", fetch.dep_id, self.fetch_timeout
            )
            if fetch.current:
                silent.append(fetch.current)
            fetch.unreached = True
            self.slots.give_back(fetch)
            self._request_next(fetch, now)
        return silent

    def end_pass(self, now: float) -> None:
        """Once per loop pass: start fetches that found a slot, report a change of the
        store's fullness and the bytes received from peers."""
        if self.slots.freed and self.slots.queue:
            for fetch, address in self.slots.startable(self._fetch_is_live):
                self._request(fetch, address, now)
        if self.store.full is not self.disk_full:
            self.disk_full = self.store.full
            logger.warning("worker %s disk full: %s", self.name, self.disk_full)
            self.outbox.append(p.DiskFull(self.disk_full))
        if self.received_from:
            self.outbox.append(p.Transfers(tuple(self.received_from.items())))
            self.received_from = {}
        limit = self.store.memory_limit
        if limit is not None and self.live.nbytes:
            live = self.live
            excess = live.nbytes - live.leaving_bytes + self.store.memory_bytes - limit
            if excess > 0:
                self._evict(excess)

    # -- the manager ------------------------------------------------------------------

    def on_manager_message(self, msg: Any, now: float) -> None:
        """A valid record from the manager (``Rejected`` and ``Shutdown`` are the shell's)."""
        self.last_contact = now
        kind = type(msg)
        if kind is p.Execute:
            self._on_execute(msg, now)
        elif kind is p.RunConfig:
            if len(self.run_configs) >= MAX_RUN_CONFIGS:
                del self.run_configs[next(iter(self.run_configs))]
            self.run_configs[msg.run_id] = msg
        elif kind is p.Function:
            self.functions[msg.function_id] = bytes(msg.code)
            for lib in self.libraries.values():
                lib.unsent.append(msg.function_id)
        elif kind is p.Release:
            for task_id in msg.task_ids:
                self.store.release(task_id)
            self._drop_live(msg.task_ids)
        elif kind is p.Cancel:
            for task_id in msg.task_ids:
                self._cancel(task_id)
        elif kind is p.Withdraw:
            dropped = tuple(task_id for task_id in msg.task_ids if self._cancel(task_id))
            if dropped:
                self.outbox.append(p.Withdrawn(dropped))
        elif kind is p.Replicate:
            self._on_replicate(msg, now)
        elif kind is p.Upload:
            for task_id in msg.task_ids:
                value = self.store.get(task_id, use=False)
                if value is None and self.serve_peer(task_id, MANAGER_IDENT):
                    continue  # uploaded once its library has exported it
                self.outbox.append(p.Uploaded(task_id, value))
        elif kind is p.Relayed:
            fetch = self.fetches.get(msg.task_id)
            if fetch is not None and fetch.current == RELAY:
                self.on_data(p.Data(msg.task_id, msg.value), now)
        elif kind is p.Welcome:
            self.registered = True
            self.heartbeat_interval = msg.heartbeat_interval

    def cannot_take(self, message: Any, why: str) -> None:
        """An ``Execute`` that was dropped: forget what was kept of its task, and tell the
        manager, which would otherwise wait for it forever."""
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
        for fetch in list(self.fetches.values()):
            fetch.waiters.discard(task_id)
            if not fetch.waiters and not fetch.replicate:  # for nobody: a later task would
                del self.fetches[fetch.dep_id]  # wait on it forever, never requested
                self.slots.give_back(fetch)
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
                self.outbox.append(p.FetchFailed(task.id, dep.task_id, (self.peer_address,)))
                self._transition(task, "forgotten")
                return
            task.missing.add(dep.task_id)
            fetch = self.fetches.get(dep.task_id)
            if fetch is None:
                fetch = self.fetches[dep.task_id] = Fetch(dep.task_id, dep.peers)
                self._request_next(fetch, now)
            fetch.waiters.add(task.id)
        self.tasks[task.id] = task
        if task.missing:
            self._transition(task, "waiting")
            self._follow(task)
        else:
            self._queue(task)

    def _on_replicate(self, msg: p.Replicate, now: float) -> None:
        if msg.task_id in self.store or msg.task_id in self.live:
            self.outbox.append(p.Replicas((msg.task_id,)))
            return
        fetch = self.fetches.get(msg.task_id)
        if fetch is not None:
            fetch.replicate = True
        elif msg.peers:
            fetch = self.fetches[msg.task_id] = Fetch(msg.task_id, msg.peers, replicate=True)
            self._request_next(fetch, now)

    def _cancel(self, task_id: int) -> bool:
        """Drop a task that has not started; whether it was dropped."""
        task = self.tasks.get(task_id)
        if task is not None and task.state != "running":
            self._transition(task, "forgotten")
            return True
        return False

    # -- peers ------------------------------------------------------------------------

    def _request_next(self, fetch: Fetch, now: float) -> None:
        """Ask the next untried holder, or queue the fetch until a transfer slot is free;
        once every holder failed, ask through the manager (``Relay``), then give up."""
        if not fetch.untried:
            if fetch.relayed or not fetch.unreached:  # (holders that answered "not here")
                self._fetch_failed(fetch)
                return
            self.slots.take_relay(fetch, RELAY)
            fetch.deadline = now + self.fetch_timeout
            self.outbox.append(p.Relay((fetch.dep_id,)))
            return
        address = self.slots.take(fetch)
        if address is None:
            fetch.deadline = float("inf")
            self.slots.queue.append(fetch)
        else:
            self._request(fetch, address, now)

    def _request(self, fetch: Fetch, address: str, now: float) -> None:
        fetch.deadline = now + self.fetch_timeout
        self.peer_outbox.setdefault(address, []).append(fetch.dep_id)

    def _fetch_is_live(self, fetch: Fetch) -> bool:
        return self.fetches.get(fetch.dep_id) is fetch

    def _fetch_failed(self, fetch: Fetch) -> None:
        self.fetches.pop(fetch.dep_id, None)
        if fetch.replicate and not fetch.waiters:
            logger.info("could not copy result %d from %s", fetch.dep_id, fetch.peers)
        for task_id in fetch.waiters:
            task = self.tasks.get(task_id)
            if task is not None:
                self.outbox.append(p.FetchFailed(task_id, fetch.dep_id, fetch.peers))
                task.missing.discard(fetch.dep_id)
                self._transition(task, "forgotten")

    def on_peer_unreachable(self, address: str, ids: list[int], now: float) -> None:
        """Requests that could not be sent to ``address``: their fetches try the next holder."""
        for dep_id in ids:
            fetch = self.fetches.get(dep_id)
            if fetch is not None and fetch.current == address:
                fetch.unreached = True
                self.slots.give_back(fetch)
                self._request_next(fetch, now)

    def on_data(self, reply: p.Data, now: float) -> None:
        """A peer's answer: the input (stored, its tasks queued) or None (ask the next)."""
        fetch = self.fetches.get(reply.task_id)
        if fetch is None or fetch.current is None:
            return  # nobody here waits for it any more, or it was asked elsewhere since
        source = fetch.current
        self.slots.give_back(fetch)
        if reply.value is None:
            self._request_next(fetch, now)
            return
        del self.fetches[reply.task_id]
        if source != RELAY:  # (the manager counts what it relays)
            received = self.received_from
            received[source] = received.get(source, 0) + reply.value.nbytes
        self.store.put(reply.task_id, reply.value)
        self.outbox.append(p.Replicas((reply.task_id,)))
        self._input_arrived(reply.task_id, fetch.waiters)

    def on_data_error(self, task_id: int) -> None:
        """A peer's answer that could not be stored: the tasks that wait give up on it."""
        fetch = self.fetches.get(task_id)
        if fetch is not None:
            self.slots.give_back(fetch)
            self._fetch_failed(fetch)

    def _input_arrived(self, dep_id: int, waiters: set[int]) -> None:
        for task_id in waiters:
            task = self.tasks.get(task_id)
            if task is None:
                continue
            task.missing.discard(dep_id)
            if not task.missing and task.state == "waiting":  # (else queued already)
                self._queue(task)

    # -- libraries --------------------------------------------------------------------

    def add_library(self, library_id: int, slots: int) -> LibraryRecord:
        """A library process started: it will be sent every function known so far."""
        lib = self.libraries[library_id] = LibraryRecord(library_id, list(self.functions), slots)
        return lib

    def start_runnable(self) -> Sequence[tuple[LibraryRecord, pipe.Run]]:
        """Hand runnable tasks to libraries with a free slot: one task per free slot, or a
        few when tasks are tiny, all of one run configuration per request, each task to
        the library that holds its live inputs if any; the requests to write to pipes.

        A library runs the tasks it is sent one after the other (or ``slots`` at once)
        and answers each at once; sending tiny tasks in batches saves pipe round trips,
        and their replies then come back, and go to the manager, in batches too.
        """
        if not self.runnable and not self.homed and not self.chained:
            return _NO_REQUESTS
        requests: list[tuple[LibraryRecord, pipe.Run]] = []
        for lib_id, calls in self.chained.items():
            lib = self.libraries[lib_id]
            functions = [(fid, self.functions[fid]) for fid in lib.unsent]
            lib.unsent = []
            requests.append(
                (lib, pipe.Run(functions, self.tasks[calls[0].task_id].config, calls))
            )
        self.chained.clear()
        recent = self.recent_duration.value if self.recent_duration.count else None
        tiny = recent is not None and recent < TINY_TASK
        depth = LIBRARY_BATCH if tiny else 1
        # Libraries with a free slot first. A one-slot library blocked writing results
        # while we write inputs would deadlock on the pipe (a library of several slots
        # keeps reading while its slots write)...
        for lib in [lib for lib in self.libraries.values() if len(lib.sent) < lib.slots]:
            self._fill_library(lib, lib.slots * depth - len(lib.sent), None, requests)
        self._steal()
        # ...then, for short tasks, one small task queued behind the running one: it fits
        # in the pipe's buffer, so writing it cannot block, and the library starts it
        # without waiting for us to hear of the previous one.
        if tiny or recent is None or recent > SHORT_TASK:
            return requests
        for lib in self.libraries.values():
            if lib.slots == 1 and len(lib.sent) == 1 and lib.ready:
                self._fill_library(lib, 1, QUEUED_REQUEST_BYTES, requests)
        return requests

    def _fill_library(
        self, lib: LibraryRecord, room: int, max_bytes: int | None, requests: list
    ) -> None:
        """Send ``lib`` up to ``room`` runnable tasks of one run configuration, of at most
        ``max_bytes`` (payloads and inputs) when given: its own (their inputs are live
        there) first, then any; with the tasks that wait here only for them (chains)."""
        batch: list[WorkerTask] = []
        for queue in (self.homed.get(lib.id), self.runnable):
            while queue and len(batch) < room:
                task = self._next_runnable(queue, lib.id)
                if task is None:
                    break
                if (batch and task.config is not batch[0].config) or (
                    max_bytes is not None and self._request_bytes(task, lib.id) > max_bytes
                ):
                    queue.appendleft(task.id)  # for the next request
                    break
                # Running as it is chosen: an older entry of it still in a queue (it was
                # queued again) is then passed over like any entry that is not queued.
                self._transition(task, "running")
                batch.append(task)
        if not self.homed.get(lib.id, True):
            del self.homed[lib.id]
        if not batch:
            return
        calls = []
        for task in batch:
            task.lib = lib.id
            lib.sent.append(task.id)
            calls.append(self.call(task, lib.id))
        config = batch[0].config
        if lib.slots == 1 and (config is None or config.exec_mode == "direct"):
            self._chain(lib, batch, calls)  # (a forked child's result is not kept live)
        functions = [(fid, self.functions[fid]) for fid in lib.unsent]
        lib.unsent = []
        requests.append((lib, pipe.Run(functions, batch[0].config, calls)))

    def call(
        self, task: WorkerTask, lib: int | None = None, upcoming: set[int] | frozenset = frozenset()
    ) -> pipe.Call:
        """What a library (``lib``) or a task process runs: the task with its inputs'
        values, inline in the ``Execute`` (small ones) or from the store, or named when
        they are live in that library (or made there earlier in the request: ``upcoming``)."""
        store = self.store
        live = self.live
        inputs = []
        for dep in task.deps:
            dep_id = dep.task_id
            if dep.value is not None:
                inputs.append((dep.key, dep_id, dep.value))
            elif lib is not None and (dep_id in upcoming or live.usable(dep_id, lib)):
                inputs.append((dep.key, dep_id, None))
            else:
                inputs.append((dep.key, dep_id, store.get(dep_id)))
        keep = task.keep and lib is not None
        send = task.want_result or not keep
        return pipe.Call(task.id, task.key, task.payload, inputs, keep, send)

    def _available(self, dep: p.DepLocation, lib: int | None) -> bool:
        """Whether a call to ``lib`` (None: a task process) can have this input now."""
        return (
            dep.value is not None
            or dep.task_id in self.store
            or self.live.held_in(dep.task_id, lib)
        )

    def _request_bytes(self, task: WorkerTask, lib: int | None = None) -> int:
        total = len(task.payload)
        for dep in task.deps:
            if dep.value is not None:
                total += dep.value.nbytes
            elif not self.live.held_in(dep.task_id, lib):  # (else named, not carried)
                total += self.store.size(dep.task_id)
        return total

    def _next_runnable(self, queue: deque[int], lib: int | None = None) -> WorkerTask | None:
        """The next queued task whose inputs are all here for ``lib``. One whose input is
        held nowhere (released, or its library died) is reported (``FetchFailed``) and
        forgotten; one whose input is live in another library, or leaving one, waits."""
        while queue:
            task = self.tasks.get(queue.popleft())
            if task is None or task.state != "queued":
                continue
            for dep in task.deps:
                if self._available(dep, lib):
                    continue
                dep_id = dep.task_id
                if dep_id not in self.live:
                    self.outbox.append(p.FetchFailed(task.id, dep_id, (self.peer_address,)))
                    self._transition(task, "forgotten")
                    break
                elsewhere = [
                    d.task_id for d in task.deps
                    if not self._available(d, lib) and d.task_id in self.live
                ]  # fmt: skip
                self._await_exports(task, elsewhere)  # then queued again
                break
            else:
                return task
        return None

    # -- library replies --------------------------------------------------------------

    def on_library_ready(self, lib: LibraryRecord) -> bool:
        """A library finished starting; whether every library is now ready."""
        lib.ready = True
        return all(other.ready for other in self.libraries.values())

    def on_library_reply(self, lib: LibraryRecord, reply: Any, wall: float) -> None:
        """A task's outcome from a library (``wall``: the clock for ``TaskDone.finished``),
        or a result it exported."""
        if type(reply) is pipe.Exported:
            self.on_exported(lib, reply)
            return
        sent = lib.sent
        if sent and sent[0] == reply.task_id:
            sent.popleft()
        else:
            sent.remove(reply.task_id)
        self.on_reply(reply, wall, lib.id)

    def on_library_death(
        self, lib: LibraryRecord, how: str, running: Collection[int] | None = None
    ) -> None:
        """A library process died (``how``: its exit): the tasks it was ``running`` (by
        default the first ones sent) crashed; the others sent to it, finished or not
        (their replies may have been held), go back to the front of the queue; the
        results it kept live are lost (the manager recomputes those still needed)."""
        del self.libraries[lib.id]
        self.chained.pop(lib.id, None)  # their tasks are in ``lib.sent``: requeued below
        if running is None:
            running = list(lib.sent)[: lib.slots]
        for task_id in running:
            task = self.tasks.get(task_id)
            if task is not None and task.state == "running" and task_id in lib.sent:
                lib.sent.remove(task_id)
                reason = f"library process {how} on worker {self.name}"
                logger.warning("task %r: %s", task.key, reason)
                self.outbox.append(p.TaskCrashed(task.id, reason))
                self._transition(task, "forgotten")
        for task_id in reversed(lib.sent):
            queued = self.tasks.get(task_id)
            if queued is not None:
                self._transition(queued, "queued")
        lib.sent.clear()
        homed = self.homed.pop(lib.id, None)
        if homed:
            self.runnable.extendleft(reversed(homed))  # they find their inputs gone
        lost = []
        for task_id in self.live.in_library(lib.id):
            self.live.drop(task_id)
            if task_id not in self.store:
                lost.append(task_id)
        for task_id, wait in [(t, w) for t, w in self.exports.items() if w.lib == lib.id]:
            del self.exports[task_id]
            self._answer_peers(task_id, wait.peers, None)
            for waiter in wait.tasks:
                task = self.tasks.get(waiter)
                if task is not None:
                    self.outbox.append(p.FetchFailed(waiter, task_id, (self.peer_address,)))
                    task.missing.discard(task_id)
                    self._transition(task, "forgotten")
        if lost:
            logger.warning(
                "worker %s lost %d results kept live by its library process", self.name, len(lost)
            )
            self.outbox.append(p.Lost(tuple(lost)))

    def on_reply(self, reply: Any, wall: float, lib: int | None = None) -> None:
        """A task's outcome, from a library (``lib``) or a task process."""
        task = self.tasks.get(reply.task_id)
        if task is None:
            return
        self._transition(task, "forgotten")
        kind = type(reply)
        if kind is pipe.Done:
            task_id, value, duration, nbytes, live, serialization = reply
            self.recent_duration.observe(duration)
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
            self.outbox.append(p.TaskDone(task_id, nbytes, duration, value, wall, serialization))
        elif kind is pipe.Erred:
            self.outbox.append(p.TaskErred(*reply))
        elif kind is pipe.Missing:  # its producer failed: the manager decides
            self.outbox.append(p.FetchFailed(task.id, reply.dep_id, (self.peer_address,)))
        else:  # Crashed: the process running it died (fork and tasks modes)
            logger.warning("task %r: %s", task.key, reply.reason)
            self.outbox.append(p.TaskCrashed(reply.task_id, reply.reason))

    # -- task processes (task_mode="tasks") ---------------------------------------------

    def next_process_task(self) -> WorkerTask | None:
        """The next task to start in a fresh interpreter, if any."""
        return self._next_runnable(self.process_runnable)

    def on_process_started(self, task: WorkerTask) -> None:
        self._transition(task, "running")

    def on_process_failed(self, task: WorkerTask, why: str) -> None:
        """Its process could not be started."""
        self._transition(task, "forgotten")
        reason = f"cannot start a task process on worker {self.name}: {why}"
        self.outbox.append(p.TaskCrashed(task.id, reason))

    # -- transitions ------------------------------------------------------------------

    def _transition(self, task: WorkerTask, finish: TaskStateName) -> None:
        step = _TRANSITIONS.get((task.state, finish), _ILLEGAL)
        if step is _ILLEGAL:
            raise InvalidTransition(task.key, task.state, finish, [])
        task.state = finish
        if step is not None:  # three transitions per task: skip the empty calls
            step(self, task)

    def _to_queued(self, task: WorkerTask) -> None:
        if task.config is not None and task.config.task_mode == "tasks":
            self.process_runnable.append(task.id)
        elif task.home is None:
            self.runnable.append(task.id)
        else:
            self.homed.setdefault(task.home, deque()).append(task.id)

    def _running_to_queued(self, task: WorkerTask) -> None:
        """Its library died before it started: first in line again (callers go in reverse)."""
        task.home = task.lib = None
        self.runnable.appendleft(task.id)

    def _forget(self, task: WorkerTask) -> None:
        """Out of ``tasks``, and out of the fetches and local waits it was in."""
        self.tasks.pop(task.id, None)
        for dep_id in task.missing:
            waiters = self.local_waiters.get(dep_id)
            if waiters is not None:
                waiters.discard(task.id)
                if not waiters:
                    del self.local_waiters[dep_id]
            fetch = self.fetches.get(dep_id)
            if fetch is not None:
                fetch.waiters.discard(task.id)
                if not fetch.waiters and not fetch.replicate:
                    del self.fetches[dep_id]
                    self.slots.give_back(fetch)  # a late reply finds no fetch and is dropped
            export = self.exports.get(dep_id)
            if export is not None:  # it still arrives, into the store
                export.tasks.discard(task.id)

    def _running_to_forgotten(self, task: WorkerTask) -> None:
        self.tasks.pop(task.id, None)  # running: nothing missing, nothing fetched for it

    def leaks(self) -> Iterator[str]:
        """Containers that still hold something: names, for tests of a quiet worker."""
        for name in ("tasks", "fetches", "local_waiters", "peer_outbox", "exports"):
            if getattr(self, name):
                yield name
        queued = [*self.runnable, *self.process_runnable]
        queued += [task_id for queue in self.homed.values() for task_id in queue]
        if any(self.tasks.get(t) for t in queued):
            yield "runnable"
        if any(lib.sent for lib in self.libraries.values()):
            yield "libraries"
        if self.slots.in_flight or any(self.slots.from_peer.values()):
            yield "slots"


_ILLEGAL = object()
#: Every legal edge and what it does besides setting the state; None: nothing more (its
#: fetches, local waits or exports are in place; or the caller records where it runs).
_TRANSITIONS: dict[tuple[str, str], Any] = {
    ("new", "waiting"): None,
    ("new", "queued"): WorkerState._to_queued,
    ("new", "forgotten"): WorkerState._forget,
    ("waiting", "queued"): WorkerState._to_queued,
    ("waiting", "running"): None,  # sent with the task it waits for (a chain)
    ("waiting", "forgotten"): WorkerState._forget,
    ("queued", "waiting"): None,  # an input must first leave another library (export)
    ("queued", "running"): None,
    ("queued", "forgotten"): WorkerState._forget,
    ("running", "queued"): WorkerState._running_to_queued,
    ("running", "forgotten"): WorkerState._running_to_forgotten,
}
