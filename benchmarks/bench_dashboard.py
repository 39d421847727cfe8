"""What a dashboard page left open costs the manager (issue 31), interleaved.

    python benchmarks/bench_dashboard.py [--rounds 5] [--tasks 100000] [--workers 2]
    python benchmarks/bench_dashboard.py --smoke

One manager (its dashboard on, as by default) and ``--workers`` local workers of one core
run each workload ``--rounds`` times with the page closed and as often with it open, in
turn (closed first in even rounds, open first in odd ones). "Open" is a browser's tab:
``page_poller.py``, a process of its own, asks for the status page's and the task stream's
content once a second with the link's token, from a second before the run until it
returns. Per run it takes the wall time of ``get``, the CPU seconds of the manager's I/O
thread (``daskvine-manager``: the dispatch), of the dashboard's thread
(``daskvine-dashboard``: drawing the pages) and of the whole process.

It prints a line per workload: the medians, closed and open, and their ratios (open ÷
closed; 1.03 is 3% more). Each workload's result is compared with ``dask.get``'s.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from swarm import _thread_cpu  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _workloads(tasks: int) -> dict[str, tuple[Any, Any, Any]]:
    """name -> (graph, keys, expected)."""
    noop_graph, noop_keys = workloads.noop_dict(tasks)
    tree_graph, tree_keys = workloads.big_graph(tasks)  # leaves, incs and sums of 16
    import dask

    return {
        f"noop ({len(noop_graph):,} tasks)": (
            noop_graph,
            noop_keys,
            list(dask.get(noop_graph, noop_keys)),
        ),
        f"tree ({len(tree_graph):,} tasks)": (
            tree_graph,
            tree_keys,
            workloads.big_graph_expected(tasks),
        ),
    }


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _one(manager: Any, graph: Any, keys: Any, page_open: bool) -> dict[str, float]:
    poller = None
    if page_open:
        poller = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "page_poller.py"), manager.dashboard_link],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)  # the page is open before the run starts
    try:
        io0, dash0 = _thread_cpu("daskvine-manager"), _thread_cpu("daskvine-dashboard")
        cpu0 = _cpu()
        t0 = time.perf_counter()
        value = manager.get(graph, keys, progress=False)
        wall = time.perf_counter() - t0
        io = _thread_cpu("daskvine-manager") - io0
        dash = _thread_cpu("daskvine-dashboard") - dash0
        cpu = _cpu() - cpu0
    finally:
        if poller is not None:
            poller.terminate()
            out, _ = poller.communicate(timeout=30)
            if " 0 errors" not in out:
                raise RuntimeError(f"the page poller failed: {out!r}")
    return {"wall": wall, "io": io, "dashboard": dash, "cpu": cpu, "value": value}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few hundred tasks, one round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.tasks = 1, 300
    from daskvine_py import Manager

    print(
        f"bench_dashboard: {args.rounds} rounds, {args.workers} workers of 1 core, "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with Manager() as manager:
        manager.start_workers(args.workers, cores=1)
        print(f"dashboard at {manager.dashboard_link.split('?')[0]}", flush=True)
        rows = []
        for name, (graph, keys, expected) in _workloads(args.tasks).items():
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            manager.get(graph, keys, progress=False)  # warm: functions sent, libraries up
            for index in range(args.rounds):
                for page_open in (False, True) if index % 2 == 0 else (True, False):
                    run = _one(manager, graph, keys, page_open)
                    if list(run.pop("value")) != expected:
                        raise AssertionError(f"{name}: a wrong result (page open: {page_open})")
                    runs[page_open].append(run)
            rows.append((name, runs))
    print(
        f"\n{'workload':<22} {'':>6} {'wall s':>8} {'I/O CPU s':>10} {'page CPU s':>11} "
        f"{'process CPU s':>14}"
    )
    for name, runs in rows:
        medians = {
            page_open: {
                k: statistics.median(r[k] for r in runs[page_open])
                for k in ("wall", "io", "dashboard", "cpu")
            }
            for page_open in (False, True)
        }
        for page_open, label in ((False, "closed"), (True, "open")):
            m = medians[page_open]
            print(
                f"{name if not page_open else '':<22} {label:>6} {m['wall']:>8.3f} "
                f"{m['io']:>10.3f} {m['dashboard']:>11.3f} {m['cpu']:>14.3f}"
            )
        closed, opened = medians[False], medians[True]
        ratios = [opened[k] / closed[k] if closed[k] else math.nan for k in ("wall", "io", "cpu")]
        print(
            f"{'':<22} {'ratio':>6} {ratios[0]:>8.3f} {ratios[1]:>10.3f} {'':>11} "
            f"{ratios[2]:>14.3f}"
        )
    print("\nresults right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
