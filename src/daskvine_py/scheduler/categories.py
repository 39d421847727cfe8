"""What a run's tasks took, by category: the prefix of their keys (dask's ``key_split``,
``TaskRecord.prefix``) unless annotated ``category=``, summed as their ``TaskDone`` reports
arrive (and their ``TaskExhausted`` ones: ``sizing``). The manager hands them to the
caller as ``Manager.last_run.categories``, and its event log and report show them
(``report.events``, ``report.page``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

_MB = float(2**20)


class _Sized(Protocol):
    """An input of a task: its result's bytes as its ``TaskDone`` said (``TaskRecord``)."""

    nbytes: int


class Category:
    """One category's totals over the tasks of a run that finished (a task run twice
    counts twice)."""

    __slots__ = (
        "tasks",
        "wall_s",
        "cpu_s",
        "peak_memory_mb",
        "allocated_memory_mb",
        "exhausted",
        "input_bytes",
        "output_bytes",
        "failed",
        "file_bytes_from_storage",
        "file_bytes_from_cache",
        "file_bytes_from_peers",
    )

    def __init__(self) -> None:
        self.tasks = 0
        #: seconds its tasks' calls took, and the CPU seconds of their processes then
        self.wall_s = 0.0
        self.cpu_s = 0.0
        #: the largest peak resident memory (MiB) of one of its tasks, above what its
        #: process held when it began: its own growth, often 0 or a fraction for a small
        #: task (0 also: not measured there)
        self.peak_memory_mb = 0.0
        #: the largest memory allotment its tasks ran with (MiB; 0: none), and how many
        #: of its tasks went past theirs
        self.allocated_memory_mb = 0.0
        self.exhausted = 0
        #: bytes its tasks read (the sizes of their inputs' results, as the inputs'
        #: ``TaskDone`` said) and bytes of the results they made
        self.input_bytes = 0
        self.output_bytes = 0
        #: its tasks that raised or whose process died (``TaskErred``, ``TaskCrashed``)
        self.failed = 0
        #: bytes of the remote files its tasks obtained through their nodes' input cache
        #: (``TaskDone.inputs``; whole files, each counted once per task that read it):
        #: fetched from their servers, found in the node's cache, fetched from a peer
        self.file_bytes_from_storage = 0
        self.file_bytes_from_cache = 0
        self.file_bytes_from_peers = 0

    def allot(self, allocated: int) -> None:
        mb = allocated / _MB
        if mb > self.allocated_memory_mb:
            self.allocated_memory_mb = mb

    def __repr__(self) -> str:
        return (
            f"Category(tasks={self.tasks}, wall_s={self.wall_s:.3f}, "
            f"cpu_s={self.cpu_s:.3f}, peak_memory_mb={self.peak_memory_mb:.1f}, "
            f"allocated_memory_mb={self.allocated_memory_mb:.1f}, "
            f"exhausted={self.exhausted}, input_bytes={self.input_bytes}, "
            f"output_bytes={self.output_bytes}"
            + (
                f", file_bytes_from_storage={self.file_bytes_from_storage}, "
                f"file_bytes_from_cache={self.file_bytes_from_cache}, "
                f"file_bytes_from_peers={self.file_bytes_from_peers})"
                if self.file_bytes_from_storage
                or self.file_bytes_from_cache
                or self.file_bytes_from_peers
                else ")"
            )
        )

    def fields(self) -> dict[str, float | int]:
        """Every field by name: what the event log writes (``events.CategoriesEntry``)."""
        return {name: getattr(self, name) for name in Category.__slots__}


#: A run's categories before any of its tasks finished.
NO_CATEGORIES: Mapping[str, Category] = MappingProxyType({})


class Categories(dict[str, Category]):
    """A run's categories by name."""

    __slots__ = ()

    def done(
        self,
        name: str,
        duration: float,
        cpu: float,
        peak_memory: int,
        nbytes: int = 0,
        inputs: Sequence[_Sized] = (),
        allocated: int = 0,
    ) -> None:
        """A task of category ``name`` finished, its result ``nbytes`` long, having read
        ``inputs`` with ``allocated`` bytes of memory: one lookup, a few additions, and
        one per input."""
        category = self.get(name)
        if category is None:
            category = self[name] = Category()
        category.tasks += 1
        category.wall_s += duration
        category.cpu_s += cpu
        peak = peak_memory / _MB
        if peak > category.peak_memory_mb:
            category.peak_memory_mb = peak
        category.output_bytes += nbytes
        if inputs:
            read = 0
            for dep in inputs:
                read += dep.nbytes
            category.input_bytes += read
        if allocated:
            category.allot(allocated)

    def files(self, name: str, reads: Sequence[tuple[str, int, int, str]]) -> None:
        """A task of category ``name`` obtained these input files (``TaskDone.inputs``:
        ``(url, bytes, source, version)``; source 0 storage, 1 the node's cache, 2 a peer)."""
        category = self.get(name)
        if category is None:
            category = self[name] = Category()
        for _, nbytes, source, _ in reads:
            if source == 0:
                category.file_bytes_from_storage += nbytes
            elif source == 1:
                category.file_bytes_from_cache += nbytes
            elif source == 2:
                category.file_bytes_from_peers += nbytes  # (3: a file let go, no read)

    def fail(self, name: str) -> None:
        """A task of category ``name`` raised, or its process died."""
        category = self.get(name)
        if category is None:
            category = self[name] = Category()
        category.failed += 1

    def exhausted(self, name: str, peak_memory: int, allocated: int) -> None:
        """A task of category ``name`` went past its allotment (stopped, not finished)."""
        category = self.get(name)
        if category is None:
            category = self[name] = Category()
        category.exhausted += 1
        category.allot(allocated)
        peak = peak_memory / _MB
        if peak > category.peak_memory_mb:
            category.peak_memory_mb = peak
