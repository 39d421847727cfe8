"""The ``root`` filesystem ``install()`` registers with fsspec: fsspec-xrootd's own, with
its reads served from the node's input cache.

uproot's ``FSSpecSource`` reads a file as byte ranges (``cat_file`` for the first bytes
of a file it opens, ``_cat_ranges`` for baskets); ``open`` and ``get_file`` read whole
files. All four are served from ``local_path``; ``info``, ``ls``, ``glob``, writes and
the rest are ``XRootDFileSystem``'s, asking the server.

A read does not stat the server for every range (uproot asks for dozens per file): the
local path found for a URL is reused for ``RECHECK_SECONDS``, and looked up again (one
stat) whenever a file is opened: ``open``, or a read at offset 0, where uproot begins
every file it opens. So each ``uproot.open`` checks the server's copy once, and a copy
changed on the server is seen by the next file opened, as reading from the server would.

This module imports fsspec-xrootd (and with it the XRootD bindings): only ``install()``
imports it.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import shutil
import threading
import time
from collections.abc import Sequence
from typing import Any

from fsspec_xrootd import XRootDFileSystem

from daskvine_py import inputs

#: Seconds a URL's local path is reused by reads within a file before the server is asked
#: again (a read at offset 0 or an ``open`` always asks): the bound on how long a process
#: reading one file keeps reading a copy that changed on the server meanwhile.
RECHECK_SECONDS = 10.0

_lock = threading.Lock()
#: URL -> (its local path, when it was looked up: ``time.monotonic()``)
_known: dict[str, tuple[str, float]] = {}  # url -> its local path, when it was looked up


class CachedXRootDFileSystem(XRootDFileSystem):
    """``root://`` as fsspec-xrootd serves it, with reads from the node's input cache."""

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        url = self.unstrip_protocol(path)
        pieces = await asyncio.to_thread(_read, url, [start], [end])
        return pieces[0]

    async def _cat_ranges(
        self,
        paths: list[str],
        starts: list[int] | int | None,
        ends: list[int] | int | None,
        max_gap: int | None = None,
        batch_size: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes]:
        count = len(paths)
        firsts = starts if isinstance(starts, list) else [starts] * count
        lasts = ends if isinstance(ends, list) else [ends] * count
        if len(firsts) != count or len(lasts) != count:
            raise ValueError("paths, starts and ends differ in length")
        urls = [self.unstrip_protocol(path) for path in paths]
        return await asyncio.to_thread(_read_ranges, urls, firsts, lasts)

    async def _get_file(
        self, rpath: str, lpath: str, chunk_size: int = 262_144, **kwargs: Any
    ) -> None:
        local = await asyncio.to_thread(_local, self.unstrip_protocol(rpath), True)
        await asyncio.to_thread(shutil.copyfile, local, lpath)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | str | None = None,
        autocommit: bool = True,
        cache_options: dict[Any, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """The local copy, opened (a plain binary file); writes go to the server."""
        if mode != "rb":
            return super()._open(
                path, mode, block_size, autocommit, cache_options=cache_options, **kwargs
            )
        return builtins.open(_local(self.unstrip_protocol(path), True), "rb")


def forget() -> None:
    """Look every URL up again on its next read (for tests, and for a worker between runs)."""
    with _lock:
        _known.clear()


def _local(url: str, opening: bool) -> str:
    """``url``'s local path: the one found within ``RECHECK_SECONDS`` unless ``opening``."""
    now = time.monotonic()
    with _lock:
        known = _known.get(url)
    if known is not None and not opening and now - known[1] < RECHECK_SECONDS:
        inputs.read_again(url, known[0])  # (this task's read, for its worker's report)
        return known[0]
    path = inputs.local_path(url)
    with _lock:
        _known[url] = (path, now)
    return path


def _read(url: str, starts: Sequence[int | None], ends: Sequence[int | None]) -> list[bytes]:
    """Byte ranges of one URL's local copy (fsspec's conventions: None is the file's
    start or end, a negative offset counts from the end)."""
    path = _local(url, opening=any(start in (0, None) for start in starts))
    pieces = []
    with builtins.open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        for start, end in zip(starts, ends, strict=True):
            first = _offset(start, size, 0)
            last = _offset(end, size, size)
            file.seek(first)
            pieces.append(file.read(max(0, last - first)))
    return pieces


def _read_ranges(
    urls: list[str], starts: Sequence[int | None], ends: Sequence[int | None]
) -> list[bytes]:
    """``_read`` for ranges of several URLs, in the order asked."""
    order: dict[str, list[int]] = {}
    for index, url in enumerate(urls):
        order.setdefault(url, []).append(index)
    out: list[bytes] = [b""] * len(urls)
    for url, indices in order.items():
        pieces = _read(url, [starts[i] for i in indices], [ends[i] for i in indices])
        for index, piece in zip(indices, pieces, strict=True):
            out[index] = piece
    return out


def _offset(value: int | None, size: int, default: int) -> int:
    if value is None:
        return default
    if value < 0:
        return max(0, size + value)
    return min(value, size)
