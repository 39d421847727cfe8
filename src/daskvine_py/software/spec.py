"""The software a run's tasks need, as it travels to workers (inside ``RunConfig``).

Plain records only (strings, integers, tuples): the manager builds them
(``pack``/``code``), the worker reads them (``node_cache``). ``unfit`` is the check a
node makes before it fetches anything: an archive built for another Python, machine or
C library cannot run there, and the worker says so, naming its node and the reason.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import NamedTuple

#: ``Environment.kind``: an archive holding an interpreter (packed by us, conda-pack,
#: venv-pack), or a requirements / lock file the node builds with ``uv``.
ARCHIVE = "archive"
REQUIREMENTS = "requirements"
KINDS = (ARCHIVE, REQUIREMENTS)


class Environment(NamedTuple):
    """A Python environment for libraries, fetched and unpacked (or built) once per node."""

    kind: str  #: ``ARCHIVE`` or ``REQUIREMENTS``
    #: what identifies its content: the archive's sha256 (hex); for requirements, the
    #: sha256 of the file's text and the Python it is built for
    key: str
    size: int  #: the archive's bytes (0: requirements)
    name: str  #: what the user named ("local", the archive's or file's path): for messages
    python: str  #: "3.11": the interpreter's minor version ("": the node's own, requirements)
    machine: str  #: ``platform.machine()`` it was built on ("": any)
    glibc: str  #: the C library it was built against ("2.36"; "": not glibc, or unknown)
    #: the interpreter's path inside the unpacked archive ("bin/python3.11"); "": found
    #: at unpack (``bin/python3``, ``bin/python``)
    interpreter: str = ""
    requirements: str = ""  #: the requirements or lock file's text (``REQUIREMENTS``)


class Code(NamedTuple):
    """The caller's own modules, as a zip archive named by its content."""

    key: str  #: sha256 (hex) of the archive's bytes
    size: int
    modules: tuple[str, ...]  #: top-level modules and packages it holds, for messages


class Software(NamedTuple):
    """What a run's libraries start with: an environment, the user's code, or both."""

    key: str  #: of both parts (``software_key``): libraries are kept per software
    environment: Environment | None
    code: Code | None
    #: where archives are asked for first: the manager's archive server ("tcp://h:p")
    sources: tuple[str, ...]


def software_key(environment: Environment | None, code: Code | None) -> str:
    """One key for an environment and a code archive (either may be None)."""
    digest = hashlib.sha256()
    digest.update(b"env:" + (environment.key.encode() if environment else b"-"))
    digest.update(b"code:" + (code.key.encode() if code else b"-"))
    return digest.hexdigest()[:32]


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
