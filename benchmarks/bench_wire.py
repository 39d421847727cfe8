"""What the plain format (msgpack) costs against pickled headers, per record of a batch.

    PYTHONPATH=src python benchmarks/bench_wire.py [--batch 48] [--batches 2000] [--repeats 7]
                                                   [--smoke]

A typical batch from a worker to its manager: two thirds ``TaskDone`` with a small inline
value (a pickled float or short tuple, as a tree of partial sums sends), a third
``Started``, one ``Status``. For each format, the best of ``--repeats`` timings of
``--batches`` batches: µs per record to encode (``protocol.encode`` for plain data,
``protocol.encode_pickled`` for a pickle) and to decode and check every field (the
manager's ``protocol.decode``; for the pickle, what ``unpack`` did before protocol 7:
``pickle.loads``, the direction's types, ``check_fields``), the bytes per record, and
plain/pickle. No sockets: the formats alone. Both decodes must give back the batch, or it
exits non-zero. ``--smoke`` (a test that it still runs, numbers meaningless): a few
batches, once.
"""

from __future__ import annotations

import argparse
import functools
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, dumps


def typical_batch(size: int) -> list[Any]:
    """``size`` records as a busy worker sends them in one loop iteration."""
    batch: list[Any] = [p.Status(12_345_678, 456_789_012, 123_456_789, 0)]
    task_id = 1_000_000
    while len(batch) < size:
        task_id += 1
        if len(batch) % 3 == 0:
            batch.append(p.Started((task_id + 1, task_id + 2)))
            continue
        value = dumps(task_id * 0.5 if task_id % 2 else ("part", task_id, 3.25))
        batch.append(p.TaskDone(task_id, 24, 0.0012, value, time.time(), 0.00004))
    return batch


def decode_pickled(frames: Sequence[Any]) -> list[Any]:
    """A pickled batch to the manager as it was read before protocol 7."""
    messages = pickle.loads(memoryview(frames[0])[len(p.MAGIC) :], buffers=frames[1:])
    if type(messages) is not list:
        raise p.ProtocolError("not a list")
    for message in messages:
        if type(message) not in p.TO_MANAGER:
            raise p.ProtocolError(f"unexpected record {type(message).__name__}")
        p.check_fields(message)
    return messages


def best_us_per_record(
    step: Callable[[], object], batches: int, repeats: int, records: int
) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batches):
            step()
        best = min(best, time.perf_counter() - start)
    return best / batches / records * 1e6


def comparable(records: Sequence[Any]) -> list[Any]:
    return [
        tuple(
            (bytes(v.header), [bytes(b) for b in v.buffers]) if type(v) is Serialized else v
            for v in record
        )
        for record in records
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=48, help="records per batch")
    parser.add_argument("--batches", type=int, default=2000, help="batches per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings; the best is shown")
    parser.add_argument("--smoke", action="store_true", help="a few batches: does it still run?")
    args = parser.parse_args(argv)
    batches, repeats = (20, 1) if args.smoke else (args.batches, args.repeats)
    batch = typical_batch(args.batch)
    n = len(batch)
    formats = {
        "msgpack": (lambda: p.encode(batch), lambda f: p.decode(f, p.TO_MANAGER)),
        "pickle": (lambda: p.encode_pickled(batch), decode_pickled),
    }
    rows = {}
    for name, (encode, decode) in formats.items():
        frames = [bytes(f) for f in encode()]
        if comparable(decode(frames)) != comparable(batch):
            print(f"{name}: the batch did not read back as it was sent", file=sys.stderr)
            return 1
        encode_us = best_us_per_record(encode, batches, repeats, n)
        decode_us = best_us_per_record(functools.partial(decode, frames), batches, repeats, n)
        size = sum(len(f) for f in frames) / n
        rows[name] = (encode_us, decode_us, size)
    kinds = {type(r).__name__: sum(type(x) is type(r) for x in batch) for r in batch}
    print(
        f"batch: {n} records ({', '.join(f'{c} {k}' for k, c in kinds.items())}); "
        f"best of {repeats} x {batches} batches"
    )
    print(f"{'format':<16}{'encode us/rec':>15}{'decode+check us/rec':>21}{'bytes/rec':>11}")
    print("-" * 63)
    for name, (encode_us, decode_us, size) in rows.items():
        print(f"{name:<16}{encode_us:>15.3f}{decode_us:>21.3f}{size:>11.1f}")
    (pe, pd, ps), (qe, qd, qs) = rows["msgpack"], rows["pickle"]
    print(f"{'msgpack/pickle':<16}{pe / qe:>15.2f}{pd / qd:>21.2f}{ps / qs:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
