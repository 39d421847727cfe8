"""A manager for workers on other machines.

Run this on the submit node, then on each compute node, with the connection file it prints
(under ``~/.daskvine_py/connections``, which a shared home directory makes visible there)::

    python -m daskvine_py.worker --connection-file PATH --cores 12

It waits for ``--workers`` workers, runs a bag computation on them and prints the result.
With ``--local N`` it starts N local workers instead, to try it on one machine.
"""

from __future__ import annotations

import argparse

import dask.bag as db

from daskvine_py import Manager


def square(x: int) -> int:
    return x * x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9123)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--local", type=int, default=0, help="start this many local workers")
    args = parser.parse_args()
    with Manager(host=args.host, port=args.port) as manager:
        print(f"workers join with: --connection-file {manager.connection_file}")
        if args.local:
            manager.start_workers(args.local)
        manager.wait_for_workers(args.workers, timeout=3600)
        total = db.from_sequence(range(100_000), npartitions=200).map(square).sum()
        print("sum of squares:", total.compute(scheduler=manager.get))
        print("workers:", ", ".join(manager.workers))


if __name__ == "__main__":
    main()
