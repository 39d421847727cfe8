"""The manager's side of tests/test_multihost.py, run on the manager's host (namespace).

It talks to the test in JSON lines on stdout: ``{"event": "listening", ...}`` once the
manager is bound and its connection file written (``--connection-file``); then
``{"event": "ran", ...}`` with what the test checks (results against Dask's sync
scheduler, bytes moved per pair of names, each worker's hostname and peer address). It
then waits for a line on stdin (or its end) and, before it closes the manager, says
``{"event": "closing", ...}`` with every worker name that ever joined.

The graph makes workers read each other's results: 16 producers of 200 KB arrays (well
past the size that travels inline through the manager), 16 consumers of producers i and
i + 1 (mod 16), and a sum. With both workers running producers, some consumer always
has one input on the other host.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import dask.local
import numpy as np

import daskvine_py
from daskvine_py import Manager

PRODUCERS = 16
#: float64 values per producer's array: 200 KB
VALUES = 25_000


def produce(i):
    time.sleep(0.05)  # long enough for both workers to take producers
    return np.full(VALUES, float(i + 1))


def combine(a, b):
    return float(a @ b)


def total(*values):
    return sum(values)


def graph() -> tuple[dict, list]:
    dsk: dict = {f"produce-{i}": (produce, i) for i in range(PRODUCERS)}
    for i in range(PRODUCERS):
        dsk[f"combine-{i}"] = (combine, f"produce-{i}", f"produce-{(i + 1) % PRODUCERS}")
    dsk["total"] = (total, *(f"combine-{i}" for i in range(PRODUCERS)))
    return dsk, ["total", [f"combine-{i}" for i in range(PRODUCERS)]]


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--connection-file", required=True)
    parser.add_argument("--insecure", action="store_true", help="Manager(security=False)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    with Manager(
        host=args.host, connection_file=args.connection_file, security=not args.insecure
    ) as manager:
        emit(
            "listening",
            address=manager.address,
            connection_file=manager.connection_file,
            hostname=socket.gethostname(),
            package=daskvine_py.__file__,
        )
        manager.wait_for_workers(args.workers, timeout=args.timeout)
        dsk, keys = graph()
        results = manager.get(dsk, keys)
        expected = dask.local.get_sync(dsk, keys)
        workers = manager.workers
        peer_addresses = {name: w["peer_address"] for name, w in manager.workers.items()}
        emit(
            "ran",
            results=results,
            expected=expected,
            transfers=[[src, dst, n] for (src, dst), n in manager.transfers.items()],
            run_transfers=[[src, dst, n] for (src, dst), n in manager.last_run.transfers.items()],
            producer_bytes=VALUES * 8,
            received_bytes=manager.received_bytes,
            workers={
                name: {"hostname": info["hostname"], "peer_address": peer_addresses.get(name)}
                for name, info in workers.items()
            },
        )
        sys.stdin.readline()  # the test is done with this manager (or gone)
        emit("closing", joined=sorted(set(manager._names_by_peer.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
