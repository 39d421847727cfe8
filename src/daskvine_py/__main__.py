"""The command line: ``python -m daskvine_py demo``, ``report`` and ``status``; ``--help``
points to the worker's and the factory's commands.

- ``demo``: an embedded manager, local workers, a real graph.
- ``report LOG -o run.html``: the performance report of a run rebuilt from its event log
  (``get(..., event_log="run.jsonl")``).
- ``status [--connection-file PATH] [--watch [SECONDS]]``: a running manager's workers,
  tasks and categories, asked over its own port (``live.terminal``, docs/live.md);
  without a file, the only manager of this user running in the default directory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from daskvine_py import __version__
from daskvine_py.demo import run_demo
from daskvine_py.wire import security

DESCRIPTION = """\
daskvine_py runs Dask graphs on worker processes: a manager in your Python process
(daskvine_py.Manager, passed to dask.compute as scheduler=manager.get) and workers on
this machine (manager.start_workers(n)) or anywhere that can reach it.
"""

EPILOG = """\
other commands:
  python -m daskvine_py.worker --connection-file PATH   (or: daskvine-py-worker ...)
      a worker joining a manager; PATH is the manager's connection_file
  python -m daskvine_py.factory ...                     (or: daskvine-py-factory ...)
      a pool of workers on a batch system for a manager running elsewhere
each takes --help.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m daskvine_py",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"daskvine_py {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a Dask array graph on local workers")
    demo.add_argument("--workers", type=int, default=2, help="local workers (default 2)")
    demo.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    demo.add_argument("--size", type=int, default=4000, help="array side (default 4000)")
    demo.add_argument("--chunks", type=int, default=250, help="chunk side (default 250)")
    report = commands.add_parser("report", help="build a run's HTML report from its event log")
    report.add_argument("log", help="the event log (JSON lines, .gz accepted)")
    report.add_argument("-o", "--output", default=None, help="the HTML file (default LOG.html)")
    status = commands.add_parser("status", help="show what a running manager is doing")
    status.add_argument(
        "--connection-file",
        default=None,
        metavar="PATH",
        help="the manager's connection file (default: the only running manager's in "
        f"${security.CONNECTION_DIR_ENV} or ~/.daskvine_py/connections)",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the manager's answer (default 10)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        _demo_requirements(parser)
        return run_demo(args.workers, args.cores, args.size, args.chunks)
    if args.command == "report":
        return _report(parser, args.log, args.output)
    if args.command == "status":
        from daskvine_py.live.terminal import status as show_status

        if args.watch is not None and not args.watch > 0:
            parser.error("--watch SECONDS must be above 0")
        return show_status(args.connection_file, args.watch, args.timeout)
    return 2


def _demo_requirements(parser: argparse.ArgumentParser) -> None:
    """The demo's graph is a Dask array: without NumPy and Dask's array extras (not
    daskvine_py's own requirements), say what to install rather than let Dask's own
    ImportError end it."""
    try:
        import dask.array  # noqa: F401
    except ImportError as exc:
        parser.exit(
            1,
            f"daskvine_py demo: it needs NumPy and Dask's array extras ({exc})\n"
            "install them with: pip install 'daskvine-py[demo]' "
            "(from a checkout: pip install -e '.[demo]')\n",
        )


def _report(parser: argparse.ArgumentParser, log: str, output: str | None) -> int:
    from daskvine_py.report import read_events, write_report

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
