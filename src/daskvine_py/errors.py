"""The exception hierarchy of daskvine_py, and how remote tracebacks travel.

Every error names what it is about (a key, a function, a worker), and errors that
specialise a builtin subclass it, so callers may catch either (``GraphCycleError`` is a
``ValueError``, ``VersionMismatch`` a ``ConnectionError``).
"""

from __future__ import annotations

import linecache
import os
from typing import Any


class DaskVineError(Exception):
    """Base class of every error raised by daskvine_py itself.

    Subclasses with their own constructor arguments keep them in ``_init_args`` so the
    error survives pickling between processes unchanged.
    """

    _init_args: tuple[object, ...] = ()

    def __reduce__(self) -> str | tuple[object, ...]:
        if self._init_args:
            return (type(self), self._init_args, self.__dict__)
        return super().__reduce__()


#: Between the two texts of a task's traceback as it travels (``RemoteTraceback.from_wire``).
FULL_TRACEBACK_MARK = "\n[daskvine_py: the full traceback, internal frames included]\n"


class RemoteTraceback(Exception):
    """The worker-side traceback of a task's exception, attached as ``__cause__``.

    The user sees, first, the stack as it was on the worker (their own frames only: the
    worker's machinery and dask's task objects left out), then under "The above
    exception was the direct cause of the following exception" their call of ``get``
    and their own exception type and message. ``text`` is what is printed; ``full``
    the traceback with every frame, for debugging daskvine_py itself.
    """

    def __init__(self, text: str, full: str | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.full = text if full is None else full

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.text, self.full))

    def __str__(self) -> str:
        return "\n" + self.text.rstrip("\n")

    @classmethod
    def from_wire(cls, text: str) -> RemoteTraceback:
        """From a worker's text (``serialize.dumps_exception``): the printed part, and
        the full one after ``FULL_TRACEBACK_MARK``. Frames whose source line the worker
        could not read (a script that exists only here) get it from this machine."""
        shown, mark, full = text.partition(FULL_TRACEBACK_MARK)
        return cls(_with_source_lines(shown), _with_source_lines(full) if mark else None)


def _with_source_lines(text: str) -> str:
    """``text`` with the source line under each ``File "...", line N`` that has none,
    where that file is on this machine."""
    lines = text.splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if not line.startswith('  File "'):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith("    "):
            continue  # the worker showed it
        path, sep, rest = line[len('  File "') :].partition('", line ')
        number = rest.partition(",")[0]
        if sep and number.isdigit() and os.path.isfile(path):
            source = linecache.getline(path, int(number)).strip()
            if source:
                out.append(f"    {source}\n")
    return "".join(out)


class TaskFailed(DaskVineError):
    """A task could not run for a reason other than its own code raising.

    Raised when a task's exception could not be transported (it was not picklable),
    or when a task crashed its worker process more often than allowed.
    """

    def __init__(self, key: Any, reason: str, worker: str | None = None) -> None:
        where = f" on worker {worker}" if worker else ""
        self._init_args = (key, reason, worker)
        super().__init__(f"task {key!r} failed{where}: {reason}")
        self.key = key
        self.reason = reason
        self.worker = worker


class ResourceExhausted(TaskFailed):
    """A task went past its memory allocation on every try it was allowed: with the
    most a worker offers, or with no retries left (``docs/resources.md``).

    ``function`` names what it ran (its kind: the prefix of its key, when nothing
    better is known); ``peak`` and ``limit`` are bytes: what it was seen to use when it
    was stopped, and what its last try was allowed (0: no allocation of its own, the
    worker's whole budget).
    """

    def __init__(
        self, key: Any, function: str, peak: int, limit: int, worker: str, attempts: int
    ) -> None:
        allowed = f"its limit of {limit / 2**20:.1f} MB" if limit else "its worker's budget"
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        reason = (
            f"{function} ran out of memory: it used {peak / 2**20:.1f} MB, past {allowed} ({tries})"
        )
        super().__init__(key, reason, worker)
        self._init_args = (key, function, peak, limit, worker, attempts)
        self.function = function
        self.peak = peak
        self.limit = limit
        self.attempts = attempts


class RemoteTaskError(DaskVineError):
    """A task's own code raised, and its exception was not unpickled on this side
    (``Manager(unpickle_remote_exceptions=False)``): it stands for that exception.

    ``type_name`` is the original exception's type, qualified (``builtins.KeyError``);
    ``message`` its ``Type: text``; ``traceback`` the worker-side traceback's text, also
    attached as ``__cause__`` (``RemoteTraceback``), so it prints as a local one would.
    """

    def __init__(self, key: Any, worker: str, type_name: str, message: str, traceback: str) -> None:
        self._init_args = (key, worker, type_name, message, traceback)
        short = type_name.rpartition(".")[2]
        text = message[len(short) + 2 :] if message.startswith(f"{short}: ") else message
        super().__init__(
            f"task {key!r} raised {type_name or 'an exception'} on worker {worker}"
            f"{': ' + text if text else ''} (not unpickled: unpickle_remote_exceptions=False)"
        )
        self.key = key
        self.worker = worker
        self.type_name = type_name
        self.message = message
        self.traceback = traceback


class SerializationError(DaskVineError, TypeError):
    """A function, argument or result could not be (de)serialized.

    The message names the key of the task and what could not be serialized.
    """

    def __init__(self, key: Any, what: str, detail: str) -> None:
        self._init_args = (key, what, detail)
        super().__init__(f"cannot serialize {what} of task {key!r}: {detail}")
        self.key = key


class ImportHoistingError(DaskVineError, ImportError):
    """A module of ``import_modules`` failed to import on a worker: the run fails at once."""

    def __init__(self, module: str, worker: str, detail: str) -> None:
        self._init_args = (module, worker, detail)
        super().__init__(f"import_modules: cannot import {module!r} on worker {worker}: {detail}")
        self.module = module
        self.worker = worker


class BindError(DaskVineError, OSError):
    """The manager cannot listen where it was told: the port is taken, or the host is not
    an address of this machine. ``host``, ``port`` and ``errno`` say which; ``__cause__``
    is ZeroMQ's own error."""

    def __init__(self, host: str, port: int, errno: int | None, reason: str) -> None:
        self._init_args = (host, port, errno, reason)
        where = f"{host}:{port}" if port else f"{host} (any free port)"
        super().__init__(f"the manager cannot listen on {where}: {reason}")
        self.errno = errno
        self.host = host
        self.port = port

    def __str__(self) -> str:  # OSError's would put "[Errno n]" first: the message says it
        return str(self.args[0])


class WorkerImportError(DaskVineError, ImportError):
    """A task's function or arguments name a module its worker cannot import.

    cloudpickle sends functions of importable modules by name, so a module that is only
    on the manager's machine (a file beside the script, a package installed there only)
    fails on the worker. ``module``, ``key`` and ``worker`` say which; the message says
    how to fix it.
    """

    def __init__(self, key: Any, module: str | None, worker: str, detail: str) -> None:
        self._init_args = (key, module, worker, detail)
        shown = module or "?"
        super().__init__(
            f"task {key!r} needs module {shown!r}, which worker {worker} cannot import "
            f"({detail}): install it on the workers or make it importable there (their "
            f"PYTHONPATH), or send it by value: import {shown}; "
            f"cloudpickle.register_pickle_by_value({shown}) before calling get()",
            name=module,
        )
        self.key = key
        self.module = module
        self.worker = worker


class NoWorkersLeft(DaskVineError, RuntimeError):
    """Every worker the manager started itself has ended, and no other is connected: the
    runs waiting fail rather than wait forever. The message names the workers and how
    they ended (exit code or signal), and how to start others."""


class EnvironmentUnfit(DaskVineError, RuntimeError):
    """The software a run ships (``environment=``) cannot run on any worker that came:
    each said why (another machine, an older glibc, a broken archive, a missing package)
    and left. ``reasons`` maps each node to its reason."""

    def __init__(self, run_id: int, reasons: dict[str, str]) -> None:
        said = "; ".join(f"{host}: {why}" for host, why in sorted(reasons.items()))
        super().__init__(
            f"run {run_id} cannot run: its environment cannot run on the workers' nodes ({said})"
        )
        self.reasons = reasons


class GraphCycleError(DaskVineError, ValueError):
    """The graph has a cycle; ``cycle`` lists its keys in order."""

    def __init__(self, cycle: list[Any]) -> None:
        shown = " -> ".join(repr(k) for k in cycle[:20])
        if len(cycle) > 20:
            shown += f" -> ... ({len(cycle)} keys)"
        self._init_args = (cycle,)
        super().__init__(f"cycle detected in the task graph: {shown}")
        self.cycle = cycle


class ProtocolError(DaskVineError):
    """A message that does not follow the protocol: unknown tag, bad fields, garbage."""


class VersionMismatch(DaskVineError, ConnectionError):
    """A worker speaks another protocol version than its manager."""

    def __init__(self, manager_version: int, worker_version: int, worker: str) -> None:
        self._init_args = (manager_version, worker_version, worker)
        super().__init__(
            f"worker {worker} speaks protocol version {worker_version}, but the manager "
            f"speaks version {manager_version}: install the same daskvine-py on both"
        )
        self.manager_version = manager_version
        self.worker_version = worker_version


class InvalidTransition(DaskVineError, RuntimeError):
    """The scheduler state was asked for a transition its table does not list.

    This is always a bug in daskvine_py; ``story`` holds the key's recent history.
    """

    def __init__(self, key: Any, start: str, finish: str, story: list[str]) -> None:
        lines = "\n  ".join(story[-10:]) or "(no history)"
        self._init_args = (key, start, finish, story)
        super().__init__(f"invalid transition {start!r} -> {finish!r} for {key!r}:\n  {lines}")
        self.key = key
        self.start = start
        self.finish = finish
        self.story = story


class RunCancelled(DaskVineError):
    """The run was cancelled (Ctrl-C in ``get``, or the manager closing)."""


class SchedulerError(DaskVineError, RuntimeError):
    """The manager failed on something that concerns a run, so the run failed.

    Raised by ``get`` when handling an event of the run raised (a report about one of its
    tasks, its submission) or a worker sent a malformed report about one of its tasks.
    ``what`` names the event, its task's key and the worker; ``__cause__`` is the error
    itself. Other runs go on.
    """

    def __init__(self, run_id: int, what: str, detail: str) -> None:
        self._init_args = (run_id, what, detail)
        super().__init__(f"run {run_id} failed: the manager could not handle {what}: {detail}")
        self.run_id = run_id
        self.what = what


class ManagerDied(DaskVineError, RuntimeError):
    """The manager's I/O thread died: no run can go on, and none can start.

    ``__cause__`` is what killed it. Close the manager (``close`` still stops its local
    workers) and start a new one.
    """

    def __init__(self, detail: str) -> None:
        self._init_args = (detail,)
        super().__init__(
            f"the manager's I/O thread died ({detail}): no run can go on; close this "
            "manager and start a new one"
        )


def attach_remote_traceback(exc: BaseException, text: str, note: str | None) -> BaseException:
    """Give ``exc`` its worker-side traceback as cause, and a note naming key and worker.

    The worker's frames are printed once, in the cause: any traceback ``exc`` brought
    with it (``tblib``'s pickling, which dask installs, restores one) is dropped, so
    raising it here does not splice them in a second time."""
    exc.__traceback__ = None
    exc.__cause__ = RemoteTraceback.from_wire(text)
    if note and hasattr(exc, "add_note"):
        exc.add_note(note)
    return exc
