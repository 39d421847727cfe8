"""The worker's sans-I/O state: literal events in, instructions out, in milliseconds.

Every transition of ``state._TRANSITIONS`` is driven here by the event that takes
it; the end of the file is a hypothesis-driven worker (random graphs of tasks with local,
peer and inline inputs, library crashes, cancels, withdraws and peer failures) checking
that every task is reported exactly once and that nothing is left behind.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from daskvine_py.errors import InvalidTransition
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import fetching, pipe, serving
from daskvine_py.worker import state as ws
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store

ME = "tcp://me:1"


def make(libraries=1, slots=1, ready=True, **kwargs):
    state = WorkerState(Store(), name="w", peer_address=ME, **kwargs)
    libs = [state.add_library(i, slots) for i in range(libraries)]
    if ready:
        for lib in libs:
            state.on_library_ready(lib)
    return state, libs


def execute(task_id, *deps, run_id=0, keep=True, want=False):
    return p.Execute(task_id, f"k{task_id}", b"payload", tuple(deps), want, run_id, keep)


def held(dep_id):
    return p.DepLocation(dep_id, f"k{dep_id}", ())


def at(dep_id, *peers):
    return p.DepLocation(dep_id, f"k{dep_id}", peers)


def computed_here(dep_id):
    return p.DepLocation(dep_id, f"k{dep_id}", None)


def inline(dep_id, value):
    return p.DepLocation(dep_id, f"k{dep_id}", (), dumps(value))


def done(task_id, value=None, duration=0.01):
    """A library's reply with the result serialized (sent, or a process's result)."""
    value = dumps(value if value is not None else task_id)
    return pipe.Done(task_id, value, duration, value.nbytes)


def done_live(task_id, nbytes=10_000, duration=0.01):
    """A library's reply for a result it keeps live, and did not send."""
    return pipe.Done(task_id, None, duration, nbytes, True)


def started(state):
    """The task ids of each library request that ``start_runnable`` returns."""
    return [(lib.id, [call.task_id for call in run.calls]) for lib, run in state.start_runnable()]


def test_a_task_with_no_inputs_runs_and_is_reported_done():
    state, (lib,) = make()
    state.on_manager_message(execute(1, want=True), now=5.0)
    assert state.tasks[1].state == "queued" and state.last_contact == 5.0
    ((sent_to, run),) = state.start_runnable()
    assert sent_to is lib and run.config is None and run.functions == []
    assert run.calls == [pipe.Call(1, "k1", b"payload", [], keep=True, send=True)]
    assert state.tasks[1].state == "running" and list(lib.sent) == [1]
    state.end_pass(0.0)  # once per loop pass: the tasks sent to run since the last one
    assert state.outbox == [p.Started((1,))]
    state.outbox.clear()
    state.on_library_reply(lib, done(1, 42), wall=100.0)
    (report,) = state.outbox
    assert type(report) is p.TaskDone and report.task_id == 1 and report.finished == 100.0
    assert loads(report.value) == 42 and loads(state.store.get(1)) == 42
    assert not state.tasks and not lib.sent and not list(state.leaks())


def test_an_output_nothing_reads_is_not_kept():
    state, (lib,) = make()
    state.on_manager_message(execute(1, keep=False), 0.0)
    state.start_runnable()
    state.on_library_reply(lib, done(1), 0.0)
    assert 1 not in state.store


def test_an_output_the_cache_keeps_stays_here_only_when_too_large_to_travel_inline():
    state, (lib,) = make()
    for task_id in (1, 2):
        state.on_manager_message(execute(task_id, keep=None, want=True), 0.0)
    # The library keeps neither live: it sends both, and the worker decides by size.
    ((_, run),) = state.start_runnable()
    assert [(c.keep, c.send) for c in run.calls] == [(None, True)]
    state.on_library_reply(lib, done(1, "small"), 0.0)
    ((_, run),) = state.start_runnable()
    assert [(c.keep, c.send) for c in run.calls] == [(None, True)]
    state.on_library_reply(lib, done(2, "x" * 10 * p.INLINE_BYTES), 0.0)
    assert 1 not in state.store and 2 in state.store  # 1: the manager holds it
    assert [m.value is not None for m in state.outbox if type(m) is p.TaskDone] == [True, True]


def test_inputs_held_or_inline_go_with_the_call():
    state, _ = make()
    state.store.put(7, dumps("seven"))
    state.on_manager_message(execute(1, held(7), inline(8, "eight")), 0.0)
    ((_, run),) = state.start_runnable()
    (call,) = run.calls
    assert [(key, dep_id, loads(value)) for key, dep_id, value in call.inputs] == [
        ("k7", 7, "seven"),
        ("k8", 8, "eight"),
    ]


def test_an_input_from_a_peer_is_fetched_then_the_task_runs():
    state, _ = make()
    state.on_manager_message(execute(1, at(7, "tcp://a:1")), now=0.0)
    assert state.tasks[1].state == "waiting" and state.peer_outbox == {"tcp://a:1": [7]}
    assert state.fetcher.fetches[7].deadline == 10.0 and state.poll_timeout(0.0) == 10.0
    state.on_data(p.Data(7, dumps("seven")), now=1.0)
    assert state.tasks[1].state == "queued" and 7 in state.store and not state.fetcher.fetches
    assert state.outbox == [p.Replicas((7,))]
    state.end_pass(1.0)
    assert state.outbox[-1] == p.Transfers((("tcp://a:1", dumps("seven").nbytes),))
    assert started(state) == [(0, [1])]


def test_a_peer_without_the_input_passes_the_fetch_to_the_next_and_the_last_fails_it():
    state, _ = make()
    state.on_manager_message(execute(1, at(7, "tcp://a:1", "tcp://b:1")), 0.0)
    (first,) = state.peer_outbox
    state.peer_outbox.clear()
    state.on_data(p.Data(7, None), 0.0)
    (second,) = state.peer_outbox
    assert {first, second} == {"tcp://a:1", "tcp://b:1"}
    state.on_data(p.Data(7, None), 0.0)
    (failed,) = state.outbox
    assert type(failed) is p.FetchFailed and failed.task_id == 1 and failed.dep_id == 7
    state.peer_outbox.clear()
    assert not state.tasks and not list(state.leaks())


def test_a_silent_peer_times_out_and_its_socket_is_reset():
    state, _ = make(fetch_timeout=2.0)
    state.on_manager_message(execute(1, at(7, "tcp://a:1")), now=0.0)
    assert state.on_timers(1.9) == []
    assert state.on_timers(2.0) == ["tcp://a:1"]
    # No holder answered: the fetch goes through the manager, and fails after that.
    assert state.outbox == [p.Relay((7,))] and state.fetcher.fetches[7].current == fetching.RELAY
    assert state.on_timers(4.0) == [fetching.RELAY]  # (a peer socket by that name: none)
    assert type(state.outbox[-1]) is p.FetchFailed and not state.tasks


def test_an_input_no_holder_can_serve_directly_comes_through_the_manager():
    state, _ = make(fetch_timeout=2.0)
    state.on_manager_message(execute(1, at(7, "tcp://a:1")), now=0.0)
    state.on_peer_unreachable("tcp://a:1", state.peer_outbox.pop("tcp://a:1"), 0.5)
    assert state.outbox == [p.Relay((7,))]
    state.on_manager_message(p.Relayed(7, dumps("seven")), now=1.0)
    assert 7 in state.store and state.tasks[1].state == "queued"
    state.end_pass(1.0)
    assert not any(type(r) is p.Transfers for r in state.outbox)  # the manager counts it


def test_a_holder_uploads_what_the_manager_relays_live_or_stored():
    state, (lib,) = make()
    state.store.put(3, dumps("three"))
    _live_in(state, lib, 1)
    state.on_manager_message(p.Upload((3, 1, 99)), 0.0)
    assert [(type(r), r.task_id) for r in state.outbox] == [(p.Uploaded, 3), (p.Uploaded, 99)]
    assert state.outbox[1].value is None  # not held here
    state.on_library_reply(lib, pipe.Exported(1, dumps("one"), 0.0, ""), 0.0)
    (uploaded,) = state.outbox[2:]
    assert type(uploaded) is p.Uploaded and loads(uploaded.value) == "one"


def test_two_tasks_share_one_fetch_and_a_cancel_keeps_it_for_the_other():
    state, _ = make()
    state.on_manager_message(execute(1, at(7, "tcp://a:1")), 0.0)
    state.on_manager_message(execute(2, at(7, "tcp://a:1")), 0.0)
    assert state.peer_outbox == {"tcp://a:1": [7]} and state.fetcher.fetches[7].waiters == {1, 2}
    state.on_manager_message(p.Cancel((1,)), 0.0)
    assert state.fetcher.fetches[7].waiters == {2}
    state.on_manager_message(p.Cancel((2,)), 0.0)
    assert (
        not state.fetcher.fetches and state.fetcher.slots.in_flight == 0
    )  # a late reply is dropped
    state.on_data(p.Data(7, dumps(1)), 0.0)
    assert 7 not in state.store


def test_an_input_computed_here_starts_its_dependent_when_done():
    """In a library of two slots no chain is sent: the dependent waits for the result,
    then goes to the library that holds it live, which it names instead of carrying."""
    state, (lib,) = make(slots=2)
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2, computed_here(1)), 0.0)
    assert state.tasks[2].state == "waiting" and state.local_waiters == {1: {2}}
    assert started(state) == [(0, [1])]
    state.on_library_reply(lib, done_live(1), 0.0)
    assert state.tasks[2].state == "queued" and not state.local_waiters
    assert state.tasks[2].home == 0 and 1 in state.live and 1 not in state.store
    ((_, run),) = state.start_runnable()
    assert run.calls[0].inputs == [("k1", 1, None)]


def test_a_chain_goes_to_the_library_with_the_task_it_waits_for():
    """One request carries the producer and the tasks waiting here only for it, in
    order: the library runs them back to back on live results, without a round trip."""
    state, (lib,) = make()
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2, computed_here(1)), 0.0)
    state.on_manager_message(execute(3, computed_here(2), inline(9, "x")), 0.0)
    ((_, run),) = state.start_runnable()
    assert [call.task_id for call in run.calls] == [1, 2, 3]
    assert run.calls[1].inputs == [("k1", 1, None)]
    assert run.calls[2].inputs[0] == ("k2", 2, None)
    assert all(state.tasks[t].state == "running" for t in (1, 2, 3))
    assert not state.local_waiters and list(lib.sent) == [1, 2, 3]
    for task_id in (1, 2, 3):
        state.on_library_reply(lib, done_live(task_id), 0.0)
    # (one Started for the three, before the first report: no end of pass came between)
    assert state.outbox[0] == p.Started((1, 2, 3))
    assert [type(r) for r in state.outbox[1:]] == [p.TaskDone] * 3
    assert set(state.live.entries) == {1, 2, 3} and not list(state.leaks())


def test_a_task_arriving_while_its_input_runs_goes_to_that_library_at_once():
    """It follows its producer into the library's pipe; it never waits for the
    producer's reply to pass through the worker."""
    state, (lib,) = make()
    state.on_manager_message(execute(1), 0.0)
    assert started(state) == [(0, [1])]
    state.on_manager_message(execute(2, computed_here(1)), 0.0)
    assert state.tasks[2].state == "running" and not state.local_waiters
    ((_, run),) = state.start_runnable()
    assert [call.task_id for call in run.calls] == [2]
    assert run.calls[0].inputs == [("k1", 1, None)] and list(lib.sent) == [1, 2]


def test_a_chained_task_whose_live_input_is_missing_is_reported_to_the_manager():
    state, (lib,) = make()
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2, computed_here(1)), 0.0)
    state.start_runnable()
    state.on_library_reply(lib, pipe.Erred(1, None, "tb", "ValueError"), 0.0)
    state.on_library_reply(lib, pipe.Missing(2, 1), 0.0)
    assert state.outbox[-1] == p.FetchFailed(2, 1, (ME,)) and not state.tasks


def test_an_input_the_manager_thinks_is_here_but_is_not_fails_at_once():
    state, _ = make()
    state.on_manager_message(execute(1, computed_here(5), held(7)), 0.0)
    assert state.outbox == [p.FetchFailed(1, 7, (ME,))]
    assert not state.tasks and not state.local_waiters


def test_an_input_released_before_its_task_starts_fails_the_task():
    state, _ = make()
    state.store.put(7, dumps(7))
    state.on_manager_message(execute(1, held(7)), 0.0)
    state.on_manager_message(p.Release((7,)), 0.0)
    assert started(state) == []
    assert state.outbox == [p.FetchFailed(1, 7, (ME,))] and not state.tasks


def test_cancel_and_withdraw_drop_only_tasks_that_have_not_started():
    state, _ = make()
    for task_id in (1, 2, 3):
        state.on_manager_message(execute(task_id), 0.0)
    state.on_manager_message(execute(4, at(9, "tcp://a:1")), 0.0)
    assert started(state) == [(0, [1])]
    state.on_manager_message(p.Cancel((1, 2)), 0.0)  # 1 runs: its report will come
    state.on_manager_message(p.Withdraw((1, 3, 4, 99)), 0.0)
    assert state.outbox == [p.Withdrawn((3, 4))]
    assert list(state.tasks) == [1] and not state.fetcher.fetches
    assert started(state) == []  # the queue's stale ids are skipped


def test_an_execute_sent_again_while_running_is_ignored():
    state, (lib,) = make()
    state.on_manager_message(execute(1), 0.0)
    state.start_runnable()
    state.on_manager_message(execute(1), 0.0)
    assert started(state) == [] and list(lib.sent) == [1]


def test_a_library_death_crashes_what_it_ran_and_requeues_the_rest_in_order():
    state, (lib, other) = make(libraries=2)
    state.dispatch.recent_duration.observe(0.0001)  # tiny tasks: batches of LIBRARY_BATCH
    for task_id in range(1, 6):
        state.on_manager_message(execute(task_id), 0.0)
    assert started(state) == [(0, [1, 2, 3, 4, 5])]
    state.on_library_death(lib, "killed by signal SIGKILL")
    started_, crashed = state.outbox
    assert started_ == p.Started((1, 2, 3, 4, 5))
    assert crashed == p.TaskCrashed(1, "library process killed by signal SIGKILL on worker w")
    assert [state.tasks[t].state for t in (2, 3, 4, 5)] == ["queued"] * 4
    assert 0 not in state.dispatch.libraries
    assert started(state) == [(1, [2, 3, 4, 5])]


def test_erred_and_crashed_replies_are_reported():
    state, (lib,) = make(slots=2)
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2), 0.0)
    assert started(state) == [(0, [1, 2])]
    state.on_library_reply(lib, pipe.Erred(2, None, "Traceback", "ValueError: x"), 0.0)
    state.on_library_reply(lib, pipe.Crashed(1, "forked task process died"), 0.0)
    assert state.outbox == [
        p.Started((1, 2)),
        p.TaskErred(2, None, "Traceback", "ValueError: x"),
        p.TaskCrashed(1, "forked task process died"),
    ]
    assert not state.tasks and not lib.sent


def test_short_tasks_get_one_more_queued_behind_the_running_one():
    state, (lib,) = make()
    state.dispatch.recent_duration.observe(0.01)  # short, not tiny
    for task_id in (1, 2, 3):
        state.on_manager_message(execute(task_id), 0.0)
    assert started(state) == [(0, [1]), (0, [2])]
    assert list(lib.sent) == [1, 2]


def test_tasks_of_two_run_configurations_never_share_a_request():
    state, _ = make(slots=4)
    config = p.RunConfig(3, "function-calls", "fork", (), (), True)
    state.on_manager_message(config, 0.0)
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2, run_id=3), 0.0)
    requests = state.start_runnable()
    assert [[c.task_id for c in run.calls] for _, run in requests] == [[1]]
    assert [[c.task_id for c in run.calls] for _, run in state.start_runnable()] == [[2]]


def test_functions_go_with_the_next_request_to_each_library_once():
    state, (lib,) = make()
    state.on_manager_message(p.Function(b"f", b"code"), 0.0)
    state.on_manager_message(execute(1), 0.0)
    ((_, run),) = state.start_runnable()
    assert run.functions == [(b"f", b"code")] and lib.unsent == []
    late = state.add_library(9, 1)
    assert late.unsent == [b"f"]


def test_run_configurations_are_bounded():
    state, _ = make()
    for run_id in range(1, ws.MAX_RUN_CONFIGS + 2):
        state.on_manager_message(p.RunConfig(run_id, "tasks", "direct", (), (), True), 0.0)
    assert len(state.run_configs) == ws.MAX_RUN_CONFIGS and 1 not in state.run_configs


def test_task_mode_tasks_go_to_processes():
    state, _ = make()
    state.on_manager_message(p.RunConfig(3, "tasks", "direct", (), (), True), 0.0)
    state.on_manager_message(execute(1, run_id=3), 0.0)
    state.on_manager_message(execute(2, run_id=3), 0.0)
    assert started(state) == [] and list(state.process_runnable) == [1, 2]
    first = state.next_process_task()
    state.on_process_started(first)
    state.on_reply(done(1), 0.0)
    second = state.next_process_task()
    state.on_process_failed(second, "no fork for you")
    assert state.outbox[0] == p.Started((1,))  # (2 never started)
    assert [type(m) for m in state.outbox[1:]] == [p.TaskDone, p.TaskCrashed]
    assert "no fork for you" in state.outbox[2].reason and not state.tasks


def test_replicate_copies_a_result_nobody_waits_for():
    state, _ = make()
    state.store.put(5, dumps(5))
    state.on_manager_message(p.Replicate(5, ("tcp://a:1",)), 0.0)
    assert state.outbox == [p.Replicas((5,))] and not state.fetcher.fetches
    state.on_manager_message(p.Replicate(6, ("tcp://a:1",)), 0.0)
    assert state.fetcher.fetches[6].replicate and state.peer_outbox == {"tcp://a:1": [6]}
    state.on_data(p.Data(6, dumps(6)), 0.0)
    assert 6 in state.store and state.outbox[-1] == p.Replicas((6,))


def test_a_task_that_cannot_be_taken_is_crashed_and_leaves_nothing():
    state, _ = make()
    message = execute(1, computed_here(5), at(7, "tcp://a:1"))
    state.on_manager_message(message, 0.0)
    state.cannot_take(message, "it could not take the task")
    assert state.outbox == [p.TaskCrashed(1, "worker w: it could not take the task")]
    assert not state.tasks and not state.fetcher.fetches and not state.local_waiters
    state.cannot_take(p.Cancel((1,)), "not an Execute")  # nothing to report
    assert len(state.outbox) == 1


def test_an_unknown_edge_raises():
    state, _ = make()
    state.on_manager_message(execute(1), 0.0)
    with pytest.raises(InvalidTransition, match="'queued' -> 'new'"):
        state._transition(state.tasks[1], "new")
    assert set(ws._TRANSITIONS) == {
        ("new", "waiting"), ("new", "queued"), ("new", "forgotten"),
        ("waiting", "queued"), ("waiting", "running"), ("waiting", "forgotten"),
        ("queued", "waiting"), ("queued", "running"), ("queued", "forgotten"),
        ("running", "queued"), ("running", "forgotten"),
    }  # fmt: skip


def test_the_poll_timeout_is_the_earliest_deadline():
    state, _ = make(manager_timeout=30.0, fetch_timeout=5.0)
    assert state.poll_timeout(0.0) == 30.0  # not registered: no heartbeat is due
    state.on_manager_message(p.Welcome("w", 1.0), now=2.0)
    state.last_sent = 2.5
    assert state.poll_timeout(3.0) == 0.5  # the next heartbeat
    assert not state.heartbeat_due(3.0) and state.heartbeat_due(3.6)
    state.on_manager_message(execute(1, at(7, "tcp://a:1")), now=3.2)
    state.last_sent = 100.0
    assert state.poll_timeout(4.0) == pytest.approx(4.2)  # the fetch, due at 8.2
    state.outbox.append(p.Status(0, 0, 0, 0))
    assert state.poll_timeout(4.0) == 0.0
    assert not state.manager_silent(33.1) and state.manager_silent(33.3)  # heard at 3.2


def test_a_full_store_is_reported_once_each_way():
    state, _ = make()
    state.store.full = True
    state.end_pass(0.0)
    state.end_pass(0.0)
    state.store.full = False
    state.end_pass(0.0)
    assert state.outbox == [p.DiskFull(True), p.DiskFull(False)]


def test_an_unreachable_peer_passes_its_fetches_on():
    state, _ = make()
    state.on_manager_message(execute(1, at(7, "tcp://a:1", "tcp://b:1")), 0.0)
    (address,) = state.peer_outbox
    ids = state.peer_outbox.pop(address)
    state.on_peer_unreachable(address, ids, 0.0)
    (other,) = state.peer_outbox
    assert other != address and state.fetcher.fetches[7].current == other


# -- live results -------------------------------------------------------------------------


def _live_in(state, lib, task_id, nbytes=10_000, duration=0.01):
    """Result ``task_id`` computed in ``lib`` and kept live there."""
    state.on_manager_message(execute(task_id), 0.0)
    state.start_runnable()
    state.on_library_reply(lib, done_live(task_id, nbytes, duration), 0.0)
    state.outbox.clear()


def test_a_result_released_by_the_manager_is_forgotten_by_its_library():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    state.on_manager_message(p.Release((1,)), 0.0)
    assert state.library_outbox == [(0, pipe.Forget([1]))] and 1 not in state.live


def test_one_release_of_many_live_results_is_one_forget_per_library():
    state, libs = make(libraries=2)
    held_by: dict[int, list[int]] = {}
    for pair in ((1, 2), (3, 4)):  # one task per library at a time
        for task_id in pair:
            state.on_manager_message(execute(task_id), 0.0)
        state.start_runnable()
        for task_id in pair:
            lib = libs[state.tasks[task_id].lib]
            state.on_library_reply(lib, done_live(task_id, 10_000, 0.01), 0.0)
            held_by.setdefault(lib.id, []).append(task_id)
    assert len(held_by) == 2  # both libraries hold some
    state.on_manager_message(p.Release((1, 2, 3, 4, 5)), 0.0)  # 5 was never here
    assert sorted(state.library_outbox) == [
        (lib, pipe.Forget(ids)) for lib, ids in sorted(held_by.items())
    ]
    assert not state.live.entries


def test_a_peer_asking_for_a_live_result_is_answered_once_it_is_exported():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    live = state.live_tasks
    assert live.serve_peer(1, b"peer-a") and live.serve_peer(1, b"peer-b")
    assert state.library_outbox == [(0, pipe.Export([1], False))]  # once for both
    state.on_library_reply(lib, pipe.Exported(1, dumps("one"), 0.001, ""), 0.0)
    assert [ident for ident, _ in state.peer_replies] == [b"peer-a", b"peer-b"]
    assert loads(state.peer_replies[0][1].value) == "one"
    assert 1 in state.store and 1 in state.live  # the copy stays for later readers
    assert not live.serve_peer(2, b"peer-a")  # not live here: the store's answer (None)


def test_an_idle_library_takes_a_task_from_a_busy_one_after_an_export():
    state, (lib0, lib1) = make(libraries=2)
    _live_in(state, lib0, 1, duration=1.0)  # long tasks: none queued behind another
    state.on_manager_message(execute(9), 0.0)
    assert started(state) == [(0, [9])]  # lib0 is busy with it
    for task_id in (2, 3, 4):
        state.on_manager_message(execute(task_id, held(1)), 0.0)
    assert list(state.dispatch.homed[0]) == [2, 3, 4]
    assert state.start_runnable() == []
    assert state.tasks[2].state == "waiting" and state.tasks[2].missing == {1}
    assert state.library_outbox == [(0, pipe.Export([1], False))]
    state.on_library_reply(lib0, pipe.Exported(1, dumps("one"), 0.001, ""), 0.0)
    requests = state.start_runnable()
    assert [(lib.id, [c.task_id for c in run.calls]) for lib, run in requests] == [(1, [2])]
    ((_, run),) = requests
    assert loads(run.calls[0].inputs[0][2]) == "one"


def test_live_results_past_the_memory_limit_are_exported_to_the_store_which_spills(tmp_path):
    state = WorkerState(Store(25_000, str(tmp_path)), name="w", peer_address=ME)
    lib = state.add_library(0, 1)
    state.on_library_ready(lib)
    for task_id in (1, 2, 3):
        _live_in(state, lib, task_id, nbytes=10_000)
    state.end_pass(0.0)
    assert state.library_outbox == [(0, pipe.Export([1], True))]  # the oldest
    state.end_pass(0.0)
    assert len(state.library_outbox) == 1  # on its way: not asked twice
    value = dumps(b"x" * 10_000)
    state.on_library_reply(lib, pipe.Exported(1, value, 0.001, ""), 0.0)
    assert 1 not in state.live and 1 in state.store and state.store.reserved == 20_000
    assert state.store.memory_bytes + state.live.nbytes <= 25_000 + value.nbytes


def test_a_live_input_that_cannot_be_serialized_fails_the_task_that_needs_it_elsewhere():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    config = p.RunConfig(6, "tasks", "direct", (), (), False)
    state.on_manager_message(config, 0.0)
    state.on_manager_message(execute(3, held(1), run_id=6), 0.0)  # a task process: export
    assert state.tasks[3].state == "waiting" and state.live_tasks.exports[1].tasks == {3}
    state.on_library_reply(lib, pipe.Exported(1, None, 0.0, "TypeError: a lock"), 0.0)
    (erred,) = [r for r in state.outbox if type(r) is p.TaskErred]
    assert erred.task_id == 3 and "k1" in erred.message and "a lock" in erred.message
    assert 3 not in state.tasks and state.live.entries[1].stuck


def test_a_dead_library_loses_its_live_results_and_blames_the_task_it_was_running():
    state, (lib,) = make()
    _live_in(state, lib, 1, duration=0.0001)  # tiny: several tasks per request
    for task_id in (2, 3, 4):
        state.on_manager_message(execute(task_id), 0.0)
    state.start_runnable()
    assert list(lib.sent) == [2, 3, 4]
    state.on_library_death(lib, "exited with code 3", running={3})
    crashed = [r for r in state.outbox if type(r) is p.TaskCrashed]
    assert [r.task_id for r in crashed] == [3]  # 2's reply was held, not lost to blame
    assert state.outbox[-1] == p.Lost((1,)) and 1 not in state.live
    assert [state.tasks[t].state for t in (2, 4)] == ["queued", "queued"]


def test_abort_drops_unstarted_tasks_silently_and_frees_their_fetches():
    state, _ = make()
    state.on_manager_message(execute(1), 0.0)
    state.on_manager_message(execute(2, at(7, "tcp://a:1")), 0.0)
    state.on_manager_message(p.Abort((1, 2, 99), "run elsewhere"), 0.0)
    assert not state.tasks and not state.take_aborted() and not state.outbox
    assert not state.fetcher.fetches and started(state) == []
    state.peer_outbox.clear()
    assert not list(state.leaks())


def test_abort_of_a_running_task_kills_its_library_and_requeues_what_else_it_ran():
    """Nothing is reported of the aborted task, even a reply that arrives before the
    kill; the other tasks the library had are not blamed (they run again) and the
    results it kept live are lost."""
    state, (lib,) = make()
    _live_in(state, lib, 1, duration=0.0001)  # tiny: several tasks per request
    for task_id in (2, 3, 4):
        state.on_manager_message(execute(task_id), 0.0)
    assert started(state) == [(0, [2, 3, 4])]
    state.end_pass(0.0)
    state.outbox.clear()
    state.on_manager_message(p.Abort((3,), "a straggler"), 0.0)
    (aborted,) = state.take_aborted()
    assert aborted.id == 3 and aborted.lib == lib.id and 3 not in state.tasks
    state.on_library_reply(lib, done(3), 0.0)  # written before the kill: not reported
    assert not state.outbox
    state.on_library_death(lib, "killed by signal SIGKILL", running={2})
    assert state.outbox == [p.Lost((1,))]  # no TaskCrashed: 2 was not at fault
    assert [state.tasks[t].state for t in (2, 4)] == ["queued", "queued"]
    state.outbox.clear()
    new = state.add_library(1, 1)
    state.on_library_ready(new)
    assert started(state) == [(1, [2, 4])]
    for task_id in (2, 4):
        state.on_library_reply(new, done(task_id), 0.0)
    assert [type(r) for r in state.outbox] == [p.Started, p.TaskDone, p.TaskDone]
    assert not list(state.leaks())


def test_a_late_reply_of_an_aborted_task_sent_again_is_not_taken_for_the_new_one():
    state, (lib, other) = make(libraries=2)
    state.on_manager_message(execute(1), 0.0)
    assert started(state) == [(0, [1])]
    state.on_manager_message(p.Abort((1,), "a straggler"), 0.0)
    state.take_aborted()
    state.on_manager_message(execute(1), 0.0)  # the manager gives it back to us
    assert started(state) == [(1, [1])]
    state.on_library_reply(lib, done(1, "stale"), 0.0)  # from the library being killed
    assert not any(type(r) is p.TaskDone for r in state.outbox)
    state.on_library_reply(other, done(1, "fresh"), 0.0)
    (report,) = [r for r in state.outbox if type(r) is p.TaskDone]
    assert loads(report.value) == "fresh"


def test_abort_of_a_task_process_names_it_for_the_shell_to_kill():
    state, _ = make()
    state.on_manager_message(p.RunConfig(3, "tasks", "direct", (), (), True), 0.0)
    state.on_manager_message(execute(1, run_id=3), 0.0)
    task = state.next_process_task()
    state.on_process_started(task)
    state.on_manager_message(p.Abort((1,), "a straggler"), 0.0)
    assert state.take_aborted() == [task] and task.lib is None and not state.aborting
    state.on_reply(pipe.Crashed(1, "task process killed by signal SIGKILL"), 0.0)
    assert [type(r) for r in state.outbox] == [p.Started]


def _unreadable(task_id, exc):
    raise AssertionError(f"result {task_id} could not be read back") from exc


# -- a simulated worker under random events ----------------------------------------------------

PEERS = ("tcp://a:1", "tcp://b:1")


class SimulatedWorker:
    """A ``WorkerState`` with fake libraries and peers, and a manager that sends each task
    once and cancels the tasks sent ahead of an input that will not come."""

    def __init__(self, graph, slots):
        self.state, libs = make(libraries=2, slots=slots, fetch_timeout=1.0)
        self.slots = slots
        self.graph = graph  #: task id -> [("local", task id) | ("peer", id, peers) | ("inline",)]
        self.now = 0.0
        self.next_library = len(libs)
        #: library id -> the calls it was sent and has not answered, in order
        self.pipes = {lib.id: [] for lib in libs}
        #: library id -> the results it keeps live, and those it drops once read
        self.lib_live = {lib.id: set() for lib in libs}
        self.doomed = {lib.id: set() for lib in libs}
        #: peer identity -> (result asked for, answers received)
        self.asks: dict[bytes, tuple[int, list]] = {}
        #: (peer, input id) requests not yet answered
        self.requests: list[tuple[str, int]] = []
        self.sent: list[int] = []
        self.executed: dict[int, int] = {}
        self.reports: dict[int, list] = {}
        self.cancelled: set[int] = set()
        #: tasks the worker said began running (``Started``)
        self.started: set[int] = set()
        #: tasks the manager aborted: nothing is reported of them
        self.aborted: set[int] = set()

    # the manager

    def execute(self, task_id):
        if task_id in self.sent:
            return
        deps = []
        for dep in self.graph[task_id]:
            if dep[0] == "local":
                producer = dep[1]
                here = producer in self.state.store or producer in self.state.live
                if producer not in self.sent or self._over(producer) and not here:
                    continue  # the manager sends it where its input is, or not yet
                deps.append(held(producer) if here else computed_here(producer))
            elif dep[0] == "peer":
                deps.append(at(dep[1], *dep[2]))
            else:
                deps.append(inline(10_000 + task_id, task_id))
        self.sent.append(task_id)
        self._tell(execute(task_id, *deps))

    def replicate(self, index, peers):
        """The manager asks for a copy of a result held by peers (``replicas=k``)."""
        self._tell(p.Replicate(1000 + index % 4, peers))

    def release(self, task_id):
        """The manager releases a result here (even one a queued task still needs: the
        worker must report that task, not lose it)."""
        self._tell(p.Release((task_id, 1000 + task_id % 4)))

    def _over(self, task_id):
        return task_id in self.reports or task_id in self.cancelled or task_id in self.aborted

    def _tell(self, message):
        self.state.on_manager_message(message, self.now)
        self._take_outbox()

    def cancel(self, task_id, withdraw=False):
        if task_id not in self.sent or self._over(task_id):
            return
        dropped = task_id in self.state.tasks and self.state.tasks[task_id].state != "running"
        if dropped and not withdraw:
            self.cancelled.add(task_id)
        self._tell((p.Withdraw if withdraw else p.Cancel)((task_id,)))
        if dropped and not withdraw:  # (a withdrawn one is recalled when it is reported)
            self._recall_dependents(task_id)

    def _take_outbox(self):
        messages = self.state.outbox[:]
        self.state.outbox.clear()
        for message in messages:
            kind = type(message)
            if kind is p.Started:
                self.started.update(message.task_ids)
            elif kind in (p.TaskDone, p.TaskErred, p.TaskCrashed, p.FetchFailed):
                if kind in (p.TaskDone, p.TaskErred):  # it ran: said so first
                    assert message.task_id in self.started, message
                self.reports.setdefault(message.task_id, []).append(message)
                if kind is not p.TaskDone:
                    self._recall_dependents(message.task_id)
            elif kind is p.Withdrawn:
                for task_id in message.task_ids:
                    self.reports.setdefault(task_id, []).append(message)
                    self.cancelled.discard(task_id)
                    self._recall_dependents(task_id)
        for address, ids in self.state.peer_outbox.items():
            self.requests.extend((address, dep_id) for dep_id in ids)
        self.state.peer_outbox.clear()
        for ident, data in self.state.peer_replies:
            self.asks[ident][1].append(data)
        self.state.peer_replies.clear()
        while self.state.library_outbox:  # libraries serve exports and forgets at once
            lib_id, request = self.state.library_outbox.pop(0)
            if lib_id not in self.lib_live:
                continue  # died since
            for task_id in request.task_ids:
                if type(request) is pipe.Export:
                    held = task_id in self.lib_live[lib_id]
                    value = dumps(task_id) if held else None
                    reply = pipe.Exported(task_id, value, 0.0, "" if held else "not held")
                    self.state.on_library_reply(
                        self.state.dispatch.libraries[lib_id], reply, self.now
                    )
                if type(request) is pipe.Forget or request.drop:
                    self.doomed[lib_id].add(task_id)
            self._settle_doomed(lib_id)
            self._take_outbox()

    def _settle_doomed(self, lib_id):
        """Forgotten results go once no call queued in their library reads them."""
        reading = {d for call in self.pipes[lib_id] for _, d, v in call.inputs if v is None}
        for task_id in list(self.doomed[lib_id] - reading):
            self.doomed[lib_id].discard(task_id)
            self.lib_live[lib_id].discard(task_id)

    def ask(self, index, task_id):
        """A peer asks for a result, answered as the peer server answers: from the store,
        or once a live one is exported."""
        ident = f"peer-{index}".encode()
        if ident in self.asks:
            return
        self.asks[ident] = (task_id, [])
        reply = serving.answer(self.state.store, self.state, ident, task_id, _unreadable)
        if reply is not None:
            self.asks[ident][1].append(reply)
        self._take_outbox()

    def _recall_dependents(self, task_id):
        """Tasks sent ahead to wait for ``task_id`` here will not get it: the manager
        calls them back (``Cancel``)."""
        for other in list(self.state.tasks.values()):
            if any(dep.task_id == task_id and dep.peers is None for dep in other.deps):
                self.cancel(other.id)

    # libraries and peers

    def start(self):
        for lib, run in self.state.start_runnable():
            self.pipes[lib.id].extend(run.calls)
        self._take_outbox()

    def finish(self, index, outcome):
        pipes = [lib_id for lib_id, sent in self.pipes.items() if sent]
        if not pipes:
            return
        lib_id = pipes[index % len(pipes)]
        running = self.pipes[lib_id][: self.slots]
        call = running[index % len(running)]
        self.pipes[lib_id].remove(call)
        task_id = call.task_id
        live = self.lib_live[lib_id]
        absent = [d for _, d, v in call.inputs if v is None and d not in live]
        if absent:
            reply = pipe.Missing(task_id, absent[0])  # it did not run
        else:
            self.executed[task_id] = self.executed.get(task_id, 0) + 1
            duration = 0.0005 if outcome == "done" else 0.01  # tiny: batches; short: queued
            if outcome in ("done", "short") and call.keep:
                live.add(task_id)
                value = dumps(task_id) if call.send else None
                reply = pipe.Done(task_id, value, duration, 100, True)
            else:
                reply = {
                    "done": done(task_id, duration=duration),
                    "short": done(task_id, duration=duration),
                    "erred": pipe.Erred(task_id, None, "tb", "ValueError"),
                    "crashed": pipe.Crashed(task_id, "the fork died"),
                }[outcome]
        self._settle_doomed(lib_id)
        self.state.on_library_reply(self.state.dispatch.libraries[lib_id], reply, self.now)
        self._take_outbox()

    def abort(self, task_id):
        """The manager takes a task back, running or not (a straggler): the library
        running it is killed; the others it ran are not blamed (they run again)."""
        if task_id not in self.sent or self._over(task_id):
            return
        self.aborted.add(task_id)
        self._tell(p.Abort((task_id,), "a straggler"))
        for task in self.state.take_aborted():
            if task.lib in self.pipes:
                self._replace(task.lib, set())
        self._recall_dependents(task_id)

    def die(self, index):
        busiest = sorted(self.pipes, key=lambda lib_id: -len(self.pipes[lib_id]))
        lib_id = busiest[index % len(busiest)]
        running = {call.task_id for call in self.pipes[lib_id][: self.slots]}
        for task_id in running:
            self.executed[task_id] = self.executed.get(task_id, 0) + 1  # it was running
        self._replace(lib_id, running)

    def _replace(self, lib_id, running):
        """Library ``lib_id`` dies, blamed for ``running``; a new one takes its place."""
        del self.pipes[lib_id], self.lib_live[lib_id], self.doomed[lib_id]
        record = self.state.dispatch.libraries[lib_id]
        self.state.on_library_death(record, "killed by signal SIGKILL", running)
        self.next_library += 1
        self.state.on_library_ready(self.state.add_library(self.next_library, self.slots))
        self.pipes[self.next_library] = []
        self.lib_live[self.next_library] = set()
        self.doomed[self.next_library] = set()
        self._take_outbox()

    def answer(self, index, how):
        if not self.requests:
            return
        address, dep_id = self.requests.pop(index % len(self.requests))
        if how == "silent":
            return
        holds = how == "data" and address == PEERS[0]
        self.state.on_data(p.Data(dep_id, dumps(dep_id) if holds else None), self.now)
        self._take_outbox()

    def tick(self):
        self.now += 1.0
        for address in self.state.on_timers(self.now):
            self.requests = [r for r in self.requests if r[0] != address]  # socket reset
        self.state.end_pass(self.now)
        self._take_outbox()

    def settle(self):
        """Everything sent runs to its end: peers answer, libraries finish."""
        for _ in range(1000):
            self.start()
            if self.requests:
                self.answer(0, "data")
            elif any(self.pipes.values()):
                self.finish(0, "done")
            elif self.state.fetcher.fetches:
                self.tick()
            else:
                return
        raise AssertionError("the simulated worker did not settle")


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 10))
    graph = {}
    for task_id in range(1, n + 1):
        deps = []
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["local", "peer", "inline"]))
            if kind == "local" and task_id > 1:
                deps.append(("local", draw(st.integers(1, task_id - 1))))
            elif kind == "peer":
                peers = draw(st.lists(st.sampled_from(PEERS), min_size=1, max_size=2, unique=True))
                deps.append(("peer", 1000 + draw(st.integers(0, 3)), tuple(peers)))
            else:
                deps.append(("inline",))
        graph[task_id] = deps
    return graph


actions = st.one_of(
    st.tuples(st.just("execute"), st.integers(1, 10)),
    st.tuples(st.just("start")),
    st.tuples(
        st.just("finish"),
        st.integers(0, 9),
        st.sampled_from(["done", "done", "short", "short", "erred", "crashed"]),
    ),
    st.tuples(st.just("die"), st.integers(0, 9)),
    st.tuples(st.just("cancel"), st.integers(1, 10), st.booleans()),
    st.tuples(
        st.just("answer"), st.integers(0, 9), st.sampled_from(["data", "data", "none", "silent"])
    ),
    st.tuples(st.just("tick")),
    st.tuples(
        st.just("replicate"),
        st.integers(0, 3),
        st.lists(st.sampled_from(PEERS), min_size=1, max_size=2, unique=True).map(tuple),
    ),
    st.tuples(st.just("release"), st.integers(1, 10)),
    st.tuples(st.just("ask"), st.integers(0, 3), st.integers(1, 10)),
    st.tuples(st.just("abort"), st.integers(1, 10)),
)


#: Examples per run; more for a longer search: ``SIM_EXAMPLES=3000 pytest -k simulated``.
SIM_EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "300"))


@settings(max_examples=SIM_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    graph=graphs(),
    steps=st.lists(actions, min_size=5, max_size=60),
    slots=st.integers(1, 2),
    recent=st.sampled_from([None, 0.0005, 0.01]),
)
@example(  # a second peer asks for a result the first one's ask exported to the store
    graph={1: [], 2: []},
    steps=[("execute", 1), ("start",), ("execute", 2), ("finish", 0, "done"), ("start",),
           ("finish", 0, "done"), ("ask", 0, 2), ("ask", 1, 2)],
    slots=1,
    recent=None,
)  # fmt: skip
def test_simulated_worker_runs_each_task_once_and_leaks_nothing(graph, steps, slots, recent):
    sim = SimulatedWorker(graph, slots)
    if recent is not None:  # tiny tasks go in batches, short ones one queued behind
        sim.state.dispatch.recent_duration.observe(recent)
    for action, *args in steps:
        if action == "execute":  # the tasks up to this one, in order
            for task_id in range(1, min(args[0], len(graph)) + 1):
                sim.execute(task_id)
        elif action == "cancel":
            sim.cancel(*args)
        else:
            getattr(sim, action)(*args)
    for task_id in graph:  # the manager sends what is left, in order
        sim.execute(task_id)
    sim.settle()
    state = sim.state
    assert not list(state.leaks()), list(state.leaks())
    assert all(count == 1 for count in sim.executed.values()), sim.executed
    assert set(sim.executed) <= sim.started, (sim.executed, sim.started)
    for task_id in sim.sent:
        reports = sim.reports.get(task_id, [])
        if task_id in sim.cancelled:
            assert reports == [] and task_id not in sim.executed, (task_id, reports)
        elif task_id in sim.aborted:  # (it may have run: it is not reported)
            assert reports == [], (task_id, reports)
        else:
            assert len(reports) == 1, (task_id, reports)
        if any(type(r) is p.TaskDone for r in reports):
            assert sim.executed.get(task_id) == 1
    for ident, (task_id, answers) in sim.asks.items():  # every peer heard once, rightly
        assert len(answers) == 1 and answers[0].task_id == task_id, (ident, answers)
        assert answers[0].value is None or loads(answers[0].value) == task_id, answers


def test_the_fetch_timeout_is_a_worker_flag(capsys):
    from daskvine_py.worker.shell import parse_args

    assert parse_args(["tcp://127.0.0.1:5"]).fetch_timeout == 10.0
    assert parse_args(["tcp://127.0.0.1:5", "--fetch-timeout", "2.5"]).fetch_timeout == 2.5
    with pytest.raises(SystemExit):
        parse_args(["tcp://127.0.0.1:5", "--fetch-timeout", "0"])
    assert "argument --fetch-timeout: must be > 0" in capsys.readouterr().err
