"""A worker's local store of results, in serialized form, spilled to disk past a limit.

Results are kept serialized: that is the form in which they reach library processes and
peers, and its size is known exactly.

Past ``memory_limit`` bytes the least recently used results are written to
``spill_dir/<task_id>`` (the pickle header, then each out-of-band buffer) and dropped from
memory; a small record of their sizes stays. ``get`` reads a spilled result back (memory
mapped, so the copy is the page cache's) and counts it as a use. A result read back keeps
its file, so spilling it again costs nothing. Files go when the result is released and
the whole directory on ``close``.

Past ``disk_limit`` spilled bytes nothing more is written: results stay in memory over
the limit and ``full`` turns true until releases make room. The worker tells the manager,
which stops placing new work here meanwhile.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from collections.abc import Callable, Iterator

from daskvine_py.wire.serialize import Serialized


class _Spilled:
    """Where a spilled result is on disk, and the sizes to cut it back into pieces."""

    __slots__ = ("path", "header", "buffers", "nbytes")

    def __init__(self, path: str, value: Serialized) -> None:
        self.path = path
        self.header = len(value.header)
        self.buffers = [memoryview(b).nbytes for b in value.buffers]
        self.nbytes = value.nbytes


class Store:
    """Results by task id: in memory, most recently used last, or spilled to disk.

    ``memory_limit=None`` never spills (and needs no ``spill_dir``).
    """

    __slots__ = (
        "_memory",
        "_disk",
        "memory_limit",
        "disk_limit",
        "spill_dir",
        "nbytes",
        "memory_bytes",
        "disk_bytes",
        "full",
        "spilled",
        "unspilled",
        "reserved",
        "allocated",
        "on_spill",
    )

    def __init__(
        self,
        memory_limit: int | None = None,
        spill_dir: str | None = None,
        disk_limit: int | None = None,
    ) -> None:
        if memory_limit is not None and spill_dir is None:
            raise ValueError("a store with a memory limit needs a spill directory")
        #: in memory, least recently used first (a dict keeps insertion order)
        self._memory: dict[int, Serialized] = {}
        #: on disk: every spilled result, including those read back into memory
        self._disk: dict[int, _Spilled] = {}
        self.memory_limit = memory_limit
        self.disk_limit = disk_limit
        self.spill_dir = spill_dir
        #: bytes of the results held, wherever they are
        self.nbytes = 0
        #: bytes in memory, and bytes in spill files
        self.memory_bytes = 0
        #: bytes held in memory elsewhere that count against the limit too (results the
        #: libraries keep live): the store spills to leave them room
        self.reserved = 0
        #: bytes of memory the tasks running now are allocated (``allocate``): the store
        #: spills to leave them room too
        self.allocated = 0
        self.disk_bytes = 0
        #: over the memory limit with no disk left to spill to
        self.full = False
        #: results written to disk, and read back, since the start
        self.spilled = 0
        self.unspilled = 0
        #: told of each spill that wrote files: (start, end, files), ``time.monotonic()``
        self.on_spill: Callable[[float, float, int], None] | None = None

    def __len__(self) -> int:
        return len(self._memory) + sum(1 for t in self._disk if t not in self._memory)

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._memory or task_id in self._disk

    def __iter__(self) -> Iterator[int]:
        yield from self._memory
        yield from (t for t in self._disk if t not in self._memory)

    def put(self, task_id: int, value: Serialized) -> None:
        self.release(task_id)
        self._memory[task_id] = value
        self.nbytes += value.nbytes
        self.memory_bytes += value.nbytes
        if self.memory_limit is not None and self._held() > self.memory_limit:
            self._spill()

    def size(self, task_id: int) -> int:
        """Bytes of a result, in memory or spilled (0 if absent), without reading it."""
        value = self._memory.get(task_id)
        if value is not None:
            return value.nbytes
        spilled = self._disk.get(task_id)
        return 0 if spilled is None else spilled.nbytes

    def get(self, task_id: int, use: bool = True) -> Serialized | None:
        """The result, read back from disk if spilled; ``use`` makes it most recent.

        With ``use=False`` (serving a peer) a spilled result is mapped but stays spilled.
        """
        memory = self._memory
        value = memory.pop(task_id, None)
        if value is not None:
            memory[task_id] = value  # most recently used: last
            return value
        spilled = self._disk.get(task_id)
        if spilled is None:
            return None
        value = _read(spilled)
        if use:
            self.unspilled += 1
            memory[task_id] = value
            self.memory_bytes += value.nbytes
            if self._held() > self.memory_limit:  # type: ignore[operator]
                self._spill(keep=task_id)
        return value

    def release(self, task_id: int) -> None:
        value = self._memory.pop(task_id, None)
        if value is not None:
            self.memory_bytes -= value.nbytes
            self.nbytes -= value.nbytes
        spilled = self._disk.pop(task_id, None)
        if spilled is not None:
            self.disk_bytes -= spilled.nbytes
            if value is None:
                self.nbytes -= spilled.nbytes
            _remove(spilled.path)
        if self.full:  # room may have been made: retry the spill
            self._spill()

    def allocate(self, nbytes: int) -> None:
        """The tasks running now are allocated ``nbytes`` of memory: results spill to
        leave them room (the worker's ``--memory`` is its whole budget)."""
        grew = nbytes > self.allocated
        self.allocated = nbytes
        if grew and self.memory_limit is not None and self._held() > self.memory_limit:
            self._spill()

    def _held(self) -> int:
        """Bytes counted against the memory limit: in memory, live, allocated."""
        return self.memory_bytes + self.reserved + self.allocated

    def close(self) -> None:
        """Forget everything and remove the spill directory."""
        self._memory.clear()
        self._disk.clear()
        self.nbytes = self.memory_bytes = self.disk_bytes = 0
        if self.spill_dir is not None:
            shutil.rmtree(self.spill_dir, ignore_errors=True)

    def _spill(self, keep: int | None = None) -> None:
        """Move least recently used results to disk until memory is under the limit."""
        memory = self._memory
        limit = self.memory_limit
        assert limit is not None
        full = False
        written = self.spilled
        began = time.monotonic()
        for task_id in list(memory):
            if self._held() <= limit:
                break
            if task_id == keep:
                continue
            value = memory[task_id]
            if task_id not in self._disk:
                if self.disk_limit is not None and self.disk_bytes + value.nbytes > self.disk_limit:
                    full = True
                    continue  # a smaller one may still fit
                self._disk[task_id] = _write(self._path(task_id), value)
                self.disk_bytes += value.nbytes
                self.spilled += 1
            del memory[task_id]
            self.memory_bytes -= value.nbytes
        self.full = full and self._held() > limit
        if self.spilled > written and self.on_spill is not None:
            self.on_spill(began, time.monotonic(), self.spilled - written)

    def _path(self, task_id: int) -> str:
        assert self.spill_dir is not None
        if not os.path.isdir(self.spill_dir):
            os.makedirs(self.spill_dir, exist_ok=True)
        return os.path.join(self.spill_dir, str(task_id))


def _write(path: str, value: Serialized) -> _Spilled:
    with open(path, "wb") as file:
        file.write(value.header)
        for buffer in value.buffers:
            file.write(buffer)
    return _Spilled(path, value)


def _read(spilled: _Spilled) -> Serialized:
    """The spilled result, its buffers views of a memory map of its file."""
    with open(spilled.path, "rb") as file:
        if spilled.nbytes == 0:
            return Serialized(b"", [])
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    header = bytes(view[: spilled.header])
    offset = spilled.header
    buffers = []
    for size in spilled.buffers:
        buffers.append(view[offset : offset + size])
        offset += size
    return Serialized(header, buffers)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
