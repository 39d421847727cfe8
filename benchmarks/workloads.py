"""The workloads of ``harness.py``: Dask graphs, how one run is timed, and their metrics.

Every workload builds its graph or collection once, outside the timing, and each run
passes it to a system's ``get``: raw dicts straight to ``get(dsk, keys)`` (what a scheduler
costs by itself), collections through ``dask.compute(..., scheduler=get)`` (what a user
sees, Dask's own graph preparation included). The task functions live here, in an
importable module, so every system's workers import them by reference rather than
unpickling copies.

Sizes come in three profiles: ``full`` (the sizes of issue 3), ``quick`` (about a tenth) and
``smoke`` (tiny: does every workload still run and compute the right thing?).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dask

Get = Callable[..., Any]


# -- task functions (imported by reference on every system's workers) --------------------


def noop(x: Any) -> Any:
    return x


def inc(x: int) -> int:
    return x + 1


def sleep_task(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def group_sum(*values: int) -> int:
    return sum(values)


def make_partition(seed: int, rows: int) -> Any:
    """One seeded partition of the dataframe workload: 100 keys, uniform values."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    return pd.DataFrame({"key": rng.integers(0, 100, rows), "value": rng.random(rows)})


# -- checking results ---------------------------------------------------------------------


def same(got: Any, expected: Any) -> bool:
    """Equal, up to float rounding (tree reductions add in another order)."""
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(same(g, e) for g, e in zip(got, expected, strict=True))
        )
    module = type(expected).__module__.split(".")[0]
    if module == "pandas":
        import pandas as pd

        try:
            check = pd.testing.assert_series_equal
            if isinstance(expected, pd.DataFrame):
                check = pd.testing.assert_frame_equal
            check(got.sort_index(), expected.sort_index(), check_exact=False, rtol=1e-9)
        except (AssertionError, AttributeError, TypeError):
            return False
        return True
    if module == "numpy" or isinstance(expected, float):
        import numpy as np

        try:
            return bool(np.allclose(got, expected, rtol=1e-9, atol=0.0))
        except TypeError:
            return False
    return bool(got == expected)


def count_tasks(dsk: Any) -> int:
    """Tasks in what a scheduler's ``get`` receives (a mapping or a Dask expression)."""
    if hasattr(dsk, "__dask_graph__"):
        dsk = dsk.__dask_graph__()
    return len(dsk)


# -- workloads ------------------------------------------------------------------------------


@dataclass
class Workload:
    """One benchmark graph and how a run of it is timed.

    ``make`` builds the graph once; ``call`` runs it on a ``get``. ``expected`` is None
    when the harness should take the synchronous scheduler's result as the reference.
    """

    name: str
    what: str
    make: Callable[[], Any]
    call: Callable[[Get, Any], Any]
    #: the answer, when known without running it (wide: the serial run would take minutes)
    expected: Callable[[], Any] | None = None
    #: seconds of task work per run; with it the harness reports efficiency
    work_seconds: float | None = None
    #: one run is this many calls and its time is their median (latency workloads)
    calls: int = 1
    #: systems that do not run it, with why
    skip: Mapping[str, str] = field(default_factory=dict)

    def measure(
        self, get: Get, graph: Any, settle: Callable[[], None] = lambda: None
    ) -> tuple[float, Any]:
        """Seconds of one run (the median call, for latency workloads) and its result.

        ``settle`` runs, untimed, before every call (see ``systems.Running.settle``).
        """
        times = []
        result = None
        for _ in range(self.calls):
            settle()
            start = time.perf_counter()
            result = self.call(get, graph)
            times.append(time.perf_counter() - start)
        return statistics.median(times), result


def _get(get: Get, graph: tuple[Mapping, Any]) -> Any:
    dsk, keys = graph
    return get(dsk, keys)


def _compute(get: Get, collection: Any) -> Any:
    return dask.compute(collection, scheduler=get)[0]


SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "noop": 10_000,
        "chain": 2_000,
        "sleep1ms": 1_000,
        "sleep100ms": 40,
        "tree": (10_000, 1_000),
        "array": 4_000,
        "dataframe": (2_000_000, 50),
        "latency": 50,
        "biggraph": 200_000,
        "wide": (50, 100),  # workers, tasks per worker
    },
    "quick": {
        "noop": 1_000,
        "chain": 200,
        "sleep1ms": 100,
        "sleep100ms": 8,
        "tree": (1_000, 100),
        "array": 1_000,
        "dataframe": (200_000, 10),
        "latency": 10,
        "biggraph": 5_000,
        "wide": (10, 20),
    },
    "smoke": {
        "noop": 50,
        "chain": 20,
        "sleep1ms": 10,
        "sleep100ms": 2,
        "tree": (100, 10),
        "array": 500,
        "dataframe": (2_000, 2),
        "latency": 2,
        "biggraph": 1_000,
        "wide": (3, 4),
    },
}


def noop_dict(n: int) -> tuple[dict, list]:
    """``n`` independent trivial tasks as one raw dict; every task is an output."""
    dsk = {("noop", i): (noop, i) for i in range(n)}
    return dsk, list(dsk)


def chain_dict(n: int) -> tuple[dict, str]:
    dsk: dict[Any, Any] = {"x0": (inc, 0)}
    for i in range(1, n):
        dsk[f"x{i}"] = (inc, f"x{i - 1}")
    return dsk, f"x{n - 1}"


def sleep_dict(n: int, seconds: float, prefix: str) -> tuple[dict, list]:
    dsk = {(prefix, i): (sleep_task, i, seconds) for i in range(n)}
    return dsk, list(dsk)


def big_graph(n: int, group: int = 16) -> tuple[dict, list]:
    """About ``n`` trivial tasks: ``w`` leaves, an ``inc`` on each, sums of ``group`` of them.

    The sums have fewer inputs than ``reduction_threshold``, so daskvine_py runs the same
    graph as the peers (no tree rewriting); the outputs are the sums.
    """
    width = round(n / (2 + 1 / group))
    dsk: dict[Any, Any] = {}
    for i in range(width):
        dsk[("leaf", i)] = (inc, i)
        dsk[("inc", i)] = (inc, ("leaf", i))
    keys = []
    for g, start in enumerate(range(0, width, group)):
        key = ("sum", g)
        dsk[key] = (group_sum, *[("inc", i) for i in range(start, min(start + group, width))])
        keys.append(key)
    return dsk, keys


def big_graph_expected(n: int, group: int = 16) -> list[int]:
    width = round(n / (2 + 1 / group))
    return [
        sum(i + 2 for i in range(start, min(start + group, width)))
        for start in range(0, width, group)
    ]


def workloads(profile: str = "full") -> dict[str, Workload]:
    """The workloads run on the warm systems (``--workers`` workers), by name.

    ``biggraph`` and ``wide`` need systems of their own and are set up by the harness.
    """
    size = SIZES[profile]
    n_noop = size["noop"]
    n_chain = size["chain"]
    n_1ms = size["sleep1ms"]
    n_100ms = size["sleep100ms"]
    tree_n, tree_parts = size["tree"]
    side = size["array"]
    rows, parts = size["dataframe"]
    calls = size["latency"]

    def bag_noop() -> Any:
        import dask.bag as db

        return db.from_sequence(range(n_noop), npartitions=n_noop).map(noop)

    def tree() -> Any:
        import dask.bag as db

        return db.from_sequence(range(tree_n), npartitions=tree_parts).map(inc).sum()

    def array() -> Any:
        import dask.array as da

        x = da.random.default_rng(0).random((side, side), chunks=250)
        return (x + x.T).mean(axis=0).sum()

    def dataframe() -> Any:
        import dask.dataframe as dd

        df = dd.from_map(make_partition, range(parts), rows=rows // parts)
        return df.groupby("key").value.mean()

    def one_task() -> Any:
        return dask.delayed(inc)(1)

    def delayed_noop() -> Any:
        return [dask.delayed(noop)(i) for i in range(n_noop)]

    serial = "serial: its efficiency is at most 1 / cores"
    all_workloads = [
        Workload(
            "noop-dict",
            f"{n_noop:,} independent trivial tasks as one raw dict, through get",
            lambda: noop_dict(n_noop),
            _get,
        ),
        Workload(
            "noop-bag",
            f"a bag of {n_noop:,} one-element partitions mapped with noop, via dask.compute",
            bag_noop,
            _compute,
        ),
        Workload(
            "noop-delayed",
            f"{n_noop:,} dask.delayed objects (a layer each) in one dask.compute",
            delayed_noop,
            _compute,
        ),
        Workload(
            "chain",
            f"a {n_chain:,}-long linear chain of inc (raw dict, through get)",
            lambda: chain_dict(n_chain),
            _get,
        ),
        Workload(
            "sleep1ms",
            f"{n_1ms:,} independent tasks sleeping 1 ms; efficiency = ideal / actual",
            lambda: sleep_dict(n_1ms, 0.001, prefix="sleep1ms"),
            _get,
            work_seconds=n_1ms * 0.001,
        ),
        Workload(
            "sleep100ms",
            f"{n_100ms} tasks sleeping 100 ms: prefetch must not lose on long tasks",
            lambda: sleep_dict(n_100ms, 0.1, prefix="sleep100ms"),
            _get,
            work_seconds=n_100ms * 0.1,
            skip={"sync": serial},
        ),
        Workload(
            "tree10k",
            f"bag.from_sequence(range({tree_n:,}), npartitions={tree_parts:,}).map(inc).sum()",
            tree,
            _compute,
        ),
        Workload(
            "array",
            f"seeded random {side}x{side}, chunks 250: (x + x.T).mean(axis=0).sum()",
            array,
            _compute,
        ),
        Workload(
            "dataframe",
            f"{rows:,} seeded rows in {parts} partitions (from_map): groupby(key).value.mean()",
            dataframe,
            _compute,
        ),
        Workload(
            "latency-compute",
            f"one tiny task through dask.compute; a run is the median of {calls} calls",
            one_task,
            _compute,
            calls=calls,
        ),
        Workload(
            "latency-get",
            f"one tiny task as a raw dict through get; a run is the median of {calls} calls",
            lambda: ({"x": (inc, 1)}, "x"),
            _get,
            calls=calls,
        ),
    ]
    return {w.name: w for w in all_workloads}


def wide_workload(profile: str = "full", workers: int | None = None) -> tuple[int, Workload]:
    """Workers and the workload of ``wide``: many one-core workers, tasks sleeping 20 ms."""
    default_workers, per_worker = SIZES[profile]["wide"]
    workers = workers or default_workers
    n = workers * per_worker
    return workers, Workload(
        "wide",
        f"{workers} one-core workers, {n:,} tasks sleeping 20 ms; busy = nominal task "
        "time / (workers x wall time)",
        lambda: sleep_dict(n, 0.02, prefix="wide"),
        _get,
        expected=lambda: list(range(n)),
        work_seconds=n * 0.02,
        skip={"sync": f"serial: {n} x 20 ms = {n * 0.02:.0f} s"},
    )


def efficiency(work_seconds: float, cores: int, seconds: float) -> float:
    """Ideal time (the work spread evenly on ``cores``) over the actual time."""
    return (work_seconds / cores) / seconds if seconds > 0 else math.nan
