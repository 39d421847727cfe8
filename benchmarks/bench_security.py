"""What CurveZMQ costs (issue 13): security on and off, interleaved, same workloads.

    python benchmarks/bench_security.py [--rounds 7] [--only chain,tree10k,noop-dict]
                                        [--workers 2] [--json security.json] [--smoke]

Starts two managers with ``--workers`` local one-core workers each: ``Manager()`` (security
on, the default) and ``Manager(security=False)``. For each workload of ``workloads.py`` it
then alternates them, on, off, on, off, ``--rounds`` times each (after one untimed run
each), so that both see the same minutes of a noisy host: a run of one system after the
other (``harness.py --insecure``) lets the host's drift between them pass for a cost.
The idle manager and its workers sleep in ``poll`` meanwhile.

Prints the median wall time of each, the ratio on/off (the target: at most 1.10), and the
spread (the lowest and highest ratio of a pair of neighbouring runs); then the median CPU
seconds per run of the manager's process (``time.process_time``: the caller's thread, the
I/O thread and the ZAP thread) and of the workers with their library processes (from
``/proc``), which a noisy host disturbs far less than wall time. Every result is
checked against Dask's synchronous scheduler; a wrong one exits non-zero. For daskvine_py
against dask.distributed in the same run, use ``harness.py --insecure``. ``--smoke`` (a test
that it still runs, numbers meaningless): the harness's smoke sizes, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from typing import Any

import workloads as w

DEFAULT = ("chain", "tree10k", "noop-dict")


def measure(
    names: list[str], rounds: int, workers: int, profile: str = "full"
) -> list[dict[str, Any]]:
    from daskvine_py import Manager

    chosen = [w.workloads(profile)[name] for name in names]
    references = []
    for workload in chosen:
        graph = workload.make()
        expected = workload.expected() if workload.expected else workload.call(_sync, graph)
        references.append((workload, graph, expected))
    rows = []
    with Manager() as secure, Manager(security=False) as plain:
        trees = {
            "on": _process_trees(secure.start_workers(workers, cores=1)),
            "off": _process_trees(plain.start_workers(workers, cores=1)),
        }
        for workload, graph, expected in references:
            times: dict[str, list[float]] = {"on": [], "off": []}
            cpu: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
            for round_ in range(rounds + 1):
                for label, manager in (("on", secure), ("off", plain)):
                    workers_before, own_before = _cpu(trees[label]), time.process_time()
                    begun = time.perf_counter()
                    got = workload.call(manager.get, graph)
                    elapsed = time.perf_counter() - begun
                    own = time.process_time() - own_before
                    if not w.same(got, expected):
                        raise AssertionError(f"{workload.name} with security {label}: {got!r}")
                    if round_:  # the first round warms both up
                        times[label].append(elapsed)
                        cpu[label].append((own, _cpu(trees[label]) - workers_before))
            pairs = [on / off for on, off in zip(times["on"], times["off"], strict=True)]
            row = {
                "workload": workload.name,
                "on_s": statistics.median(times["on"]),
                "off_s": statistics.median(times["off"]),
                "pair_ratios": pairs,
                "runs": times,
            }
            row["ratio"] = row["on_s"] / row["off_s"]
            for label in ("on", "off"):
                row[f"{label}_manager_cpu_s"] = statistics.median(c[0] for c in cpu[label])
                row[f"{label}_workers_cpu_s"] = statistics.median(c[1] for c in cpu[label])
            rows.append(row)
            print(
                f"{workload.name:<12} on {row['on_s']:.4f} s  off {row['off_s']:.4f} s  "
                f"on/off {row['ratio']:.3f}  (pairs {min(pairs):.2f}-{max(pairs):.2f});  CPU "
                f"manager {row['on_manager_cpu_s']:.3f}/{row['off_manager_cpu_s']:.3f} s "
                f"({_ratio(row['on_manager_cpu_s'], row['off_manager_cpu_s']):.3f}), workers "
                f"{row['on_workers_cpu_s']:.3f}/{row['off_workers_cpu_s']:.3f} s "
                f"({_ratio(row['on_workers_cpu_s'], row['off_workers_cpu_s']):.3f})",
                flush=True,
            )
    return rows


def _ratio(a: float, b: float) -> float:
    """``a / b``; nan when ``b`` is 0 (a tiny run can take less than a clock tick of CPU)."""
    return a / b if b else float("nan")


def _process_trees(processes: list[Any]) -> list[int]:
    """The worker processes and, below them, their library processes."""
    from systems import descendants

    return [pid for proc in processes for pid in (proc.pid, *descendants(proc.pid))]


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far, from ``/proc``."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _sync(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    from dask.local import get_sync

    return get_sync(dsk, keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default=",".join(DEFAULT), help="workloads, comma-separated")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, once: still runs?")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 1
    names = [name for name in args.only.split(",") if name]
    print(
        f"{args.workers} one-core workers per manager, {args.rounds} interleaved rounds; "
        f"load {os.getloadavg()[0]:.2f} at start"
    )
    rows = measure(names, args.rounds, args.workers, "smoke" if args.smoke else "full")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        info = {
            "python": platform.python_version(),
            "pyzmq": metadata.version("pyzmq"),
            "dask": metadata.version("dask"),
            "cpus": os.cpu_count(),
            "args": vars(args),
        }
        with open(args.json, "w") as file:
            json.dump({"machine": info, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
