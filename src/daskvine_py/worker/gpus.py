"""A worker's GPUs: the devices it offers (``--gpus``) and which library runs a GPU task.

- Devices are named as CUDA names them in ``CUDA_VISIBLE_DEVICES`` (indices, or UUIDs).
  By default a worker offers those ``CUDA_VISIBLE_DEVICES`` names, else those
  ``nvidia-smi -L`` lists, else none (``detect``).
- CUDA reads ``CUDA_VISIBLE_DEVICES`` once per process, so a library is started for a set
  of devices and keeps it: on a worker with GPUs, a library starts with the variable
  naming its devices, or empty (no device) for tasks without GPUs.
- A task asking for ``k`` GPUs runs alone in an idle library started with ``k`` devices
  that no running task holds. When there is none, an idle library is started again with
  ``k`` free devices (``restarts``: the state has it killed, ``KillLibrary``, and its
  replacement gets them), once the results it keeps live have been exported to the
  store, so none is lost.
  Tasks without GPUs that find no library of theirs free have idle GPU libraries started
  again without devices.
- A device is held while the library started with it runs a task: until the task's
  reply, the library's death, or its abort (which kills the library). So no two running
  tasks ever share a device.
- A GPU task has no home library, joins no chain, and keeps no result live in its
  library (it goes to the store): what a GPU library holds never pins it to its devices.
  In ``task_mode="tasks"`` it runs forked from such a library (``exec_mode="fork"``),
  isolated as in a process of its own; task processes see no device.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from daskvine_py.worker import pipe

if TYPE_CHECKING:
    from daskvine_py.worker.live_results import LiveResults
    from daskvine_py.worker.live_tasks import LiveTasks
    from daskvine_py.worker.records import LibraryRecord, TaskStateName, WorkerTask
    from daskvine_py.worker.store import Store

#: The variable that names the devices a process may use.
VISIBLE = "CUDA_VISIBLE_DEVICES"


def parse_visible(value: str) -> tuple[str, ...]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value names: CUDA stops at the first
    invalid entry, and ``-1`` is the usual way of saying none."""
    devices: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        devices.append(item)
    return tuple(devices)


def nvidia_devices() -> int:
    """GPUs ``nvidia-smi -L`` lists (0 without the command, or when it fails)."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return 0
    try:
        done = subprocess.run(
            [command, "-L"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    if done.returncode != 0:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def detect(count: int | None, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The devices a worker offers: ``count`` of them (None: all it finds), named by
    ``CUDA_VISIBLE_DEVICES`` when it is set, else ``0`` to ``count - 1``. ``ValueError``
    when ``count`` is more than ``CUDA_VISIBLE_DEVICES`` names."""
    visible = (os.environ if environ is None else environ).get(VISIBLE)
    if visible is not None:
        named = parse_visible(visible)
        if count is None:
            return named
        if count > len(named):
            raise ValueError(
                f"--gpus {count}: {VISIBLE}={visible!r} names only {len(named)} "
                f"device{'' if len(named) == 1 else 's'}"
            )
        return named[:count]
    if count is None:
        count = nvidia_devices()
    return tuple(str(i) for i in range(count))


class Dispatch(Protocol):
    """What the pool reads of its ``dispatch.Dispatch`` (named here: the dispatch imports
    this module)."""

    libraries: dict[int, LibraryRecord]
    functions: dict[bytes, bytes]
    runnable: deque[int]
    homed: dict[int, deque[int]]
    tasks: dict[int, WorkerTask]
    live_tasks: LiveTasks
    live: LiveResults
    store: Store
    transition: Callable[[WorkerTask, TaskStateName], None]

    def call(
        self, task: WorkerTask, lib: int | None = None, upcoming: Collection[int] = frozenset()
    ) -> pipe.Call: ...

    def _next_runnable(self, queue: deque[int], lib: int | None = None) -> WorkerTask | None: ...


class GpuPool:
    """The worker's devices and its GPU libraries; a component of ``dispatch.Dispatch``,
    with no I/O. See the module docstring."""

    __slots__ = ("devices", "queue", "libraries", "bound", "restarting", "restarts", "next_devices")

    def __init__(self) -> None:
        #: the devices this worker offers (``--gpus``)
        self.devices: tuple[str, ...] = ()
        #: queued GPU tasks, in order (ids of tasks started or forgotten are skipped)
        self.queue: deque[int] = deque()
        #: library id -> the devices it was started with (only libraries with some)
        self.libraries: dict[int, tuple[str, ...]] = {}
        #: libraries that take no task without GPUs: GPU libraries and those restarting
        self.bound: set[int] = set()
        #: libraries to be started again -> the devices their replacement gets
        self.restarting: dict[int, tuple[str, ...]] = {}
        #: idle libraries to kill (``KillLibrary``; their replacements get new devices)
        self.restarts: list[int] = []
        #: devices for the libraries about to start (replacements), in order
        self.next_devices: deque[tuple[str, ...]] = deque()

    def declare(self, devices: Sequence[str]) -> GpuPool:
        self.devices = tuple(devices)
        return self

    # -- libraries ----------------------------------------------------------------------

    def env(self, library_id: int | None) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` for a library, or a task process (``library_id``
        None: it runs no GPU task); None: leave the worker's alone, on a worker without
        GPUs."""
        if not self.devices:
            return None
        if library_id is None:
            return ""
        return ",".join(self.libraries.get(library_id, ()))

    def on_added(self, library_id: int) -> None:
        """A library starts: a replacement gets the devices it was started again for."""
        if self.next_devices:
            devices = self.next_devices.popleft()
            if devices:
                self.libraries[library_id] = devices
                self.bound.add(library_id)

    def on_dropped(self, library_id: int) -> None:
        """A library died (or was killed to start again): its devices are free."""
        self.libraries.pop(library_id, None)
        self.bound.discard(library_id)
        devices = self.restarting.pop(library_id, None)
        if devices is not None:
            self.next_devices.append(devices)

    def take_restarts(self) -> list[int]:
        restarts, self.restarts = self.restarts, []
        return restarts

    # -- tasks --------------------------------------------------------------------------

    def check(self, task: WorkerTask) -> None:
        """``ValueError`` for a task asking for more GPUs than this worker has (the
        manager places none here; the worker reports it crashed, never waits for good)."""
        if task.gpus > len(self.devices):
            raise ValueError(
                f"task {task.key!r} asks for {task.gpus} GPUs; this worker has {len(self.devices)}"
            )

    def fits(self, task: WorkerTask, library_id: int) -> bool:
        """Whether ``task`` may run in that library, where its inputs are live."""
        return not task.gpus and library_id not in self.bound

    def start(self, dispatch: Dispatch, requests: list[tuple[LibraryRecord, pipe.Run]]) -> None:
        """Send queued GPU tasks to idle libraries started with devices no running task
        holds, then plan the restarts of libraries for what still waits."""
        if not self.devices:
            return
        busy = self._busy(dispatch)
        if self.queue:
            for library_id, devices in self.libraries.items():
                lib = dispatch.libraries[library_id]
                if lib.sent or library_id in self.restarting or busy.intersection(devices):
                    continue
                task = self._take(dispatch, lib)
                if task is not None:
                    busy.update(devices)
                    self._send(dispatch, lib, task, requests)
        self._plan(dispatch, busy)

    def _busy(self, dispatch: Dispatch) -> set[str]:
        """Devices held by running tasks."""
        libraries = dispatch.libraries
        return {
            device
            for library_id, devices in self.libraries.items()
            if libraries[library_id].sent
            for device in devices
        }

    def _queued(self, dispatch: Dispatch) -> list[WorkerTask]:
        """The queued GPU tasks (the queue pruned of tasks started or forgotten)."""
        tasks = dispatch.tasks
        queued = [tasks[i] for i in self.queue if i in tasks and tasks[i].state == "queued"]
        if len(queued) != len(self.queue):
            self.queue = deque(task.id for task in queued)
        return queued

    def _take(self, dispatch: Dispatch, lib: LibraryRecord) -> WorkerTask | None:
        """The first queued task asking for as many GPUs as ``lib`` was started with,
        if its inputs are here (else it waits for their exports)."""
        want = len(self.libraries[lib.id])
        for task in self._queued(dispatch):
            if task.gpus == want:
                self.queue.remove(task.id)
                # (the dispatch's check of its inputs: held nowhere, or live elsewhere)
                return dispatch._next_runnable(deque((task.id,)), lib.id)
        return None

    def _send(
        self,
        dispatch: Dispatch,
        lib: LibraryRecord,
        task: WorkerTask,
        requests: list[tuple[LibraryRecord, pipe.Run]],
    ) -> None:
        dispatch.transition(task, "running")
        task.lib = lib.id
        lib.sent.append(task.id)
        call = dispatch.call(task, lib.id)
        if call.keep:  # to the store: a later restart of this library loses nothing
            call = call._replace(keep=False, send=True)
        functions = [(fid, dispatch.functions[fid]) for fid in lib.unsent]
        lib.unsent = []
        config = task.config
        if config is not None and config.task_mode == "tasks":  # isolated all the same
            config = config._replace(exec_mode="fork")
        requests.append((lib, pipe.Run(functions, config, [call])))

    # -- restarts -----------------------------------------------------------------------

    def _plan(self, dispatch: Dispatch, busy: set[str]) -> None:
        """Start idle libraries again with the devices waiting tasks need: free devices
        for queued GPU tasks that no library fits, none for tasks without GPUs when
        every library of theirs is busy and no GPU task waits."""
        gpu_tasks = self._queued(dispatch) if self.queue else []
        cpu_waiting = _cpu_waiting(dispatch)
        if not gpu_tasks and not (cpu_waiting and self.libraries):
            return
        idle = [
            lib
            for lib in dispatch.libraries.values()
            if not lib.sent and lib.id not in self.restarting and not dispatch.homed.get(lib.id)
        ]
        if not idle:
            return
        # GPU libraries first (their devices serve no waiting task, else it would be
        # there), then those keeping no live result, which start again at once
        holding = {entry.lib for entry in dispatch.live.entries.values()}
        idle.sort(key=lambda lib: (lib.id not in self.libraries, lib.id in holding))
        if not gpu_tasks:
            for lib in idle:
                if lib.id in self.libraries:
                    self._restart(dispatch, lib, ())
            return
        claimed = set(busy)
        for task in gpu_tasks:
            free = [device for device in self.devices if device not in claimed]
            if len(free) < task.gpus or not idle:
                continue
            if any(
                len(devices) == task.gpus
                and not claimed.intersection(devices)
                and not dispatch.libraries[library_id].sent
                for library_id, devices in self.libraries.items()
                if library_id not in self.restarting
            ):
                continue  # one fits: it takes the task once its inputs are here
            lib = idle.pop(0)
            devices = tuple(free[: task.gpus])
            claimed.update(devices)
            self._restart(dispatch, lib, devices)

    def _restart(self, dispatch: Dispatch, lib: LibraryRecord, devices: tuple[str, ...]) -> None:
        """Have ``lib`` started again with ``devices``, once the results it keeps live
        are in the store (asked for now when they are not: it is chosen again later)."""
        live = dispatch.live_tasks
        held = [
            (task_id, entry)
            for task_id, entry in live.live.entries.items()
            if entry.lib == lib.id and not entry.stuck
        ]
        if held:
            for task_id, entry in held:
                if task_id in dispatch.store:
                    live.forget((task_id,))
                elif not entry.leaving:
                    live.export(task_id, drop=True)
            return
        self.restarting[lib.id] = devices
        self.bound.add(lib.id)
        self.restarts.append(lib.id)


def live_only(task: WorkerTask, live: LiveResults, store: Store) -> list[int]:
    """The inputs of ``task`` that only a library holds (live, not in the store)."""
    return [
        dep.task_id
        for dep in task.deps
        if dep.value is None and dep.task_id in live and dep.task_id not in store
    ]


def _cpu_waiting(dispatch: Dispatch) -> bool:
    """Whether a task without GPUs waits for a library (the first in line is queued)."""
    runnable = dispatch.runnable
    if not runnable:
        return False
    task = dispatch.tasks.get(runnable[0])
    return task is not None and task.state == "queued"
