"""What a flood of ids on a worker's peer port costs it (issue 29, item 4).

    python benchmarks/bench_peer_flood.py [--rounds 30] [--ids 1000000] [--smoke]

A ``Manager()`` (security on) with two local one-core workers; a client holding the
connection file's worker keys sends each worker's peer port ``--rounds`` requests of
``--ids`` unknown ids, each round beside a small graph the manager runs (checked against
Dask's synchronous scheduler). It prints how many answers each request got (at most
``serving.REQUEST_IDS``), the slowest wait for an answer, the slowest graph, and each
worker's resident memory before and after (``VmRSS``).
"""

from __future__ import annotations

import argparse
import operator
import time

import dask
import zmq

from daskvine_py import Manager
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.worker import serving


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def graph(seed: int) -> dict:
    g: dict = {("a", i): (operator.add, seed, i) for i in range(20)}
    g.update({("b", i): (operator.mul, ("a", i), ("a", (i + 1) % 20)) for i in range(20)})
    g["total"] = (sum, [("b", i) for i in range(20)])
    return g


def answers(sock: zmq.Socket, wanted: int) -> int:
    """Answers until ``wanted`` came, then any more within 0.2 s (none should)."""
    got = 0
    while sock.poll(10_000 if got < wanted else 200):
        got += len(p.decode(sock.recv_multipart(), p.FROM_PEER))
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 10,000 ids")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.ids = 2, 10_000
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        assert manager.get(graph(0), "total") == dask.get(graph(0), "total")
        keys = security.read_connection_file(manager.connection_file).keys
        assert keys is not None
        workers = list(manager.workers.values())
        before = [rss_mb(w["pid"]) for w in workers]
        context = zmq.Context()
        socks = []
        for w in workers:
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.curve_serverkey = keys.worker_public
            sock.curve_publickey, sock.curve_secretkey = keys.worker_public, keys.worker_secret
            sock.connect(w["peer_address"])
            socks.append(sock)
        flood = p.encode([p.GetData(tuple(range(10**9, 10**9 + args.ids)))])
        counts, waits, graphs = set(), [], []
        for round_ in range(1, args.rounds + 1):
            for sock in socks:
                sock.send_multipart(flood)
            start = time.perf_counter()
            assert manager.get(graph(round_), "total") == dask.get(graph(round_), "total")
            graphs.append(time.perf_counter() - start)
            for sock in socks:
                start = time.perf_counter()
                counts.add(answers(sock, min(args.ids, serving.REQUEST_IDS)))
                waits.append(time.perf_counter() - start)
        after = [rss_mb(w["pid"]) for w in workers]
        context.destroy(linger=0)
    print(f"answers per request of {args.ids} ids: {sorted(counts)}")
    print(
        f"slowest answer wait (with 0.2 s for any extra) {max(waits):.3f} s, "
        f"slowest graph {max(graphs):.3f} s"
    )
    print(
        "worker RSS MB before "
        + ", ".join(f"{m:.0f}" for m in before)
        + "; after "
        + ", ".join(f"{m:.0f}" for m in after)
    )


if __name__ == "__main__":
    main()
