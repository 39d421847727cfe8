"""The churn probe: a run that loses the worker holding the most results every few
seconds, with the default retries (issue 29).

    python benchmarks/churn.py [--maps 11610] [--fan-in 8] [--workers 4] [--every 6]
                               [--max-kills 0] [--no-baseline] [--no-replicas]
                               [--json churn.json] [--smoke]

The graph has the probe's shape: ``--maps`` first-stage tasks ``("a", i)`` (10 ms each),
as many second-stage ones ``("b", i)`` (20 ms), each reading two first-stage results, and
a tree of sums of ``--fan-in`` (10 ms each): 24,881 tasks at the defaults. Every result is
an array of 1,000 int64 (8 KB), so that results live on workers, not in the manager.

Two runs, each on a fresh manager with ``--workers`` local one-core workers: without
churn (skipped with ``--no-baseline``), then with a SIGKILL every ``--every`` seconds of
the worker holding the most result bytes (by the manager's records: a busy worker's
heartbeat, which carries its stored bytes, is rare), each followed by the start of a
replacement; ``--max-kills`` stops killing after that many (0: no limit). ``get`` keeps
its default ``retries``. Printed: each run's makespan (``get`` alone, workers already
joined), their ratio, the kills, the results recomputed after every copy was lost
(``recomputed``), the temporary replicas the scheduler asked for, and whether each result
equals Dask's synchronous scheduler's on the same graph without the sleeps. A failed or
wrong run exits non-zero. ``--no-replicas``: the scheduler makes no temporary replicas
(what they save, in recomputed results and time). ``--json``: the numbers in a file.

``--smoke`` (a test that it still runs, numbers meaningless): 100 maps on two workers,
one kill as soon as a worker holds a result, no baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
from dask.local import get_sync

from daskvine_py import Manager
from daskvine_py.scheduler import churn as scheduler_churn

#: Elements of each result array (int64: 8 KB).
WIDTH = 1_000


def first(i: int, seconds: float) -> np.ndarray:
    time.sleep(seconds)
    return np.full(WIDTH, i, dtype=np.int64)


def second(x: np.ndarray, y: np.ndarray, seconds: float) -> np.ndarray:
    time.sleep(seconds)
    return x * 3 + y


def total(parts: list[np.ndarray], seconds: float) -> np.ndarray:
    time.sleep(seconds)
    return np.sum(parts, axis=0)


def probe_graph(maps: int, fan_in: int, scale: float = 1.0) -> tuple[dict, Any]:
    """The probe's shape (module docstring); ``scale`` multiplies every sleep."""
    dsk: dict = {("a", i): (first, i, 0.01 * scale) for i in range(maps)}
    dsk.update(
        {("b", i): (second, ("a", i), ("a", (i + 1) % maps), 0.02 * scale) for i in range(maps)}
    )
    keys, level = [("b", i) for i in range(maps)], 0
    while len(keys) > 1:
        level += 1
        groups = [keys[i : i + fan_in] for i in range(0, len(keys), fan_in)]
        for j, group in enumerate(groups):
            dsk[(f"sum{level}", j)] = (total, list(group), 0.01 * scale)
        keys = [(f"sum{level}", j) for j in range(len(groups))]
    return dsk, keys[0]


def holder_of_most(manager: Manager, empty_too: bool = False) -> int | None:
    """The pid of the connected worker holding the most result bytes, or None (also when
    none holds any, unless ``empty_too``). The manager's records are read from this
    thread while its I/O thread changes them: read again when a set changes size under
    the count."""
    for _ in range(100):
        try:
            held = {
                w.name: sum(t.nbytes for t in w.has_what)
                for w in list(manager._state.workers.values())
            }
            break
        except RuntimeError:
            continue
    else:
        return None
    published = manager.workers
    held = {name: n for name, n in held.items() if name in published and (n or empty_too)}
    if not held:
        return None
    return published[max(held, key=held.__getitem__)]["pid"]


class Killer(threading.Thread):
    """Every ``every`` seconds (or as soon as a worker holds a result, with ``eager``),
    SIGKILL the worker holding the most and start a replacement, until ``stop`` is set
    or ``max_kills`` (0: no limit) were killed."""

    def __init__(self, manager: Manager, every: float, max_kills: int, eager: bool) -> None:
        super().__init__(daemon=True)
        self.manager, self.every, self.max_kills, self.eager = manager, every, max_kills, eager
        self.stop = threading.Event()
        self.kills = 0

    def run(self) -> None:
        while not self.stop.wait(0.05 if self.eager else self.every):
            if self.max_kills and self.kills >= self.max_kills:
                return
            pid = holder_of_most(self.manager)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it was already gone
            self.kills += 1
            self.manager.start_workers(1, cores=1, wait=False)


def measure(args: argparse.Namespace, dsk: dict, key: Any, churn: bool) -> dict[str, Any]:
    with Manager() as manager:
        manager.start_workers(args.workers, cores=1)
        killer = Killer(manager, args.every, args.max_kills, args.smoke) if churn else None
        error = None
        start = time.perf_counter()
        if killer is not None:
            killer.start()
        try:
            value = manager.get(dsk, key)
        except Exception as exc:  # a failed run is what this measures: report it
            value, error = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        if killer is not None:
            killer.stop.set()
            killer.join()
        state = manager._state  # quiet now: the run ended
        return {
            "seconds": seconds,
            "value": value,
            "error": error,
            "kills": killer.kills if killer else 0,
            "recomputed": state.recomputed,
            "replicas": state.churn.replicas,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maps", type=int, default=11_610)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between kills")
    parser.add_argument("--max-kills", type=int, default=0, help="0: no limit")
    parser.add_argument("--no-baseline", action="store_true", help="only the run with churn")
    parser.add_argument("--no-replicas", action="store_true", help="no temporary replicas")
    parser.add_argument("--json", help="write the numbers to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny, one kill: still runs?")
    args = parser.parse_args()
    if args.smoke:
        args.maps, args.workers, args.max_kills, args.no_baseline = 100, 2, 1, True
    if args.no_replicas:  # (the manager's state runs in this process)
        scheduler_churn.CHURN_LEVEL = float("inf")
    dsk, key = probe_graph(args.maps, args.fan_in)
    expected = get_sync(probe_graph(args.maps, args.fan_in, scale=0.0)[0], key)
    print(
        f"graph: {len(dsk):,} tasks ({args.maps:,} maps in two stages, sums of "
        f"{args.fan_in}), {args.workers} one-core workers",
        flush=True,
    )
    runs = {}
    for name, churn in (("no churn", False), ("churn", True)):
        if not churn and args.no_baseline:
            continue
        run = measure(args, dsk, key, churn)
        run["right"] = run["error"] is None and np.array_equal(run["value"], expected)
        runs[name] = run
        outcome = "right" if run["right"] else run["error"] or "WRONG"
        print(
            f"{name:9s} makespan {run['seconds']:8.1f} s  kills {run['kills']:3d}  "
            f"recomputed {run['recomputed']:6,}  temporary replicas {run['replicas']:6,}  "
            f"result {outcome}",
            flush=True,
        )
    if len(runs) == 2:
        print(f"churn/no churn: {runs['churn']['seconds'] / runs['no churn']['seconds']:.2f}x")
    right = all(run["right"] for run in runs.values())
    print(f"result equals dask's synchronous scheduler: {'yes' if right else 'NO'}")
    if args.json:
        summary = {
            name: {k: v for k, v in run.items() if k != "value"} for name, run in runs.items()
        }
        with open(args.json, "w") as f:
            json.dump(
                {
                    "tasks": len(dsk),
                    "workers": args.workers,
                    "every": args.every,
                    "replicas": not args.no_replicas,
                    "runs": summary,
                },
                f,
                indent=1,
            )
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
