"""A performance report and an event log of a run on local workers.

    python examples/report.py [run.html]

Computes a dask.array expression on two local workers with ``report=`` and ``event_log=``,
checks the result against Dask's synchronous scheduler, then rebuilds the same report from
the saved event log, as ``python -m daskvine_py report run.jsonl -o run.html`` does.
"""

from __future__ import annotations

import sys

import dask
import dask.array as da

from daskvine_py import Manager
from daskvine_py.manager.events import read_events
from daskvine_py.manager.report import write_report


def main(report: str = "run.html") -> None:
    x = da.random.default_rng(0).random((4000, 4000), chunks=250)
    y = (x + x.T).mean(axis=0).sum()
    log = report.removesuffix(".html") + ".jsonl"
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        (got,) = dask.compute(y, scheduler=manager.get, report=report, event_log=log)
        run = manager.last_run
    (expected,) = dask.compute(y, scheduler="sync")
    assert abs(got - expected) <= 1e-9 * abs(expected), (got, expected)
    print(f"{run.tasks} tasks in {run.duration:.2f} s; report: {report}, event log: {log}")
    again = report.removesuffix(".html") + "-again.html"
    write_report(read_events(log), again)
    print(f"rebuilt from the event log: {again}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
