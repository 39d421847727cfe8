"""Inputs cached on workers by content: what a task calls to read a remote file.

A task that reads ``root://`` or ``http(s)://`` inputs reads them from storage every run,
on every worker that runs one of its chunks. Here a node fetches each input once, keeps it
in a directory shared by all its workers and libraries, and hands tasks a local path::

    from daskvine_py import inputs

    path = inputs.local_path("root://eosserver//store/nano_dy.root")
    with inputs.open("https://example.org/calibration.json") as file:
        ...

- ``local_path(url)``: a local file holding ``url``'s content. A plain path or ``file://``
  URL is returned as it is (it is local, or on a shared filesystem already).
- ``open(url, mode="rb")``: ``open(local_path(url), mode)``.
- ``counters()``: this process's bytes read from storage, bytes served from the cache,
  files fetched and cache hits (the worker can diff them around a task).
- ``install()``: the transparent path, for an analysis that is not changed at all (below).
- ``release()``: let the node evict what this process has used (see "In use").
- ``take_reads()``: the files obtained since the last call, ``(url, bytes, source, version)``
  each: what a worker reports after each task (``TaskDone.inputs``), so that its manager
  knows which node holds which input and places the next readers there.
- ``using(lifetime, run)``: the inputs read meanwhile are kept ``lifetime`` (below).

**Named by content, never stale.** Each call asks the server once what its copy is (an
XRootD stat: size, modification time, and checksum where the extended stat has one; an
HTTP HEAD: ``Content-Length``, ``Last-Modified``, ``ETag``) and names the entry by the
sha256 of the URL with those. A changed copy gets a new name and is fetched afresh; the
old entry is no longer asked for and ages out. An unchanged one is found by that stat alone
and read from the node's disk: a cache hit, no byte from the server. The fetch itself checks
that the server still serves the copy it stated, and that as many bytes arrived as it
reported: a truncated transfer is never cached. (``store`` describes the directory: one
fetch per node under a file lock, atomic rename, ``.complete`` marker, LRU.)

**Whole files, not blocks.** A file is fetched whole the first time any task of the node
asks for it, though uproot may want only a few of its columns. What that buys: one fetch
per file per node whatever the number of chunk tasks that read it; a second run reads 0
bytes from the server; and a file is one thing a worker holds, which the manager can
place tasks beside and which can later move whole from a peer instead of from storage.
What it costs: the first run reads every byte of a file even when the analysis needs a
tenth of them (a block cache would read only those, but every run and every worker would
then depend on which blocks earlier tasks happened to touch, and a peer could not serve a
file it holds in part).

**Faults.** A server that is down, goes away mid-fetch, times out (``TIMEOUT`` seconds a
request) or answers a server error is asked again after each of ``RETRY_DELAYS`` (three
retries: 0.5, 1 and 2 s), each time with a fresh stat; then ``InputUnavailable`` names
the URL, the worker (``$DASKVINE_PY_WORKER_NAME``, else the host) and the last error. A
file the server does not have (never had, or removed since an earlier run: the cached
copy is not served) is ``FileNotFoundError`` naming the URL at once; one the server
refuses, or whose server accepts none of the process's credentials (an X.509 proxy
missing or expired), ``PermissionError`` naming the URL at once. The bounds, with the
XRootD client as ``remote.configure_xrootd`` sets it (one try to connect, no memory of a
failed server, timeouts checked every second): a server that is down (the connection
refused) fails each attempt in milliseconds, so its task fails after the retries' 3.5 s
(164 s with the client's defaults, measured); a host or server that does not answer
at all, each attempt within ``min(10, TIMEOUT)`` s plus a second (measured: 47.6 s in all
against a socket that never answers); a server that stalls mid-transfer, each attempt
within ``TIMEOUT`` + 1 s a read. A server back
within the retries (a restart) is read from again. A copy truncated or replaced on the
server mid-fetch is never cached: its bytes fall short, or its stat changed, and the
retry fetches the copy the server has then.

**Credentials.** ``root://`` reads authenticate as the XRootD client does, from the
task's environment: for X.509 (GSI), ``X509_USER_PROXY`` names the proxy and
``X509_CERT_DIR`` the CAs' certificates. ``get(env_files={"X509_USER_PROXY": path})``
ships the caller's proxy to the workers and sets the variable for the tasks;
``env_vars=`` sets ``X509_CERT_DIR`` where the nodes' own is elsewhere. The client reads
these variables once per process, when it first authenticates (measured with the
bindings 6.2: a process that first asked without a proxy is refused later too, though
the variable names one by then; so is a library that served a run without a proxy, when
a later run ships one).

**In use.** A process holds a shared lock on every entry it has handed out, until
``release()`` (or its end), and no process of the node removes an entry another holds. A
path is a promise: a task may keep it, pass it to a library that opens it later, or open
it twice, and a fetch by a neighbour must not remove it meanwhile. A library releases
whenever none of its tasks of a ``cache_inputs`` run runs (``using``): a task's paths are
its own while it runs, not after.

**Lifetimes** (``get(cache_inputs=...)``). How long a run's fetched inputs stay on the
node: ``"run"``, until the run ends on the worker that read them; ``"worker"`` (what
``True`` means), until that worker exits (on ``Shutdown``, SIGTERM or SIGINT; a worker
killed with SIGKILL leaves them to the next worker of the node, which removes them as it
starts); ``"forever"``, kept across runs and worker restarts, bounded only by size
(least recently used first). The worker names itself to its libraries
(``$DASKVINE_PY_INPUT_OWNER``); a library's tasks of a run claim each input they read for
that run's lifetime (``using``), with an empty file in the input's entry. The worker drops
its claims as the run ends or as it exits, and an entry goes once no claim is left on it
and no process uses it: it stays as long as the longest lifetime anyone asked for (a
"run" cleanup never removes what another worker keeps for ever or for its life), and one
still in use is left for a later cleanup (``store``). Outside a run with
``cache_inputs`` (a task that calls ``local_path`` itself), a library claims for its
worker's life (which the worker holds from its first run with ``cache_inputs`` on; before
that, the node's next cleanup takes such a claim for a dead worker's); a process that no
worker started, for ever.

**The transparent path: uproot through fsspec.** uproot 5 opens every path or URL it is
given as a string with ``uproot.source.fsspec.FSSpecSource`` unless a ``handler=`` is
passed (``uproot.reading.open.defaults["handler"]`` is None); coffea's processor path
(``uproot.open`` with its ``timeout``) and its Dask path (dask-awkward's ``from_uproot``,
whose tasks open each file with uproot's ``ReadOnlyFile``, as ``uproot.open`` does) both
do so. FSSpecSource asks fsspec for the
``root`` protocol's filesystem and reads byte ranges from it (``cat_file``,
``_cat_ranges``). ``install()`` registers, for ``root``, fsspec-xrootd's own
``XRootDFileSystem`` with its reads served from ``local_path`` (``filesystem``): listing,
``info`` and everything else still go to the server. So an unchanged analysis, in a process
that called ``install()``, reads its ``root://`` inputs from the node's cache. Should
uproot's default handler have been set to one of its XRootD sources, ``install()`` sets it
back to None (fsspec); a ``handler=`` passed to ``uproot.open`` itself still bypasses the
cache. HTTP stays off this path: fsspec's HTTP filesystem serves far more than ROOT files
(``local_path`` and ``open`` serve HTTP inputs).

The cache: ``$DASKVINE_PY_INPUT_CACHE``, else ``daskvine_py-UID/inputs`` in the node's
temp directory, bounded by ``$DASKVINE_PY_INPUT_CACHE_BYTES`` (default 10 GiB). A worker
sets both for its libraries and task processes: its ``--input-cache DIR`` (default that
same temp directory) and its ``--disk`` (when given; else the default).

- ``store``: the node's directory: entries named by content, locked, renamed, LRU;
- ``remote``: the servers: one stat that names a copy, one fetch (XRootD, HTTP);
- ``filesystem``: the fsspec filesystem ``install()`` registers (imports fsspec-xrootd).

Nothing here imports dask: libraries import it in their tasks, the worker beside them.

May import: the standard library, and fsspec, fsspec-xrootd and the XRootD bindings (lazily,
in the library processes that read inputs); never dask, nor any package of ours but the
bottom modules: a task imports it in a library.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import urlsplit

from daskvine_py.inputs import remote
from daskvine_py.inputs.store import (
    LIFETIMES,
    Identity,
    Incomplete,
    InputCache,
    claim,
    default_root,
)

__all__ = [
    "LIFETIMES",
    "InputUnavailable",
    "counters",
    "install",
    "local_path",
    "open",
    "release",
    "take_reads",
    "uninstall",
    "using",
]

logger = logging.getLogger("daskvine_py.inputs")

#: Seconds before each retry of a failed fetch (a fresh stat and fetch): the first attempt
#: and three retries, 3.5 s in all. A server that restarts is usually back within it; one
#: that is gone should fail its task soon, not hold a worker's core.
RETRY_DELAYS = (0.5, 1.0, 2.0)
#: Seconds one request may take (a stat, the wait for an HTTP response, an XRootD open or
#: read of ``remote.CHUNK`` bytes) before the attempt counts as failed. The XRootD client
#: checks its timeouts every ``XRD_TIMEOUTRESOLUTION`` seconds (15 by default).
TIMEOUT = 30.0
#: Seconds a process waits for another process of the node fetching the same input: a
#: large file over a slow link takes long; one that never arrives should not hold forever.
LOCK_WAIT = 3600.0
#: The cache's bound by default, in bytes, when ``$DASKVINE_PY_INPUT_CACHE_BYTES`` is not set.
DEFAULT_LIMIT = 10 * 2**30
#: Where a file handed out came from (``take_reads``; the wire's ``INPUT_FROM_*``):
#: fetched from its server by this call, found in the node's cache, fetched from a peer.
FROM_STORAGE, FROM_CACHE, FROM_PEER = 0, 1, 2
#: In ``take_reads``: the node's cache let this file go (to make room).
DROPPED = 3
#: Reads kept until taken: a process that never takes them (not a worker's) keeps the last.
READS_KEPT = 1024
#: A file handed out: its URL, bytes, where it came from (``FROM_*``), its server's version.
Read = tuple[str, int, int, str]
#: The variable that names the worker whose library this is, in the claims its tasks
#: make (``store.claim``): set by the worker for its libraries.
OWNER_VARIABLE = "DASKVINE_PY_INPUT_OWNER"


class InputUnavailable(OSError):
    """An input could not be fetched: its server is down, went away or refused.

    The message names the URL, the worker and the last error."""

    def __init__(self, url: str, reason: str, worker: str | None = None) -> None:
        self.url = url  #: the input
        self.reason = reason  #: what failed, last
        #: where: ``$DASKVINE_PY_WORKER_NAME`` (set by the worker), else the host name
        self.worker = worker if worker is not None else _worker_name()
        super().__init__(f"input {url} unavailable on worker {self.worker}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # OSError's own would lose the fields
        return (type(self), (self.url, self.reason, self.worker))


# -- the process's state ---------------------------------------------------------------

_lock = threading.Lock()
#: cache root -> this process's view of it (its ``.use`` locks)
_caches: dict[str, InputCache] = {}
_counters = {"bytes_from_storage": 0, "bytes_from_cache": 0, "files_fetched": 0, "cache_hits": 0}
#: files handed out since the last ``take_reads``
_reads: deque[Read] = deque(maxlen=READS_KEPT)
#: path handed out -> what it holds (``read_again``)
_handed: dict[str, Identity] = {}
#: (lifetime, run) -> calls of that run running now in this process (``using``)
_using: dict[tuple[str, int], int] = {}


def counters() -> dict[str, int]:
    """This process's totals since it began.

    ``bytes_from_storage``: bytes read from servers (failed attempts' too);
    ``bytes_from_cache``: the sizes of the files served from the node's cache;
    ``files_fetched``: files this process fetched into it; ``cache_hits``: files served
    from it (fetched earlier, or by another process of the node). A plain or ``file://``
    path counts in none."""
    with _lock:
        return dict(_counters)


def take_reads() -> tuple[Read, ...]:
    """The remote files handed out (``local_path``, ``open``, the installed fsspec path)
    since the last call, in order, as ``(url, bytes, source, version)``: source ``FROM_STORAGE``
    (this process fetched it), ``FROM_CACHE`` (the node had it) or ``FROM_PEER``; a file
    asked for again (uproot asks once per read) is named once, by where it came from
    first; and the files an eviction of this process removed (``DROPPED``, 0 bytes).
    A worker takes them after each task."""
    with _lock:
        if not _reads:
            return ()
        taken = list(_reads)
        _reads.clear()
    first: dict[tuple[str, bool], Read] = {}  # (url, dropped) -> the first such read
    for read in taken:
        first.setdefault((read[0], read[2] == DROPPED), read)
    return tuple(first.values())


def _note_dropped(cache: InputCache) -> None:
    """What an eviction just removed: reported (``DROPPED``), so that the manager stops
    placing those files' readers on this node."""
    dropped, cache.dropped = cache.dropped, []
    if dropped:
        with _lock:
            for gone in dropped:
                _reads.append((gone.url, 0, DROPPED, gone.version))


def read_again(url: str, path: str) -> None:
    """``url``, handed out before as ``path``, is read again without a new lookup (the
    fsspec path's recent lookups): a read from the cache, for ``take_reads``."""
    with _lock:
        if _reads and _reads[-1][0] == url:
            return  # (the usual case: the same file read on; named once anyway)
        identity = _handed.get(path)
        if identity is not None:
            _reads.append((url, identity.size, FROM_CACHE, identity.version))


def _add(name: str, amount: int) -> None:
    with _lock:
        _counters[name] += amount


def _worker_name() -> str:
    return os.environ.get("DASKVINE_PY_WORKER_NAME") or socket.gethostname()


def cache_limit() -> int:
    """The cache's bound the environment names: ``$DASKVINE_PY_INPUT_CACHE_BYTES`` (the
    worker's ``--disk``), else ``DEFAULT_LIMIT``."""
    configured = os.environ.get("DASKVINE_PY_INPUT_CACHE_BYTES", "").strip()
    try:
        return int(configured) if configured else DEFAULT_LIMIT
    except ValueError:
        raise ValueError(
            f"DASKVINE_PY_INPUT_CACHE_BYTES must be a number of bytes, not {configured!r}"
        ) from None


def _cache() -> InputCache:
    """The cache the environment names now (the worker sets it for its libraries)."""
    root = default_root()
    limit = cache_limit()
    with _lock:
        cache = _caches.get(root)
        if cache is None:
            cache = _caches[root] = InputCache(root, limit)
        cache.limit = limit
        return cache


# -- the API ---------------------------------------------------------------------------


def local_path(url: str) -> str:
    """A local file holding ``url``'s content, fetched into the node's cache unless it is
    there already (one stat of the server either way).

    ``url``: a path or ``file://`` URL (returned as it is), ``root://`` or ``http(s)://``.
    Raises ``FileNotFoundError`` if the server has no such file (at once),
    ``InputUnavailable`` once the retries are spent, ``ValueError`` for another scheme.
    """
    if "://" not in url:
        return url  # a path (uproot's "file.root:tree" too)
    parsed = urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"a file:// URL of another host cannot be read here: {url}")
        return urllib.request.url2pathname(parsed.path)
    if scheme not in remote.SCHEMES:
        raise ValueError(
            f"cannot read {url}: daskvine_py.inputs reads paths, file://, root:// and http(s)://"
        )
    cache = _cache()
    attempts = len(RETRY_DELAYS) + 1
    for attempt in range(attempts):
        try:
            return _attempt(cache, url)
        except (remote.Transient, Incomplete) as exc:
            if attempt + 1 == attempts:
                raise InputUnavailable(url, f"{attempts} attempts failed, the last: {exc}") from exc
            delay = RETRY_DELAYS[attempt]
            logger.warning("fetching %s failed (%s); again in %g s", url, exc, delay)
            time.sleep(delay)
        except remote.Refused as exc:
            raise InputUnavailable(url, str(exc)) from exc
        except TimeoutError as exc:  # waiting for another process's fetch
            raise InputUnavailable(url, str(exc)) from exc
    raise AssertionError("unreachable")


def open(url: str, mode: str = "rb") -> IO[Any]:
    """``open(local_path(url), mode)``: the input, read from the node's cache."""
    return builtins.open(local_path(url), mode)


def release() -> None:
    """Let the node remove the inputs this process has used (the paths handed out before
    may then go): for a library, between tasks, when no task holds a path."""
    with _lock:
        caches = list(_caches.values())
    for cache in caches:
        cache.release()
    filesystem = sys.modules.get("daskvine_py.inputs.filesystem")
    if filesystem is not None:  # its paths are looked up (and held) again when read
        filesystem.forget()


@contextlib.contextmanager
def using(lifetime: str, run: int = 0) -> Iterator[None]:
    """The inputs read meanwhile (by any thread of this process) are claimed for
    ``lifetime`` (``LIFETIMES``), of run ``run`` for ``"run"``; once no ``using`` of this
    process is left, ``release()``. A library wraps each call of a ``cache_inputs`` run
    in it."""
    if lifetime not in LIFETIMES:
        raise ValueError(f"cache_inputs must be one of {LIFETIMES}, not {lifetime!r}")
    scope = (lifetime, run if lifetime == "run" else 0)
    with _lock:
        _using[scope] = _using.get(scope, 0) + 1
    try:
        yield
    finally:
        with _lock:
            left = _using.pop(scope) - 1
            if left:
                _using[scope] = left
            idle = not _using
        if idle:
            release()


def _claims() -> list[str]:
    """What an input read now is claimed for: each run's lifetime ``using`` names (several
    runs at once: each of theirs), else the worker's life in a library, else for ever."""
    owner = os.environ.get(OWNER_VARIABLE, "")
    with _lock:
        scopes = list(_using) or [("worker", 0)]
    if not owner:
        return ["forever"]
    return [claim(lifetime, owner, run) for lifetime, run in scopes]


def _attempt(cache: InputCache, url: str) -> str:
    """One stat, and the file from the cache or fetched into it."""
    identity = remote.identify(url, TIMEOUT)
    cache.use(identity.key, LOCK_WAIT)
    path = cache.lookup(identity)
    fetched = False
    if path is None:
        cache.evict(room=identity.size)
        _note_dropped(cache)
        path, fetched = cache.fill(identity, lambda part: _fetch(url, identity, part), LOCK_WAIT)
    if fetched:
        _add("files_fetched", 1)
        logger.info("fetched %s (%d bytes) into %s", url, identity.size, path)
    else:
        _add("cache_hits", 1)
        _add("bytes_from_cache", identity.size)
    with _lock:
        _reads.append(
            (url, identity.size, FROM_STORAGE if fetched else FROM_CACHE, identity.version)
        )
        _handed[path] = identity
    cache.claim(identity.key, _claims())
    return path


def _fetch(url: str, identity: Identity, part: str) -> None:
    remote.fetch(url, identity, part, TIMEOUT, lambda size: _add("bytes_from_storage", size))


# -- the transparent path --------------------------------------------------------------

#: what ``install`` replaced: the ``root`` protocol's fsspec class, uproot's handler
_installed: list[Any] = []


def install() -> None:
    """Serve reads of ``root://`` through fsspec (so uproot's and coffea's) from the
    node's cache, in this process. Needs fsspec and fsspec-xrootd; idempotent."""
    import fsspec

    from daskvine_py.inputs.filesystem import CachedXRootDFileSystem

    with _lock:
        if _installed:
            return
        remote.configure_xrootd()  # before fsspec-xrootd makes its first client
        previous = fsspec.get_filesystem_class("root")
        fsspec.register_implementation("root", CachedXRootDFileSystem, clobber=True)
        handler = _uproot_handler()
        _installed.extend([previous, handler])
    logger.info("root:// reads through fsspec come from the input cache in this process")


def uninstall() -> None:
    """Undo ``install()``."""
    import fsspec

    with _lock:
        if not _installed:
            return
        previous, handler = _installed
        _installed.clear()
    fsspec.register_implementation("root", previous, clobber=True)
    uproot = sys.modules.get("uproot")
    if handler is not None and uproot is not None:
        uproot.reading.open.defaults["handler"] = handler


def _uproot_handler() -> Any:
    """Point uproot's default handler back at fsspec if it was set to one of its XRootD
    sources; what it was (None: left alone). uproot not yet imported has its defaults."""
    uproot = sys.modules.get("uproot")
    if uproot is None:
        return None
    defaults = uproot.reading.open.defaults
    handler = defaults.get("handler")
    xrootd = sys.modules.get("uproot.source.xrootd")
    if handler is None or xrootd is None:
        return None
    if handler in (
        getattr(xrootd, "XRootDSource", None),
        getattr(xrootd, "MultithreadedXRootDSource", None),
    ):
        defaults["handler"] = None
        logger.info("uproot's default handler was %s: now fsspec's", handler.__name__)
        return handler
    return None
