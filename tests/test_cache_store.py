"""The cache's directory (issue 17): atomic entries, broken ones missed, eviction; and
``Cache.clear``, which waits for the state before it empties the directories."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest

from daskvine_py.cache.directory import DiskStore
from daskvine_py.cache.result_cache import Cache
from daskvine_py.errors import ManagerDied
from daskvine_py.scheduler.cache_placement import CacheIndex
from daskvine_py.scheduler.messages import CacheClear
from daskvine_py.wire.serialize import dumps, loads


def test_a_result_goes_to_disk_and_comes_back_with_its_seconds(tmp_path):
    store = DiskStore(tmp_path)
    value = dumps({"x": np.arange(100_000)})  # with an out-of-band buffer
    assert value.buffers
    store.put(b"k" * 20, value, 1.5)
    again = DiskStore(tmp_path)  # another manager, later
    assert b"k" * 20 in again and len(again) == 1
    got, seconds = again.get(b"k" * 20)
    assert seconds == 1.5
    assert np.array_equal(loads(got)["x"], np.arange(100_000))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_a_truncated_entry_is_a_miss_logged_once_and_removed(tmp_path, caplog):
    store = DiskStore(tmp_path)
    store.put(b"a" * 20, dumps(list(range(1000))), 0.1)
    (path,) = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path)]
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) - 10)
    again = DiskStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        assert again.get(b"a" * 20) is None
        assert again.get(b"a" * 20) is None
    assert len([r for r in caplog.records if "truncated" in r.getMessage()]) == 1
    assert b"a" * 20 not in again and not os.listdir(tmp_path)


def test_a_garbled_entry_is_a_miss(tmp_path):
    store = DiskStore(tmp_path)
    store.put(b"b" * 20, dumps("hello" * 100), 0.1)
    (path,) = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path)]
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert DiskStore(tmp_path).get(b"b" * 20) is None


def test_a_half_written_entry_is_never_read(tmp_path):
    # What a writer killed before its rename leaves: a temporary file, under no key.
    open(os.path.join(tmp_path, ".tmp-1-2-" + "c" * 40), "wb").write(b"DVPCACHE1\npartial")
    store = DiskStore(tmp_path)
    assert len(store) == 0 and store.get(b"\xcc" * 20) is None


def test_eviction_keeps_the_directory_under_its_limit_least_recently_used_first(tmp_path):
    store = DiskStore(tmp_path, limit=350_000)
    for i in range(5):
        store.put(bytes([i]) * 20, dumps(b"x" * 100_000), 0.1)
        if i == 2:
            assert store.get(bytes([0]) * 20) is not None  # 0 used: 1 and 2 are older now
    sizes = sum(os.path.getsize(os.path.join(tmp_path, n)) for n in os.listdir(tmp_path))
    assert sizes <= 350_000 and store.info()["bytes"] == sizes
    kept = [i for i in range(5) if bytes([i]) * 20 in store]
    assert kept == [0, 3, 4]


def test_clear_removes_everything(tmp_path):
    store = DiskStore(tmp_path)
    store.put(b"d" * 20, dumps(1), 0.1)
    store.clear()
    assert len(store) == 0 and not os.listdir(tmp_path)


# -- Cache.clear: the state first, then the directories ---------------------------------


def _cache(tmp_path, send_event, raise_if_dead=lambda: None):
    return Cache(CacheIndex(), send_event, raise_if_dead, tmp_path)


def test_clear_waits_until_the_state_handled_it_then_empties_the_directory(tmp_path):
    sent = []

    def send_event(event, handled):  # the I/O thread sets ``handled`` a little later
        sent.append(event)
        threading.Timer(0.05, handled.set).start()

    cache = _cache(tmp_path, send_event)
    cache.store(tmp_path).put(b"k" * 20, dumps(1), 0.1)
    cache.clear()
    assert sent == [CacheClear()]
    assert not os.listdir(tmp_path)


def test_clear_raises_manager_died_when_the_loop_is_dead(tmp_path):
    def dead():
        raise ManagerDied("RuntimeError: gone")

    cache = _cache(tmp_path, lambda event, handled: handled.set(), dead)  # a dying loop's set
    with pytest.raises(ManagerDied):
        cache.clear()


def test_clear_times_out_when_the_state_never_handles_it(tmp_path):
    cache = _cache(tmp_path, lambda event, handled: None)
    with pytest.raises(TimeoutError, match="not cleared within"):
        cache.clear(timeout=0.05)
