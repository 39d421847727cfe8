"""The command line: ``python -m daskvine_py demo`` and ``python -m daskvine_py report``.

- ``demo``: an embedded manager, local workers, a real graph.
- ``report LOG -o run.html``: the performance report of a run rebuilt from its event log
  (``get(..., event_log="run.jsonl")``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from daskvine_py.demo import run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m daskvine_py")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a Dask array graph on local workers")
    demo.add_argument("--workers", type=int, default=2, help="local workers (default 2)")
    demo.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    demo.add_argument("--size", type=int, default=4000, help="array side (default 4000)")
    demo.add_argument("--chunks", type=int, default=250, help="chunk side (default 250)")
    report = commands.add_parser("report", help="build a run's HTML report from its event log")
    report.add_argument("log", help="the event log (JSON lines, .gz accepted)")
    report.add_argument("-o", "--output", default=None, help="the HTML file (default LOG.html)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.workers, args.cores, args.size, args.chunks)
    if args.command == "report":
        return _report(parser, args.log, args.output)
    return 2


def _report(parser: argparse.ArgumentParser, log: str, output: str | None) -> int:
    from daskvine_py.manager.events import read_events
    from daskvine_py.manager.report import write_report

    try:
        records = read_events(log)
    except (OSError, ValueError) as exc:
        parser.exit(1, f"daskvine_py report: {exc}\n")
    if output is None:
        output = log.removesuffix(".gz").removesuffix(".jsonl") + ".html"
    write_report(records, output)
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
