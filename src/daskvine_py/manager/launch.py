"""Starting worker processes on this machine."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from daskvine_py.command_line import WorkerCommand
from daskvine_py.wire.exits import EXIT_MEANINGS
from daskvine_py.wire.security import CONNECTION_FILE_ENV

#: Local workers named one by one in a message; the rest are counted.
NAMED_WORKERS = 8


def spawn(
    address: str | None,
    cores: int = 1,
    name: str | None = None,
    extra_args: Sequence[str] = (),
    connection_file: str | None = None,
    command: WorkerCommand | None = None,
    **popen_options: Any,
) -> subprocess.Popen[bytes]:
    """Start ``python -m daskvine_py.worker`` as a child process that sees our ``sys.path``.

    Functions that cloudpickle sends by reference (defined in the caller's own modules)
    then import on the worker, as they would under multiprocessing's spawn. The
    connection file travels in the environment (``security.CONNECTION_FILE_ENV``), not
    on the command line; ``address``, when given, overrides the one inside it.
    ``command`` holds the worker's other options (``worker_command``), ``extra_args``
    any more (the last one given wins).

    The worker starts in a session of its own: a terminal's Ctrl-C (SIGINT to the whole
    foreground process group) then reaches only the caller, whose ``get`` cancels its run,
    rather than stopping every local worker under a manager that goes on. The worker
    still leaves with the manager: told to when it closes, and by itself after
    ``--manager-timeout`` (30 s) of silence should the manager be killed.
    """
    env = dict(popen_options.pop("env", None) or os.environ)
    paths = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if connection_file is not None:
        env[CONNECTION_FILE_ENV] = os.fspath(connection_file)
    command = dataclasses.replace(
        command or WorkerCommand(),
        python=sys.executable,
        address=address,
        cores=cores,
        name=name or None,
        # Quiet beside the caller's own output (the command line's default is INFO).
        log_level=command.log_level if command and command.log_level else "WARNING",
    )
    popen_options.setdefault("start_new_session", True)
    return subprocess.Popen(
        [*command.argv(), *extra_args], env=env, stdin=subprocess.DEVNULL, **popen_options
    )


def exit_meaning(code: int | None) -> str:
    """What a worker's exit code means, as `` (...)`` to append to a message; "" if unknown."""
    meaning = None if code is None else EXIT_MEANINGS.get(code)
    return f" ({meaning})" if meaning else ""


def kill_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill the processes still running (a manager never closed, at interpreter exit)."""
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def worker_command(
    memory: int | None,
    disk: int | None,
    workdir: str | None,
    fetch_timeout: float | None,
    lib_resources: dict[str, int],
) -> WorkerCommand:
    """The worker's options for those given (``Manager.start_workers``'s);
    ``lib_resources`` are its ``--lib-cores``/``--lib-slots``."""
    unknown = set(lib_resources) - {"cores", "slots"}
    if unknown:
        raise ValueError(f"lib_resources takes 'cores' and 'slots', not {sorted(unknown)}")
    for name, value in lib_resources.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"lib_resources[{name!r}] must be an integer >= 1, not {value!r}")
    return WorkerCommand(
        memory=memory,
        disk=disk,
        workdir=workdir,
        fetch_timeout=fetch_timeout,
        lib_cores=lib_resources.get("cores"),
        lib_slots=lib_resources.get("slots"),
    )


def how_ended(proc: subprocess.Popen[bytes]) -> str:
    """``local-0 (pid 123) was killed by SIGKILL``: a local worker that exited, in words."""
    args = list(proc.args) if isinstance(proc.args, (list, tuple)) else []
    name = str(args[args.index("--name") + 1]) if "--name" in args[:-1] else "a worker"
    code = proc.returncode
    if code is not None and code < 0:
        try:
            ended = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            ended = f"was killed by signal {-code}"
    else:
        meaning = EXIT_MEANINGS.get(code) if code else "told to stop, or the manager fell silent"
        ended = f"exited with code {code}" + (f" ({meaning})" if meaning else "")
    return f"{name} (pid {proc.pid}) {ended}"


def how_they_ended(procs: Sequence[subprocess.Popen[bytes]]) -> str:
    """Each exited local worker in words (the first ``NAMED_WORKERS``, then a count)."""
    said = [how_ended(proc) for proc in procs[:NAMED_WORKERS]]
    if len(procs) > NAMED_WORKERS:
        said.append(f"and {len(procs) - NAMED_WORKERS} more")
    return "; ".join(said)
