"""Large buffers between a worker and its libraries go through shared memory, not the pipe.

A result that moves from one library to another of the same worker (or to the worker's
store, a peer, a spill) crosses two pipes: each copies it into the kernel and out again,
64 KiB per system call. Through a POSIX shared-memory segment the writer copies it once,
and the reader maps it with no copy at all. Measured with three real processes and the
library framing (``benchmarks/bench_library_transfer.py``, docs/benchmarks.md), from one
library to the worker to another: the segment, mapped by its reader, moves 1 MB 1.4x and
100 MB 1.7x faster than the pipe, so buffers of at least ``MIN_BYTES`` take it.

A segment lives only while its message is in flight: the reader unlinks it as soon as it
has mapped it (the mapping stays valid until the last view of it is gone). Its name
starts with ``dvp<worker pid>-``, so that segments left by a worker killed mid-message are
removed by the next worker of the host (``remove_dead``), as its directories are.
"""

from __future__ import annotations

import glob
import mmap
import os
import secrets

try:  # CPython's own binding, behind multiprocessing.shared_memory (POSIX systems)
    import _posixshmem  # type: ignore[import-not-found]  # CPython's own: no stubs
except ImportError:  # pragma: no cover - no POSIX shared memory here: pipes only
    _posixshmem = None

#: Buffers of at least this many bytes travel through a segment. Below it, opening,
#: mapping and unlinking a segment (some 30 µs) cost more than copying through the pipe.
MIN_BYTES = 256 * 1024
#: Where Linux shows the segments, for removing those of dead workers.
SHM_DIR = "/dev/shm"
PREFIX = "dvp"

AVAILABLE = _posixshmem is not None and os.path.isdir(SHM_DIR)


def put(data: memoryview, owner: int) -> str:
    """Copy ``data`` into a new segment, named for worker ``owner``; its name."""
    name = f"/{PREFIX}{owner}-{secrets.token_hex(8)}"
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, data.nbytes)
        with mmap.mmap(fd, data.nbytes) as mapped:
            mapped[:] = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    except BaseException:
        _posixshmem.shm_unlink(name)
        raise
    finally:
        os.close(fd)
    return name


def take(name: str) -> memoryview:
    """The contents of segment ``name``, mapped (no copy); the segment is unlinked."""
    if not name.startswith(f"/{PREFIX}") or "/" in name[1:]:
        raise ValueError(f"not a segment of this project: {name!r}")
    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        mapped = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink(name)
    return memoryview(mapped)


def remove_dead(directory: str = SHM_DIR) -> None:
    """Remove segments whose worker is gone (killed while a message was in flight)."""
    for path in glob.glob(os.path.join(directory, PREFIX + "*-*")):
        pid_text = os.path.basename(path)[len(PREFIX) :].partition("-")[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except OSError:
            pass  # alive, another user's


def remove_owned(owner: int, directory: str = SHM_DIR) -> None:
    """Remove the segments still in flight to or from worker ``owner`` (it is exiting)."""
    for path in glob.glob(os.path.join(directory, f"{PREFIX}{owner}-*")):
        try:
            os.unlink(path)
        except OSError:
            pass
