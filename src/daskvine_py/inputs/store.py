"""The node's input cache: whole remote files, each named by what identifies its content.

One directory serves every worker and library of a node (node-local: under the temp
directory unless ``$DASKVINE_PY_INPUT_CACHE`` says otherwise), and outlives them; what it
keeps of theirs, and how long, is the claims' (**Lifetimes**, below)::

    root/
      entries/<key>/<name>         the input's bytes; <name> is the URL's last part, so
                                   that its suffix (``.root``) stays for tools that look
      entries/<key>/<name>.part    one being fetched
      entries/<key>/.complete      written last (JSON: url, size, version); its mtime is
                                   the entry's last use
      entries/<key>/.claim.<claim> who wants it kept, and how long (below)
      locks/<key>.lock             exclusive while one process fetches (or removes) it
      locks/<key>.use              shared while a process uses it
      owners/<owner>.lock          exclusive while the worker ``owner`` lives

``key`` is the sha256 of the URL with the size and the version (modification time, ETag,
checksum) its server reported: a changed copy on the server has another key, so an entry
never goes stale; it is simply no longer asked for, and ages out.

An entry is complete once ``.complete`` is there: its bytes were fetched to ``.part``,
found to be as many as the server reported, and renamed into place before the marker
was written. A process that finds an entry incomplete takes its ``.lock`` and looks again:
the second library of a node waits there, then finds the first one's fetch done, so a
node fetches each input once. Under the lock, anything else of that key (a directory
without its marker) is a leftover of a process that died fetching, and goes.

The directory is kept under ``limit`` bytes: before each fetch, the least recently used
entries go until the new one fits, but only an entry whose ``.use`` lock can be taken
exclusively at once. A process takes its shared ``.use`` lock before it looks for an
entry and keeps it (see ``InputCache.use``), so nothing a process may still read is
removed. The lock files themselves stay (an empty pair per input ever seen): removing a
lock file another process waits on would let two processes hold "the" lock.

**Lifetimes.** Whoever uses an entry claims it, once per lifetime asked for, with an
empty file in the entry: ``.claim.forever`` (kept across runs and worker restarts),
``.claim.worker.<owner>`` (until the worker ``owner`` exits) or ``.claim.run.<run>.<owner>``
(until run ``run`` ends on that worker). A cleanup (``end_run``, ``end_worker``, ``tidy``)
drops the claims it ends, and those of owners that are dead (their ``owners/`` lock free:
a worker killed with SIGKILL), then removes each entry that no claim is left on. So an
entry stays as long as the longest lifetime anyone asked for: a "run" cleanup never
removes what another worker fetched for ever, or uses for its own life or run. Nor does
it remove an entry in use (its ``.use`` lock) or being fetched: that entry is spared,
claimless, and the next cleanup of the node removes it once it is free. An entry with no
claim at all (spared so, or left by a process that died before it claimed it) goes at
any cleanup. The size bound (``evict``) ignores claims: it removes the least recently
used entries nobody uses, whatever was asked of them.

The same shape as ``daskvine_py.software.node_cache`` (the software's per-node cache),
for single files rather than unpacked trees.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

logger = logging.getLogger("daskvine_py.inputs")

COMPLETE = ".complete"
_KEY = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[^0-9A-Za-z._-]")

#: How long a run's fetched inputs stay on the node, shortest first: until the run ends on
#: the worker, until the worker exits, or for ever (within the size bound).
LIFETIMES = ("run", "worker", "forever")
#: What names a claim's file in its entry: ``.claim.`` + the claim (``claim``).
CLAIM = ".claim."
#: A worker's name in claims (``owner``): letters, digits, ``_`` and ``-``.
_OWNER = re.compile(r"[0-9A-Za-z_-]{1,64}")


def claim(lifetime: str, owner: str = "", run: int = 0) -> str:
    """The claim a use with ``lifetime`` makes: ``forever``, ``worker.<owner>`` or
    ``run.<run>.<owner>``."""
    if lifetime == "forever":
        return "forever"
    if not _OWNER.fullmatch(owner):
        raise ValueError(f"not an input cache owner: {owner!r}")
    if lifetime == "worker":
        return f"worker.{owner}"
    if lifetime == "run":
        return f"run.{int(run)}.{owner}"
    raise ValueError(f"an input's lifetime is one of {LIFETIMES}, not {lifetime!r}")


def claim_owner(name: str) -> str | None:
    """The worker a claim is of (None: ``forever``, or not a claim of ours)."""
    parts = name.split(".")
    if len(parts) == 2 and parts[0] == "worker":
        return parts[1]
    if len(parts) == 3 and parts[0] == "run":
        return parts[2]
    return None


def new_owner() -> str:
    """A name for a worker's claims, unique on the node: its pid and random bits."""
    return f"{os.getpid()}-{secrets.token_hex(6)}"


class Cleanup(NamedTuple):
    """What a cleanup did: the keys it removed, and those it left claimless because a
    process uses them (the next cleanup removes them once free)."""

    removed: list[str]
    spared: list[str]


class Incomplete(OSError):
    """A fetch wrote other than the size the server reported: a truncated transfer
    (never cached; worth another attempt)."""


class Identity(NamedTuple):
    """What names an input's content: its URL and what its server reports of it."""

    url: str  #: the URL, as the task spelled it
    size: int  #: bytes, as the server reports them
    #: what else the server reports of this copy: its modification time, ETag or checksum
    version: str

    @property
    def key(self) -> str:
        """The entry's name: sha256 of the three."""
        text = f"{self.url}\0{self.size}\0{self.version}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def name(self) -> str:
        """The file's name inside its entry: the URL's last part, tamed."""
        last = self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        tamed = _NAME.sub("_", last)[-100:].lstrip(".")
        return tamed or "input"


#: Writes an input's bytes to the path given, or raises.
Fetch = Callable[[str], None]


class _Entry(NamedTuple):
    """What the directory holds of one key, for eviction."""

    used: float  #: last use (the marker's mtime; 0.0: no marker, a leftover or one being made)
    size: int


def default_root() -> str:
    """``$DASKVINE_PY_INPUT_CACHE``, else this user's directory under the node's temp
    directory (``$TMPDIR``, else /tmp): node-local, so that its locks hold."""
    configured = os.environ.get("DASKVINE_PY_INPUT_CACHE")
    return os.path.abspath(configured) if configured else temporary_root()


def temporary_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"daskvine_py-{os.getuid()}", "inputs")


class InputCache:
    """The node's input directory, as one process uses it (thread-safe).

    The shared ``.use`` locks this object takes are kept until ``release`` (or ``close``):
    a path handed out stays readable, whatever other processes of the node fetch.
    """

    def __init__(self, root: str, limit: int) -> None:
        self.root = os.path.abspath(root)
        self.limit = limit
        if self.root == temporary_root():  # where anyone may have made it first
            parent = os.path.dirname(self.root)
            os.makedirs(parent, mode=0o700, exist_ok=True)
            _check_private(parent)
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            _check_private(self.root)
        for part in ("entries", "locks", "owners"):
            os.makedirs(os.path.join(self.root, part), mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        #: key -> the shared ``.use`` lock (an open descriptor) held on it
        self._uses: dict[str, int] = {}
        #: what this object's evictions and cleanups removed, for its owner to take (a
        #: library's reads report them, ``inputs.take_reads``; a worker's, ``InputsDropped``)
        self.dropped: list[Identity] = []
        #: key -> the claims this object made on it (each claim's file made once)
        self._claimed: dict[str, set[str]] = {}
        #: the owner whose life this object holds (``own``): (name, its lock's descriptor)
        self._owner: tuple[str, int] | None = None

    def __repr__(self) -> str:
        return f"<InputCache {self.root} {len(self._uses)} in use>"

    def __enter__(self) -> InputCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- a process's calls --------------------------------------------------------------

    def use(self, key: str, wait: float) -> None:
        """Hold ``key`` in use (a shared ``.use`` lock) until ``release``: take it before
        looking for the entry, so that it cannot go between the look and the read. Waits
        only while an eviction removes it."""
        with self._lock:
            if key in self._uses:
                return
        descriptor = self._lock_file(key, ".use")
        try:
            _flock(descriptor, fcntl.LOCK_SH, wait)
        except BaseException:
            os.close(descriptor)
            raise
        with self._lock:
            if key not in self._uses:
                self._uses[key] = descriptor
                return
        os.close(descriptor)  # another thread took it meanwhile

    def lookup(self, identity: Identity) -> str | None:
        """The complete entry's file (now its most recent use), or None."""
        place = self._place(identity.key)
        marker = os.path.join(place, COMPLETE)
        if not os.path.exists(marker):
            return None
        now = time.time()  # fine-grained, unlike the kernel's clock for an mtime of "now"
        with contextlib.suppress(OSError):
            os.utime(marker, (now, now))
        return os.path.join(place, identity.name)

    def reserve(self, key: str) -> int | None:
        """Take ``key``'s exclusive ``.lock`` now, without waiting (None: another process
        holds it): for a fill that will run on another thread (``fill(reserved=...)``),
        so that a library asking for the entry meanwhile waits for it."""
        descriptor = self._lock_file(key, ".lock")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        return descriptor

    def fill(
        self, identity: Identity, fetch: Fetch, wait: float, reserved: int | None = None
    ) -> tuple[str, bool]:
        """The entry's file, fetched by ``fetch(part)`` under the entry's lock unless
        another process did it meanwhile; and whether this call fetched it. ``reserved``:
        the lock, taken already (``reserve``); closed here.

        Raises ``Incomplete`` if what was fetched is not the size the server reported,
        ``TimeoutError`` after ``wait`` seconds of another process holding the lock, and
        whatever ``fetch`` raises; nothing of a failed fetch stays."""
        key = identity.key
        with self._locked(key, wait, reserved):
            found = self.lookup(identity)
            if found is not None:
                return found, False
            place = self._place(key)
            _remove_tree(place)  # a leftover of a process that died fetching it
            os.makedirs(place, mode=0o700)
            path = os.path.join(place, identity.name)
            part = path + ".part"
            try:
                fetch(part)
                got = os.path.getsize(part)
                if got != identity.size:
                    raise Incomplete(
                        f"the transfer was incomplete: {got} bytes arrived, "
                        f"the server reported {identity.size}"
                    )
                os.rename(part, path)
                record = {"url": identity.url, "size": identity.size, "version": identity.version}
                temporary = os.path.join(place, COMPLETE + ".tmp")
                with open(temporary, "w", encoding="utf-8") as file:
                    json.dump(record, file)
                os.rename(temporary, os.path.join(place, COMPLETE))
            except BaseException:
                _remove_tree(place)
                raise
        return path, True

    def claim(self, key: str, claims: Iterable[str]) -> None:
        """Claim ``key``'s entry (complete, and held in use: ``use``) for ``claims``
        (``claim``'s names): it stays until a cleanup ends each of them."""
        with self._lock:
            new = set(claims) - self._claimed.get(key, set())
        if not new:
            return
        place = self._place(key)
        for name in new:
            if "/" in name or not name:
                raise ValueError(f"not a claim: {name!r}")
            descriptor = os.open(
                os.path.join(place, CLAIM + name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            os.close(descriptor)
        with self._lock:
            self._claimed.setdefault(key, set()).update(new)

    def release(self) -> None:
        """Release every entry this object holds in use: other processes may evict them
        (and a cleanup remove those no claim keeps)."""
        with self._lock:
            held = list(self._uses.values())
            self._uses.clear()
            self._claimed.clear()  # a cleanup may drop them once released: made again
        for descriptor in held:
            os.close(descriptor)

    def close(self) -> None:
        self.release()
        self.disown()

    # -- a worker's calls ---------------------------------------------------------------

    def own(self, owner: str) -> None:
        """Hold ``owner``'s life (its ``owners/`` lock) until ``disown``: its claims are
        kept while it is held, and dropped by any cleanup of the node once it is not (a
        worker killed with SIGKILL)."""
        if not _OWNER.fullmatch(owner):
            raise ValueError(f"not an input cache owner: {owner!r}")
        path = os.path.join(self.root, "owners", owner + ".lock")
        while True:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(descriptor, path):
                    break  # (else a cleanup took it for a dead owner's and removed it)
            except BaseException:
                os.close(descriptor)
                raise
            os.close(descriptor)
        with self._lock:
            self._owner, previous = (owner, descriptor), self._owner
        if previous is not None:
            os.close(previous[1])

    def disown(self) -> None:
        """Let go of the owner's life (``own``): its lock file goes too."""
        with self._lock:
            owner, self._owner = self._owner, None
        if owner is not None:
            _remove_file(os.path.join(self.root, "owners", owner[0] + ".lock"))
            os.close(owner[1])

    def end_run(self, owner: str, run: int) -> Cleanup:
        """Run ``run`` ended on the worker ``owner``: drop its claims and remove what no
        claim keeps (``cleanup``)."""
        ended = claim("run", owner, run)
        return self.cleanup(lambda name: name == ended)

    def end_worker(self, owner: str) -> Cleanup:
        """The worker ``owner`` exits: drop its claims, of its own life and of its runs,
        and remove what no claim keeps (``cleanup``)."""
        return self.cleanup(lambda name: claim_owner(name) == owner)

    def tidy(self) -> Cleanup:
        """Drop the claims of dead owners and remove what no claim keeps (``cleanup``)."""
        return self.cleanup(lambda name: False)

    def cleanup(self, ends: Callable[[str], bool]) -> Cleanup:
        """Drop every claim ``ends`` names, and those of dead owners; then remove each
        entry no claim is left on, unless a process uses or fetches it (spared)."""
        alive: dict[str, bool] = {}
        removed: list[str] = []
        spared: list[str] = []
        for key in _listdir(os.path.join(self.root, "entries")):
            if not _KEY.fullmatch(key):
                continue
            left = False
            for name in self._claims(key):
                owner = claim_owner(name)
                if ends(name) or (owner is not None and not self._alive(owner, alive)):
                    _remove_file(os.path.join(self._place(key), CLAIM + name))
                else:
                    left = True
            if left:
                continue
            identity = self._identity(key)
            if self._remove(key, unclaimed=True):
                removed.append(key)
                if identity is not None:
                    self.dropped.append(identity)
            elif os.path.isdir(self._place(key)) and not self._claims(key):
                spared.append(key)
        with self._lock:  # claims this process made may be gone: made again when used
            for key in removed:
                self._claimed.pop(key, None)
        if removed or spared:
            logger.info(
                "input cache %s: removed %d entries no one keeps; %d in use, left for later",
                self.root,
                len(removed),
                len(spared),
            )
        return Cleanup(removed, spared)

    def entry_file(self, key: str) -> str | None:
        """The file of ``key``'s complete entry, or None: what a peer is served
        (``worker.input_peers``). Its name comes from the entry's own record."""
        identity = self._identity(key) if _KEY.fullmatch(key) else None
        if identity is None or identity.key != key:
            return None
        return os.path.join(self._place(key), identity.name)

    def _identity(self, key: str) -> Identity | None:
        """What ``key``'s complete entry holds, as its record says (None: not complete)."""
        try:
            with open(os.path.join(self._place(key), COMPLETE), encoding="utf-8") as file:
                record = json.load(file)
            return Identity(record["url"], int(record["size"]), record["version"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def holds(self) -> list[Identity]:
        """The complete entries of the node (what a worker could tell its manager)."""
        found = []
        for key in _listdir(os.path.join(self.root, "entries")):
            try:
                with open(os.path.join(self._place(key), COMPLETE), encoding="utf-8") as file:
                    record = json.load(file)
                found.append(Identity(record["url"], int(record["size"]), record["version"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return found

    def evict(self, room: int = 0) -> list[str]:
        """Remove the least recently used entries nobody uses until ``room`` more bytes
        fit under the limit; the keys removed."""
        entries = self._entries()
        total = sum(entry.size for entry in entries.values())
        removed = []
        for key, entry in sorted(entries.items(), key=lambda item: item[1].used):
            if total + room <= self.limit:
                break
            identity = self._identity(key)
            if self._remove(key):
                total -= entry.size
                removed.append(key)
                if identity is not None:
                    self.dropped.append(identity)
        if removed:
            logger.info(
                "input cache %s: removed %d entries not in use, %d bytes kept",
                self.root,
                len(removed),
                total,
            )
        return removed

    # -- the parts ----------------------------------------------------------------------

    def _place(self, key: str) -> str:
        return os.path.join(self.root, "entries", key)

    def _lock_file(self, key: str, suffix: str) -> int:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not an input cache key: {key!r}")
        path = os.path.join(self.root, "locks", key + suffix)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.contextmanager
    def _locked(self, key: str, wait: float, reserved: int | None = None) -> Iterator[None]:
        """The exclusive ``.lock`` of ``key``: one process of the node fetches it."""
        descriptor = self._lock_file(key, ".lock") if reserved is None else reserved
        try:
            if reserved is None:
                _flock(descriptor, fcntl.LOCK_EX, wait)
            yield
        finally:
            os.close(descriptor)  # unlocks

    def _entries(self) -> dict[str, _Entry]:
        """Every key the directory holds something of, with its last use and size."""
        entries = {}
        for key in _listdir(os.path.join(self.root, "entries")):
            if not _KEY.fullmatch(key):
                continue
            place = self._place(key)
            try:
                used = os.stat(os.path.join(place, COMPLETE)).st_mtime
            except OSError:
                used = 0.0  # a leftover (or one being fetched: its lock keeps it)
            entries[key] = _Entry(used, _bytes(place))
        return entries

    def _claims(self, key: str) -> list[str]:
        """The claims on ``key``'s entry."""
        return [
            name[len(CLAIM) :]
            for name in _listdir(self._place(key))
            if name.startswith(CLAIM) and len(name) > len(CLAIM)
        ]

    def _alive(self, owner: str, known: dict[str, bool]) -> bool:
        """Whether the worker ``owner`` holds its ``owners/`` lock (``known``: the answers
        of this cleanup so far). A dead one's lock file goes."""
        if owner in known:
            return known[owner]
        with self._lock:
            if self._owner is not None and self._owner[0] == owner:
                known[owner] = True
                return True
        path = os.path.join(self.root, "owners", owner + ".lock")
        alive = False
        if _OWNER.fullmatch(owner):
            try:
                descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                descriptor = -1
            if descriptor >= 0:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    alive = True
                else:
                    _remove_file(path)  # (while locked: its owner is gone for good)
                finally:
                    os.close(descriptor)
        known[owner] = alive
        return alive

    def _remove(self, key: str, unclaimed: bool = False) -> bool:
        """Remove ``key``'s entry if nobody uses or fetches it now (and, ``unclaimed``,
        no claim is on it: one made since the caller looked keeps it); whether it went."""
        use = self._lock_file(key, ".use")
        try:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a process reads it
            lock = self._lock_file(key, ".lock")
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # a process fetches it
                place = self._place(key)
                if unclaimed and self._claims(key):
                    return False  # claimed meanwhile, by a process now done with it
                _remove_file(os.path.join(place, COMPLETE))  # first: half removed is incomplete
                _remove_tree(place)
                return True
            finally:
                os.close(lock)
        finally:
            os.close(use)


# -- helpers ---------------------------------------------------------------------------


def _check_private(path: str) -> None:
    """Refuse a directory of the shared temp directory that another user made or may
    write to: what is found in it is handed to tasks as their inputs."""
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & stat.S_IWOTH:
        raise PermissionError(
            f"the input cache {path} belongs to another user or anyone may write to it: "
            "set DASKVINE_PY_INPUT_CACHE to a directory of your own"
        )


def _flock(descriptor: int, operation: int, wait: float) -> None:
    """``flock``, waiting at most ``wait`` seconds (polled: flock itself has no timeout)."""
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        try:
            fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0.0:
            raise TimeoutError(f"waited {wait:g} s for another process of this node fetching it")
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)


def _same_file(descriptor: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``descriptor``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _bytes(place: str) -> int:
    """An entry's input bytes (what is being fetched too; not its small marker)."""
    total = 0
    for name in _listdir(place):
        if not name.startswith("."):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(place, name)).st_size
    return total


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
