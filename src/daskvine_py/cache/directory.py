"""The cache's directory: results by cache key on disk, across manager restarts.

One file per result, ``<cache_dir>/<key in hex>.dvc``::

    MAGIC, header length (8 bytes), header (JSON: sizes, seconds, digest), payload

The payload is the result's pickle stream and its out-of-band buffers, end to end; the
header's BLAKE2b digest covers them. A file is written under a temporary name in the same
directory and renamed into place (atomic on POSIX), so a run killed while writing leaves
at worst a temporary file, which nobody reads and the next ``DiskStore`` removes. A file
that is short, garbled or fails its digest is a miss: logged once, and removed.

The directory is kept under ``limit`` bytes: after each write the least recently used
files go (a read touches its file's modification time). Several managers may share a
directory (a shared filesystem): each keeps its own index of it, brought up to date when
the directory itself changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
from typing import Any

from daskvine_py.wire.serialize import Serialized

logger = logging.getLogger("daskvine_py.manager")

MAGIC = b"DVPCACHE1\n"
SUFFIX = ".dvc"
#: Bytes kept on disk by default: past it the least recently used results are removed.
DEFAULT_LIMIT = 10 * 2**30
#: Temporary files older than this (seconds) are leftovers of a killed writer.
STALE_TEMPORARY = 3600.0
_LENGTH = struct.Struct("<Q")


class DiskStore:
    """Results by cache key in one directory (thread-safe)."""

    def __init__(self, path: str | os.PathLike[str], limit: int = DEFAULT_LIMIT) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.limit = limit
        os.makedirs(self.path, exist_ok=True)
        self._lock = threading.Lock()
        #: hex key -> (bytes, last use) of the files there
        self._index: dict[str, tuple[int, float]] = {}
        self._scanned = -1
        #: keys whose file was found broken (each is logged once)
        self._broken: set[str] = set()
        self._rescan(force=True)

    def __repr__(self) -> str:
        return f"<DiskStore {self.path} {len(self._index)} entries>"

    # -- reading ------------------------------------------------------------------------

    def __contains__(self, key: bytes) -> bool:
        return key.hex() in self._index

    def __len__(self) -> int:
        return len(self._index)

    def refresh(self) -> None:
        """See files other managers wrote or removed since the last look (cheap when the
        directory has not changed)."""
        self._rescan(force=False)

    def get(self, key: bytes) -> tuple[Serialized, float] | None:
        """The result and the seconds it took to compute, or None (absent or broken)."""
        name = key.hex()
        path = self._file(name)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            with self._lock:
                self._index.pop(name, None)
            return None
        except OSError as exc:
            self._broken_entry(name, f"unreadable ({exc})")
            return None
        try:
            value, seconds = _decode(data)
        except ValueError as exc:
            self._broken_entry(name, str(exc))
            return None
        now = time.time()
        try:
            os.utime(path, (now, now))  # used: the most recent now
        except OSError:
            pass
        with self._lock:
            self._index[name] = (len(data), now)
        return value, seconds

    # -- writing ------------------------------------------------------------------------

    def put(self, key: bytes, value: Serialized, seconds: float) -> None:
        """Write a result (atomically), then keep the directory under its limit."""
        name = key.hex()
        temporary = os.path.join(self.path, f".tmp-{os.getpid()}-{threading.get_ident()}-{name}")
        parts = [value.header, *value.buffers]
        try:
            with open(temporary, "wb") as file:
                size = _write(file, parts, seconds)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self._file(name))
        except OSError as exc:
            logger.warning("could not write a result to the cache directory %s: %s", self.path, exc)
            try:
                os.unlink(temporary)
            except OSError:
                pass
            return
        with self._lock:
            self._index[name] = (size, time.time())
            self._broken.discard(name)
        self._evict()

    def clear(self) -> None:
        """Remove every result."""
        with self._lock:
            names = list(self._index)
            self._index.clear()
        for name in names:
            try:
                os.unlink(self._file(name))
            except OSError:
                pass
        self._rescan(force=True)
        for name in list(self._index):  # written by others meanwhile
            try:
                os.unlink(self._file(name))
            except OSError:
                pass
        with self._lock:
            self._index.clear()

    def info(self) -> dict[str, Any]:
        with self._lock:
            nbytes = sum(size for size, _ in self._index.values())
            return {
                "path": self.path,
                "entries": len(self._index),
                "bytes": nbytes,
                "limit": self.limit,
            }

    # -- inside -------------------------------------------------------------------------

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name + SUFFIX)

    def _broken_entry(self, name: str, why: str) -> None:
        with self._lock:
            first = name not in self._broken
            self._broken.add(name)
            self._index.pop(name, None)
        if first:
            logger.warning(
                "cache entry %s in %s is broken (%s): recomputing it", name, self.path, why
            )
        try:
            os.unlink(self._file(name))
        except OSError:
            pass

    def _rescan(self, force: bool) -> None:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if not force and stamp == self._scanned:
            return
        index: dict[str, tuple[int, float]] = {}
        now = time.time()
        with os.scandir(self.path) as entries:
            for entry in entries:
                try:
                    info = entry.stat()
                except OSError:
                    continue
                if entry.name.endswith(SUFFIX):
                    index[entry.name[: -len(SUFFIX)]] = (info.st_size, info.st_mtime)
                elif entry.name.startswith(".tmp-") and now - info.st_mtime > STALE_TEMPORARY:
                    try:
                        os.unlink(entry.path)  # a writer killed half-way
                    except OSError:
                        pass
        with self._lock:
            self._index = index
            self._scanned = stamp

    def _evict(self) -> None:
        with self._lock:
            total = sum(size for size, _ in self._index.values())
            if total <= self.limit:
                return
            oldest = sorted(self._index.items(), key=lambda item: item[1][1])
            doomed = []
            for name, (size, _) in oldest:
                if total <= self.limit:
                    break
                doomed.append(name)
                total -= size
                del self._index[name]
        for name in doomed:
            try:
                os.unlink(self._file(name))
            except OSError:
                pass


def _write(file: Any, parts: list[Any], seconds: float) -> int:
    digest = hashlib.blake2b(digest_size=20)
    sizes = []
    for part in parts:
        view = memoryview(part).cast("B")
        digest.update(view)
        sizes.append(view.nbytes)
    header = json.dumps({"sizes": sizes, "seconds": seconds, "digest": digest.hexdigest()}).encode()
    file.write(MAGIC)
    file.write(_LENGTH.pack(len(header)))
    file.write(header)
    for part in parts:
        file.write(part)
    return len(MAGIC) + _LENGTH.size + len(header) + sum(sizes)


def _decode(data: bytes) -> tuple[Serialized, float]:
    """The result in a file's bytes, or ``ValueError`` saying what is wrong."""
    if not data.startswith(MAGIC):
        raise ValueError("not a cache entry")
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start:
        raise ValueError("truncated header")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + length])
        sizes = [int(n) for n in header["sizes"]]
        seconds = float(header["seconds"])
        expected = str(header["digest"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"garbled header ({exc})") from exc
    offset = start + length
    if not sizes or len(data) != offset + sum(sizes):
        raise ValueError(f"{len(data)} bytes, not {offset + sum(sizes)}: truncated")
    view = memoryview(data)
    parts = []
    digest = hashlib.blake2b(digest_size=20)
    for size in sizes:
        part = view[offset : offset + size]
        digest.update(part)
        parts.append(part)
        offset += size
    if digest.hexdigest() != expected:
        raise ValueError("its digest does not match its contents")
    return Serialized(bytes(parts[0]), parts[1:]), seconds
