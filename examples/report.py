"""A performance report and an event log of a run on local workers.

    python examples/report.py [--output-dir DIR]

Computes a dask.array expression on two local workers with ``report=`` and ``event_log=``,
checks the result against Dask's synchronous scheduler, then rebuilds the same report from
the saved event log, as ``python -m daskvine_py report run.jsonl -o run.html`` does. The
three files (``run.html``, ``run.jsonl``, ``run-again.html``) go to ``--output-dir``, by
default a new temporary directory; their paths are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence

import dask
import dask.array as da

from daskvine_py import Manager
from daskvine_py.report import read_events, write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output-dir",
        default=None,
        help="where the report and the event log go (made if missing; default: a new "
        "temporary directory, named at the end)",
    )
    args = parser.parse_args(argv)
    # Not the current directory: a run from a checkout would leave its files there.
    if args.output_dir is None:
        out = tempfile.mkdtemp(prefix="daskvine-py-report-")
    else:
        out = args.output_dir
        os.makedirs(out, exist_ok=True)
    report = os.path.join(out, "run.html")
    log = os.path.join(out, "run.jsonl")
    again = os.path.join(out, "run-again.html")

    x = da.random.default_rng(0).random((4000, 4000), chunks=250)
    y = (x + x.T).mean(axis=0).sum()
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        (got,) = dask.compute(y, scheduler=manager.get, report=report, event_log=log)
        run = manager.last_run
    (expected,) = dask.compute(y, scheduler="sync")
    assert abs(got - expected) <= 1e-9 * abs(expected), (got, expected)
    assert run is not None
    print(f"{run.tasks} tasks in {run.duration:.2f} s")
    write_report(read_events(log), again)
    print(f"report: {report}")
    print(f"event log: {log}")
    print(f"rebuilt from the event log: {again}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
