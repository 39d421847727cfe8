"""Options of a run (keyword arguments of ``get``) and of a manager.

Each record is frozen and validated at construction; each tunable says what it trades.
Run options apply to one ``get`` call only: they never become state of the manager.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

#: Keyword arguments that Dask's own machinery may hand any scheduler; accepted and ignored
#: because the manager, not the caller, decides how many processes run tasks.
IGNORED_DASK_OPTIONS = frozenset({"num_workers", "chunksize", "pool"})

TASK_MODES = ("function-calls", "tasks")
#: How long a run's fetched inputs stay on the node (``cache_inputs``), shortest first:
#: ``daskvine_py.inputs.LIFETIMES``.
INPUT_LIFETIMES = ("run", "worker", "forever")
EXEC_MODES = ("direct", "fork")
#: How a category's memory allocation is chosen from its measured tasks
#: (``scheduler.sizing``, docs/resources.md "Sizing categories").
SIZING_MODES = ("fixed", "max", "min-waste", "max-throughput")

#: Options that belong to workers, not to a run: ``get`` names where they go instead.
WORKER_SETTINGS = {
    "lib_resources": "it shapes a worker's persistent library processes: pass it to "
    "start_workers(lib_resources=...) or give the worker --lib-cores/--lib-slots",
}


def input_lifetime(value: object) -> str:
    """``cache_inputs`` as the lifetime's name: True is "worker", False and None are ""
    (off); a ``ValueError`` naming the option for anything else."""
    if value is True:
        return "worker"
    if value is False or value is None or value == "":
        return ""
    if isinstance(value, str) and value in INPUT_LIFETIMES:
        return value
    raise ValueError(
        f"cache_inputs must be one of {INPUT_LIFETIMES} (how long a run's fetched inputs "
        f'stay on the node), True ("worker"), False or None, not {value!r}'
    )


def check_environment(value: object) -> None:
    """An environment: None, "local", or the path of an archive or requirements file."""
    if value is None or (isinstance(value, str | os.PathLike) and str(value)):
        return
    raise ValueError(
        f"environment must be 'local', the path of an environment archive or of a "
        f"requirements file, or None, not {value!r}"
    )


def check_fast_abort(value: object) -> None:
    """A fast-abort multiplier: None, 0 (off) or a finite number >= 1."""
    if value is None:
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if number == 0 or (math.isfinite(number) and number >= 1):
            return
    raise ValueError(f"fast_abort must be a number >= 1, or 0 or None (off), not {value!r}")


@dataclass(frozen=True)
class RunOptions:
    """Options of one ``get`` call."""

    #: How often a task may be re-run after it crashed its process or lost its worker.
    #: Higher survives more preemptions; lower reports a task that kills workers sooner.
    #: Exceptions raised by the task's own code are never retried.
    retries: int = 3
    #: Inputs per task when a large associative reduction is rewritten as a tree
    #: (``rewrite.DEFAULT_ARITY``, where the measurements behind it are). Smaller bounds
    #: a reducing worker's memory tighter but makes more tasks and more levels; None turns
    #: rewriting off.
    reduction_arity: int | None = 8
    #: Fewest inputs a reduction needs before it is rewritten (``rewrite.DEFAULT_THRESHOLD``):
    #: above the fan-ins of Dask's own trees, which are left alone.
    reduction_threshold: int = 32
    #: "function-calls": tasks run inside the worker's resident library processes (no
    #: interpreter start, functions deserialized once). "tasks": every task runs in a
    #: fresh Python interpreter: full isolation, at the cost of a start-up per task.
    task_mode: str = "function-calls"
    #: In function-calls mode: "direct" runs a task in the library process itself
    #: (fastest); "fork" runs it in a child forked from the library, so nothing a task
    #: leaves behind (globals, patched modules, leaked memory) reaches the next one, at
    #: the cost of a fork per task.
    exec_mode: str = "direct"
    #: Modules each library imports once, before the first task of this run (import
    #: hoisting). A module that fails to import fails the run with an error naming it.
    import_modules: tuple[str, ...] = ()
    #: Environment variables set for each task of this run (restored after it in direct
    #: mode; set in the child in fork and tasks modes).
    env_vars: Mapping[str, str] = field(default_factory=dict)
    #: Give every task its own current directory and ``TMPDIR`` under the worker's
    #: ``--workdir``, removed after it. Always on in fork and tasks modes; off by default
    #: in direct mode, where it would cost more than a tiny task itself.
    task_sandbox: bool = False
    #: Show a progress bar (tasks done / total, rate) on stderr. None: only when stderr is
    #: a terminal. Costs a redraw ten times a second in the waiting thread, nothing per task.
    progress: bool | None = None
    #: Write a self-contained HTML performance report of this run here (see ``report.page``).
    #: Records every task's dispatch and completion: a few hundred bytes of memory per task.
    report: str | os.PathLike[str] | None = None
    #: Write the run's event log here as JSON lines (gzip when the name ends in ``.gz``),
    #: from which ``python -m daskvine_py report`` rebuilds the report. Same cost as ``report``.
    event_log: str | os.PathLike[str] | None = None
    #: Copies to keep, on different workers, of each result that other tasks read (outputs
    #: included; an output nothing reads goes to the caller and is kept nowhere). 2 or more
    #: lets a run on preemptible nodes lose a worker without recomputing what it held, at
    #: the cost of copying every intermediate (network, memory) while it is needed.
    replicas: int = 1
    #: Share of the tasks (0 to 1) run a second time on another worker, their results'
    #: bytes compared by content hash: a mismatch fails the run naming both workers (a
    #: node that corrupts data). Chosen tasks send their value to the manager and hold
    #: their inputs until the re-run read them: off (0) by default (docs/faults.md).
    verify: float = 0.0
    #: Run each linear chain of tasks (a task whose only reader has no other input) as one
    #: task, up to ``fusion.FUSE_LIMIT`` links: no round trip and no state per link. The
    #: chain is one task for retries, progress and the report, named by its last key.
    #: False sends every task on its own. None: fuse, except in runs that use the result
    #: cache, which keeps every task's result apart (a changed last link then re-runs
    #: only itself).
    fuse: bool | None = None
    #: Reuse results across runs by content (``docs/cache.md``): a task whose cache key
    #: (its function's code, literal arguments, local files' size and mtime, its inputs'
    #: keys) has a result on a worker or in ``cache_dir`` is not run, and this run's
    #: results stay on their workers for later runs. Costs hashing every task (a few µs)
    #: and workers' memory for what they keep. None: the manager's ``cache`` setting (on
    #: when a ``cache_dir`` is given).
    cache: bool | None = None
    #: A directory (local, or shared by managers) that also keeps results across manager
    #: restarts: every result of a cacheable task travels to the manager and is written
    #: there. None: the manager's ``cache_dir``.
    cache_dir: str | os.PathLike[str] | None = None
    #: Fast abort (docs/faults.md): a task running this many times its kind's usual
    #: duration is taken back and run on another worker. None: the manager's
    #: ``fast_abort``; 0: off for this run.
    fast_abort: float | None = None
    #: The software its tasks run with, on workers that share no files with the caller
    #: (docs/environments.md): "local" (this process's own environment, packed once per
    #: content), the path of an archive you built (conda-pack, venv-pack), or of a
    #: requirements file each node builds with ``uv``. The modules of yours that no
    #: environment holds (the working directory's, editable installs) travel with it, by
    #: content: a changed module reaches every library. Workers fetch both once per node.
    #: None: the manager's ``environment`` (by default none: workers use their own Python
    #: and files, and nothing is packed or shipped).
    environment: str | os.PathLike[str] | None = None
    #: Files the tasks read on the nodes, by the environment variable that names them:
    #: ``{"X509_USER_PROXY": "/tmp/x509up_u1000"}``. Each is read at every ``get`` and
    #: travels encrypted to the workers, which write it with mode 0600 in their directory
    #: (removed when they leave) and set the variable to that path for the tasks.
    env_files: Mapping[str, str | os.PathLike[str]] = field(default_factory=dict)
    #: Tasks read ``root://`` inputs (uproot, coffea: through fsspec) from the node's input
    #: cache (``daskvine_py.inputs``): each file fetched whole, once per node, named by its
    #: URL, size and modification time (a changed file is fetched again), within the
    #: worker's ``--disk``. A later run reads nothing from the storage while the files are
    #: kept; the first reads every byte of each file, even columns it does not use. How
    #: long they stay: ``"run"`` (removed as the run ends on each worker), ``"worker"``
    #: (until the worker that read them exits; what ``True`` means: nothing outlives a
    #: batch job's pilot), ``"forever"`` (across runs and worker restarts, bounded by size
    #: only). False or None: off. Read as the lifetime's name ("" when off).
    cache_inputs: bool | str | None = False
    #: With ``cache_inputs``: a worker lacking an input file that another worker's node
    #: holds pulls it from that node (its input server, with the run's keys) rather than
    #: from the storage; the manager places readers where their files are first, so this
    #: is for the readers it could not. False: every node reads from the storage (sites
    #: that forbid traffic between nodes).
    input_peers: bool = True

    def __post_init__(self) -> None:
        check_fast_abort(self.fast_abort)
        check_environment(self.environment)
        files = self.env_files
        if not isinstance(files, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str | os.PathLike) for k, v in files.items()
        ):
            raise ValueError(f"env_files must map variable names to paths, not {files!r}")
        object.__setattr__(self, "env_files", dict(files))
        if self.fuse is not None and not isinstance(self.fuse, bool):
            raise ValueError(f"fuse must be True, False or None, not {self.fuse!r}")
        if self.task_mode not in TASK_MODES:
            raise ValueError(f"task_mode must be one of {TASK_MODES}, not {self.task_mode!r}")
        if self.exec_mode not in EXEC_MODES:
            raise ValueError(f"exec_mode must be one of {EXEC_MODES}, not {self.exec_mode!r}")
        modules = self.import_modules
        if isinstance(modules, str):
            modules = (modules,)
        modules = tuple(modules)
        if not all(isinstance(m, str) and m for m in modules):
            raise ValueError(f"import_modules must be module names, not {self.import_modules!r}")
        object.__setattr__(self, "import_modules", modules)
        env = self.env_vars
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"env_vars must map names to strings, not {env!r}")
        object.__setattr__(self, "env_vars", dict(env))
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a non-negative integer, not {self.retries!r}")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, not {self.replicas!r}")
        verify = self.verify
        if isinstance(verify, bool) or not isinstance(verify, int | float) or not 0 <= verify <= 1:
            raise ValueError(f"verify must be a number from 0 to 1, not {verify!r}")
        arity = self.reduction_arity
        if arity is not None and (not isinstance(arity, int) or arity < 2):
            raise ValueError(f"reduction_arity must be an integer >= 2 or None, not {arity!r}")
        if not isinstance(self.reduction_threshold, int) or self.reduction_threshold < 2:
            raise ValueError(
                f"reduction_threshold must be an integer >= 2, not {self.reduction_threshold!r}"
            )
        object.__setattr__(self, "cache_inputs", input_lifetime(self.cache_inputs))
        if not isinstance(self.input_peers, bool):
            raise ValueError(f"input_peers must be True or False, not {self.input_peers!r}")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ValueError(f"progress must be True, False or None, not {self.progress!r}")
        if self.cache is not None and not isinstance(self.cache, bool):
            raise ValueError(f"cache must be True, False or None, not {self.cache!r}")
        for name in ("report", "event_log", "cache_dir"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, str | os.PathLike):
                raise ValueError(f"{name} must be a path or None, not {path!r}")

    def as_dict(self) -> dict[str, Any]:
        """The options by name (shallow: ``dataclasses.asdict`` deep-copies, at some
        100 µs per call)."""
        return {name: getattr(self, name) for name in _RUN_OPTION_NAMES}

    @classmethod
    def from_kwargs(
        cls, kwargs: Mapping[str, Any], defaults: RunOptions | None = None
    ) -> RunOptions:
        """The options of a ``get`` called with ``kwargs``; the others from ``defaults``
        (``config.run_options``: ``dask.config``), else the built-in ones."""
        if not kwargs:
            return defaults or _DEFAULT_RUN_OPTIONS  # frozen; most calls pass no options
        known = frozenset(_RUN_OPTION_NAMES)
        for name in WORKER_SETTINGS.keys() & kwargs.keys():
            raise TypeError(f"{name} is not an option of get(): {WORKER_SETTINGS[name]}")
        unknown = set(kwargs) - known - IGNORED_DASK_OPTIONS
        if unknown:
            raise TypeError(
                f"get() got unknown option(s) {sorted(unknown)}; known options: {sorted(known)}"
            )
        given = {k: v for k, v in kwargs.items() if k in known}
        return cls(**given) if defaults is None else replace(defaults, **given)

    @property
    def default_execution(self) -> bool:
        """True when tasks run the default way, so workers need to be told nothing."""
        return (
            self.task_mode == "function-calls"
            and self.exec_mode == "direct"
            and not self.import_modules
            and not self.env_vars
            and not self.task_sandbox
            and self.environment is None
            and not self.env_files
            and not self.cache_inputs
        )


_RUN_OPTION_NAMES = tuple(f.name for f in fields(RunOptions))
_DEFAULT_RUN_OPTIONS = RunOptions()


@dataclass(frozen=True)
class ManagerOptions:
    """Settings of a manager, fixed for its lifetime."""

    #: Interface to listen on. 127.0.0.1 admits local workers only; "0.0.0.0" or a
    #: hostname admits remote workers (they join with the connection file).
    host: str = "127.0.0.1"
    #: Port to listen on; 0 picks a free one (see ``Manager.address``).
    port: int = 0
    #: Seconds between heartbeats the manager sends to idle workers. Shorter notices a
    #: dead manager sooner on the worker side, at the cost of more idle traffic.
    heartbeat_interval: float = 1.0
    #: Seconds of silence after which a worker is declared lost and its work re-run.
    #: Shorter recovers sooner from dead nodes; too short declares busy nodes dead.
    worker_timeout: float = 30.0
    #: Upper bound on the tasks a worker holds beyond one per core. Within it, the manager
    #: sizes each worker's queue from the measured round trip and an EMA of task durations
    #: (see ``saturation``). Higher keeps workers busy on tiny tasks over slow links; lower
    #: bounds how much unstarted work can sit on one worker (idle workers take it back).
    max_extra_tasks_per_core: int = 16
    #: A fixed number of extra tasks per core instead of the EMA sizing; None (the default)
    #: sizes queues from measurements. For comparison benchmarks and for workloads whose
    #: task durations vary too wildly to estimate.
    fixed_extra_tasks_per_core: int | None = None
    #: CurveZMQ on every socket (see ``security``): only holders of the run's keys can
    #: connect, and every message is encrypted. False is for trusted benchmarks only:
    #: then anyone who can reach the port can run code as you.
    security: bool = True
    #: A file of the manager's keys to reuse across restarts, so that workers holding an
    #: earlier connection file can join the new manager; made with fresh keys if it does
    #: not exist. None: fresh keys for every manager.
    key_file: str | os.PathLike[str] | None = None
    #: Where to write the connection file workers join with (mode 0600, its directory
    #: made 0700). None: a new file under ``security.default_connection_dir()``, removed
    #: when the manager closes.
    connection_file: str | os.PathLike[str] | None = None
    #: The default of ``get(cache=...)``: reuse results across runs by content.
    cache: bool = False
    #: The default of ``get(cache_dir=...)``: where results are kept across restarts.
    cache_dir: str | os.PathLike[str] | None = None
    #: Bytes a cache directory may hold; past it the least recently used results go.
    cache_dir_limit: int = 10 * 2**30
    #: Bytes of cached results each worker keeps for later runs (every copy counts), on
    #: top of what runs in progress hold; past it the least recently used are released.
    #: More reuses more; less leaves the worker's memory and spill disk to the runs.
    cache_worker_bytes: int = 2 * 2**30
    #: Unpickle a failed task's exception in the caller's thread, so that ``get`` raises
    #: it as it was raised (``pytest.raises(ZeroDivisionError)`` works, as with Dask's own
    #: schedulers). False never opens that pickle, which any holder of the connection file
    #: could have written: ``get`` raises a ``RemoteTaskError`` naming the task, the
    #: worker, the exception's type and message, with the worker's traceback.
    unpickle_remote_exceptions: bool = True
    #: The default of ``get(fast_abort=...)``: a task running this many times its kind's
    #: usual duration (and past its spread) is taken back and run on another worker
    #: (docs/faults.md). Lower catches stragglers sooner but kills more tasks that were
    #: merely long; 0 or None turns it off.
    fast_abort: float | None = 3.0
    #: How each category of tasks (its keys' prefix, or ``dask.annotate(category=...)``)
    #: is allotted memory once one of its tasks was measured (docs/resources.md):
    #: "max" (the largest peak seen, plus a margin), "min-waste", "max-throughput"
    #: (from the spread of peaks seen, counting a retry as the cost of too little), or
    #: "fixed" (only annotated ``resources={"memory": MB}``; no measuring, no limit).
    sizing: str = "max"
    #: Modes of named categories, overriding ``sizing``: ``{"load": "min-waste"}``.
    sizing_categories: Mapping[str, str] = field(default_factory=dict)
    #: Where the live dashboard listens, "host:port" (docs/live.md): this machine only
    #: and a free port by default; its link (``Manager.dashboard_link``) carries the token
    #: every request needs. None: no dashboard.
    dashboard_address: str | None = "127.0.0.1:0"
    #: The default of ``get(environment=...)``: the software runs ship to workers that
    #: share no files with the caller ("local", an archive's or a requirements file's
    #: path; docs/environments.md). None: workers run tasks with their own Python.
    environment: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        check_fast_abort(self.fast_abort)
        check_environment(self.environment)
        if self.sizing not in SIZING_MODES:
            raise ValueError(f"sizing must be one of {SIZING_MODES}, not {self.sizing!r}")
        named = self.sizing_categories
        if not isinstance(named, Mapping) or not all(
            isinstance(k, str) and v in SIZING_MODES for k, v in named.items()
        ):
            raise ValueError(
                f"sizing_categories must map category names to one of {SIZING_MODES}, not {named!r}"
            )
        object.__setattr__(self, "sizing_categories", dict(named))
        for name in ("key_file", "connection_file", "cache_dir"):  # "~/..." as a shell reads it
            path = getattr(self, name)
            if isinstance(path, str | os.PathLike):
                object.__setattr__(self, name, os.path.expanduser(path))
        address = self.dashboard_address
        if address is not None and (
            not isinstance(address, str)
            or not address.rpartition(":")[2].isdigit()
            or int(address.rpartition(":")[2]) > 65535
        ):
            raise ValueError(
                "dashboard_address must be 'host:port' (port 0: a free one) or None, "
                f"not {address!r}"
            )
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(
                f"host must be an address or host name of this machine, not {self.host!r}"
            )
        port = self.port
        if not _is_int(port) or not 0 <= port < 65536:
            raise ValueError(
                f"port must be an integer in [0, 65535] (0 picks a free port), not {port!r}"
            )
        check_seconds("heartbeat_interval", self.heartbeat_interval)
        check_seconds("worker_timeout", self.worker_timeout)
        if self.worker_timeout <= self.heartbeat_interval:
            raise ValueError(
                "need heartbeat_interval < worker_timeout, got "
                f"{self.heartbeat_interval} and {self.worker_timeout}"
            )
        if not _is_int(self.max_extra_tasks_per_core) or self.max_extra_tasks_per_core < 0:
            raise ValueError(
                "max_extra_tasks_per_core must be an integer >= 0, "
                f"not {self.max_extra_tasks_per_core!r}"
            )
        fixed = self.fixed_extra_tasks_per_core
        if fixed is not None and (not _is_int(fixed) or fixed < 0):
            raise ValueError(
                f"fixed_extra_tasks_per_core must be an integer >= 0 or None, not {fixed!r}"
            )
        if not isinstance(self.security, bool):
            raise ValueError(f"security must be True or False, not {self.security!r}")
        for name in ("cache", "unpickle_remote_exceptions"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, not {getattr(self, name)!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, str | os.PathLike):
            raise ValueError(f"cache_dir must be a path or None, not {self.cache_dir!r}")
        for name in ("cache_dir_limit", "cache_worker_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a number of bytes >= 0, not {value!r}")
        if self.key_file is not None and not self.security:
            raise ValueError("key_file needs security=True: without security there are no keys")


def _is_int(value: object) -> bool:
    """An integer, and not a bool (``port=True`` is a mistake, not port 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_seconds(name: str, value: object, zero: bool = False) -> float:
    """``value`` as a duration in seconds: a finite number > 0 (>= 0 with ``zero``), or
    a ``ValueError`` naming ``name``. NaN passes every comparison's negation, and a NaN
    or infinite timer never fires (or fires at once): both are refused where they enter."""
    bound = ">= 0" if zero else "> 0"
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds {bound}, not {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be a finite number of seconds {bound}, not {value!r}")
    return float(value)
