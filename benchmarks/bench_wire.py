"""What the plain format (msgpack) costs against pickled headers, and against msgspec's
typed structs, per record of a batch.

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
exits non-zero.

Then, per record type (a batch of one kind: ``TaskDone``, ``Started``, ``Status`` to the
manager, ``Execute`` to a worker; and the typical batch), today's format against msgspec
(``wire_msgspec``: typed structs decoded and checked in one step, then made the records
the package reads), best and median of the repeats, every timing interleaved in one
process so that a busy machine slows each format alike. ``msgspec, structs`` decodes to
the checked structs alone, not made records: a ceiling. Before timing, each format must
read every batch back as it was sent and refuse each of a list of malformed records
(wrong types, out-of-range values, NaN, too few or too many fields), or it exits
non-zero. Without msgspec installed, that half says so and measures today's formats only.

``--smoke`` (a test that it still runs, numbers meaningless): a few batches, three times.
"""

from __future__ import annotations

import argparse
import functools
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from statistics import median
from typing import Any, NamedTuple

from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, dumps
from daskvine_py.wire.validation import shown


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


def comparable(value: Any) -> Any:
    """``value`` with its ``Serialized`` parts as bytes and its records' types named."""
    if type(value) is Serialized:
        return ("Serialized", bytes(value.header), [bytes(b) for b in value.buffers])
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [comparable(v) for v in value])
    return value


def execute_batch(size: int) -> list[Any]:
    """``size`` tasks as the manager sends them: a key of a collection's chunk, a small
    payload, two inputs (one on a peer, one small value passed inline)."""
    batch: list[Any] = []
    for i in range(size):
        task_id = 2_000_000 + i
        payload = pickle.dumps(("resident", b"f" * 16, ("x-3f2a91", i), ("y-3f2a91", i)))
        deps = (
            p.DepLocation(task_id - 1000, ("x-3f2a91", i), ("tcp://10.1.2.3:40001",), None),
            p.DepLocation(task_id - 2000, ("y-3f2a91", i), ("tcp://10.1.2.4:40001",), dumps(0.5)),
        )
        batch.append(p.Execute(task_id, ("sum-9c1e07", i), payload, deps, False, 3, True, 1, 0, 0))
    return batch


def one_kind(size: int, kind: type) -> list[Any]:
    """``size`` records of one kind, as in a busy batch."""
    if kind is p.Execute:
        return execute_batch(size)
    if kind is p.Status:
        bars = (
            (0, "sum", 1.7e9, 1.7e9 + 0.5, 0.01, 40),
            (p.FETCH_LANE, "fetch", 1.7e9, 1.7e9, 0.0, 2),
        )
        return [
            p.Status(12_345_678 + i, 456_789_012, 123_456_789, 0, 500_000_000, bars)
            for i in range(size)
        ]
    return [r for r in typical_batch(3 * size + 1) if type(r) is kind][:size]


def malformed(kind: type) -> list[tuple[str, tuple[Any, ...]]]:
    """Records of ``kind`` that ``check_fields`` refuses, each with what is wrong."""
    good = one_kind(1, kind)[0]
    nan, inf = float("nan"), float("inf")
    deep: Any = "k"
    for _ in range(p.MAX_KEY_DEPTH + 4):  # a key nested too deep
        deep = (deep, 1)
    bad_fields: dict[type, dict[str, list[Any]]] = {
        p.TaskDone: {
            "task_id": ["7", 1.5, None],
            "nbytes": [-1, "1", 2.0],
            "duration": [nan, inf, -1.0, "0"],
            "value": ["x", b"raw", 3],
            "finished": [nan],
            "serialization": [-0.5],
            "cpu": [inf],
            "peak_memory": [-1],
            "inputs": [
                ("x",),
                (("", 1, 0, "v"),),
                (("u", -1, 0, "v"),),
                (("u", 1, 7, "v"),),
                (("u" * 5000, 1, 0, "v"),),
                (("u", 1, 0, "v" * 2000),),
                (("u\n", 1, 0, "v"),),
                (("u", 1, 0, "v\x00"),),
                (("u", 1, 0),),
                (("u", 1, 0, "v"),) * (p.MAX_INPUT_FILES + 1),
            ],
        },
        p.Started: {"task_ids": [("1",), (1.5,), "x", None, (None,)]},
        p.Status: {
            "stored_bytes": [-1, 1.5],
            "resident": ["x"],
            "activity": [
                ((-3, "p", 0.0, 1.0, 0.0, 1),),
                ((0, "p", nan, 1.0, 0.0, 1),),
                ((0, "p", 0.0, inf, 0.0, 1),),
                ((0, "p", 0.0, 1.0, 0.0, -1),),
                ((0, 1, 0.0, 1.0, 0.0, 1),),
                ((0, "p", 0.0, 1.0, 0.0),),
                ("bar",),
            ],
        },
        p.Execute: {
            "task_id": ["7"],
            "key": [{"a": 1}, None, deep],
            "payload": ["text", 5],
            "deps": [
                ("x",),
                (p.DepLocation("1", "k", (), None),),
                (p.DepLocation(1, "k", (1,), None),),
                (p.DepLocation(1, "k", "peer", None),),
                (p.DepLocation(1, "k", (), "not serialized"),),
                (p.DepLocation(1, None, (), None),),
                ((1, "k", ()),),
            ],
            "want_result": [1, None],
            "keep": ["x"],
            "cores": [0, -1],
            "memory": [-1],
            "gpus": [-1],
        },
    }
    cases = [("too few fields", tuple(good)[:-1]), ("too many fields", (*good, 0))]
    for name, values in bad_fields[kind].items():
        index = kind._fields.index(name)
        for value in values:
            fields = list(good)
            fields[index] = value
            cases.append((f"{name}={shown(value)}", tuple(fields)))
    return cases


class Format(NamedTuple):
    encode: Callable[[list[Any]], list[Any]]
    decode: Callable[[Sequence[Any]], list[Any]]


def formats_for(kind: type | None, wire: Any) -> dict[str, Format]:
    """Today's format for records of ``kind`` (None: the typical batch) and msgspec's."""
    allowed = p.TO_WORKER if kind is p.Execute else p.TO_MANAGER
    today = "pickle" if kind is p.Execute else "msgpack"
    formats = {today: Format(p.encode, functools.partial(p.decode, allowed=allowed))}
    if wire is not None:
        decoder = wire.to_worker if kind is p.Execute else wire.to_manager
        formats["msgspec"] = Format(wire.encode, functools.partial(wire.decode, decoder=decoder))
        formats["msgspec, structs"] = Format(
            wire.encode, functools.partial(wire.decode_structs, decoder=decoder)
        )
    return formats


def refuses_alike(kind: type, formats: dict[str, Format]) -> list[str]:
    """The records ``check_fields`` refuses that a format of ``formats`` read as sent."""
    accepted = []
    for what, fields in malformed(kind):
        record = tuple.__new__(kind, fields)
        for name, (encode, decode) in formats.items():
            if name.endswith("structs"):
                continue
            try:
                frames = [bytes(f) for f in encode([record])]
            except (TypeError, ValueError, OverflowError):
                continue  # cannot even be sent
            try:
                decoded = decode(frames)
            except p.ProtocolError:
                continue
            # (a short record pickled is unpickled whole, its defaults filled in)
            if comparable(decoded) == comparable([record]):
                accepted.append(f"{name} accepted a {kind.__name__} with {what}")
    return accepted


def per_kind(args: argparse.Namespace, batches: int, repeats: int) -> int:
    """Today's formats against msgspec per record type, interleaved; 1 on a wrong result."""
    try:
        import wire_msgspec
    except ImportError as exc:
        print(f"\nmsgspec: absent ({exc}); only today's formats are measured below")
        wire = None
    else:
        wire = wire_msgspec.MsgspecWire()
    kinds: list[type | None] = [p.TaskDone, p.Started, p.Status, p.Execute, None]
    cases = []  # (kind's name, format's name, encode step, decode step, records, bytes)
    for kind in kinds:
        batch = typical_batch(args.batch) if kind is None else one_kind(args.batch, kind)
        formats = formats_for(kind, wire)
        if kind is not None:
            for problem in refuses_alike(kind, formats):
                print(problem, file=sys.stderr)
                return 1
        for name, (encode, decode) in formats.items():
            frames = [bytes(f) for f in encode(batch)]
            if not name.endswith("structs") and comparable(decode(frames)) != comparable(batch):
                print(f"{name}: the batch did not read back as it was sent", file=sys.stderr)
                return 1
            label = "typical batch" if kind is None else kind.__name__
            size = sum(len(f) for f in frames) / len(batch)
            cases.append(
                (
                    label,
                    name,
                    functools.partial(encode, batch),
                    functools.partial(decode, frames),
                    len(batch),
                    size,
                )
            )
    timings: dict[tuple[int, int], list[float]] = {}
    steps = [(i, j) for i in range(len(cases)) for j in (2, 3)]
    for repeat in range(repeats):
        shift = repeat % len(steps)
        for i, j in steps[shift:] + steps[:shift]:  # each repeat starts elsewhere
            step = cases[i][j]
            start = time.perf_counter()
            for _ in range(batches):
                step()
            us = (time.perf_counter() - start) / batches / cases[i][4] * 1e6
            timings.setdefault((i, j), []).append(us)
    print(
        f"\nper record type: {args.batch} records a batch; best and median of {repeats} "
        f"x {batches} batches, interleaved (us per record)"
    )
    print(
        f"{'records':<15}{'format':<18}{'encode best':>12}{'median':>9}"
        f"{'decode+check best':>19}{'median':>9}{'bytes':>8}"
    )
    print("-" * 90)
    for i, (label, name, _, _, _, size) in enumerate(cases):
        encode_us, decode_us = timings[i, 2], timings[i, 3]
        encode_text = (
            "" if name.endswith("structs") else f"{min(encode_us):>12.3f}{median(encode_us):>9.3f}"
        )
        print(
            f"{label:<15}{name:<18}{encode_text:>21}"
            f"{min(decode_us):>19.3f}{median(decode_us):>9.3f}{size:>8.1f}"
        )
    if wire is not None:
        print("-" * 90)
        print(f"{'records':<15}{'today/msgspec':<18}{'encode':>12}{'':>9}{'decode+check':>19}")
        by = {(c[0], c[1]): i for i, c in enumerate(cases)}
        for label in dict.fromkeys(c[0] for c in cases):
            today = by.get((label, "msgpack"), by.get((label, "pickle")))
            ours = by[label, "msgspec"]
            ratio_e = min(timings[today, 2]) / min(timings[ours, 2])
            ratio_d = min(timings[today, 3]) / min(timings[ours, 3])
            print(f"{label:<15}{'(best)':<18}{ratio_e:>12.2f}{'':>9}{ratio_d:>19.2f}")
    return 0


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
    return per_kind(args, batches, max(repeats, 3) if args.smoke else repeats)


if __name__ == "__main__":
    sys.exit(main())
