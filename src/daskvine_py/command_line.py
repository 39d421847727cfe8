"""What the worker's and the factory's command lines share: the bounds and argparse types
of their numeric options, and the logging they set up.

Below every package (it imports nothing of ours), so ``worker/`` and ``batch/``, which
never import each other, check the same values the same way.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

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
