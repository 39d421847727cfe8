"""What a run ships to workers that share no files with the caller: its software
(``environment=``: the environment and the user's code, ``software``) and its files
(``env_files=``), resolved at each ``get`` in the caller's thread.

The environment is packed or read once per content (``software.pack``: an unchanged one
is a cache hit); the code archive is rebuilt only when a module changed
(``software.code``). Both are served by the manager's archive server, started on first
use, which sends later workers to peers that already hold an archive
(``software.transfer``), so the manager's host sends each a few times, whatever the
number of workers. A run without ``environment`` costs none of this: its ``RunConfig``
carries no software and nothing is packed, hashed or served.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from daskvine_py.options import ManagerOptions, RunOptions
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security

if TYPE_CHECKING:
    from daskvine_py.software import transfer

logger = logging.getLogger("daskvine_py.manager")


class Shipped(NamedTuple):
    """What one run ships: ``RunConfig.software`` and ``RunConfig.files``."""

    software: p.Software | None
    files: tuple[tuple[str, bytes], ...]


NOTHING = Shipped(None, ())


class Shipping:
    """The archives this manager serves, by key, and its archive server."""

    def __init__(self, host: str, keys: security.Keys | None) -> None:
        self.host = host
        self.keys = keys
        #: archive key (sha256) -> its path on this host
        self.archives: dict[str, str] = {}
        self.server: transfer.ArchiveServer | None = None
        self._lock = threading.Lock()  # (gets may run in several threads)

    def resolve(self, run: RunOptions, manager: ManagerOptions) -> Shipped:
        """What a run of these options ships (``NOTHING`` for most runs)."""
        environment = run.environment if run.environment is not None else manager.environment
        if environment is None and not run.env_files:
            return NOTHING
        files = read_files(run)
        if environment is None:
            return Shipped(None, files)
        with self._lock:
            return Shipped(self._software(environment), files)

    def _software(self, environment: str | os.PathLike[str]) -> p.Software:
        from daskvine_py.software import code, pack, spec, transfer  # (only runs that ship)

        began = time.perf_counter()
        env, env_path = pack.environment_of(environment)
        if env_path is not None:
            self.archives[env.key] = env_path
        found = code.code_archive(code.default_roots())
        user_code = None
        if found is not None:
            user_code, code_path = found
            self.archives[user_code.key] = code_path
        if self.server is None:
            self.server = transfer.ArchiveServer(
                self.archives.get, self.keys, manager=True, host=self.host
            )
        logger.debug(
            "software %s: environment %s, code %s (%.3f s)",
            environment,
            env.key[:12],
            user_code.key[:12] if user_code else None,
            time.perf_counter() - began,
        )
        return p.Software(spec.software_key(env, user_code), env, user_code, (self.server.address,))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def read_files(run: RunOptions) -> tuple[tuple[str, bytes], ...]:
    """The run's ``env_files``, read now (a renewed proxy travels with the next run);
    ``ValueError`` naming the variable and the path of one that cannot be read."""
    files = []
    for variable, path in run.env_files.items():
        try:
            with open(os.path.expanduser(path), "rb") as file:
                files.append((variable, file.read()))
        except OSError as exc:
            raise ValueError(f"env_files: cannot read {variable}'s file {path!r}: {exc}") from exc
    return tuple(files)
