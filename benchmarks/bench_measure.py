"""What measuring every task costs: the harness's workloads, measured and not, interleaved.

    python benchmarks/bench_measure.py [--rounds 7] [--workers 2] [--quick | --smoke]
                                       [--only noop-dict,chain,tree10k] [--unmeasured-first]

Two embedded managers run side by side on the same cores, each with ``--workers`` one-core
workers: one as shipped (every task's CPU time and peak memory measured in its library),
one whose workers run with ``DASKVINE_PY_MEASURE=0`` (nothing measured; automatic sizing
then has nothing to size from). Each round runs every workload once on each side,
alternating which goes first, so both sides share the host's drift. Prints, per workload,
the median seconds of each side and the ratio measured / unmeasured (1.03: measuring costs
3%). Which manager starts first weighs a little (a few %, seen running both sides
measured): ``--unmeasured-first`` swaps them; run both ways. Every result is checked
against Dask's synchronous scheduler. ``--smoke``: tiny sizes,
one round (a test that it still runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dask  # noqa: E402

import workloads as wl  # noqa: E402
from daskvine_py import Manager  # noqa: E402

DEFAULT_ONLY = ("noop-dict", "chain", "tree10k")


@contextlib.contextmanager
def _side(measured: bool, workers: int) -> Iterator[Manager]:
    """A manager and its workers; without measuring, the workers' environment says so."""
    saved = os.environ.get("DASKVINE_PY_MEASURE")
    with Manager() as manager:
        try:
            if not measured:
                os.environ["DASKVINE_PY_MEASURE"] = "0"  # inherited by workers and libraries
            manager.start_workers(workers, cores=1)
        finally:
            if saved is None:
                os.environ.pop("DASKVINE_PY_MEASURE", None)
            else:
                os.environ["DASKVINE_PY_MEASURE"] = saved
        warm = {("warm", i): (wl.inc, i) for i in range(4 * workers)}
        if list(manager.get(warm, list(warm))) != [i + 1 for i in range(4 * workers)]:
            raise AssertionError("warming up computed a wrong result")
        yield manager


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default=",".join(DEFAULT_ONLY))
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true")
    sizes.add_argument("--smoke", action="store_true")
    parser.add_argument("--unmeasured-first", action="store_true")
    args = parser.parse_args(argv)
    profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    rounds = 1 if args.smoke else args.rounds
    every = wl.workloads(profile)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {sorted(every)}")
    graphs = {name: every[name].make() for name in names}
    expected = {}
    for name in names:
        work = every[name]
        if work.expected is not None:
            expected[name] = work.expected()
        else:
            expected[name] = work.measure(dask.get, graphs[name])[1]
    times: dict[tuple[str, bool], list[float]] = {}
    wrong = 0
    first = not args.unmeasured_first
    with _side(first, args.workers) as one, _side(not first, args.workers) as other:
        sides = {first: one, not first: other}
        for r in range(rounds):
            for name in names:
                order = (True, False) if (r + names.index(name)) % 2 == 0 else (False, True)
                for measured in order:
                    seconds, got = every[name].measure(sides[measured].get, graphs[name])
                    if not wl.same(got, expected[name]):
                        wrong += 1
                        print(f"{name}: a wrong result (measured={measured})", file=sys.stderr)
                    times.setdefault((name, measured), []).append(seconds)
    print(f"{'workload':<12} {'measured s':>11} {'unmeasured s':>13} {'ratio':>7}")
    for name in names:
        a = statistics.median(times[(name, True)])
        b = statistics.median(times[(name, False)])
        print(f"{name:<12} {a:>11.4f} {b:>13.4f} {a / b:>7.3f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
