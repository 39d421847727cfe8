"""Framing and validation of messages, and serialization with out-of-band buffers."""

from __future__ import annotations

import pickle
import typing

import numpy as np
import pytest

from daskvine_py.errors import ProtocolError
from daskvine_py.wire import protocol as p
from daskvine_py.wire import validation
from daskvine_py.wire.serialize import dumps, dumps_exception, loads


def test_a_batch_round_trips_with_large_buffers_out_of_band():
    big = np.arange(1_000_000, dtype="float64")
    batch = [p.TaskDone(1, 8, 0.5, dumps(big)), p.Status(1, 2, 3), p.Replicas((1, 2))]
    frames = p.encode(batch)
    assert frames[0].startswith(p.PLAIN_MAGIC)  # a worker's records: plain data
    assert len(frames[0]) < 10_000  # the 8 MB array is not in the header
    assert sum(memoryview(f).nbytes for f in frames[1:]) >= big.nbytes
    decoded = p.decode([bytes(f) for f in frames], p.TO_MANAGER)
    assert decoded[1:] == batch[1:]
    np.testing.assert_array_equal(loads(decoded[0].value), big)


@pytest.mark.parametrize(
    ("alias", "kinds"),
    [
        (p.ToManager, p.TO_MANAGER),
        (p.ToWorker, p.TO_WORKER),
        (p.ToPeer, p.TO_PEER),
        (p.FromPeer, p.FROM_PEER),
        (p.FromClient, p.FROM_CLIENT),
        (p.ToClient, p.TO_CLIENT),
        (p.FromManager, p.TO_WORKER | p.TO_CLIENT),
        (
            p.Record,
            p.TO_MANAGER | p.TO_WORKER | p.TO_PEER | p.FROM_PEER | p.FROM_CLIENT | p.TO_CLIENT,
        ),
    ],
)
def test_each_direction_s_type_names_the_records_its_set_allows(alias, kinds):
    """The unions that annotate a direction and the sets a receiver checks are written
    apart: they must name the same records."""
    assert set(typing.get_args(alias) or (alias,)) == kinds


def test_a_small_batch_is_one_frame():
    frames = p.encode([p.TaskDone(1, 8, 0.5, dumps(1)), p.Status(1, 2, 3, 4)])
    assert len(frames) == 1 and not p.zero_copy(frames)
    assert p.decode(frames, p.TO_MANAGER)[1] == p.Status(1, 2, 3, 4)


def test_a_pickled_registration_is_refused_unopened():
    """Protocol 6 and older pickled every batch: the manager no longer opens a pickle
    from a worker, so such a registration is refused as not ours, in either layout."""
    old = p.Register(6, "old", 1, 0, "h", "tcp://127.0.0.1:1", 1)
    for frames in ([p.MAGIC, pickle.dumps([old])], [p.MAGIC + pickle.dumps([old])]):
        with pytest.raises(ProtocolError, match="pickled batch"):
            p.decode(frames, p.TO_MANAGER)


def test_small_values_stay_in_band():
    ser = dumps({"a": np.arange(10)})
    assert ser.buffers == [] and loads(ser)["a"].sum() == 45


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"hello"],
        [b"xyz", b"abc"],
        [p.MAGIC, b"garbage"],
        [p.MAGIC, pickle.dumps({"not": "a list"})],
        [p.MAGIC, pickle.dumps([1, 2])],
        [p.MAGIC, pickle.dumps([p.Execute(1, "k", b"", (), False)])],  # wrong direction
        [p.MAGIC + b"garbage"],
        [p.MAGIC + pickle.dumps([1, 2])],
        [b"dv" + pickle.dumps([p.Status(1, 2, 3, 4)])],  # truncated magic
        [p.MAGIC + pickle.dumps([p.Execute(1, "k", b"", (), False)])],  # wrong direction
    ],
)
def test_malformed_batches_raise_protocol_error(frames):
    with pytest.raises(ProtocolError):
        p.decode(frames, p.TO_MANAGER)


def test_field_types_are_checked():
    p.check_fields(p.TaskDone(1, 2, 0.1, None))
    with pytest.raises(ProtocolError, match="TaskDone.task_id"):
        p.check_fields(p.TaskDone("1", 2, 0.1, None))
    with pytest.raises(ProtocolError, match="Register.cores"):
        p.check_fields(p.Register(1, "w", "many", 0, "h", "tcp://x:1", 1))


def test_status_records_round_trip_and_are_checked():
    """A factory's status client and the manager (issue 16): requests one way, answers
    the other, each field checked like every other record's."""
    request = [
        p.StatusRequest(p.PROTOCOL_VERSION, "factory-login1-42"),
        p.RetireWorker("pool1-42-0", "idle for 60 s"),
    ]
    assert p.decode(p.encode(request), p.FROM_CLIENT) == request
    reply = p.StatusReply(12, (("pool1-42-0", 4, 0.0), ("pool1-42-1", 8, 61.5)))
    assert p.decode(p.encode([reply]), p.TO_CLIENT) == [reply]
    with pytest.raises(ProtocolError, match="unexpected record StatusReply"):
        p.decode(p.encode([reply]), p.TO_MANAGER)  # a worker's direction
    with pytest.raises(ProtocolError, match="unexpected record StatusRequest"):
        p.decode(p.encode(request[:1]), p.TO_MANAGER)
    for bad, field in [
        (p.StatusRequest("4", "f"), "StatusRequest.version"),
        (p.RetireWorker(b"w", "r"), "RetireWorker.name"),
        (p.StatusReply(-1, ()), "StatusReply.cores_needed"),
        (p.StatusReply(1, (("w", 0, 1.0),)), "StatusReply.workers"),
        (p.StatusReply(1, (("w", 1, float("nan")),)), "StatusReply.workers"),
        (p.StatusReply(1, (("w", 1),)), "StatusReply.workers"),
        (p.StatusReply(1, [("w", 1, 1.0)]), "StatusReply.workers"),
    ]:
        with pytest.raises(ProtocolError, match=field):
            p.check_fields(bad)


def test_a_task_done_with_its_serialization_takes_the_fast_check():
    done = p.TaskDone(1, 2, 0.1, None, 1769000000.5, 0.02)
    assert validation._task_done_ok(done)  # not the slower rule-by-rule path
    p.check_fields(done)
    with pytest.raises(ProtocolError, match="TaskDone.serialization"):
        p.check_fields(done._replace(serialization=-1.0))


def test_started_and_status_as_workers_send_them_take_the_fast_check():
    started = p.Started((1, 2, 3))
    bars = ((0, "inc", 1769000000.5, 1769000001.0, 0.01, 12), (p.FETCH_LANE, "", 1.0, 2.0, 0.0, 0))
    status = p.Status(10, 20, 30, 0, 50, bars)
    assert validation._started_ok(started) and validation._status_ok(status)
    p.check_fields(started)
    p.check_fields(status)
    # What the fast checks refuse, the rules judge (and explain)
    assert not validation._status_ok(status._replace(stored_bytes=True))
    p.check_fields(status._replace(stored_bytes=True))  # a bool is an int to the rules
    with pytest.raises(ProtocolError, match="Status.activity"):
        p.check_fields(status._replace(activity=((0, "inc", float("nan"), 1.0, 0.0, 1),)))
    with pytest.raises(ProtocolError, match="Status.activity"):
        p.check_fields(status._replace(activity=((-3, "inc", 1.0, 1.0, 0.0, 1),)))
    with pytest.raises(ProtocolError, match="Status.peak_memory"):
        p.check_fields(status._replace(peak_memory=-1))
    with pytest.raises(ProtocolError, match="Started.task_ids"):
        p.check_fields(p.Started((1, "2")))


def test_exceptions_travel_with_their_traceback():
    try:
        {}["missing"]
    except KeyError as exc:
        ser, text = dumps_exception(exc)
    assert isinstance(loads(ser), KeyError)
    assert "test_exceptions_travel_with_their_traceback" in text


def _refuse():
    raise RuntimeError("this exception cannot be rebuilt")


class Unrebuildable(Exception):
    def __reduce__(self):
        return (_refuse, ())


def test_exceptions_that_cannot_be_rebuilt_fall_back_to_text():
    ser, text = dumps_exception(Unrebuildable(1))
    assert ser is None and "Unrebuildable" in text


def _scale(x, factor):
    return x * factor


def test_task_encoder_takes_functions_out_once():
    from dask._task_spec import convert_legacy_graph

    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    big = np.arange(1_000_000)
    closure = lambda x: x + big.sum()  # noqa: E731 - a closure over 8 MB
    nodes = convert_legacy_graph({f"t{i}": (closure, i) for i in range(50)})
    nodes.update(convert_legacy_graph({f"s{i}": (_scale, i, 2) for i in range(50)}))
    encoder = TaskEncoder()
    payloads = {key: encoder.encode(node) for key, node in nodes.items()}
    assert len(encoder.functions) == 2
    assert max(len(payload) for payload, _ in payloads.values()) < 1000
    assert sum(len(code) for code in encoder.functions.values()) > big.nbytes
    decoder = TaskDecoder()
    decoder.add_functions(encoder.functions)
    assert decoder.decode(payloads["t3"][0])({}) == 3 + big.sum()
    assert decoder.decode(payloads["s4"][0])({}) == 8
    assert decoder.function(payloads["t1"][1][0]) is decoder.function(payloads["t2"][1][0])


def test_a_light_legacy_task_names_only_the_package_and_runs_where_decoded():
    """A payload names ``resident`` and ``LegacyCall`` by the package (``daskvine_py``), not
    by their modules: dozens of bytes fewer per task of a graph of 10^6, on the wire and in
    the manager. The package gives both, and a library's decoder runs the task."""
    import pickletools

    from daskvine_py.plan.graph import read
    from daskvine_py.plan.legacy import LegacyCall
    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    plan = read({("leaf", 5): (_scale, 5, 3), "sum": (_scale, ("leaf", 5), 2)}, "sum")
    assert type(plan.nodes[("leaf", 5)]) is LegacyCall
    encoder = TaskEncoder()
    leaf, _ = encoder.encode(plan.nodes[("leaf", 5)])
    reader, _ = encoder.encode(plan.nodes["sum"])
    for payload in (leaf, reader):
        names = {arg for op, arg, _ in pickletools.genops(payload) if op.name.endswith("UNICODE")}
        assert "daskvine_py" in names and not any(n.startswith("daskvine_py.") for n in names)
    assert len(leaf) < 100  # (127 bytes when the modules were named in full)
    decoder = TaskDecoder()
    decoder.add_functions(encoder.functions)
    assert decoder.decode(leaf)({}) == 15
    assert decoder.decode(reader)({("leaf", 5): 15}) == 30


def test_partials_and_bound_methods_travel_once_too():
    import functools

    from dask._task_spec import convert_legacy_graph

    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    heavy = functools.partial(_scale, factor=np.ones(100_000))
    nodes = convert_legacy_graph({f"p{i}": (heavy, i) for i in range(20)})
    encoder = TaskEncoder()
    payloads = [encoder.encode(node) for node in nodes.values()]
    assert len(encoder.functions) == 1 and max(len(pl) for pl, _ in payloads) < 500
    decoder = TaskDecoder()
    decoder.add_functions(encoder.functions)
    assert decoder.decode(payloads[3][0])({}).sum() == 3 * 100_000


class _Reader:
    """A callable object, as I/O layers make them (Coffea's, dask-awkward's): one shared
    by every partition's task, carrying a large description of what it reads."""

    def __init__(self):
        self.form = np.arange(50_000.0)

    def __call__(self, i):
        return i + self.form[i]


def test_callable_objects_shared_by_tasks_travel_once_and_are_one_object_there():
    import operator

    from dask._task_spec import convert_legacy_graph

    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    reader = _Reader()  # 400 kB, which every task pickled again before
    getter = operator.itemgetter(0)  # a C callable: small, left in the payload
    nodes = convert_legacy_graph({f"r{i}": (reader, i) for i in range(20)})
    nodes["g"] = convert_legacy_graph({"g": (getter, [1, 2])})["g"]
    encoder = TaskEncoder()
    payloads = {key: encoder.encode(node) for key, node in nodes.items()}
    assert len(encoder.functions) == 1 and max(len(pl) for pl, _ in payloads.values()) < 500
    decoder = TaskDecoder()
    decoder.add_functions(encoder.functions)
    tasks = [decoder.decode(payloads[f"r{i}"][0]) for i in (3, 4)]
    assert tasks[0]({}) == 3 + reader.form[3] and tasks[1]({}) == 4 + reader.form[4]
    assert tasks[0].func is tasks[1].func  # unpickled once in this process
    assert decoder.decode(payloads["g"][0])({}) == 1


def test_task_encoder_round_trips_what_plain_pickle_cannot_write():
    """Local classes, lambdas inside data, and classes of ``__main__`` all travel."""
    from daskvine_py.plan.graph import LegacyCall
    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    class Local:  # plain pickle cannot find this class by name: cloudpickle writes it
        def __init__(self, x):
            self.x = x

    class MainLike:
        def __init__(self, x):
            self.x = x

    MainLike.__module__ = "__main__"  # as if defined in a script: travels by value
    encoder = TaskEncoder()
    decoder = TaskDecoder()
    for value, check in [
        (Local(3), lambda v: type(v).__name__ == "Local" and v.x == 3),
        (MainLike(4), lambda v: type(v).__name__ == "MainLike" and v.x == 4),
        ({"f": lambda y: y * 2}, lambda v: v["f"](5) == 10),
        (("key", 1, 2.5, None, b"b"), lambda v: v == ("key", 1, 2.5, None, b"b")),
    ]:
        payload, functions = encoder.encode(LegacyCall((_identity, value), frozenset()))
        decoder.add_functions({f: encoder.functions[f] for f in functions})
        assert check(decoder.decode(payload)({})), value


def _identity(x):
    return x


def test_module_functions_are_pickled_once_per_process_closures_every_time(monkeypatch):
    """A function pickled by name cannot change, so later gets reuse its bytes; a closure
    is pickled by value, so a changed captured value is never served from a cache."""
    from daskvine_py.wire import serialize
    from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder

    calls = []
    real = serialize._dumps_function  # cloudpickle, keeping file names
    monkeypatch.setattr(serialize, "_dumps_function", lambda f: calls.append(f) or real(f))
    monkeypatch.setattr(serialize, "_BY_REFERENCE", {})
    ids = {TaskEncoder().function_id(_scale) for _ in range(3)}
    assert len(ids) == 1 and calls == [_scale]

    def closure_over(n):
        return lambda x: x + n

    decoder = TaskDecoder()
    for n in (1, 2):
        encoder = TaskEncoder()
        fid = encoder.function_id(closure_over(n))
        decoder.add_functions(encoder.functions)
        assert decoder.function(fid)(10) == 10 + n
    assert len(calls) == 3


def test_adjacent_releases_travel_as_one_and_nothing_moves_past_another_record():
    execute = p.Execute(9, "k", b"payload", (), False)
    batch = [
        p.Release((1,)),
        p.Release((2, 3)),
        p.Release((4,)),
        execute,
        p.Release((9,)),  # after the Execute of 9: never merged into the ones before it
        p.Heartbeat(),
        p.Release((5,)),
        p.Release((6,)),
    ]
    merged = p.coalesce_releases(batch)
    assert merged == [
        p.Release((1, 2, 3, 4)),
        execute,
        p.Release((9,)),
        p.Heartbeat(),
        p.Release((5, 6)),
    ]
    assert p.decode(p.encode(merged), p.TO_WORKER) == merged  # still valid on the wire
    assert p.coalesce_releases([execute]) == [execute]
    assert p.coalesce_releases([]) == []
