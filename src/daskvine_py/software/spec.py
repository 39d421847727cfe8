"""The software a run's tasks need, as it travels to workers (inside ``RunConfig``).

Plain records only (strings, integers, tuples), defined with the wire's records
(``wire.software``): the manager builds them (``pack``/``code``), the worker reads them
(``node_cache``). ``unfit`` is the check a node makes before it fetches anything: an
archive built for another machine or an older C library cannot run there, and the
worker says so, naming its node and the reason.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import NamedTuple

from daskvine_py.wire.software import (
    ARCHIVE,
    KINDS,
    REQUIREMENTS,
    Code,
    Environment,
    Software,
    software_key,
)

__all__ = [
    "ARCHIVE",
    "KINDS",
    "REQUIREMENTS",
    "Code",
    "Environment",
    "NodeFacts",
    "Software",
    "glibc",
    "node_facts",
    "software_key",
    "unfit",
]


class NodeFacts(NamedTuple):
    """What a node offers an environment."""

    python: str  #: the worker's own Python, "3.11"
    machine: str
    glibc: str  #: "" when the C library is not glibc


def node_facts() -> NodeFacts:
    """This node's facts."""
    return NodeFacts(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine(), glibc())


def glibc() -> str:
    """The running glibc's version ("2.36"), or "" where the C library is another."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return ""
    return name.split()[-1] if name.startswith("glibc") else ""


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


def unfit(environment: Environment, node: NodeFacts) -> str | None:
    """Why ``environment`` cannot run on a node with ``node``'s facts; None if it can.

    An archive carries its own interpreter, so only the machine and the C library
    matter (a newer glibc runs what an older one built); a requirements file is built
    with the node's own Python, so nothing is checked before the build.
    """
    if environment.kind == REQUIREMENTS:
        return None
    if environment.machine and node.machine and environment.machine != node.machine:
        return (
            f"the environment {environment.name!r} was built for {environment.machine}, "
            f"this node is {node.machine}"
        )
    if environment.glibc:
        if not node.glibc:
            return (
                f"the environment {environment.name!r} needs glibc {environment.glibc}, "
                "this node's C library is not glibc"
            )
        need, have = _version(environment.glibc), _version(node.glibc)
        if need and have and have < need:
            return (
                f"the environment {environment.name!r} needs glibc {environment.glibc} or "
                f"newer, this node has {node.glibc}"
            )
    return None
