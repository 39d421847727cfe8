"""Locality for input files: the manager learns which worker's node holds which remote file
(``TaskDone.inputs``) and places the tasks that read it there, as it does for results; the
report and the dashboard count the files' bytes by where they came from.

The state is driven with literal records; the end-to-end test runs a real manager with
two local workers, each with an input cache of its own (two "nodes"), reading files
served over HTTP on 127.0.0.1 through ``daskvine_py.inputs``.
"""

from __future__ import annotations

import operator
import os
import time

import dask
import pytest
import zmq

from daskvine_py import Manager, inputs
from daskvine_py.errors import ProtocolError
from daskvine_py.inputs.store import Identity, InputCache, default_root
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.records import MAX_INPUT_FILES
from daskvine_py.wire.serialize import TaskEncoder, dumps, urls_in
from daskvine_py.worker.input_peers import InputPeers
from test_inputs import _Server, _write, http_server  # noqa: F401 (a fixture)

W1, W2 = b"w1", b"w2"
A = "root://eos.example.org//store/a.root"
B = "https://data.example.org/b.root"


def _joined(worker: bytes) -> s.WorkerJoined:
    return s.WorkerJoined(worker, worker.decode(), 1, f"tcp://{worker.decode()}:1")


def _executes(out: list[s.Instruction]) -> dict[str, bytes]:
    """Task key -> the worker it was sent to."""
    return {
        i.message.key: i.worker for i in out if type(i) is s.Send and type(i.message) is p.Execute
    }


def _reading(run_id: int, files: dict[str, str]) -> s.SubmitRun:
    """A run of independent tasks, key -> the file it reads, in priority order."""
    tasks = [
        s.NewTask(key, b"payload", (), (), priority, "read", 0, (url,))
        for priority, (key, url) in enumerate(files.items())
    ]
    return s.SubmitRun(run_id, tasks, list(files), 0)


def test_readers_of_a_file_go_where_a_task_obtained_it_and_bytes_count_by_source():
    state = s.SchedulerState(fixed_extra_tasks_per_core=0)
    state.handle([_joined(W1), _joined(W2)])
    placed = _executes(state.handle([_reading(1, {"r0": A, "r1": B})]))
    assert sorted(placed.values()) == [W1, W2]
    holder = {A: placed["r0"], B: placed["r1"]}
    reads = {
        A: ((A, 100, p.INPUT_FROM_STORAGE, "mtime=1"),),
        B: ((B, 300, p.INPUT_FROM_STORAGE, "etag=x"),),
    }
    done = []
    for task_id, (key, url) in enumerate((("r0", A), ("r1", B)), start=1):
        value = p.TaskDone(task_id, 1, 0.01, None)._replace(inputs=reads[url])
        done += state.handle([s.FromWorker(holder[url], value._replace(value=dumps(key)))])
    (finished,) = [i for i in done if type(i) is s.RunDone]
    (category,) = finished.categories.values()
    assert category.file_bytes_from_storage == 400
    assert category.file_bytes_from_cache == category.file_bytes_from_peers == 0

    # The second run lists B's reader first: on its own it would go to the first worker.
    placed = _executes(state.handle([_reading(2, {"s0": B, "s1": A})]))
    assert placed == {"s0": holder[B], "s1": holder[A]}

    # A worker that leaves takes its node's files with it: no target there any more.
    lost = holder[B]
    state.handle([s.WorkerLost(lost, "gone")])
    assert not state.ctx.input_files[B].holders
    assert all(file.holders.isdisjoint({lost}) for file in state.ctx.input_files.values())


def test_urls_are_found_in_a_task_payload_as_strings_of_their_own():
    encoder = TaskEncoder()
    payload, _ = encoder.encode(
        (
            operator.getitem,
            (A, "Events", 0, 100, False),
            {"calibration": B},
            "root:// alone",
            "see root://x//y",
        )
    )
    assert urls_in(payload) == (A, B)
    plain, _ = encoder.encode((operator.add, "/store/a.root", 1))
    assert urls_in(plain) == ()
    long = "root://eos.example.org//" + "x" * 300 + ".root"  # a 4-byte length
    payload, _ = encoder.encode((len, long))
    assert urls_in(payload) == (long,)


@pytest.mark.parametrize(
    "files",
    [
        ((A, -1, 0, ""),),
        ((A, 10, 4, ""),),
        ((A, 10, True, ""),),
        (("", 10, 0, ""),),
        ((A + "\n", 10, 0, ""),),
        ((A, 10, 0, "v\n"),),
        ((A, 10, 0),),
        ((A, 10, 0, ""),) * (MAX_INPUT_FILES + 1),
    ],
)
def test_a_task_done_naming_bad_files_is_refused(files):
    message = p.TaskDone(1, 1, 0.1, None)._replace(inputs=files)
    with pytest.raises(ProtocolError, match="TaskDone"):
        p.check_fields(message)
    p.check_fields(message._replace(inputs=((A, 10, 0, "mtime=1"), (B, 0, 2, ""))))


def test_take_reads_names_each_file_once_by_its_first_source(
    tmp_path,
    monkeypatch,
    http_server,  # noqa: F811
):
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(inputs, "_caches", {})
    _write(http_server.directory / "one.root", b"1" * 1000, 1_700_000_000)
    _write(http_server.directory / "two.root", b"2" * 20, 1_700_000_000)
    one, two = http_server.url("one.root"), http_server.url("two.root")
    inputs.take_reads()
    try:
        inputs.local_path(one)
        inputs.local_path(one)
        inputs.local_path(two)
        version = "last-modified=Tue, 14 Nov 2023 22:13:20 GMT"
        assert [read[:3] for read in inputs.take_reads()] == [
            (one, 1000, inputs.FROM_STORAGE),
            (two, 20, inputs.FROM_STORAGE),
        ]
        assert inputs.take_reads() == ()
        inputs.local_path(one)
        ((url, size, source, seen),) = inputs.take_reads()
        assert (url, size, source) == (one, 1000, inputs.FROM_CACHE)
        assert seen.startswith(version)
        assert (inputs.FROM_STORAGE, inputs.FROM_CACHE, inputs.FROM_PEER) == (
            p.INPUT_FROM_STORAGE,
            p.INPUT_FROM_CACHE,
            p.INPUT_FROM_PEER,
        )
    finally:
        inputs.release()


def read_size(url: str) -> int:
    with inputs.open(url) as file:
        return len(file.read())


@pytest.mark.timeout(120)
def test_a_second_run_reads_each_file_where_a_node_holds_it(
    tmp_path,
    monkeypatch,
    http_server,  # noqa: F811
):
    """Two workers, each with a cache of its own (two nodes). The first run reads four
    files on each, placed there by annotation; the second, with no annotation and its
    tasks in another order, reads every file from the node that holds it (its cache, or,
    for a task an idle worker took from the other, pulled from there): not one byte from
    the server. The placement itself is the state test's above."""
    sizes = {f"f{i}.root": 10_000 * (i + 1) for i in range(8)}
    for name, size in sizes.items():
        _write(http_server.directory / name, bytes([len(name)]) * size, 1_700_000_000)
    urls = [http_server.url(name) for name in sizes]
    total = sum(sizes.values())
    with Manager() as manager:
        for i in range(2):  # each worker's libraries inherit its cache
            monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / f"node{i}"))
            manager.start_workers(1, cores=2)
        names = sorted(manager.workers)

        first = []
        for i, url in enumerate(urls):
            with dask.annotate(workers=[names[i % 2]]):
                first.append(dask.delayed(read_size)(url, dask_key_name=f"first-{i}"))
        got = dask.compute(*first, scheduler=manager.get, cache_inputs=True)
        assert list(got) == list(sizes.values())
        (category,) = manager.last_run.categories.values()
        assert category.file_bytes_from_storage == total
        assert category.file_bytes_from_cache == 0
        gets = http_server.count("GET")
        assert gets == 8

        second = [
            dask.delayed(read_size)(url, dask_key_name=f"second-{i}")
            for i, url in reversed(list(enumerate(urls)))
        ]
        got = dask.compute(*second, scheduler=manager.get, cache_inputs=True)
        assert list(got) == list(reversed(sizes.values()))
        assert http_server.count("GET") == gets  # nothing fetched from the server again
        (category,) = manager.last_run.categories.values()
        assert category.file_bytes_from_storage == 0
        # (a task an idle worker took from the other pulls its file from that node)
        assert category.file_bytes_from_cache + category.file_bytes_from_peers == total

        page = tmp_path / "report.html"
        manager.report(page)
        assert "files from storage MB" in page.read_text()
    assert dask.compute(*second, scheduler="sync") == tuple(reversed(sizes.values()))


# -- peers as the source ----------------------------------------------------------------


def test_the_readers_of_a_file_no_node_holds_go_where_the_first_went():
    """Read for the first time, a file's chunks are all ready at once: queued where the
    first went, they are not spread over every worker (each would fetch the whole file)."""
    state = s.SchedulerState(fixed_extra_tasks_per_core=3)
    state.handle([_joined(W1), _joined(W2)])
    chunks = {f"a{i}": A for i in range(4)} | {f"b{i}": B for i in range(4)}
    placed = _executes(state.handle([_reading(1, dict(sorted(chunks.items())))]))
    by_file = {url: {placed[k] for k in chunks if chunks[k] == url} for url in (A, B)}
    assert len(by_file[A]) == len(by_file[B]) == 1, placed
    assert by_file[A] != by_file[B]  # (the other worker took the first chunk of B)
    assert not state.ctx.input_files[A].readers and not state.ctx.input_files[B].readers


def test_readers_forgotten_unsent_leave_their_files():
    state = s.SchedulerState()
    state.handle([_reading(1, {"r0": A, "r1": A})])  # no worker: they wait, ready
    assert len(state.ctx.input_files[A].readers) == 2
    state.handle([s.CancelRun(1)])
    assert not state.ctx.input_files[A].readers


def _second_run_of_two_readers(config: p.RunConfig, other_cache: str) -> list[s.Instruction]:
    """A first run reads A on one worker (which serves its cache at 10.0.0.1:7); then two
    readers of A come, and the holder, with one core, takes one: what goes to the other
    worker (whose cache is ``other_cache``) with the second."""
    state = s.SchedulerState(fixed_extra_tasks_per_core=0)
    state.handle([_joined(W1), _joined(W2)])
    (holder,) = _executes(state.handle([_reading(1, {"r0": A})._replace(config=config)])).values()
    other = W2 if holder == W1 else W1
    state.handle([s.FromWorker(holder, p.InputServer("tcp://10.0.0.1:7", "node-a:/cache"))])
    state.handle([s.FromWorker(other, p.InputServer("tcp://10.0.0.2:7", other_cache))])
    done = p.TaskDone(1, 1, 0.01, dumps(1))._replace(inputs=((A, 100, 0, "mtime=1"),))
    state.handle([s.FromWorker(holder, done)])
    second = _reading(2, {"s0": A, "s1": A})._replace(config=config._replace(run_id=2))
    out = state.handle([second])
    assert _executes(out) == {"s0": holder, "s1": other}
    return [i for i in out if type(i) is s.Send and i.worker == other]


def test_a_worker_lacking_a_file_is_sent_its_holders_before_the_task():
    config = p.RunConfig(1, "function-calls", "direct", (), (), False, inputs="worker")
    sent = [i.message for i in _second_run_of_two_readers(config, "node-b:/cache")]
    kinds = [type(m) for m in sent]
    assert kinds.index(p.FetchInputs) < kinds.index(p.Execute)
    (fetch,) = [m for m in sent if type(m) is p.FetchInputs]
    assert fetch == p.FetchInputs(2, "worker", ((A, 100, "mtime=1", ("tcp://10.0.0.1:7",)),))
    p.check_fields(fetch)
    # Not where peers are forbidden, nor to a worker that shares the holder's cache.
    for other, cache in (
        (config._replace(input_peers=False), "node-b:/cache"),
        (config, "node-a:/cache"),
    ):
        sent = [i.message for i in _second_run_of_two_readers(other, cache)]
        assert p.FetchInputs not in [type(m) for m in sent]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("peers", [True, False])
def test_a_node_lacking_a_file_pulls_it_from_a_node_that_holds_it_unless_forbidden(
    tmp_path,
    monkeypatch,
    http_server,  # noqa: F811
    peers,
):
    """Two workers, each with a cache of its own. The first run reads four files on one;
    the second must run on the other (annotated): with ``input_peers`` it pulls them from
    the first's input server, not one byte from the storage; without, from the storage."""
    sizes = {f"p{i}.root": 3_000_000 + i for i in range(4)}  # a transfer of several chunks
    for name, size in sizes.items():
        _write(http_server.directory / name, os.urandom(size), 1_700_000_000)
    urls = [http_server.url(name) for name in sizes]
    total = sum(sizes.values())
    with Manager() as manager:
        for i in range(2):
            monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / f"node{i}"))
            manager.start_workers(1, cores=2)
        first_worker, second_worker = sorted(manager.workers)

        def on(worker: str, tag: str) -> list:
            with dask.annotate(workers=[worker]):
                return [
                    dask.delayed(read_size)(url, dask_key_name=f"{tag}-{i}")
                    for i, url in enumerate(urls)
                ]

        options = {"cache_inputs": True, "input_peers": peers}
        got = dask.compute(*on(first_worker, "first"), scheduler=manager.get, **options)
        assert list(got) == list(sizes.values())
        gets = http_server.count("GET")
        assert gets == 4
        got = dask.compute(*on(second_worker, "second"), scheduler=manager.get, **options)
        assert list(got) == list(sizes.values())
        (category,) = manager.last_run.categories.values()
        if peers:
            assert http_server.count("GET") == gets  # none from the storage
            assert category.file_bytes_from_peers == total
            assert category.file_bytes_from_storage == 0
        else:
            assert http_server.count("GET") == gets + 4
            assert category.file_bytes_from_storage == total
            assert category.file_bytes_from_peers == 0
        for i, name in enumerate(sizes):  # the copies on the second node are the files
            (copy,) = (tmp_path / "node1" / "entries").glob(f"*/{name}")
            assert copy.read_bytes() == (http_server.directory / name).read_bytes(), i


def test_a_file_a_node_let_go_is_no_longer_placed_there():
    state = s.SchedulerState(fixed_extra_tasks_per_core=0)
    state.handle([_joined(W1), _joined(W2)])
    (holder,) = _executes(state.handle([_reading(1, {"r0": A})])).values()
    done = p.TaskDone(1, 1, 0.01, dumps(1))._replace(inputs=((A, 100, 0, "mtime=1"),))
    state.handle([s.FromWorker(holder, done)])
    assert state.ctx.input_files[A].holders == {state.workers[holder]}
    (worker,) = _executes(state.handle([_reading(2, {"r1": B})])).values()
    gone = p.TaskDone(2, 1, 0.01, dumps(1))._replace(
        inputs=((A, 0, p.INPUT_DROPPED, "mtime=1"), (B, 5, 0, "etag=1"))
    )
    state.handle([s.FromWorker(worker, gone)])
    files = state.ctx.input_files
    assert state.workers[worker] not in files[A].holders
    assert files[A].holders == ({state.workers[holder]} if worker != holder else set())
    assert files[B].holders == {state.workers[worker]}


def test_an_eviction_is_reported_with_the_reads(tmp_path, monkeypatch, http_server):  # noqa: F811
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE_BYTES", "1500")
    monkeypatch.setattr(inputs, "_caches", {})
    _write(http_server.directory / "one.root", b"1" * 1000, 1_700_000_000)
    _write(http_server.directory / "two.root", b"2" * 1000, 1_700_000_000)
    one, two = http_server.url("one.root"), http_server.url("two.root")
    inputs.take_reads()
    try:
        inputs.local_path(one)
        inputs.release()  # (a later task: "one" is no longer in use)
        inputs.take_reads()
        inputs.local_path(two)  # 2,000 bytes do not fit in 1,500: "one" goes
        reads = inputs.take_reads()
        assert [(url, size, source) for url, size, source, _ in reads] == [
            (one, 0, inputs.DROPPED),
            (two, 1000, inputs.FROM_STORAGE),
        ]
        assert inputs.DROPPED == p.INPUT_DROPPED
    finally:
        inputs.release()


def test_what_a_node_holds_as_its_worker_joins_places_the_first_readers():
    state = s.SchedulerState(fixed_extra_tasks_per_core=0)
    state.handle([_joined(W1), _joined(W2)])
    held = p.InputServer("", "node-2:/cache", ((A, 100, "mtime=1"),))
    p.check_fields(held)
    state.handle([s.FromWorker(W2, held)])
    assert _executes(state.handle([_reading(1, {"r0": A})])) == {"r0": W2}


@pytest.mark.timeout(120)
def test_a_joining_worker_tells_what_its_node_holds(tmp_path, monkeypatch, http_server):  # noqa: F811
    """A node's cache kept from before (``"forever"``) is known as its worker joins."""
    _write(http_server.directory / "kept.root", b"k" * 5000, 1_700_000_000)
    url = http_server.url("kept.root")
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "node"))
    monkeypatch.setattr(inputs, "_caches", {})
    with inputs.using("forever"):  # (as a run of an earlier manager left it)
        inputs.local_path(url)
    with Manager() as manager:
        manager.start_workers(1)
        deadline = time.monotonic() + 30
        while not manager._state.ctx.input_files and time.monotonic() < deadline:
            time.sleep(0.05)  # (the state takes it in the I/O thread)
        (file,) = manager._state.ctx.input_files.values()
        assert (file.url, file.nbytes) == (url, 5000)
        assert [w.name for w in file.holders] == list(manager.workers)


@pytest.mark.timeout(120)
def test_files_a_run_s_lifetime_removed_are_no_longer_placed(
    tmp_path,
    monkeypatch,
    http_server,  # noqa: F811
):
    """``cache_inputs="run"``: as the run ends its files go from the node, and the worker
    says so (``InputsDropped``): the manager no longer counts it a holder."""
    _write(http_server.directory / "brief.root", b"b" * 4000, 1_700_000_000)
    url = http_server.url("brief.root")
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "node"))
    with Manager() as manager:
        manager.start_workers(1)
        task = dask.delayed(read_size)(url)
        assert dask.compute(task, scheduler=manager.get, cache_inputs="run") == (4000,)
        files = manager._state.ctx.input_files
        deadline = time.monotonic() + 30
        while (url not in files or files[url].holders) and time.monotonic() < deadline:
            time.sleep(0.05)  # (the cleanup, then its report, follow the run's end)
        assert url in files and not files[url].holders
        assert not list((tmp_path / "node" / "entries").glob("*/brief.root"))


def test_a_cleanup_records_what_it_removed(tmp_path):
    from daskvine_py.inputs.store import Identity, InputCache

    with InputCache(str(tmp_path), 10**6) as cache:
        identity = Identity("root://eos//a.root", 3, "mtime=1")
        cache.fill(identity, lambda part: open(part, "wb").write(b"abc"), 5.0)
        cache.release()
        cleanup = cache.cleanup(lambda claim: True)
        assert cleanup.removed == [identity.key]
        assert cache.dropped == [identity]


@pytest.mark.timeout(30)
def test_a_worker_closing_while_it_pulls_from_a_silent_peer_stops_the_pull_at_once(
    tmp_path, monkeypatch
):
    """A peer that takes the request and never answers held a closing worker 5 s (its
    join's limit; the pull itself waits 30 s): the pull stops, the queued one is let go,
    and both entries' locks are free for the node's other processes."""
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "node"))
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    peers = InputPeers("w", "127.0.0.1", None)
    try:
        files = tuple((url, 10, "mtime=1", (f"tcp://127.0.0.1:{port}",)) for url in (A, B))
        peers.fetch(p.FetchInputs(1, "worker", files))
        assert silent.poll(10_000)  # the first pull asked, and waits for an answer
        start = time.monotonic()
        peers.close()
        assert time.monotonic() - start < 1.0
        assert peers.failed == 0  # stopped, not failed
        cache = InputCache(default_root(), 10**6)
        try:
            for url in (A, B):
                descriptor = cache.reserve(Identity(url, 10, "mtime=1").key)
                assert descriptor is not None, url  # its lock was let go
                os.close(descriptor)
        finally:
            cache.close()
    finally:
        silent.close()
        context.term()
