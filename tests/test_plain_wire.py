"""Issue 29, part 5: less to trust in the analyst's process.

The manager's I/O thread opens no pickle a worker, peer or status client sends: their
records travel as plain data, a pickled batch from them is dropped unopened, results are
unpickled in the caller's thread only, and a task's exception only when the caller allows
it (``Manager(unpickle_remote_exceptions=...)``). The format alone, then fuzzers that
write plain batches as a hostile sender would (the field rules are ``test_robustness``'s),
then real managers and workers, a key holder playing a hostile worker (``KeyedWorker``).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading

import dask
import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from daskvine_py import Manager, ProtocolError, RemoteTaskError, RemoteTraceback
from daskvine_py.wire import plain, security
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import Serialized, dumps, loads
from keyed import KeyedWorker
from sockets import dealer
from test_robustness import _FUZZ, DIRECTIONS, VALID, _decode_or_protocol_error

# -- the format --------------------------------------------------------------------------


def test_what_the_manager_must_not_trust_travels_plain_and_what_it_sends_workers_pickled():
    assert p.PLAIN_KINDS == p.TO_MANAGER | p.FROM_CLIENT | p.TO_CLIENT | p.TO_PEER | p.FROM_PEER
    assert p.PLAIN_KINDS.isdisjoint(p.TO_WORKER - {p.Rejected})
    for batch, magic in [
        ([p.Status(1, 2, 3, 4), p.Started((5,))], p.PLAIN_MAGIC),
        ([p.Rejected("protocol version mismatch")], p.PLAIN_MAGIC),
        ([p.Rejected("x"), p.Heartbeat()], p.MAGIC),
        ([p.Release((1,))], p.MAGIC),
    ]:
        frames = p.encode(batch)
        assert frames[0][:3] == magic
        assert p.decode(frames, p.TO_WORKER if magic == p.MAGIC else p.TO_MANAGER | {p.Rejected})


def test_values_keep_their_bytes_and_their_buffers_in_order_as_frames():
    big, other = np.arange(100_000.0), np.ones(50_000)
    batch = [
        p.TaskDone(1, 8, 0.5, dumps(big), 2.0, 0.1),
        p.TaskErred(2, None, "tb", "E: m", "E"),
        p.Uploaded(3, dumps(other)),
        p.TaskDone(4, 8, 0.5, dumps("x"), 2.0, 0.1),
    ]
    frames = p.encode(batch)
    assert len(frames) == 3 and p.zero_copy(frames)
    assert len(frames[0]) < 1000  # the arrays are not in the first frame
    done, erred, uploaded, small = p.decode([bytes(f) for f in frames], p.TO_MANAGER)
    np.testing.assert_array_equal(loads(done.value), big)
    np.testing.assert_array_equal(loads(uploaded.value), other)
    assert loads(small.value) == "x" and type(small.value.header) is bytes
    assert erred == batch[1] and done[:3] == (1, 8, 0.5) and type(done) is p.TaskDone


def test_text_with_lone_surrogates_travels_as_in_a_pickle():
    """A file name decoded with ``surrogateescape`` in a traceback must not fail the batch."""
    erred = p.TaskErred(1, None, 'File "/data/caf\udce9.py", line 1', "OSError: x", "OSError")
    assert p.decode(p.encode([erred]), p.TO_MANAGER) == [erred]


def test_a_pickle_is_refused_in_every_plain_direction_and_read_from_the_manager():
    for direction in (
        p.TO_MANAGER,
        p.FROM_CLIENT,
        p.TO_CLIENT,
        p.TO_PEER,
        p.FROM_PEER,
        p.TO_MANAGER | p.FROM_CLIENT,
    ):
        with pytest.raises(ProtocolError, match="pickled batch"):
            p.unpack(p.encode_pickled([p.Goodbye("x")]), direction)
    assert p.unpack(p.encode_pickled([p.Heartbeat()]), p.TO_WORKER) == [p.Heartbeat()]


def test_a_record_nested_a_thousand_deep_is_refused_with_a_short_message():
    nest = b"\x91" * 1000 + b"\x01"
    for kind in (p.Transfers, p.StatusReply):
        frames = [p.PLAIN_MAGIC + b"\x92" + bytes([plain.CODES[kind]]) + b"\x91" + nest]
        with pytest.raises(ProtocolError, match=kind.__name__) as info:
            p.decode(frames, p.TO_MANAGER | p.TO_CLIENT)
        assert len(str(info.value)) < 200


def test_what_is_not_plain_data_does_not_encode():
    for record in (p.Goodbye(object()), p.Status(2**64, 0, 0, 0), p.Data(1, Serialized(5, []))):
        with pytest.raises(ValueError, match="plain data"):
            p.encode([record])


# -- fuzzing -----------------------------------------------------------------------------

#: Anything msgpack can say: every scalar at the edges of its range (ints from -2**63 to
#: 2**64 - 1), extensions of our codes and others, arrays, maps.
_PLAIN_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.builds(msgpack.ExtType, st.integers(0, 3), st.binary(max_size=12)),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
)
_PLAIN_ANY = st.recursive(
    _PLAIN_SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=8,
)


@st.composite
def plain_batches(draw, kinds):
    """The frames of a plain batch written by a hostile sender: right or wrong codes, a
    record's fields valid, replaced or of the wrong number, values whose extensions claim
    buffers that may not be there, a nesting too deep for anything."""
    expected = sorted(plain.CODES[kind] for kind in kinds if kind in plain.CODES) or [1]
    flat = []
    for _ in range(draw(st.integers(0, 3))):
        # mostly what is expected here, else any of ours or any at all
        anything = st.one_of(st.sampled_from(sorted(plain.KINDS)), st.integers(-(2**63), 2**64 - 1))
        code = draw(st.sampled_from(expected) if draw(st.integers(0, 3)) else anything)
        kind = plain.KINDS.get(code)
        if kind is not None and draw(st.integers(0, 4)):
            corrupt = draw(st.booleans())
            fields = [
                draw(_PLAIN_ANY if corrupt and draw(st.booleans()) else valid)
                for valid in VALID[kind]
            ]
            if draw(st.integers(0, 4)) == 3:  # wrong arity
                fields = fields[: draw(st.integers(0, len(fields)))] + draw(
                    st.lists(_PLAIN_ANY, max_size=2)
                )
            fields = tuple(fields)
        else:
            fields = draw(_PLAIN_ANY)
        flat += [code, fields]
    if draw(st.integers(0, 7)) == 3:
        flat.append(draw(_PLAIN_ANY))  # a code without its record
    frames = [b""]
    body = msgpack.packb(flat, default=lambda v: plain._extension(v, frames))
    if draw(st.integers(0, 7)) == 3:  # an array thousands deep: as the batch, or in a record
        nest = b"\x91" * draw(st.sampled_from([100, 1023, 1024, 5000])) + b"\x01"
        kind = draw(st.sampled_from([p.Replicas, p.Transfers, p.StatusReply]))
        code = bytes([plain.CODES[kind]])
        body = nest if draw(st.booleans()) else b"\x92" + code + b"\x91" + nest
    if draw(st.integers(0, 4)) == 3:  # frames that belong to no value, or too few
        frames = frames[: draw(st.integers(1, len(frames)))]
        frames += draw(st.lists(st.binary(max_size=8), max_size=2))
    return [p.PLAIN_MAGIC + body, *frames[1:]]


@_FUZZ
@given(direction=st.sampled_from(sorted(DIRECTIONS)), data=st.data())
def test_fuzz_plain_batches_decode_valid_or_raise_protocol_error(direction, data):
    allowed = DIRECTIONS[direction]
    frames = data.draw(plain_batches(allowed))
    decoded = _decode_or_protocol_error(frames, allowed)
    for record in decoded or ():
        assert type(record) in allowed and type(record) in p.PLAIN_KINDS
    try:  # what a receiver that keeps the good records beside a bad one sees
        unpacked = p.unpack(frames, allowed)
    except ProtocolError:
        return
    for record in unpacked:
        try:
            p.check_fields(record)
        except ProtocolError as exc:
            str(exc)  # its message, bounded whatever the record holds
            p.task_ids_named(record)


def _comparable(value):
    if type(value) is Serialized:
        return ("Serialized", bytes(value.header), [bytes(b) for b in value.buffers])
    if isinstance(value, tuple):
        return (type(value).__name__, *(_comparable(v) for v in value))
    return value


@_FUZZ
@given(
    direction=st.sampled_from([d for d in sorted(DIRECTIONS) if d != "TO_WORKER"]), data=st.data()
)
def test_fuzz_valid_plain_records_round_trip_exactly(direction, data):
    """Every valid record of a plain direction travels as plain data and reads back as it
    was sent: same types, same values, buffers out of band in order."""
    allowed = DIRECTIONS[direction]
    kinds = sorted(allowed, key=lambda k: k.__name__)
    batch = data.draw(
        st.lists(
            st.sampled_from(kinds).flatmap(
                lambda kind: st.tuples(*VALID[kind]).map(lambda f, kind=kind: kind(*f))
            ),
            max_size=4,
        )
    )
    frames = p.encode(batch)
    assert bytes(frames[0][: len(p.PLAIN_MAGIC)]) == p.PLAIN_MAGIC
    decoded = p.decode([bytes(f) for f in frames], allowed)
    assert [_comparable(r) for r in decoded] == [_comparable(r) for r in batch]
    with pytest.raises(ProtocolError, match="pickled batch"):
        p.decode([p.MAGIC + pickle.dumps(batch, protocol=5)], allowed)


# -- end to end --------------------------------------------------------------------------


def inc(x):
    return x + 1


def divide_by_zero(x):
    return x / 0


def chunk(i):
    return np.arange(20_000, dtype="float64") * i  # 160 kB: travels between peers, out of band


def total(chunks):
    return float(sum(c.sum() for c in chunks))


def _record(path, pid, what):
    """Called by unpickling: notes which thread of process ``pid`` opened the pickle
    (a worker unpickles an exception once, to check that it travels: not noted)."""
    if os.getpid() == pid:
        with open(path, "a") as file:
            file.write(threading.current_thread().name + "\n")
    return what


class Traced(Exception):
    """An exception whose unpickling on the caller's side leaves a trace in ``path``."""

    def __init__(self, path, pid):
        super().__init__(f"traced into {path}")
        self.path, self.pid = path, pid

    def __reduce__(self):
        return (_rebuild_traced, (self.path, self.pid))


def _rebuild_traced(path, pid):
    return _record(path, pid, Traced(path, pid))


def raise_traced(x, path, pid):
    raise Traced(path, pid)


class Recorder:
    """A result whose unpickling leaves a trace in ``path``: what a worker could send."""

    def __init__(self, path, pid):
        self.path, self.pid = path, pid

    def __reduce__(self):
        return (_record, (self.path, self.pid, "recorded"))


class Bomb:
    """Unpickled anywhere, it creates ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _caller(func, *args, **kwargs):
    """``func`` run in a thread named "the-caller"; its outcome once joined."""
    outcome = {}

    def run():
        try:
            outcome["value"] = func(*args, **kwargs)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="the-caller", daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_by_default_a_tasks_exception_is_raised_as_itself_unpickled_in_the_callers_thread(
    shared_manager, tmp_path
):
    marker = tmp_path / "opened"
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        shared_manager.get({"x": (divide_by_zero, 1)}, "x")
    with pytest.raises(Traced):
        shared_manager.get({"t": (raise_traced, 1, str(marker), os.getpid())}, "t")
    assert marker.read_text() == "MainThread\n"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_declined_a_tasks_exception_is_never_unpickled_and_named_by_remote_task_error(tmp_path):
    marker = tmp_path / "opened"
    with Manager(unpickle_remote_exceptions=False) as manager:
        manager.start_workers(1, cores=1)
        with pytest.raises(RemoteTaskError) as info:
            manager.get({"x": 1, "y": (divide_by_zero, "x")}, "y", fuse=False)
        error = info.value
        assert not isinstance(error, ZeroDivisionError)
        assert (error.key, error.worker) == ("y", "local-0")
        assert error.type_name == "builtins.ZeroDivisionError"
        assert str(error).startswith(
            "task 'y' raised builtins.ZeroDivisionError on worker local-0: division by zero"
        )
        assert "divide_by_zero" in error.traceback and "return x / 0" in error.traceback
        assert isinstance(error.__cause__, RemoteTraceback)
        assert pickle.loads(pickle.dumps(error)).type_name == error.type_name

        with pytest.raises(RemoteTaskError, match="Traced") as info:
            manager.get({"t": (raise_traced, 1, str(marker), os.getpid())}, "t")
        assert info.value.type_name == f"{__name__}.Traced"
        dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b")}
        assert manager.get(dsk, "c") == dask.get(dsk, "c")
    assert not marker.exists()


def test_the_option_is_a_dask_config_setting_and_is_checked():
    with dask.config.set({"daskvine_py.manager.unpickle_remote_exceptions": False}):
        with Manager() as manager:
            assert manager.options.unpickle_remote_exceptions is False
    with pytest.raises(ValueError, match="unpickle_remote_exceptions must be True or False"):
        Manager(unpickle_remote_exceptions="no")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_pickled_batch_from_a_key_holder_is_dropped_unopened(tmp_path, caplog):
    """A registered worker and a stranger, both holding the keys, send pickles that
    would create a file when unpickled: nothing is opened; the worker is lost and told
    why, the stranger's batch dropped with a warning; runs beside them are right."""
    marker = tmp_path / "unpickled"
    bomb = pickle.dumps([Bomb(str(marker))], protocol=5)
    with Manager() as manager, caplog.at_level(logging.WARNING, "daskvine_py.manager"):
        manager.start_workers(2, cores=1)
        with KeyedWorker(manager, "liar") as liar, KeyedWorker(manager, register=False) as stranger:
            liar.sock.send_multipart([p.MAGIC + bomb])
            (shutdown,) = liar.receive(p.Shutdown, 1)
            assert "pickled batch" in shutdown.reason
            for frames in ([p.MAGIC + bomb], [p.MAGIC, bomb]):  # both layouts of old
                stranger.sock.send_multipart(frames)
                # told, in the pickle an old sender reads, that pickles are not read
                assert stranger.sock.poll(20_000)
                answer = stranger.sock.recv_multipart()
                (refusal,) = pickle.loads(answer[0][len(p.MAGIC) :])
                assert type(refusal) is p.Rejected and "reads no pickles" in refusal.reason
            stranger.send(p.StatusRequest(p.PROTOCOL_VERSION, "probe"))  # answered: plain
            assert stranger.sock.poll(20_000)
            (reply,) = p.decode(stranger.sock.recv_multipart(), p.TO_CLIENT)
            assert type(reply) is p.StatusReply
            assert not stranger.sock.poll(300)  # nothing more
        assert set(manager.workers) == {"local-0", "local-1"}
        dsk = {f"c{i}": (chunk, i) for i in range(6)}
        dsk["s"] = (total, [f"c{i}" for i in range(6)])
        assert manager.get(dsk, "s") == dask.get(dsk, "s")
        assert manager._thread.is_alive()
    assert not marker.exists()
    drops = [r.getMessage() for r in caplog.records if "unregistered" in r.getMessage()]
    assert drops and "pickled batch" in drops[0]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_output_a_worker_sends_is_unpickled_in_the_callers_thread_only(tmp_path):
    """The value travels inside a plain ``TaskDone`` as opaque bytes: the I/O thread
    passes it on, and the caller's own thread opens it."""
    marker = tmp_path / "opened"
    with Manager() as manager, KeyedWorker(manager, "keyed", cores=1) as keyed:
        thread, outcome = _caller(manager.get, {"x": (inc, 1)}, "x")
        (execute,) = keyed.receive(p.Execute, 1)
        assert execute.want_result
        value = Serialized(pickle.dumps(Recorder(str(marker), os.getpid()), protocol=5), [])
        keyed.send(p.TaskDone(execute.task_id, 64, 0.01, value, 0.0, 0.0))
        thread.join(60)
        assert outcome == {"value": "recorded"}
    assert marker.read_text() == "the-caller\n"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_pickle_sent_to_a_workers_peer_port_by_a_key_holder_is_dropped_unopened(tmp_path):
    marker = tmp_path / "unpickled"
    with Manager() as manager:
        manager.start_workers(1, cores=1)
        dsk = {"x": 1, "y": (inc, "x")}
        assert manager.get(dsk, "y") == dask.get(dsk, "y")
        keys = security.read_connection_file(manager.connection_file).keys
        (worker,) = manager.workers.values()
        context = zmq.Context()
        try:
            holder = dealer(
                context,
                worker["peer_address"],
                keys=(keys.worker_public, keys.worker_secret),
                server_key=keys.worker_public,
            )
            holder.send_multipart([p.MAGIC + pickle.dumps([Bomb(str(marker))], protocol=5)])
            assert not holder.poll(500)  # no answer to it
            holder.send_multipart(p.encode([p.GetData((123456789,))]))
            assert holder.poll(10_000)  # the port still serves, in plain data
            assert p.decode(holder.recv_multipart(), p.FROM_PEER) == [p.Data(123456789, None)]
        finally:
            context.destroy(linger=0)
        assert manager.get(dsk, "y") == dask.get(dsk, "y")
    assert not marker.exists()
