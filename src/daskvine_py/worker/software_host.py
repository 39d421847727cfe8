"""The shell's side of shipped software: prepared on the node out of the loop, libraries
started with it, archives served to peers, the files runs ship.

``WorkerState`` decides when (``PrepareSoftware``, ``StartLibrary.software``); this does
the I/O. A preparation (fetch, unpack or build, check: ``software.node_cache``) may take
minutes for a large environment, so it runs on a thread of its own and its outcome comes
back to the loop through a pipe the loop polls: the worker answers its manager and peers
meanwhile. Archives are fetched from the manager's archive server, which sends later
workers to peers that hold them (``software.transfer``); this worker's own archive server
serves what its node holds to those peers.

A library of shipped software is that environment's interpreter running this worker's
own ``daskvine_py`` (a directory holding only a link to it goes first on ``PYTHONPATH``,
so the library speaks the worker's pipe protocol whatever the environment holds), then
the user's code archive, then the environment's own packages.

Files a run ships (``RunConfig.files``: an X.509 proxy, a token) are written with mode
0600 in the worker's directory, replaced atomically when a later run brings new content,
and named to the tasks by their variable; the directory goes with the worker.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import socket
import threading

from daskvine_py.software import node_cache, transfer
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.worker.messages import SoftwarePrepared

logger = logging.getLogger("daskvine_py.worker")

#: This worker's ``daskvine_py`` package directory (``worker``'s parent)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def files_digest(files: tuple[tuple[str, bytes], ...]) -> str:
    """What names a run's files (``RunConfig.files``): their variables and contents."""
    digest = hashlib.sha256()
    for variable, content in sorted(files):
        digest.update(b"%d:%s\0%d:" % (len(variable), variable.encode(), len(content)))
        digest.update(content)
    return digest.hexdigest()


class SoftwareHost:
    """Software prepared on this node, by key; see the module docstring."""

    def __init__(
        self,
        workdir: str,
        name: str,
        host: str,
        keys: security.Keys | None,
        cache_root: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.host = host  #: the interface peers reach this worker on
        self.keys = keys
        self.cache_root = cache_root
        self.cache: node_cache.NodeCache | None = None
        self.server: transfer.ArchiveServer | None = None
        #: software key -> how its libraries start
        self.prepared: dict[str, node_cache.Prepared] = {}
        self._done: queue.SimpleQueue[SoftwarePrepared] = queue.SimpleQueue()
        #: written once per finished preparation; the loop polls the read end
        self.wake_fd, self._wake_write = os.pipe()
        os.set_blocking(self.wake_fd, False)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # (preparations run on threads of their own)
        self.files_dir = os.path.join(workdir, "files")
        #: a directory holding only a link to this worker's ``daskvine_py``
        self.path_dir = os.path.join(workdir, "pythonpath")

    # -- preparing ----------------------------------------------------------------------

    def prepare(self, software: p.Software) -> None:
        """Start preparing ``software`` (``SoftwarePrepared`` comes back through ``drain``)."""
        thread = threading.Thread(
            target=self._prepare, args=(software,), name="daskvine-software", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _open(self) -> tuple[node_cache.NodeCache, transfer.ArchiveServer]:
        """The node's cache and this worker's archive server, made on first use."""
        with self._lock:
            if self.cache is None:
                self.cache = node_cache.NodeCache(self.cache_root or node_cache.default_root())
            if self.server is None:
                self.server = transfer.ArchiveServer(
                    self.cache.archive_path,
                    self.keys,
                    host=self.host,
                    name=f"worker {self.name}'s archive server",
                )
            os.makedirs(self.path_dir, exist_ok=True)
            link = os.path.join(self.path_dir, "daskvine_py")
            if not os.path.lexists(link):
                os.symlink(_PACKAGE, link)
            return self.cache, self.server

    def _prepare(self, software: p.Software) -> None:
        error: str | None = None
        where = f"worker {self.name} on {socket.gethostname()}"
        try:
            cache, server = self._open()
            fetch = functools.partial(
                transfer.fetch, sources=software.sources, keys=self.keys, own_address=server.address
            )
            self.prepared[software.key] = cache.prepare(software, fetch)
        except node_cache.SoftwareUnfit as exc:
            error = f"{where}: {exc.reason}"
        except Exception as exc:  # a cache directory it cannot make, a full disk...
            error = f"{where} could not prepare the run's software: {type(exc).__name__}: {exc}"
        self._done.put(SoftwarePrepared(software.key, error))
        try:
            os.write(self._wake_write, b"!")
        except OSError:  # closed: the worker is leaving
            pass

    def drain(self) -> list[SoftwarePrepared]:
        """The preparations finished since the last call (the wake pipe was readable)."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        done = []
        while not self._done.empty():
            done.append(self._done.get())
        return done

    def launch(self, key: str) -> tuple[str, dict[str, str]]:
        """The interpreter and the variables a library or task process of ``key`` runs
        with (it was prepared)."""
        prepared = self.prepared[key]
        env = dict(os.environ)
        env.pop("PYTHONHOME", None)
        env.update(prepared.env)
        env["PYTHONPATH"] = os.pathsep.join((self.path_dir, *prepared.pythonpath))
        env["PYTHONNOUSERSITE"] = "1"  # the node user's own packages are not the software's
        return prepared.python, env

    # -- files ------------------------------------------------------------------------

    def with_files(self, config: p.RunConfig) -> p.RunConfig:
        """``config`` with its files written here and named in its variables."""
        if not config.files:
            return config
        os.makedirs(self.files_dir, mode=0o700, exist_ok=True)
        named = []
        for variable, content in config.files:
            path = os.path.join(self.files_dir, variable)
            part = f"{path}.{os.getpid()}.part"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, content)
            finally:
                os.close(fd)
            os.replace(part, path)
            named.append((variable, path))
        return config._replace(env_vars=(*config.env_vars, *named), files=())

    def close(self) -> None:
        """Stop serving archives and drop this worker's hold on the node's cache."""
        if self.server is not None:
            self.server.close()
        if self.cache is not None:
            self.cache.close()
        for fd in (self.wake_fd, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass


def own_python() -> bool:
    """Whether libraries can start with this worker's own Python: dask and cloudpickle
    are installed beside it (not in the small install, ``pip install daskvine-py[worker]``
    with ``--no-deps``)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("dask", "cloudpickle"))
