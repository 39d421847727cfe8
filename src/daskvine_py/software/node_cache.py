"""The worker's side: a run's software, fetched and unpacked (or built) once per node.

The workers of one node share one directory (``default_root``: node-local, under the
temp directory, never ``$HOME``, which is often a shared filesystem where locks are
unreliable)::

    root/
      archives/<key>          an archive as fetched and checked (kept: peers fetch from it)
      archives/<key>.part     one being fetched
      env/<key>/              an environment: unpacked archive, or a venv uv built
      env/.<key>.<pid>.tmp/   one being unpacked or built
      code/<key>/             the caller's modules (a zip), unpacked
      locks/<key>.lock        exclusive while one worker prepares (or removes) the entry
      locks/<key>.use         shared while a worker's libraries use the entry

An entry is complete once its directory holds ``.complete`` (written last; its text is
the interpreter's path inside it, its mtime the entry's last use) and ``.size`` (the
unpacked bytes). Nothing in memory is needed to find one: a restarted worker uses what is
there. A worker that finds an entry incomplete takes its ``.lock`` and looks again: the
second worker of a node waits there and then finds the first one's work done, so a node
fetches and unpacks each archive once. Under the lock anything else of that key (a
``.tmp`` directory, a ``.part`` file, a directory without its marker) is a leftover of a
worker that died preparing it, and goes.

How an environment is made ready, and why in this order:

1. the node's facts (``spec.unfit``): an archive built for another machine or a newer
   glibc is refused before a byte is fetched;
2. the archive is fetched to ``.part`` and checked (size and sha256) before it is renamed
   into place; it is unpacked into a ``.tmp`` directory with ``tarfile``'s "tar" filter
   (absolute symlinks stay: environments have them; names that leave the directory do not),
   or built there with ``uv venv --relocatable`` and ``uv pip install``;
3. the directory is renamed to its place, and only then is ``bin/conda-unpack`` run:
   conda-pack archives record their build prefix and conda-unpack rewrites it to the
   directory it runs in, so it must run where the environment will stay. Our own archives
   and uv's relocatable venvs find their prefix from the interpreter's location, so the
   rename does not disturb them;
4. the interpreter is asked its version and to import ``cloudpickle`` and ``dask`` (a
   library needs both): a broken unpack, a binary for another machine, a missing shared
   library or a Python older than 3.10 is found here, with the interpreter's own words;
5. ``.size`` and then ``.complete`` are written. A failure at any step removes what the
   step left (the archive too: it is kept only beside its unpacked entry).

The directory is kept under ``limit`` bytes (archives and unpacked entries together):
after each ``prepare`` the least recently used entries go, each with its archive, but
only one whose ``.use`` lock can be taken exclusively at once: nothing a worker's
libraries use is ever removed, and a worker takes its shared ``.use`` lock before it
looks for the entry, so an entry cannot go between the look and the use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import logging
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from daskvine_py.software.spec import (
    ARCHIVE,
    REQUIREMENTS,
    Code,
    Environment,
    NodeFacts,
    Software,
    node_facts,
    unfit,
)

logger = logging.getLogger("daskvine_py.worker")

#: Bytes kept by default (archives and unpacked entries): past it the least recently used
#: entries not in use go. An environment with dask, numpy and pandas unpacks to about
#: 0.5 GB and its archive is a third of that; 20 GiB holds a few dozen without a
#: node's temp disk filling up.
DEFAULT_LIMIT = 20 * 2**30
#: Seconds a ``prepare`` may take by default, waiting for another worker included: a uv
#: build that compiles from source can take long, a node that never finishes should not
#: hold its worker forever.
DEFAULT_TIMEOUT = 1800.0
#: What a library imports before its first task: an environment without them cannot run one.
NEEDED = ("cloudpickle", "dask", "msgpack")
#: The oldest Python daskvine_py's libraries run on.
MIN_PYTHON = (3, 10)

COMPLETE = ".complete"
SIZE = ".size"
_KEY = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")
_TMP = re.compile(r"\.([0-9A-Za-z][0-9A-Za-z_-]{0,127})\.[0-9]+\.tmp")
#: what the interpreter is asked: its version, then each module it cannot import (written
#: for any Python, so that an old one answers with its version rather than a SyntaxError)
_PROBE = (
    "import sys\n"
    "sys.stdout.write('%d.%d\\n' % tuple(sys.version_info[:2]))\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        __import__(name)\n"
    "    except Exception as exc:\n"
    "        sys.stdout.write('missing %s %s\\n' % (name, exc))\n"
)
#: a requirements text that is a PEP 751 lock file (uv reads it by its name, pylock.toml)
_PYLOCK = re.compile(r"^\s*lock-version\s*=", re.MULTILINE)


class SoftwareUnfit(Exception):
    """A run's software cannot be made ready on this node; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  #: one sentence naming what failed


class Prepared(NamedTuple):
    """How a run's libraries start on this node."""

    python: str  #: the interpreter libraries start with
    #: variables to set for them: ``LD_LIBRARY_PATH`` (an archive's ``lib`` first, the
    #: node's own after it) for archives, ``VIRTUAL_ENV`` for uv's venvs; nothing else
    env: dict[str, str]
    #: directories for ``PYTHONPATH`` (the caller's unpacked code), after the worker's own
    #: daskvine_py directory, which the caller adds
    pythonpath: tuple[str, ...]
    key: str  #: ``Software.key``


#: ``(archive key (its sha256), size, destination path)``: writes the archive's bytes there
#: or raises (the transfer layer's: from the manager's host or a peer).
Fetch = Callable[[str, int, str], None]


def default_root() -> str:
    """``$DASKVINE_PY_SOFTWARE_CACHE``, else a directory of this user's under the node's temp
    directory (``$TMPDIR``, else /tmp): node-local, so that its locks hold."""
    configured = os.environ.get("DASKVINE_PY_SOFTWARE_CACHE")
    return os.path.abspath(configured) if configured else _temporary_root()


def _temporary_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"daskvine_py-{os.getuid()}", "software")


class _Budget:
    """The seconds left to one ``prepare``."""

    __slots__ = ("seconds", "deadline")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class _Entry(NamedTuple):
    """What the directory holds of one key, for eviction."""

    used: float  #: last use (the newest ``.complete``'s mtime; 0.0: only leftovers)
    size: int
    paths: tuple[str, ...]  #: what goes


class NodeCache:
    """The node's software directory, as one worker uses it (thread-safe).

    Each ``prepare`` keeps shared ``.use`` locks on what it returned until ``release``
    (or ``close``), so other workers of the node cannot evict it meanwhile.
    """

    def __init__(self, root: str, limit: int = DEFAULT_LIMIT) -> None:
        self.root = os.path.abspath(root)
        self.limit = limit
        if self.root == _temporary_root():  # where anyone may have made it first
            os.makedirs(os.path.dirname(self.root), mode=0o700, exist_ok=True)
            _check_private(os.path.dirname(self.root))
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        if self.root == _temporary_root():
            _check_private(self.root)
        for part in ("env", "code", "archives", "locks"):
            os.makedirs(os.path.join(self.root, part), exist_ok=True)
        self._lock = threading.Lock()
        #: software key -> the ``.use`` locks (open descriptors) held for it
        self._uses: dict[str, list[int]] = {}
        #: keys of the entries this object unpacked or built (it found the others ready)
        self.built: list[str] = []

    def __repr__(self) -> str:
        return f"<NodeCache {self.root} {len(self._uses)} in use>"

    def __enter__(self) -> NodeCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the worker's calls -------------------------------------------------------------

    def prepare(
        self,
        software: Software,
        fetch: Fetch,
        node: NodeFacts | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Prepared:
        """Make ``software`` ready here (fetching what the node lacks) and hold it in use.

        Raises ``SoftwareUnfit`` naming what failed: the node's facts, a corrupt archive,
        an interpreter that does not run, a missing module, uv, or the timeout.
        """
        budget = _Budget(timeout)
        environment, code = software.environment, software.code
        if environment is not None:
            reason = unfit(environment, node if node is not None else node_facts())
            if reason:
                raise SoftwareUnfit(reason)
        held: list[int] = []
        try:
            python = sys.executable
            variables: dict[str, str] = {}
            pythonpath: tuple[str, ...] = ()
            if environment is not None:
                what = f"environment {environment.name!r}"
                held.append(self._use(environment.key, what, budget))
                python, variables = self._environment(environment, fetch, budget)
            if code is not None:
                what = _code_name(code)
                held.append(self._use(code.key, what, budget))
                pythonpath = (self._code(code, fetch, budget),)
        except BaseException as exc:
            for descriptor in held:
                os.close(descriptor)
            if isinstance(exc, OSError):  # the cache's own files (a lock, a marker)
                raise SoftwareUnfit(f"the software cache {self.root} failed: {exc}") from exc
            raise
        with self._lock:
            previous = self._uses.pop(software.key, [])
            self._uses[software.key] = held
        for descriptor in previous:
            os.close(descriptor)
        try:
            self.evict()
        except OSError as exc:
            logger.warning(
                "could not keep the software cache %s under its limit: %s", self.root, exc
            )
        return Prepared(python, variables, pythonpath, software.key)

    def archive_path(self, key: str) -> str | None:
        """A complete archive held here (an environment's tar or a code zip), to serve to
        peers; None if it is not here."""
        if not _KEY.fullmatch(key):
            return None
        path = os.path.join(self.root, "archives", key)
        return path if os.path.isfile(path) else None

    def release(self, key: str) -> None:
        """This worker no longer uses software ``key``: others may evict it."""
        with self._lock:
            held = self._uses.pop(key, [])
        for descriptor in held:
            os.close(descriptor)

    def close(self) -> None:
        """Release everything this worker uses."""
        with self._lock:
            held = [descriptor for descriptors in self._uses.values() for descriptor in descriptors]
            self._uses.clear()
        for descriptor in held:
            os.close(descriptor)

    def evict(self) -> list[str]:
        """Remove the least recently used entries nobody uses until the directory is under
        its limit (``prepare`` calls it); the keys removed."""
        entries = self._entries()
        total = sum(entry.size for entry in entries.values())
        removed: list[str] = []
        for key, entry in sorted(entries.items(), key=lambda item: item[1].used):
            if total <= self.limit:
                break
            if self._remove(key, entry):
                total -= entry.size
                removed.append(key)
        if removed:
            logger.info(
                "software cache %s: removed %d entries not in use (%s), %d bytes kept",
                self.root,
                len(removed),
                ", ".join(key[:12] for key in removed),
                total,
            )
        return removed

    # -- the parts ----------------------------------------------------------------------

    def _environment(
        self, environment: Environment, fetch: Fetch, budget: _Budget
    ) -> tuple[str, dict[str, str]]:
        what = f"environment {environment.name!r}"
        if environment.kind not in (ARCHIVE, REQUIREMENTS):
            raise SoftwareUnfit(
                f"the {what} is of a kind this worker does not know: {environment.kind!r}"
            )

        def make(temporary: str, place: str) -> str:
            if environment.kind == ARCHIVE:
                archive = self._archive(environment.key, environment.size, what, fetch)
                logger.info("unpacking the %s (%d bytes) into %s", what, environment.size, place)
                _unpack_tar(archive, temporary, what)
            else:
                logger.info("building the %s with uv into %s", what, place)
                _build_venv(environment, temporary, budget)
            os.rename(temporary, place)
            interpreter = _interpreter(place, environment)
            python = os.path.join(place, interpreter)
            variables = _variables(environment, place)
            conda_unpack = os.path.join(place, "bin", "conda-unpack")
            if environment.kind == ARCHIVE and os.path.isfile(conda_unpack):
                # after the rename: conda-unpack rewrites the prefixes to where it runs
                run = [python, conda_unpack]
                _run(run, f"conda-unpack in the {what}", place, _environ(variables), budget)
            _verify(environment, python, variables, place, budget)
            return interpreter

        place, interpreter = self._entry("env", environment.key, what, budget, make)
        return os.path.join(place, interpreter), _variables(environment, place)

    def _code(self, code: Code, fetch: Fetch, budget: _Budget) -> str:
        what = _code_name(code)

        def make(temporary: str, place: str) -> str:
            archive = self._archive(code.key, code.size, what, fetch)
            try:
                with zipfile.ZipFile(archive) as opened:
                    opened.extractall(temporary)  # names leaving it are cut
            except (OSError, zipfile.BadZipFile) as exc:
                raise SoftwareUnfit(f"unpacking the {what} failed: {exc}") from exc
            os.rename(temporary, place)
            return ""

        place, _ = self._entry("code", code.key, what, budget, make)
        return place

    def _entry(
        self, kind: str, key: str, what: str, budget: _Budget, make: Callable[[str, str], str]
    ) -> tuple[str, str]:
        """``root/kind/key`` and its marker's text (the interpreter): made, under the
        entry's lock, by ``make(temporary, place)`` unless another worker made it."""
        place = os.path.join(self.root, kind, key)
        text = _ready(place)
        if text is not None:
            return place, text
        with self._locked(key, what, budget):
            text = _ready(place)
            if text is not None:
                return place, text
            self._clear_leftovers(kind, key)
            temporary = os.path.join(self.root, kind, f".{key}.{os.getpid()}.tmp")
            started = time.monotonic()
            try:
                text = make(temporary, place)
                _complete(place, text)
            except BaseException as exc:
                _remove_tree(temporary)
                _remove_tree(place)
                _remove_file(os.path.join(self.root, "archives", key))  # kept only beside it
                if isinstance(exc, OSError):
                    raise SoftwareUnfit(f"making the {what} ready failed: {exc}") from exc
                raise
        self.built.append(key)
        logger.info("the %s is ready in %s (%.1f s)", what, place, time.monotonic() - started)
        return place, text

    def _archive(self, key: str, size: int, what: str, fetch: Fetch) -> str:
        """The archive ``key`` in ``archives/``, fetched unless it is there (under its lock)."""
        path = os.path.join(self.root, "archives", key)
        if os.path.isfile(path) and os.path.getsize(path) == size:
            return path  # renamed into place only once checked: a worker died unpacking it
        part = path + ".part"
        _remove_file(part)
        try:
            fetch(key, size, part)
        except Exception as exc:
            _remove_file(part)
            raise SoftwareUnfit(f"fetching the archive of the {what} failed: {exc}") from exc
        try:
            got, digest = _digest(part)
        except OSError as exc:
            _remove_file(part)
            raise SoftwareUnfit(f"the archive of the {what} could not be read: {exc}") from exc
        if got != size or digest != key:
            _remove_file(part)
            raise SoftwareUnfit(
                f"the archive of the {what} arrived corrupt: {got} bytes, sha256 {digest[:16]}..., "
                f"expected {size} bytes, sha256 {key[:16]}..."
            )
        os.replace(part, path)
        return path

    # -- locks --------------------------------------------------------------------------

    def _lock_file(self, key: str, suffix: str, what: str) -> int:
        if not _KEY.fullmatch(key):
            raise SoftwareUnfit(f"the {what} has a malformed key {key!r}")
        path = os.path.join(self.root, "locks", key + suffix)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _use(self, key: str, what: str, budget: _Budget) -> int:
        """A shared ``.use`` lock on ``key`` (waits only while an eviction removes it)."""
        descriptor = self._lock_file(key, ".use", what)
        try:
            _flock(descriptor, fcntl.LOCK_SH, what, budget)
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    @contextlib.contextmanager
    def _locked(self, key: str, what: str, budget: _Budget) -> Iterator[None]:
        """The exclusive ``.lock`` of ``key``: one worker of the node prepares it."""
        descriptor = self._lock_file(key, ".lock", what)
        try:
            _flock(descriptor, fcntl.LOCK_EX, what, budget)
            yield
        finally:
            os.close(descriptor)  # unlocks

    # -- leftovers and eviction ---------------------------------------------------------

    def _clear_leftovers(self, kind: str, key: str) -> None:
        """What a worker that died preparing ``key`` left (called under its lock)."""
        directory = os.path.join(self.root, kind)
        for name in os.listdir(directory):
            match = _TMP.fullmatch(name)
            if match and match.group(1) == key:
                _remove_tree(os.path.join(directory, name))
        _remove_tree(os.path.join(directory, key))  # no marker (or it would be ready)
        _remove_file(os.path.join(self.root, "archives", key + ".part"))

    def _entries(self) -> dict[str, _Entry]:
        """Every key the directory holds something of, with its last use and size."""
        used: dict[str, float] = {}
        sizes: dict[str, int] = {}
        paths: dict[str, list[str]] = {}

        def add(key: str, path: str, size: int) -> None:
            sizes[key] = sizes.get(key, 0) + size
            paths.setdefault(key, []).append(path)

        for kind in ("env", "code"):
            directory = os.path.join(self.root, kind)
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                match = _TMP.fullmatch(name)
                if match:
                    add(match.group(1), path, _tree_size(path))
                    continue
                if not _KEY.fullmatch(name):
                    continue
                marker = os.path.join(path, COMPLETE)
                try:
                    mtime = os.stat(marker).st_mtime
                except OSError:
                    add(name, path, _tree_size(path))  # a leftover, or one being made
                    continue
                used[name] = max(used.get(name, 0.0), mtime)
                add(name, path, _recorded_size(path))
        archives = os.path.join(self.root, "archives")
        for name in os.listdir(archives):
            path = os.path.join(archives, name)
            key = name[: -len(".part")] if name.endswith(".part") else name
            if not _KEY.fullmatch(key):
                continue
            try:
                info = os.stat(path)
            except OSError:
                continue
            add(key, path, info.st_size)
            if key not in used and not name.endswith(".part"):
                used[key] = info.st_mtime  # an archive whose entry is gone or not yet made
        return {key: _Entry(used.get(key, 0.0), sizes[key], tuple(paths[key])) for key in paths}

    def _remove(self, key: str, entry: _Entry) -> bool:
        """Remove ``entry`` if nobody uses or prepares it now; whether it went."""
        use = self._lock_file(key, ".use", "entry")
        try:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a worker's libraries use it
            lock = self._lock_file(key, ".lock", "entry")
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                for path in entry.paths:
                    if os.path.isdir(path) and not os.path.islink(path):
                        # the marker first: a directory half removed is not complete
                        _remove_file(os.path.join(path, COMPLETE))
                        _remove_tree(path)
                    else:
                        _remove_file(path)
                return True
            finally:
                os.close(lock)
        finally:
            os.close(use)


# -- helpers ---------------------------------------------------------------------------


def _code_name(code: Code) -> str:
    return f"code of {', '.join(code.modules) or code.key[:12]}"


def _variables(environment: Environment, place: str) -> dict[str, str]:
    if environment.kind == REQUIREMENTS:
        return {"VIRTUAL_ENV": place}
    library = os.path.join(place, "lib")
    node = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": f"{library}{os.pathsep}{node}" if node else library}


def _check_private(path: str) -> None:
    """Refuse a directory of the shared temp directory that another user made or may
    write to: the interpreters found in it are run."""
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & stat.S_IWOTH:
        raise PermissionError(
            f"the software cache {path} belongs to another user or anyone may write to it: "
            "set DASKVINE_PY_SOFTWARE_CACHE to a directory of your own"
        )


def _flock(descriptor: int, operation: int, what: str, budget: _Budget) -> None:
    """``flock``, waiting at most the budget's time (polled: flock itself has no timeout)."""
    delay = 0.01
    while True:
        try:
            fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = budget.left()
        if left <= 0.0:
            raise SoftwareUnfit(
                f"waited {budget.seconds:g} s for another worker of this node to prepare the {what}"
            )
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)


def _ready(place: str) -> str | None:
    """The interpreter (path inside it; "" for code) of a complete entry, which is now
    its most recent use; None if it is not complete."""
    marker = os.path.join(place, COMPLETE)
    try:
        with open(marker, encoding="utf-8") as file:
            interpreter = file.read().strip()
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):  # a directory shared read-only: still usable
        os.utime(marker)
    return interpreter


def _complete(place: str, interpreter: str) -> None:
    """Mark ``place`` complete: its size first, the marker last (atomically)."""
    with open(os.path.join(place, SIZE), "w", encoding="utf-8") as file:
        file.write(f"{_tree_size(place)}\n")
    temporary = os.path.join(place, COMPLETE + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(f"{interpreter}\n")
    os.rename(temporary, os.path.join(place, COMPLETE))


def _recorded_size(place: str) -> int:
    try:
        with open(os.path.join(place, SIZE), encoding="utf-8") as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return _tree_size(place)


def _tree_size(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


def _digest(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- unpacking -------------------------------------------------------------------------


def _unpack_tar(archive: str, destination: str, what: str) -> None:
    try:
        with tarfile.open(archive, "r:*") as opened:
            _extract(opened, destination, filters=hasattr(tarfile, "tar_filter"))
    except tarfile.ReadError as exc:
        raise SoftwareUnfit(f"the archive of the {what} is not a tar archive: {exc}") from exc
    except (OSError, tarfile.TarError, KeyError) as exc:  # KeyError: a link to no member
        raise SoftwareUnfit(f"unpacking the {what} failed: {exc}") from exc


def _extract(opened: tarfile.TarFile, destination: str, filters: bool) -> None:
    """Extract with the "tar" filter (or, where Python lacks filters, our own check of the
    same rules), owned by whoever unpacks."""
    os.makedirs(destination)
    if filters:

        def own(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
            member = tarfile.tar_filter(member, path)
            if member.islnk() and not _inside(member.linkname):
                raise tarfile.TarError(f"{member.name!r} links to {member.linkname!r}, outside")
            return member.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)

        opened.extractall(destination, filter=own)
    else:
        opened.extractall(destination, members=_checked(opened))


def _checked(members: Iterable[tarfile.TarInfo]) -> Iterator[tarfile.TarInfo]:
    """Members that stay inside the destination (Python without tarfile's filters), by
    the "tar" filter's rules: leading slashes cut, no ``..``, no hard link out, nothing
    written through a symlink, no device; setuid bits and others' write bits cleared."""
    links: set[str] = set()
    for member in members:
        name = posixpath.normpath(member.name.lstrip("/"))
        parts = name.split("/")
        if ".." in parts:
            raise tarfile.TarError(f"{member.name!r} would be written outside the environment")
        member.name = name
        if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
            raise tarfile.TarError(f"{member.name!r} would be written through a symbolic link")
        if member.islnk() and not _inside(member.linkname):
            raise tarfile.TarError(f"{member.name!r} links to {member.linkname!r}, outside")
        if member.isdev():
            continue
        if member.issym():
            links.add(name)
        member.mode &= ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
        member.uid, member.gid = os.getuid(), os.getgid()
        member.uname = member.gname = ""
        yield member


def _inside(name: str) -> bool:
    """Whether a relative path inside an archive stays inside it."""
    normal = posixpath.normpath(name)
    return not normal.startswith("/") and normal.split("/")[0] != ".."


def _interpreter(place: str, environment: Environment) -> str:
    """The interpreter's path inside ``place``."""
    what = f"environment {environment.name!r}"
    candidates = (
        [environment.interpreter] if environment.interpreter else ["bin/python3", "bin/python"]
    )
    for relative in candidates:
        name = posixpath.normpath(relative)
        if not _inside(name):
            raise SoftwareUnfit(f"the {what} names an interpreter outside itself: {relative!r}")
        if os.path.isfile(os.path.join(place, name)):
            return name
    raise SoftwareUnfit(f"the {what} holds no interpreter: no {' or '.join(candidates)} in it")


# -- running ---------------------------------------------------------------------------


def _environ(variables: dict[str, str]) -> dict[str, str]:
    """The node's environment with ``variables``, less the worker's own Python settings."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    environ = {name: value for name, value in os.environ.items() if name not in drop}
    environ.update(variables)
    return environ


def _run(
    command: list[str],
    what: str,
    cwd: str,
    environ: dict[str, str],
    budget: _Budget,
    lines: int = 1,
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; a failure is ``SoftwareUnfit`` naming ``what`` with its last words."""
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=environ,
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=max(budget.left(), 1.0),
        )
    except OSError as exc:
        raise SoftwareUnfit(f"{what} does not run on this node: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SoftwareUnfit(f"{what} ran past the {budget.seconds:g} s given") from exc
    if done.returncode != 0:
        words = _last_words(done.stderr, done.returncode, lines)
        raise SoftwareUnfit(f"{what} failed on this node: {words}")
    return done


def _last_words(stderr: str, returncode: int, lines: int = 1) -> str:
    words = [line.strip() for line in stderr.splitlines() if line.strip()][-lines:]
    return "; ".join(words) if words else f"exit status {returncode}"


def _verify(
    environment: Environment, python: str, variables: dict[str, str], place: str, budget: _Budget
) -> None:
    """Ask the interpreter its version and to import what libraries need."""
    what = f"environment {environment.name!r}"
    relative = os.path.relpath(python, place)
    done = _run(
        [python, "-c", _PROBE, *NEEDED],
        f"the interpreter of the {what} ({relative})",
        place,  # not the worker's directory: its modules would count as the environment's
        _environ(variables),
        budget,
    )
    lines = done.stdout.splitlines()
    version = lines[0].strip() if lines else ""
    numbers = tuple(int(part) for part in version.split(".") if part.isdigit())
    if len(numbers) != 2:
        raise SoftwareUnfit(
            f"the interpreter of the {what} ({relative}) answered {version!r} to its version"
        )
    if numbers < MIN_PYTHON:
        raise SoftwareUnfit(
            f"the {what} runs Python {version}, daskvine_py's libraries need "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
        )
    if environment.python and version != environment.python:
        raise SoftwareUnfit(
            f"the {what} runs Python {version}, it was made for Python {environment.python}"
        )
    missing = []
    for line in lines[1:]:
        if line.startswith("missing "):
            _, name, message = (line.split(" ", 2) + [""])[:3]
            missing.append(f"{name} ({message})" if message else name)
    if missing:
        raise SoftwareUnfit(
            f"the {what} lacks {' and '.join(missing)}: libraries need {', '.join(NEEDED)} in it"
        )


def _find_uv() -> str | None:
    """The ``uv`` executable: on ``PATH``, else the ``uv`` Python package's."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        module = importlib.import_module("uv")
        path = module.find_uv_bin()
    except (ImportError, FileNotFoundError, AttributeError):
        return None
    return str(path)


def _build_venv(environment: Environment, destination: str, budget: _Budget) -> None:
    """``uv venv --relocatable`` at ``destination``, then the requirements installed in it.

    uv runs with the worker's environment (the user's index, find-links, offline mode,
    proxies and cache settings all reach it) and in ``destination``, so that no
    ``pyproject.toml`` of the worker's directory configures it. The interpreter is the
    worker's own when the requirements were made for its Python (or for none); else uv
    looks for that version on the node (and may download one, as the user's uv settings
    allow)."""
    what = f"environment {environment.name!r}"
    uv = _find_uv()
    if uv is None:
        raise SoftwareUnfit(f"building the {what} needs uv on this node: pip install uv")
    own = f"{sys.version_info[0]}.{sys.version_info[1]}"
    python = sys.executable if environment.python in ("", own) else environment.python
    os.makedirs(destination)
    environ = _environ({})  # the user's uv settings pass, the worker's Python does not
    making = f"uv (building the {what})"
    venv = [uv, "venv", "--relocatable", "--python", python, destination]
    _run(venv, making, destination, environ, budget, lines=4)
    pylock = _PYLOCK.search(environment.requirements) is not None
    requirements = os.path.join(destination, "pylock.toml" if pylock else "requirements.txt")
    with open(requirements, "w", encoding="utf-8") as file:
        file.write(environment.requirements)
    install = [uv, "pip", "install", "--python", os.path.join(destination, "bin", "python")]
    _run([*install, "-r", requirements], making, destination, environ, budget, lines=4)
