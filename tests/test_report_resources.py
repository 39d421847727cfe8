"""What tasks and workers took, in the report and the event log of real runs: the categories
table is ``last_run.categories``, bytes in and out are the sizes of the results, each worker
gets its memory chart, and each task's "done" record its CPU, peak memory and category."""

from __future__ import annotations

import re
import sys
import time

import dask
import numpy as np
import pytest

from daskvine_py.report.events import read_events
from daskvine_py.report.resources import amount
from daskvine_py.sizes import peak_memory
from test_events import section, section_rows

MB = 2**20
#: What each "hold" task keeps resident while it sleeps: its workers' heartbeats see it.
HOLD_MB = 100


def _hold(i):
    block = bytearray(HOLD_MB * MB)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))  # every page resident
    time.sleep(0.6)  # longer than the heartbeat interval: the worker beats meanwhile
    return np.ones(1000 * (i + 1)) * block[4096]


def _mix(a, b):
    n = min(len(a), len(b))
    return a[:n] + b[:n]


def _total(*parts):
    return float(sum(part.sum() for part in parts))


def _boom(x):
    raise ValueError(f"no {x}")


def _graph() -> dict:
    """Four "hold" arrays, each read by two "mix" tasks (so none fuses), and their total."""
    n = 4
    dsk: dict = {("hold", i): (_hold, i) for i in range(n)}
    dsk.update({("mix", i): (_mix, ("hold", i), ("hold", (i + 1) % n)) for i in range(n)})
    dsk["total"] = (_total, *[("mix", i) for i in range(n)])
    return dsk


def _category(key) -> str:
    return key[0] if isinstance(key, tuple) else key


def _size(value) -> int:
    return value.nbytes if isinstance(value, np.ndarray) else sys.getsizeof(value)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_report_and_log_show_what_each_category_and_worker_took(manager, tmp_path):
    report, log = tmp_path / "run.html", tmp_path / "run.jsonl"
    dsk = _graph()
    got = manager.get(dsk, "total", report=report, event_log=log)
    values = dict(zip(dsk, dask.get(dsk, list(dsk)), strict=True))  # (once: its naps take 2.4 s)
    assert got == values["total"]
    categories = manager.last_run.categories
    assert {name: c.tasks for name, c in categories.items()} == {"hold": 4, "mix": 4, "total": 1}
    assert all(c.failed == 0 for c in categories.values())

    records = read_events(log)
    keys = {
        r["id"]: tuple(r["key"]) if isinstance(r["key"], list) else r["key"]
        for r in records
        if r["event"] == "dispatch"
    }
    done = {keys[r["id"]]: r for r in records if r["event"] == "done"}
    assert len(done) == 9
    # Each task's measurements, under its key's category.
    for key, record in done.items():
        assert record["category"] == _category(key)
        assert record["cpu"] >= 0 and record["peak_memory"] >= 0
    if sys.platform.startswith("linux"):
        assert all(done[("hold", i)]["peak_memory"] >= (HOLD_MB - 10) * MB for i in range(4))

    # Bytes out: the results' sizes as the workers reported them, summed by category; and
    # those are the sizes of the values dask computes: an array's bytes (plus a pickle's
    # framing when it travelled pickled), a float's pickle or ``sizeof``.
    made = {name: 0 for name in categories}
    for key, record in done.items():
        made[_category(key)] += record["nbytes"]
    assert {name: c.output_bytes for name, c in categories.items()} == made
    for name in categories:
        sizes = [_size(v) for k, v in values.items() if _category(k) == name]
        assert abs(categories[name].output_bytes - sum(sizes)) <= 1024 * len(sizes)
    assert categories["hold"].output_bytes >= 8 * 1000 * (1 + 2 + 3 + 4)
    # Bytes in: each task's inputs' sizes, read from the graph.
    nbytes = {key: record["nbytes"] for key, record in done.items()}
    mix_in = sum(nbytes[("hold", i)] + nbytes[("hold", (i + 1) % 4)] for i in range(4))
    assert categories["mix"].input_bytes == mix_in
    assert categories["total"].input_bytes == sum(nbytes[("mix", i)] for i in range(4))
    assert categories["hold"].input_bytes == 0
    assert mix_in == pytest.approx(
        2 * sum(_size(values[("hold", i)]) for i in range(4)), abs=2 * 4 * 1024
    )

    # The "categories" record is last_run's, and so is the report's table.
    (summary,) = [r["categories"] for r in records if r["event"] == "categories"]
    assert summary == {name: category.fields() for name, category in categories.items()}
    page = report.read_text()
    rows = {row[0]: row for row in section_rows(page, "categories")}
    for name, category in categories.items():
        assert rows[name][1] == str(category.tasks)
        assert rows[name][2:4] == [amount(category.wall_s), amount(category.cpu_s)]
        assert rows[name][5] == peak_memory(category.peak_memory_mb)
        assert rows[name][8:10] == [
            amount(category.input_bytes / MB),
            amount(category.output_bytes / MB),
        ]

    # A memory chart per worker, from heartbeats sent while the "hold" tasks slept.
    beats = [r for r in records if r["event"] == "memory"]
    assert {r["worker"] for r in beats} == set(manager.workers)
    memory = section(page, "memory")
    assert set(re.findall(r"data-worker='([^']+)'", memory)) == set(manager.workers)
    assert memory.count("data-series='library_peak'") == len(manager.workers)
    if sys.platform.startswith("linux"):  # a library's peak while a "hold" task ran in it
        assert max(r["peak_library_memory"] for r in beats) >= HOLD_MB * MB
        # and the worker's resident memory (its process and libraries) held it meanwhile
        assert max(r["resident"] for r in beats) >= HOLD_MB * MB
        assert memory.count("data-series='resident'") == len(manager.workers)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tasks_that_raised_count_as_failed_in_their_category(shared_manager, tmp_path):
    log = tmp_path / "run.jsonl"
    # read twice: not fused into a chain with its reader, so its category is its own
    dsk = {
        ("boom", 0): (_boom, 1),
        ("after", 0): (_mix, ("boom", 0), ("boom", 0)),
        ("after", 1): (_mix, ("boom", 0), ("boom", 0)),
    }
    keys = [("after", 0), ("after", 1)]
    with pytest.raises(ValueError, match="no 1"):
        shared_manager.get(dsk, keys, event_log=log)
    with pytest.raises(ValueError, match="no 1"):
        dask.get(dsk, keys)
    categories = shared_manager.last_run.categories
    erred = [r for r in read_events(log) if r["event"] in ("erred", "crashed")]
    assert erred and all(r["category"] == "boom" for r in erred)
    assert categories["boom"].failed == len(erred)
    assert categories["boom"].tasks == 0 and "after" not in categories
