"""``python -m daskvine_py demo``: an embedded manager, local workers, a real graph."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .local import run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m daskvine_py")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a Dask array graph on local workers")
    demo.add_argument("--workers", type=int, default=2, help="local workers (default 2)")
    demo.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    demo.add_argument("--size", type=int, default=4000, help="array side (default 4000)")
    demo.add_argument("--chunks", type=int, default=250, help="chunk side (default 250)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.workers, args.cores, args.size, args.chunks)
    return 2


if __name__ == "__main__":
    sys.exit(main())
