"""A worker's local store of results, in serialized form.

Results are kept serialized: that is the form in which they reach library processes and
peers, and its size is known exactly. Spilling to disk past a memory limit belongs here.
"""

from __future__ import annotations

from collections.abc import Iterator

from .serialize import Serialized


class Store:
    """Results by task id, with their total size."""

    __slots__ = ("_data", "nbytes")

    def __init__(self) -> None:
        self._data: dict[int, Serialized] = {}
        #: bytes held, headers and buffers
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._data

    def __iter__(self) -> Iterator[int]:
        return iter(self._data)

    def put(self, task_id: int, value: Serialized) -> None:
        self.release(task_id)
        self._data[task_id] = value
        self.nbytes += value.nbytes

    def get(self, task_id: int) -> Serialized | None:
        return self._data.get(task_id)

    def release(self, task_id: int) -> None:
        value = self._data.pop(task_id, None)
        if value is not None:
            self.nbytes -= value.nbytes
