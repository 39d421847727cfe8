"""Dask's callbacks (``dask.callbacks.Callback``) around ``Manager.get``.

Dask's local schedulers call the active callbacks' ``start(dsk)`` and
``start_state(dsk, state)`` before the first task, ``pretask(key, dsk, state)`` as each
task starts, ``posttask(key, result, dsk, state, worker_id)`` as each ends and
``finish(dsk, state, failed)`` at the end. So does ``get``, on the caller's thread:

- ``dsk`` is the graph that runs, culled and with reductions rewritten, as Dask's task
  objects (``dask._task_spec``);
- ``state`` is a Dask-style scheduler state, kept up to date on the caller's side from
  what the manager hears: ``dependencies``, ``dependents``, ``waiting``,
  ``waiting_data``, ``ready``, ``running``, ``finished``, ``released`` and ``cache``.
  ``ready`` is a set here (Dask's own schedulers keep a list they pop from); ``cache``
  holds only the results that reached the manager (outputs, and results small enough
  to ride along);
- ``pretask`` is called when the manager sends the task to a worker (it may still queue
  there), ``posttask`` when the worker's report arrives, with the result when it came
  along (outputs, small results; None for results that stayed on their worker) and the
  worker's name as ``worker_id``.

The run is watched (``state.Dispatched``/``state.TaskFinished``), and the manager's I/O
thread puts what the callbacks must hear on the run's ``feed`` (``watching.TaskSent`` and
``TaskReported`` records); the caller's thread, which waits in ``get`` anyway, calls them.
Dask's callback 5-tuples are read by name once, at the boundary (``DaskCallback``). A
``get`` with no active callback takes none of this path: it costs nothing per task.

Which callbacks are active follows Dask's ``local_callbacks``: those passed to the call
(``dask.compute(..., callbacks=[...])``, ``Callback`` objects or 5-tuples), else the
registered ones (``with ProgressBar():``, ``cb.register()``), which are taken for the
duration of the call, so a nested call does not run them twice.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from dask.callbacks import Callback, local_callbacks, normalize_callback

from daskvine_py.manager.progress import wait_with_progress
from daskvine_py.manager.watching import FeedItem, Run, TaskReported, TaskSent
from daskvine_py.plan.graph import LegacyCall, Plan, convert
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import loads

#: Seconds between looks at the run while no event arrives: how soon a run that ended
#: without the feed's last word (the manager died, or closed) is noticed.
POLL = 0.1


def take(passed: Any) -> Hooks | None:
    """The callbacks a ``get`` must call (None, at no cost, when there are none).

    ``passed``: the call's ``callbacks=`` argument (a ``Callback``, or an iterable of
    ``Callback`` objects and 5-tuples); None takes the registered ones. Call
    ``Hooks.release`` when the call ends.
    """
    if passed is None and not Callback.active:
        return None
    if passed is not None:
        if isinstance(passed, Callback):
            passed = [passed]
        passed = [normalize_callback(cb) for cb in passed]  # type: ignore[no-untyped-call]
    context = local_callbacks(passed)
    callbacks = context.__enter__()
    if not callbacks:
        context.__exit__(None, None, None)
        return None
    return Hooks([DaskCallback(cb) for cb in callbacks], context)


class DaskCallback:
    """One of Dask's callback 5-tuples (``dask.callbacks.Callback._callback``), by name:
    each hook a function, or None where the callback has none."""

    __slots__ = ("start", "start_state", "pretask", "posttask", "finish")

    def __init__(self, hooks: tuple[Any, ...]) -> None:
        self.start: Callable[[dict[Any, Any]], None] | None
        self.start_state: Callable[[dict[Any, Any], dict[str, Any]], None] | None
        self.pretask: Callable[[Any, dict[Any, Any], dict[str, Any]], None] | None
        self.posttask: Callable[[Any, Any, dict[Any, Any], dict[str, Any], str], None] | None
        self.finish: Callable[[dict[Any, Any], dict[str, Any], bool], None] | None
        self.start, self.start_state, self.pretask, self.posttask, self.finish = hooks


class Hooks:
    """The active callbacks of one ``get``, and the Dask-style state they read."""

    def __init__(self, callbacks: list[DaskCallback], context: AbstractContextManager[Any]) -> None:
        self._context = context
        self._callbacks = callbacks
        self._pretask = [cb.pretask for cb in callbacks if cb.pretask]
        self._posttask = [cb.posttask for cb in callbacks if cb.posttask]
        #: the callbacks whose ``start`` was called: they get ``finish``
        self._started: list[DaskCallback] = []
        self.dsk: dict[Any, Any] = {}
        self.state: dict[str, Any] = {}
        self._outputs: frozenset[Any] = frozenset()
        #: outputs unpickled for ``posttask``, so that ``get`` does not do it again
        self.values: dict[Any, Any] = {}

    def release(self) -> None:
        """Give the registered callbacks back (``local_callbacks``)."""
        self._context.__exit__(None, None, None)

    def start(self, plan: Plan, run: Run) -> None:
        """Call ``start`` and ``start_state``, and have the run feed the others."""
        self.dsk = {
            key: convert(key, node.task, plan.nodes) if type(node) is LegacyCall else node
            for key, node in plan.nodes.items()
        }
        self.state = _start_state(plan)
        self._outputs = frozenset(plan.outputs)
        for cb in self._callbacks:
            if cb.start:
                cb.start(self.dsk)
            self._started.append(cb)
        for cb in self._callbacks:
            if cb.start_state:
                cb.start_state(self.dsk, self.state)
        run.feed = queue.SimpleQueue()

    def waiter(self, run: Run) -> _Follow:
        """What ``get`` waits on instead of ``run.done``: it calls the callbacks."""
        return _Follow(self, run)

    def finish(self, failed: bool) -> None:
        for cb in self._started:
            if cb.finish:
                cb.finish(self.dsk, self.state, failed)
        self._started = []

    # -- what the run feeds ---------------------------------------------------------------

    def dispatched(self, key: Any, worker: str) -> None:
        state = self.state
        running = state["running"]
        if key in running:
            return  # taken back from one worker and sent to another: it has not run yet
        state["ready"].discard(key)
        state["waiting"].pop(key, None)  # sent ahead of an input still being computed
        state["finished"].discard(key)  # recomputed: its result was lost with a worker
        running.add(key)
        for pretask in self._pretask:
            pretask(key, self.dsk, state)

    def finished(
        self, key: Any, worker: str, report: p.TaskDone | p.TaskErred | p.TaskCrashed
    ) -> None:
        state = self.state
        state["running"].discard(key)
        if type(report) is not p.TaskDone:
            if type(report) is p.TaskCrashed:
                state["ready"].add(key)  # to be retried, or the run fails
            return
        state["finished"].add(key)
        result = None
        if report.value is not None:
            try:
                result = loads(report.value)
            except Exception:  # get unpickles it again, and says what went wrong
                pass
            else:
                state["cache"][key] = result
                if key in self._outputs:
                    self.values[key] = result
        waiting, ready = state["waiting"], state["ready"]
        for dependent in state["dependents"].get(key, ()):
            missing = waiting.get(dependent)
            if missing is not None:
                missing.discard(key)
                if not missing:
                    del waiting[dependent]
                    ready.add(dependent)
        waiting_data, cache = state["waiting_data"], state["cache"]
        for dep in state["dependencies"].get(key, ()):
            readers = waiting_data.get(dep)
            if readers is not None:
                readers.discard(key)
                if not readers:
                    del waiting_data[dep]
                    if dep not in self._outputs:
                        state["released"].add(dep)
                        cache.pop(dep, None)
        for posttask in self._posttask:
            posttask(key, result, self.dsk, state, worker)


class _Follow:
    """Waits for a run like ``run.done`` does, calling the callbacks meanwhile."""

    def __init__(self, hooks: Hooks, run: Run) -> None:
        self._hooks = hooks
        self._run = run
        self._over = False

    def wait(self, timeout: float | None = None) -> bool:
        """Take what the run feeds until it ends (True) or ``timeout`` passes (False)."""
        if self._over:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        feed, run, hooks = self._run.feed, self._run, self._hooks
        assert feed is not None
        while True:
            wait = POLL
            if deadline is not None:  # checked between events too: they may never pause
                wait = min(POLL, deadline - time.monotonic())
                if wait <= 0:
                    return False
            try:
                item = feed.get(timeout=wait)
            except queue.Empty:
                if run.done.is_set():  # ended without the last word: take what is left
                    self._drain(feed)
                    return self._end()
                continue
            if item is None:
                return self._end()
            _deliver(hooks, item)

    def _drain(self, feed: queue.SimpleQueue[FeedItem | None]) -> None:
        while True:
            try:
                item = feed.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            _deliver(self._hooks, item)

    def _end(self) -> bool:
        self._run.done.wait()
        self._over = True
        return True


def _deliver(hooks: Hooks, item: FeedItem) -> None:
    if type(item) is TaskSent:
        hooks.dispatched(item.key, item.worker)
    elif type(item) is TaskReported:
        hooks.finished(item.key, item.worker, item.report)


def _start_state(plan: Plan) -> dict[str, Any]:
    """Dask's scheduler state for a plan about to run: nothing sent, nothing done."""
    dependencies = {key: set(deps) for key, deps in plan.dependencies.items()}
    dependents: dict[Any, set[Any]] = {key: set[Any]() for key in dependencies}
    for key, deps in dependencies.items():
        for dep in deps:
            dependents[dep].add(key)
    return {
        "dependencies": dependencies,
        "dependents": dependents,
        "waiting": {key: set(deps) for key, deps in dependencies.items() if deps},
        "waiting_data": {key: set(users) for key, users in dependents.items() if users},
        "cache": {},
        "ready": {key for key, deps in dependencies.items() if not deps},
        "running": set(),
        "finished": set(),
        "released": set(),
    }


def wait(run: Run, hooks: Hooks | None, progress: bool) -> None:
    """Wait for the run to end: calling the callbacks as it goes, if any, and showing
    a progress bar, if asked."""
    waiter = run.done if hooks is None else hooks.waiter(run)
    if progress:
        wait_with_progress(waiter, lambda: run.finished_tasks, run.info.tasks)
    else:
        waiter.wait()
