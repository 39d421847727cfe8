"""Round trip of one trivial call through a library process's pipe: one ``Run``, one reply.

    python benchmarks/bench_library_pipe.py
    PYTHONPATH=../before/src python benchmarks/bench_library_pipe.py   # an older checkout

A diagnostic of the worker <-> library path alone (no manager, no peer system): the median
of 1,900 round trips after 100 warm-up ones.
"""

import multiprocessing
import statistics
import time

import daskvine_py.worker.library as L
from daskvine_py.plan import graph
from daskvine_py.wire.serialize import TaskEncoder


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    args = (b, "w", (), "/tmp", 1)
    new = "running" in L.main.__code__.co_varnames
    if new:
        args = args + (ctx.RawArray("q", 1),)
    proc = ctx.Process(target=L.main, args=args, daemon=True)
    proc.start()
    b.close()
    assert type(L.receive(a)) is L.Ready
    plan = graph.build_plan({"x": (abs, -1)}, ["x"])
    node = plan.nodes["x"] if hasattr(plan, "nodes") else list(plan.tasks.values())[0]
    enc = TaskEncoder()
    payload, fids = enc.encode(node)
    functions = [(f, enc.functions[f]) for f in fids]
    times = []
    for i in range(2000):
        fields = (i + 1, "x", payload, [])
        call = L.Call(*fields, True, True) if new else L.Call(*fields)
        t = time.perf_counter()
        L.send(a, L.Run(functions if i == 0 else [], None, [call]))
        reply = L.receive(a)
        times.append(time.perf_counter() - t)
    median = statistics.median(times[100:]) * 1e6
    print(f"median round trip {median:.1f} us ({type(reply).__name__})")
    a.close()
    proc.join(2)


if __name__ == "__main__":
    main()
