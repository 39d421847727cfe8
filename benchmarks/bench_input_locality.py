"""How locality for inputs changes the bytes read from storage: the deterministic
simulation of 200 workers running a DV3-shaped analysis twice over 1.2 TB of remote files
(issue 40).

    python benchmarks/bench_input_locality.py                 # 200 workers x 12 cores
    python benchmarks/bench_input_locality.py --smoke         # does it still run?

The simulator (``daskvine_py.simulate``, docs/simulation.md) runs the real
``SchedulerState`` and 200 real ``WorkerState``s on a simulated clock and network, with
no faults. The graph is the simulator's DV3 shape (loads, three histogram fills per load,
fan-in-8 accumulation trees, one merge) of about 17,000 tasks; its loads read remote
files, about ``--chunks-per-file`` consecutive loads a chunk each of one file, the
files' sizes summing to ``--input-tb``. Each node keeps the files its tasks read in an
LRU input cache of ``--disk-gb`` (0: no bound), whole files, as ``daskvine_py.inputs``
does; a task on a node that does not hold its file fetches the whole file from storage.

The same graph runs twice, the second submitted when the first ended (an analysis
iterated: the second run is where the caches pay), with locality for inputs on (tasks
are submitted naming their files; the manager places a reader where a node holds its
file) and off (not named). Per case and run: TB read from storage, TB served from the
nodes' caches, storage over the input's size, and the makespan in simulated seconds;
each node's count of what its tasks obtained (a task the manager took back after it
started, and ran elsewhere, read twice: the bytes moved). The plot (``--svg``): TB read
from storage over simulated time, one line per case, both runs on one axis.

Not modelled: the transfers' time (a file arrives at once, so the makespans do not show
what a read from storage costs against one from the node's disk), peers as a source
(``INPUT_FROM_PEER``), the storage server's bandwidth.

The run exits 1 if a simulated invariant broke, a run did not end done, a check below
failed, or the same seed gave other numbers (``--repeat``). Sets iterate by Python's
hash seed: the script runs itself again under ``PYTHONHASHSEED=0`` (as
``python -m daskvine_py.simulate`` does), so a seed means the same numbers everywhere.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HASH_SEED = "0"
TB = 1e12
GB = 1e9


@dataclass
class Case:
    locality: bool
    disk: int  # bytes of each node's input cache (0: no bound)
    #: per run: (time, bytes, from storage) of each file a task obtained, in order
    reads: dict[int, list[tuple[float, int, bool]]] = field(default_factory=dict)
    #: per run: (submitted, ended) in simulated seconds
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: per node: bytes it read from storage over both runs, and the files it read
    node_storage: dict[str, int] = field(default_factory=dict)
    node_files: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per run: the manager's count (its runs' categories): from storage, from the cache
    manager: dict[int, tuple[int, int]] = field(default_factory=dict)
    wall: float = 0.0

    @property
    def label(self) -> str:
        disk = "unbounded disk" if not self.disk else f"{self.disk / GB:g} GB disk"
        return f"locality {'on' if self.locality else 'off'}, {disk}"

    def storage(self, run: int) -> int:
        return sum(nbytes for _, nbytes, stored in self.reads[run] if stored)

    def cached(self, run: int) -> int:
        return sum(nbytes for _, nbytes, stored in self.reads[run] if not stored)


def simulate(args: argparse.Namespace, locality: bool, disk: int) -> Case:
    from daskvine_py.simulate.simulation import Config, Simulation
    from daskvine_py.simulate.worker_node import WorkerNode
    from daskvine_py.wire import protocol as p

    case = Case(locality, disk)
    # The node of each read: the simulation logs (time, run, bytes, source).
    nodes: list[tuple[str, str]] = []

    class Counted(Simulation):
        def file_read(self, node: WorkerNode, url: str, nbytes: int, source: int) -> None:
            super().file_read(node, url, nbytes, source)
            nodes.append((node.name, url))

    workload = make_workload(args)
    config = Config(
        workers=args.workers,
        tasks=args.tasks,
        cores=(args.cores,),
        preempt=0,
        leave=0,
        oom=0,
        cancel=0,
        cache=0,
        fail=0,
        input_locality=locality,
        node_disk=disk,
        in_turn=True,
    )
    started = time.perf_counter()
    sim = Counted(args.seed, config, workloads=[workload, workload])
    outcome = sim.run()
    case.wall = time.perf_counter() - started
    if outcome.violations:
        for violation in outcome.violations[:10]:
            print(f"violation: {violation}", file=sys.stderr)
        raise SystemExit(f"{case.label}: {len(outcome.violations)} invariants broke")
    for run_id, record in sim.runs.items():
        if record.ended is None or run_id not in sim.ended_at:
            raise SystemExit(f"{case.label}: run {run_id} did not end")
        if not hasattr(record.ended, "categories"):
            raise SystemExit(f"{case.label}: run {run_id} failed: {record.ended!r}")
        case.spans[run_id] = (record.submitted, sim.ended_at[run_id])
        categories = record.ended.categories.values()
        case.manager[run_id] = (
            sum(c.file_bytes_from_storage for c in categories),
            sum(c.file_bytes_from_cache for c in categories),
        )
    for (at, run_id, nbytes, source), (node, url) in zip(sim.file_reads, nodes, strict=True):
        stored = source == p.INPUT_FROM_STORAGE
        case.reads.setdefault(run_id, []).append((at, nbytes, stored))
        if stored:
            case.node_storage[node] = case.node_storage.get(node, 0) + nbytes
        case.node_files.setdefault(node, {})[url] = nbytes
    return case


def make_workload(args: argparse.Namespace):  # -> wl.Workload
    from daskvine_py.simulate import workloads as wl

    workload = wl.make("dv3", random.Random(args.seed), args.tasks)
    total = int(args.input_tb * TB)
    return wl.with_inputs(workload, total, args.chunks_per_file, random.Random(args.seed + 1))


def input_bytes(args: argparse.Namespace) -> tuple[int, int, int, int]:
    """The graph's tasks, its loads, its files and their bytes in all."""
    workload = make_workload(args)
    files = dict(workload.reads.values())
    return len(workload.graph), len(workload.reads), len(files), sum(files.values())


def check(cases: list[Case], total: int) -> list[str]:
    """What must hold whatever the numbers: every file is read from storage at least once
    in the first run (the caches start empty); a node with no disk bound reads each file
    from storage at most once over both runs; with locality, the second run reads
    strictly less from storage than without, at every disk bound."""
    wrong = []
    for case in cases:
        if case.storage(1) < total:
            wrong.append(f"{case.label}: run 1 read {case.storage(1)} B from storage < {total}")
        if not case.disk:
            for node, nbytes in case.node_storage.items():
                held = sum(case.node_files[node].values())
                if nbytes != held:
                    wrong.append(
                        f"{case.label}: node {node} read {nbytes} B from storage, "
                        f"its files are {held} B"
                    )
    by_disk: dict[int, dict[bool, Case]] = {}
    for case in cases:
        by_disk.setdefault(case.disk, {})[case.locality] = case
    for disk, pair in by_disk.items():
        if True in pair and False in pair and not pair[True].storage(2) < pair[False].storage(2):
            wrong.append(
                f"disk {disk}: run 2 with locality read {pair[True].storage(2)} B from "
                f"storage, without {pair[False].storage(2)} B"
            )
    return wrong


def table(cases: list[Case], total: int) -> str:
    head = (
        f"{'case':<34} {'run':>3} {'storage TB':>10} {'cache TB':>9} "
        f"{'storage/input':>13} {'makespan s':>10}"
    )
    lines = [head, "-" * len(head)]
    for case in cases:
        for run_id in sorted(case.reads):
            start, end = case.spans[run_id]
            lines.append(
                f"{case.label:<34} {run_id:>3} {case.storage(run_id) / TB:>10.2f} "
                f"{case.cached(run_id) / TB:>9.2f} {case.storage(run_id) / total:>13.2f} "
                f"{end - start:>10.1f}"
            )
    return "\n".join(lines)


# -- the plot -------------------------------------------------------------------------

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def svg(cases: list[Case], total: int, title: str) -> str:
    from daskvine_py.report.drawing import escape, tick_label, ticks

    width, height = 760, 420
    left, right, top, bottom = 70, 20, 40, 120
    plot_w, plot_h = width - left - right, height - top - bottom
    curves = []
    t_max = y_max = 0.0
    for case in cases:
        points = [(0.0, 0.0)]
        stored = 0
        for run_id in sorted(case.reads):
            for at, nbytes, from_storage in case.reads[run_id]:
                if from_storage:
                    stored += nbytes
                    points.append((at, stored / TB))
        end = max(e for _, e in case.spans.values())
        points.append((end, stored / TB))
        curves.append((case, _thin(points, 400)))
        t_max, y_max = max(t_max, end), max(y_max, stored / TB)
    x_ticks, y_ticks = ticks(t_max), ticks(y_max * 1.05)
    t_top, y_top = max(x_ticks[-1], t_max), max(y_ticks[-1], y_max)

    def x(t: float) -> float:
        return left + plot_w * t / t_top

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_top)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    for t in x_ticks:
        out.append(
            f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{top + plot_h}" '
            'stroke="#eee"/>'
            f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
            f"{tick_label(t)}</text>"
        )
    for v in y_ticks:
        out.append(
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}" '
            'stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{tick_label(v)}</text>'
        )
    # the input's size: what one read of every file costs
    out.append(
        f'<line x1="{left}" y1="{y(total / TB):.1f}" x2="{left + plot_w}" '
        f'y2="{y(total / TB):.1f}" stroke="#888" stroke-dasharray="2,3"/>'
        f'<text x="{left + plot_w - 4}" y="{y(total / TB) - 4:.1f}" text-anchor="end" '
        f'fill="#666">the input: {total / TB:.2f} TB</text>'
    )
    out.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#333"/>'
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 34}" text-anchor="middle">'
        "simulated seconds (run 1, then run 2 from the marker on each line)</text>"
        f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + plot_h / 2})">TB read from storage, cumulative</text>'
    )
    disks = sorted({case.disk for case in cases})
    for i, (case, points) in enumerate(curves):
        colour = COLOURS[disks.index(case.disk) % len(COLOURS)]
        dash = "" if case.locality else ' stroke-dasharray="6,4"'
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        second = case.spans.get(2)
        if second is not None:  # where run 2 began, on this line
            at = second[0]
            value = sum(n for t, n, s in case.reads[1] if s) / TB
            out.append(
                f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="4" fill="{colour}" '
                'stroke="white"/>'
            )
        lx = left + (i % 2) * (plot_w / 2)
        ly = top + plot_h + 56 + (i // 2) * 18
        out.append(
            f'<line x1="{lx:.1f}" y1="{ly - 4}" x2="{lx + 30:.1f}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
            f'<text x="{lx + 36:.1f}" y="{ly}">{escape(case.label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _thin(points: list[tuple[float, float]], count: int) -> list[tuple[float, float]]:
    """At most about ``count`` points of a rising step curve, its shape kept: the last
    point of each of ``count`` spans of time, and the first and last."""
    if len(points) <= count:
        return points
    end = points[-1][0] or 1.0
    kept: dict[int, tuple[float, float]] = {}
    for t, v in points:
        kept[int(t / end * count)] = (t, v)
    return [points[0], *kept.values()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--cores", type=int, default=12)
    parser.add_argument(
        "--tasks", type=int, default=30700, help="the DV3's size (30,700: about 17,000 tasks)"
    )
    parser.add_argument("--input-tb", type=float, default=1.2)
    parser.add_argument("--chunks-per-file", type=int, default=8)
    parser.add_argument(
        "--disk-gb",
        type=float,
        nargs="+",
        default=[0, 50, 10],
        help="each node's input cache, one set of cases each (0: no bound)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--svg", help="where the plot goes (docs/input-locality.svg; --smoke: in this directory)"
    )
    parser.add_argument(
        "--repeat", action="store_true", help="run the first case again: the same numbers?"
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.smoke:
        args.workers, args.cores, args.tasks, args.repeat = 10, 4, 1200, True
        args.disk_gb = [0, 5]
        args.input_tb = 0.012
        args.svg = args.svg or "input-locality.svg"
    args.svg = args.svg or str(ROOT / "docs" / "input-locality.svg")
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(message)s")

    tasks, loads, files, total = input_bytes(args)
    print(
        f"DV3 of {tasks:,} tasks, {loads:,} loads reading {files:,} files "
        f"({args.chunks_per_file} chunks each on average, {total / files / GB:.2f} GB a file), "
        f"{total / TB:.3f} TB in all; {args.workers} workers x {args.cores} cores; "
        f"seed {args.seed}; the same graph twice, in turn"
    )
    cases = []
    for disk_gb in args.disk_gb:
        for locality in (True, False):
            case = simulate(args, locality, int(disk_gb * GB))
            cases.append(case)
            print(f"  {case.label}: {case.wall:.1f} s of wall time", flush=True)
    print()
    print(table(cases, total))
    print()
    print("the manager's count (accepted TaskDone reports; a task run twice counts once):")
    for case in cases:
        counts = ", ".join(
            f"run {r} {s / TB:.2f} + {c / TB:.2f} TB" for r, (s, c) in sorted(case.manager.items())
        )
        print(f"  {case.label}: {counts} (storage + cache)")
    wrong = check(cases, total)
    if args.repeat:
        again = simulate(args, cases[0].locality, cases[0].disk)
        same = again.reads == cases[0].reads and again.spans == cases[0].spans
        print(f"the same seed again ({cases[0].label}): {'the same' if same else 'OTHER'} numbers")
        if not same:
            wrong.append("the same seed gave other numbers")
    title = (
        f"DV3 of {tasks:,} tasks over {total / TB:.3g} TB, run twice, "
        f"{args.workers} simulated workers"
    )
    Path(args.svg).write_text(svg(cases, total, title))
    print(f"plot: {args.svg}")
    for line in wrong:
        print(f"WRONG: {line}")
    print("checks: " + ("failed" if wrong else "passed"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
