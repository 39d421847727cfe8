"""Round trip of one trivial call through a library process's pipe: one ``Run``, one reply.

    python benchmarks/bench_library_pipe.py [--calls 2000] [--smoke]
    PYTHONPATH=../before/src python benchmarks/bench_library_pipe.py   # an older checkout

A diagnostic of the worker <-> library path alone (no manager, no peer system): the median
of ``--calls`` round trips after the first 100 (warm-up). Every reply must be the call's
result (``abs(-1)``), or it exits non-zero. ``--smoke`` (a test that it still runs, numbers
meaningless): 20 round trips, the median of all of them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Sequence

import daskvine_py.worker.library as L
from daskvine_py.plan import graph
from daskvine_py.wire.serialize import TaskEncoder, loads
from daskvine_py.worker import pipe

#: round trips not counted in the median
WARM_UP = 100


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="round trips, warm-up included")
    parser.add_argument("--smoke", action="store_true", help="20 calls: does it still run?")
    args = parser.parse_args(argv)
    calls, warm_up = (20, 0) if args.smoke else (args.calls, min(WARM_UP, args.calls - 1))
    ctx = multiprocessing.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    library_args: tuple = (b, "w", (), "/tmp", 1)
    new = "running" in L.main.__code__.co_varnames
    if new:
        library_args = library_args + (ctx.RawArray("q", 2),)  # a slot: its task, its base
    proc = ctx.Process(target=L.main, args=library_args, daemon=True)
    proc.start()
    b.close()
    try:
        ready = pipe.receive(a)
        if type(ready) is not pipe.Ready:
            raise AssertionError(f"the library said {ready!r} first, not Ready")
        plan = graph.build_plan({"x": (abs, -1)}, ["x"])
        node = plan.nodes["x"] if hasattr(plan, "nodes") else list(plan.tasks.values())[0]
        enc = TaskEncoder()
        payload, fids = enc.encode(node)
        functions = [(f, enc.functions[f]) for f in fids]
        times = []
        for i in range(calls):
            fields = (i + 1, "x", payload, [])
            call = pipe.Call(*fields, True, True) if new else pipe.Call(*fields)
            t = time.perf_counter()
            pipe.send(a, pipe.Run(functions if i == 0 else [], None, [call]))
            reply = pipe.receive(a)
            times.append(time.perf_counter() - t)
            replies = getattr(reply, "replies", [reply])  # held replies come together
            done = replies[0]
            if len(replies) != 1 or type(done) is not pipe.Done or done.task_id != i + 1:
                raise AssertionError(f"call {i + 1}: the library answered {reply!r}")
            if loads(done.value) != 1:
                raise AssertionError(f"call {i + 1}: abs(-1) came back as {loads(done.value)!r}")
    finally:
        a.close()
        proc.join(2)
        if proc.is_alive():
            proc.kill()
    median = statistics.median(times[warm_up:]) * 1e6
    print(f"median round trip {median:.1f} us ({type(reply).__name__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
