"""Moving a large result between two libraries of one worker: the pipe against shared memory.

    python benchmarks/bench_library_transfer.py [--sizes 1,100] [--repeat 5] [--smoke]

A result made in library A and read by a task in library B of the same worker travels
today as the library protocol carries it: A pickles it (protocol 5, the array's buffer out
of band) and writes it to its pipe (``pipe.send``, ``Exported``); the worker reads it
(``pipe.receive``) and keeps it in its store; then writes it into B's pipe inside the
``Call`` that needs it, and B reads and unpickles it. Three real processes do exactly that
here, with the project's own framing, and the same move through shared memory:

- ``pipe``: as above: the buffer is copied into and out of the kernel twice.
- ``shm``: A copies the buffer into a new ``multiprocessing.shared_memory`` segment and sends
  its name; the worker keeps the name; B maps the segment and copies the array out of it
  (so it owns its memory, as a pipe read does); the worker then unlinks the segment.
- ``shm-mapped``: the same, but B keeps the array on the mapping (no copy at all): what a
  zero-copy design would get, if segments lived as long as the results in them.

Prints the median seconds per move and GB/s for each size, and which is faster. No peer
system here: this measures a choice inside daskvine_py (issue 15: "measure ... at 1 MB and
100 MB, and keep the faster"). Every move is checked (B's checksum of what it read) and a
wrong one exits non-zero. ``--smoke`` (a test that it still runs, numbers meaningless):
0.1 MB, one timed move per mode.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import pipe

MODES = ("pipe", "shm", "shm-mapped")


def segment(name: str | None = None, size: int = 0) -> shared_memory.SharedMemory:
    """A segment made or opened without the resource tracker (Python < 3.13 has no
    ``track=False``): the worker's side unlinks it, as a real design's store would."""
    made = shared_memory.SharedMemory(name=name, create=name is None, size=size)
    resource_tracker.unregister(made._name, "shared_memory")  # type: ignore[attr-defined]
    return made


def producer(conn: Any, nbytes: int, mode: str, repeat: int) -> None:
    """Library A: makes the result, and exports it when asked."""
    value = np.arange(nbytes // 8, dtype=np.float64)
    for _ in range(repeat):
        conn.recv_bytes()  # "export it"
        if mode == "pipe":
            pipe.send(conn, pipe.Exported(1, dumps(value), 0.0, ""))
        else:
            made = segment(size=value.nbytes)
            np.ndarray(value.shape, value.dtype, buffer=made.buf)[:] = value
            name = made.name
            made.close()
            pipe.send(conn, pipe.Exported(1, (name, value.shape), 0.0, ""))


def consumer(conn: Any, mode: str, repeat: int) -> None:
    """Library B: runs the call that reads the result, answers with a checksum."""
    for _ in range(repeat):
        call = pipe.receive(conn).calls[0]
        carried = call.inputs[0][2]
        if mode == "pipe":
            value = loads(carried)
        else:
            name, shape = carried
            opened = segment(name)
            mapped = np.ndarray(shape, np.float64, buffer=opened.buf)
            value = mapped.copy() if mode == "shm" else mapped
            del mapped
            if mode == "shm":
                opened.close()
        conn.send_bytes(float(value[-1]).hex().encode())
        del value


def move_once(to_a: Any, to_b: Any, mode: str) -> tuple[float, str]:
    """The worker's side of one move: ask A, keep what it sends, hand it to B."""
    start = time.perf_counter()
    to_a.send_bytes(b"export")
    exported = pipe.receive(to_a)
    kept = exported.value  # the store's copy (or the segment's name)
    call = pipe.Call(2, "reader", b"", [("result", 1, kept)], False, True)
    pipe.send(to_b, pipe.Run([], None, [call]))
    answer = to_b.recv_bytes().decode()
    if mode != "pipe":
        done = segment(kept[0])
        done.close()
        shared_memory._posixshmem.shm_unlink(done._name)  # type: ignore[attr-defined]
        # (B copied it out, or keeps its own mapping)
    return time.perf_counter() - start, answer


def measure(nbytes: int, mode: str, repeat: int) -> list[float]:
    context = mp.get_context("spawn")
    a_worker, a_library = context.Pipe()
    b_worker, b_library = context.Pipe()
    a = context.Process(target=producer, args=(a_library, nbytes, mode, repeat + 1))
    b = context.Process(target=consumer, args=(b_library, mode, repeat + 1))
    a.start()
    b.start()
    try:
        _, answer = move_once(a_worker, b_worker, mode)  # warm up: imports, first pages
        expected = float(nbytes // 8 - 1).hex()
        if answer != expected:
            raise AssertionError(f"{mode}: B read {answer}, expected {expected}")
        times = []
        for _ in range(repeat):
            seconds, answer = move_once(a_worker, b_worker, mode)
            if answer != expected:
                raise AssertionError(f"{mode}: B read {answer}, expected {expected}")
            times.append(seconds)
        return times
    finally:
        a.join(30)
        b.join(30)
        for process in (a, b):
            if process.is_alive():
                process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100", help="megabytes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="0.1 MB, once: still runs?")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.repeat = "0.1", 1
    print(f"{'size':>8}  {'mode':<11} {'median s':>10} {'GB/s':>7}  vs pipe")
    for megabytes in (float(s) for s in args.sizes.split(",")):
        nbytes = int(megabytes * 1_000_000) // 8 * 8
        medians = {}
        for mode in MODES:
            medians[mode] = statistics.median(measure(nbytes, mode, args.repeat))
        for mode in MODES:
            seconds = medians[mode]
            print(
                f"{megabytes:>6g}MB  {mode:<11} {seconds:>10.5f} {nbytes / seconds / 1e9:>7.2f}"
                f"  {medians['pipe'] / seconds:>5.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
