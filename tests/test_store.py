"""The worker's store: memory limit, LRU spilling to disk, reading back, disk limit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker.store import Store

MB = 2**20


def array(i: int, mb: int = 1):
    return np.full(mb * MB // 8, float(i))


def spill_files(store: Store) -> list[str]:
    return sorted(os.listdir(store.spill_dir)) if os.path.isdir(store.spill_dir) else []


def test_without_a_limit_nothing_spills():
    store = Store()
    for i in range(5):
        store.put(i, dumps(array(i)))
    assert len(store) == 5 and store.spilled == 0 and store.disk_bytes == 0
    assert store.nbytes == store.memory_bytes > 5 * MB
    store.release(3)
    assert 3 not in store and store.get(3) is None and len(store) == 4


def test_least_recently_used_results_spill_and_read_back(tmp_path):
    store = Store(memory_limit=int(3.5 * MB), spill_dir=str(tmp_path / "spill"))
    for i in range(3):
        store.put(i, dumps(array(i)))
    assert store.spilled == 0
    store.get(0)  # 0 is now more recent than 1
    store.put(3, dumps(array(3)))
    assert spill_files(store) == ["1"]
    assert store.memory_bytes <= store.memory_limit
    assert store.nbytes == store.memory_bytes + store.disk_bytes
    # Reading back gives the same value and counts as a use: 2 is then the oldest.
    np.testing.assert_array_equal(loads(store.get(1)), array(1))
    assert store.unspilled == 1
    assert "2" in spill_files(store)
    assert all(i in store for i in range(4)) and len(store) == 4
    # A result read back keeps its file: spilling it again writes nothing.
    written = store.spilled
    for i in (2, 3, 0):
        store.get(i)
    assert store.spilled == written + 1  # 3 was spilled for the first time; 1 again for free
    # Releasing removes the file; close removes the directory.
    store.release(1)
    assert "1" not in spill_files(store) and 1 not in store
    store.close()
    assert not os.path.exists(tmp_path / "spill")


def test_serving_a_peer_does_not_read_back_into_memory(tmp_path):
    store = Store(memory_limit=MB + 4096, spill_dir=str(tmp_path))
    store.put(1, dumps(array(1)))
    store.put(2, dumps(array(2)))
    memory = store.memory_bytes
    np.testing.assert_array_equal(loads(store.get(1, use=False)), array(1))
    assert store.memory_bytes == memory and store.unspilled == 0


def test_results_with_and_without_buffers_round_trip(tmp_path):
    store = Store(memory_limit=0, spill_dir=str(tmp_path))
    values = {1: {"a": [1, 2, 3]}, 2: b"x" * 200_000, 3: (array(1), array(2), "text")}
    for task_id, value in values.items():
        store.put(task_id, dumps(value))
    assert store.memory_bytes == 0 and store.spilled == 3
    got = loads(store.get(3))
    np.testing.assert_array_equal(got[1], array(2))
    assert loads(store.get(1)) == values[1] and loads(store.get(2)) == values[2]


def test_past_the_disk_limit_the_store_is_full_until_releases_make_room(tmp_path):
    size = dumps(array(0)).nbytes
    store = Store(memory_limit=size, spill_dir=str(tmp_path), disk_limit=2 * size)
    for i in range(3):
        store.put(i, dumps(array(i)))
    assert not store.full and store.disk_bytes == 2 * size
    store.put(3, dumps(array(3)))  # no disk left: over the memory limit, full
    assert store.full and store.memory_bytes == 2 * size
    store.release(0)  # a file goes: the oldest in memory can spill now
    assert not store.full and store.memory_bytes == size and store.disk_bytes == 2 * size
    for i in (1, 2, 3):
        np.testing.assert_array_equal(loads(store.get(i)), array(i))
    for i in (1, 2, 3):
        store.release(i)
    assert store.nbytes == store.memory_bytes == store.disk_bytes == 0
    assert spill_files(store) == []


def test_a_memory_limit_needs_a_spill_directory():
    with pytest.raises(ValueError, match="spill directory"):
        Store(memory_limit=10)
