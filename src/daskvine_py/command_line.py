"""What the worker's and the factory's command lines share: the bounds and argparse types
of their numeric options, the logging they set up, and the worker's command line as its
launchers write it (``WorkerCommand``).

Below every package (it imports nothing of ours), so ``worker/`` and ``batch/``, which
never import each other, check the same values the same way, and the manager's local
launcher and the batch pools, which may not import the worker, start it with the same
argv. ``worker/args.py`` parses what ``WorkerCommand`` writes (``tests/test_command_lines.py``
holds the two together).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

#: Upper bound of every duration option, in seconds (about 11 days): past it a wait is
#: "forever" in all but name, and poll timeouts in milliseconds must stay sane.
MAX_SECONDS = 1e6
#: Cores a worker may claim: one library process per ``--lib-cores`` of them, started at
#: once. Far above any node; a typo (``--cores 100000``) must not fork that many.
MAX_CORES = 4096
#: Upper bound of ``--memory`` and ``--disk``: 1 EB, in MB.
MAX_MB = 2**40
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, else a usage error naming both."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, not {value}")
        return value

    return convert


def seconds(text: str) -> float:
    """An argparse type: a duration in seconds, > 0 and at most ``MAX_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
    if not 0 < value <= MAX_SECONDS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be > 0 and <= {MAX_SECONDS:g} s, not {text}")
    return value


def configure_logging(level: str) -> None:
    """The command line's logging, set up here only (library code never adds handlers):
    ``level`` for daskvine_py's own loggers, WARNING for other libraries' (Parsl's)
    unless DEBUG."""
    logging.basicConfig(
        level=logging.DEBUG if level == "DEBUG" else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("daskvine_py").setLevel(level)


def libraries(cores: int, lib_cores: int) -> int:
    """Library processes a worker of ``cores`` cores runs: one per ``lib_cores``, at least one."""
    return max(1, cores // lib_cores)


@dataclass(frozen=True)
class WorkerCommand:
    """``python -m daskvine_py.worker`` as a launcher starts it: the local one
    (``Manager.start_workers``) and the batch pools'. Each field is the worker's option of
    the same name (``worker/args.py``); None leaves it to the worker's default.
    """

    #: the Python that runs the worker
    python: str = sys.executable
    #: the manager's ``tcp://HOST:PORT`` (None: the connection file's)
    address: str | None = None
    connection_file: str | None = None
    cores: int | None = None
    memory: int | None = None
    disk: int | None = None
    workdir: str | None = None
    lib_cores: int | None = None
    lib_slots: int | None = None
    fetch_timeout: float | None = None
    manager_timeout: float | None = None
    log_level: str | None = None
    name: str | None = None

    def argv(self) -> list[str]:
        """The command line, ready for ``subprocess`` (or ``shlex.join`` for a job script)."""
        argv = [self.python, "-m", "daskvine_py.worker"]
        if self.address is not None:
            argv.append(self.address)
        for flag, value in (
            ("--connection-file", self.connection_file),
            ("--cores", self.cores),
            ("--memory", self.memory),
            ("--disk", self.disk),
            ("--workdir", self.workdir),
            ("--lib-cores", self.lib_cores),
            ("--lib-slots", self.lib_slots),
            ("--fetch-timeout", self.fetch_timeout),
            ("--manager-timeout", self.manager_timeout),
            ("--log-level", self.log_level),
            ("--name", self.name),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return argv
