"""The data plane on real workers: peer transfers and their accounting, bounded fetches,
spilling past --memory, replicas, and recomputing exactly what a lost worker held."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import dask
import numpy as np
import pytest
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from beacon import Beacon, ping
from daskvine_py import Manager
from daskvine_py.manager.launch import spawn
from daskvine_py.report.runinfo import MANAGER

pytestmark = pytest.mark.integration

MB = 2**20


def wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def block(i, mb=8):
    return np.full(mb * MB // 8, float(i))


def dot(a, b):
    return float(a @ b)


def total(*values):
    return sum(values)


def test_pairwise_8mb_intermediates_move_between_peers_never_through_the_manager(
    shared_manager,
):
    """100 x 8 MB arrays combined pairwise: the manager receives the scalars only."""
    n = 100
    dsk = {f"a{i}": (block, i) for i in range(n)}
    dsk.update({f"c{i}": (dot, f"a{i}", f"a{(i + 1) % n}") for i in range(n)})
    keys = [f"c{i}" for i in range(n)]
    before = shared_manager.received_bytes
    got = shared_manager.get(dsk, keys)
    assert got == dask.get(dsk, keys)
    received = shared_manager.received_bytes - before
    assert received < 1 * MB  # one relayed intermediate alone would be 8 MB
    transfers = shared_manager.last_run.transfers
    to_manager = sum(v for (_, dst), v in transfers.items() if dst == MANAGER)
    assert 0 < to_manager < received
    between_workers = {pair: v for pair, v in transfers.items() if MANAGER not in pair}
    # Neighbours on different workers travel peer to peer, as whole 8 MB arrays.
    assert between_workers and all(v >= 8 * MB for v in between_workers.values())
    assert set(between_workers) <= {("local-0", "local-1"), ("local-1", "local-0")}
    assert shared_manager.transfers.keys() >= transfers.keys()


def small_block(i):
    # A little work each, so that both workers take their share even when one of them is
    # still importing numpy (otherwise the other steals nearly all of them, rightly).
    time.sleep(0.02)
    return np.full(20_000, float(i))


def gather(*blocks):
    return float(sum(b.sum() for b in blocks))


def test_a_task_with_many_inputs_on_one_peer_fetches_them_all_in_bounded_batches(
    shared_manager,
):
    """120 inputs, about half of them on the other worker: more than the per-peer bound
    of fetches in flight, so most wait their turn; all arrive and the sum is right."""
    n = 120
    dsk = {f"s{i}": (small_block, i) for i in range(n)}
    dsk["all"] = (gather, *[f"s{i}" for i in range(n)])
    assert shared_manager.get(dsk, "all", reduction_arity=None) == dask.get(dsk, "all")
    moved = sum(v for pair, v in shared_manager.last_run.transfers.items() if MANAGER not in pair)
    assert moved >= 20 * 160_000  # the inputs held by the other worker came over


def test_a_tree_of_small_partial_results_moves_nothing_between_peers(shared_manager):
    """Small results ride inside TaskDone and Execute: the partial sums of a bag reduce
    across both workers without a single fetch from a peer."""
    import dask.bag as db

    total = db.from_sequence(range(2_000), npartitions=200).map(lambda x: x * 3).sum()
    assert dask.compute(total, scheduler=shared_manager.get) == dask.compute(
        total, scheduler="sync"
    )
    transfers = shared_manager.last_run.transfers
    assert not {pair: v for pair, v in transfers.items() if MANAGER not in pair}, transfers
    inline = {dst: v for (src, dst), v in transfers.items() if src == MANAGER}
    assert inline and all(v > 0 for v in inline.values()), transfers  # partials came inline


def test_a_popular_result_feeds_many_tasks_on_both_workers(shared_manager):
    dsk = {"p": (block, 1, 2)}
    dsk.update({f"u{i}": (dot, "p", f"v{i}") for i in range(60)})
    dsk.update({f"v{i}": (block, i, 2) for i in range(60)})
    keys = [f"u{i}" for i in range(60)]
    assert shared_manager.get(dsk, keys) == dask.get(dsk, keys)


def spill_files(root):
    return [
        os.path.join(d.path, "spill", f)
        for d in os.scandir(root)
        if os.path.isdir(os.path.join(d.path, "spill"))
        for f in os.listdir(os.path.join(d.path, "spill"))
    ]


def checksum(a):
    return float(a[::4096].sum())


def shifted(a, barrier):
    return float(a[::4096].sum()) + barrier


def test_2gb_of_intermediates_complete_with_200mb_of_memory_by_spilling(tmp_path):
    """256 x 8 MB arrays all held until a barrier: each worker spills past --memory 200,
    reads them back, and leaves no spill file behind."""
    n = 256
    dsk = {f"a{i}": (block, i) for i in range(n)}
    dsk.update({f"s{i}": (checksum, f"a{i}") for i in range(n)})
    dsk["barrier"] = (total, *[f"s{i}" for i in range(n)])
    dsk.update({f"b{i}": (shifted, f"a{i}", "barrier") for i in range(n)})
    dsk["out"] = (total, *[f"b{i}" for i in range(n)])
    expected = dask.get(dsk, "out")
    workdir = tmp_path / "work"
    with Manager() as manager:
        manager.start_workers(2, memory=200, workdir=str(workdir))
        result = {}
        thread = threading.Thread(target=lambda: result.update(v=manager.get(dsk, "out")))
        thread.start()
        most = 0
        while thread.is_alive():
            most = max(most, len(spill_files(workdir)))
            time.sleep(0.05)
        thread.join()
        assert result["v"] == expected
        # More than 1.5 GB were on disk at once: every worker spilled all but ~200 MB.
        assert most * 8 * MB > 1.5 * 2**30
        wait_until(lambda: not spill_files(workdir))
    assert os.listdir(workdir) == []  # each worker removed its own directory


def test_a_worker_past_its_disk_limit_gets_no_new_work_until_it_has_room(tmp_path):
    """One worker may hold 64 MB in memory (tasks and results together) and 96 MB on disk:
    it fills up, says so, and the other worker takes the rest of the work; the answer is
    right, no file is left."""
    n = 40
    # 8 x 24 MB pinned to the limited worker overflow its 160 MB, however the scheduler
    # splits the other 32 (a busy machine once left it only 7 of 40 unpinned blocks).
    pinned = {f"a{i}": (block, i, 24) for i in range(8)}
    dsk = {f"a{i}": (block, i, 24) for i in range(8, n)}
    dsk.update({f"s{i}": (checksum, f"a{i}") for i in range(n)})
    dsk["barrier"] = (total, *[f"s{i}" for i in range(n)])
    dsk.update({f"b{i}": (shifted, f"a{i}", "barrier") for i in range(n)})
    dsk["out"] = (total, *[f"b{i}" for i in range(n)])
    graph = HighLevelGraph(
        {
            "pinned": MaterializedLayer(pinned, annotations={"workers": ["limited"]}),
            "rest": MaterializedLayer(dsk),
        },
        {"pinned": set(), "rest": {"pinned"}},
    )
    workdir = tmp_path / "work"
    full, room = threading.Event(), threading.Event()

    def watch(lines):
        """The limited worker says when it tells the manager it is full, and not any more."""
        for line in lines:
            if "disk full: True" in line:
                full.set()
            elif "disk full: False" in line and full.is_set():
                room.set()

    with Manager() as manager:
        limited = spawn(
            manager.address,
            name="limited",
            extra_args=["--memory", "64", "--disk", "96", "--workdir", str(workdir)],
            connection_file=manager.connection_file,
            stderr=subprocess.PIPE,
            text=True,
        )
        watcher = threading.Thread(target=watch, args=(limited.stderr,))
        watcher.start()
        try:
            manager.wait_for_workers(1, processes=[limited])
            manager.start_workers(1, workdir=str(workdir))
            assert manager.get(graph, "out") == dask.get({**pinned, **dsk}, "out")
            assert full.wait(30)
            assert room.wait(30)  # its results released: it takes work again
            wait_until(lambda: not spill_files(workdir))
        finally:
            manager.close()
            try:
                limited.wait(20)
            except subprocess.TimeoutExpired:
                limited.kill()
                limited.wait()
            watcher.join(20)


def produce(i, path):
    with open(os.path.join(path, f"a{i}"), "a") as log:
        log.write("ran\n")
    # Longer than a short task (``dispatch.SHORT_TASK``): none is queued in the pipe of
    # the library that runs the gate, where it would wait for the gate the test holds.
    time.sleep(0.06)
    return np.full(1000, float(i))


def gate(address):
    """Tell the test which worker runs this (its process's parent), then wait until the test
    opens the gate; without a test to ask (Dask's scheduler), pass at once."""
    if address is not None:
        ping(address, str(os.getppid()).encode(), hold=True)
    return 0.0


def combine(a, g):
    return float(a.sum()) + g


def _gated_graph(path, address=None, n=20):
    """a_i all finish, then wait (held on their workers) while one worker runs the gate."""
    dsk = {f"a{i}": (produce, i, path) for i in range(n)}
    dsk["gate"] = (gate, address)
    dsk.update({f"b{i}": (combine, f"a{i}", "gate") for i in range(n)})
    dsk["total"] = (total, *[f"b{i}" for i in range(n)])
    return dsk


def _executions(path):
    return sum(len(open(e.path).readlines()) for e in os.scandir(path))


def _kill_during_the_gate(manager, path, replicas):
    """Run the gated graph; once every a_i is done, SIGKILL the worker not running the gate,
    then open the gate.

    Returns the result, the a_i that existed only on the victim, and the state's count
    of recomputed results. Which results only the victim held, and that the manager knows
    every a_i done, come from the manager's private state: it offers no public view of
    where results are."""
    state = manager._state
    before = state.recomputed
    result = {}
    beacon = Beacon()
    dsk = _gated_graph(path, beacon.address)
    thread = threading.Thread(
        target=lambda: result.update(v=manager.get(dsk, "total", replicas=replicas))
    )
    thread.start()
    gate_pid, gate_conn = beacon.accept()  # the gate runs, and waits for us

    def a_tasks():
        (run,) = list(state.runs.values())
        return [t for k, t in list(run.tasks.items()) if k.startswith("a")]

    def settled():
        return all(t.state == "memory" and len(t.who_has) >= replicas for t in a_tasks())

    try:
        wait_until(settled)
        (victim,) = [n for n, w in manager.workers.items() if w["pid"] != int(gate_pid)]
        lost = {t.key for t in a_tasks() if {w.name for w in list(t.who_has)} == {victim}}
        os.kill(manager.workers[victim]["pid"], signal.SIGKILL)
    finally:
        gate_conn.close()  # open the gate
        beacon.close()
    thread.join(60)
    assert not thread.is_alive()
    return result["v"], lost, state.recomputed - before


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_killed_worker_costs_exactly_the_recomputation_of_what_only_it_held(
    manager, tmp_path, replicas
):
    """One copy: exactly the results only the victim held are recomputed (and that set is
    not empty). Two replicas: nothing is recomputed."""
    (tmp_path / "sync").mkdir()
    (tmp_path / "run").mkdir()
    expected = dask.get(_gated_graph(str(tmp_path / "sync")), "total")
    value, lost, recomputed = _kill_during_the_gate(manager, str(tmp_path / "run"), replicas)
    assert value == expected
    if replicas == 1:
        assert lost  # the victim ran a_i while the other worker ran the gate
    else:
        assert lost == set()
    assert recomputed == len(lost)
    assert _executions(tmp_path / "run") == 20 + len(lost)


def big_block(i):
    return np.full(50_000, float(i))  # 400 kB: fetched from its holder, never inlined


def test_workers_that_cannot_reach_each_other_get_results_through_the_manager(caplog):
    """Each worker advertises a peer address where nothing listens (as batch nodes that
    cannot open connections to one another): every input held by the other worker comes
    through the manager, counted in the transfers and reported once per pair; no task
    fails."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
        dsk = {f"a{i}": (big_block, i) for i in range(8)}
        dsk["out"] = (total, *[(np.sum, f"a{i}") for i in range(8)])
        dsk["pairs"] = (total, *[(np.sum, (np.add, f"a{i}", f"a{7 - i}")) for i in range(8)])
        expected = dask.get(dsk, ["out", "pairs"])
        with Manager() as manager:
            procs = [
                spawn(
                    manager.address,
                    name=f"cut-{n}",
                    connection_file=manager.connection_file,
                    extra_args=["--contact-address", dead, "--fetch-timeout", "1"],
                )
                for n in range(2)
            ]
            try:
                manager.wait_for_workers(2, processes=procs)
                with caplog.at_level("WARNING", logger="daskvine_py.manager"):
                    assert manager.get(dsk, ["out", "pairs"]) == expected
                run = manager.last_run
                assert run.relayed and all(n > 0 for _, _, n in run.relayed), run.relayed
                for holder, reader, nbytes in run.relayed:
                    assert {holder, reader} == {"cut-0", "cut-1"}
                    assert run.transfers[(holder, MANAGER)] >= nbytes  # both legs counted
                    assert run.transfers[(MANAGER, reader)] >= nbytes
                assert ("cut-0", "cut-1") not in run.transfers  # nothing went directly
                assert ("cut-1", "cut-0") not in run.transfers
                warned = [r for r in caplog.records if "go through the manager" in r.message]
                assert 1 <= len(warned) <= 2  # once per (holder, reader) pair
            finally:
                manager.close()
                for proc in procs:
                    proc.wait(20)
