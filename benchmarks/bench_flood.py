"""What an unauthenticated flood costs a manager (issue 13), and what it gets the attacker.

    python benchmarks/bench_flood.py [--tasks 5000] [--repeat 3] [--attackers 1]
                                     [--only KINDS] [--json flood.json] [--quick | --smoke]

A ``Manager()`` (security on, the default) with two local one-core workers runs a graph of
``--tasks`` no-op tasks ``--repeat`` times in each of these conditions, while
``--attackers`` processes on the same machine hammer its port:

- ``quiet``: nobody else on the port (the baseline);
- ``tcp-garbage``: TCP connections that send 4 KB of random bytes and hang up, as fast as
  they can: libzmq drops them at the ZMTP greeting, before any handshake;
- ``no-curve``: ZeroMQ DEALERs without CurveZMQ that connect and send batches (that would
  run code if unpickled): refused at the security-mechanism check of the handshake;
- ``wrong-key``: CurveZMQ DEALERs with the manager's public key but their own client keys,
  reconnecting every 10 ms: each attempt reaches the ZAP gate (a Python thread), which
  refuses the key. This is the most expensive kind for the manager.

For each condition it prints the median wall time of a run, the manager process's CPU per
run (``time.process_time``: I/O thread, ZAP thread and the caller together), the ratio to
quiet, the handshakes the gate refused per second, and whether any result was wrong or any
attacker got a byte back. Every result is checked against Dask's synchronous scheduler,
and a wrong result or an attacker's answer exits non-zero. ``--quick``: 500 tasks, once.
``--smoke`` (a test that it still runs, numbers meaningless): 100 tasks, once, in every
condition, the flood given 0.2 s to build up instead of a second.

The attackers share the machine's cores with the manager and its workers, so wall time
also measures the CPU they take from everyone; the manager's own CPU per run is the
cleaner number for "what the flood costs the manager".
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import pickle
import platform
import resource
import socket
import statistics
import sys
import time
from importlib import metadata
from typing import Any

from workloads import noop_dict

KINDS = ("quiet", "tcp-garbage", "no-curve", "wrong-key")


class _Bomb:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo unpickled > /dev/null",))


def attack(kind: str, address: str, server_key: bytes, stop: Any, answered: Any) -> None:
    """One attacker process: hammer ``address`` until ``stop`` is set."""
    import zmq

    from daskvine_py.wire.protocol import split_address

    host, port = split_address(address)
    if kind == "tcp-garbage":
        junk = os.urandom(4096)
        while not stop.is_set():
            try:
                with socket.create_connection((host, port), timeout=1) as raw:
                    raw.sendall(junk)
            except OSError:
                pass
        return
    # A refused client does not retry on its own: every attempt is a new socket, with
    # the last 200 kept open so that each gets as far as its handshake.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 8192)
    public, secret = zmq.curve_keypair()
    batch = [b"dvp" + pickle.dumps([_Bomb()], protocol=5)]
    recent: collections.deque = collections.deque()
    while not stop.is_set():
        try:
            sock = context.socket(zmq.DEALER)
        except zmq.ZMQError:  # closed sockets are reaped in the background: wait for it
            time.sleep(0.001)
            continue
        sock.setsockopt(zmq.LINGER, 0)
        if kind == "wrong-key":
            sock.curve_serverkey = server_key
            sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.connect(address)
        try:
            sock.send_multipart(batch, zmq.NOBLOCK)
        except zmq.Again:
            pass
        recent.append(sock)
        if len(recent) > 200:  # each lives long enough for its handshake (~0.1 s)
            old = recent.popleft()
            if old.poll(0):
                answered.value += 1
            old.close()
        time.sleep(0.0005)
    context.destroy(linger=0)


#: Seconds the attackers hammer the port before the first timed run.
BUILD_UP = 1.0


def measure(
    tasks: int, repeat: int, attackers: int, kinds: list[str], build_up: float = BUILD_UP
) -> list[dict[str, Any]]:
    import dask

    from daskvine_py import Manager
    from daskvine_py.wire import security

    dsk, keys = noop_dict(tasks)
    expected = dask.get(dsk, keys)
    rows = []
    ctx = multiprocessing.get_context("spawn")
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        server_key = security.read_connection_file(manager.connection_file).keys.manager_public
        manager.get(dsk, keys)  # warm up
        for kind in kinds:
            stop, answered = ctx.Event(), ctx.Value("i", 0)
            procs = []
            if kind != "quiet":
                procs = [
                    ctx.Process(
                        target=attack,
                        args=(kind, manager.address, server_key, stop, answered),
                        daemon=True,
                    )
                    for _ in range(attackers)
                ]
                for proc in procs:
                    proc.start()
                time.sleep(build_up)  # let the flood build up
            refused_before, begun = manager._gate.refused, time.perf_counter()
            walls, cpus, wrong = [], [], 0
            for _ in range(repeat):
                cpu, wall = time.process_time(), time.perf_counter()
                got = manager.get(dsk, keys)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
                wrong += got != expected
            elapsed = time.perf_counter() - begun
            refused = manager._gate.refused - refused_before
            stop.set()
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
            rows.append(
                {
                    "condition": kind,
                    "wall_s": statistics.median(walls),
                    "manager_cpu_s": statistics.median(cpus),
                    "refused_per_s": refused / elapsed,
                    "wrong_results": wrong,
                    "attacker_answers": answered.value,
                    "workers": sorted(manager.workers),
                }
            )
            print(_line(rows[-1], rows[0]), flush=True)
    return rows


def _line(row: dict[str, Any], quiet: dict[str, Any]) -> str:
    return (
        f"{row['condition']:<12} {row['wall_s']:8.3f} s {row['manager_cpu_s']:8.3f} s CPU "
        f"{row['wall_s'] / quiet['wall_s']:6.2f}x wall "
        f"{row['manager_cpu_s'] / quiet['manager_cpu_s']:6.2f}x CPU "
        f"{row['refused_per_s']:9.0f} refused/s  wrong results {row['wrong_results']}  "
        f"attacker answered {row['attacker_answers']}  workers {','.join(row['workers'])}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--attackers", type=int, default=1, help="attacker processes")
    parser.add_argument("--only", default=",".join(KINDS), help="conditions, comma-separated")
    parser.add_argument("--json", default=None)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="500 tasks, once")
    sizes.add_argument("--smoke", action="store_true", help="100 tasks, once: still runs?")
    args = parser.parse_args(argv)
    kinds = ["quiet", *(k for k in args.only.split(",") if k and k != "quiet")]
    build_up = BUILD_UP
    if args.quick:
        args.tasks, args.repeat = 500, 1
    if args.smoke:
        args.tasks, args.repeat, build_up = 100, 1, 0.2
    print(
        f"{args.tasks} no-op tasks, 2 one-core workers, {args.attackers} attacker process(es); "
        f"median of {args.repeat}"
    )
    rows = measure(args.tasks, args.repeat, args.attackers, kinds, build_up)
    if args.json:
        info = {
            "python": platform.python_version(),
            "pyzmq": metadata.version("pyzmq"),
            "cpus": os.cpu_count(),
            "args": vars(args),
        }
        with open(args.json, "w") as file:
            json.dump({"machine": info, "rows": rows}, file, indent=1)
    bad = any(row["wrong_results"] or row["attacker_answers"] for row in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
