"""The software a run's tasks need, as it travels in ``RunConfig`` (``software.spec``
adds what a node checks; ``software.pack`` and ``software.code`` build them)."""

from __future__ import annotations

import hashlib
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
