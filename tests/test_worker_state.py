"""The worker's sans-I/O state: literal events in, instructions out, in milliseconds.

Every transition of ``state._TRANSITIONS`` is driven here by the event that takes it
(``WorkerState.handle``, as the scheduler's tests drive ``SchedulerState.handle``); the
end of the file is a hypothesis-driven worker (random graphs of tasks with local, peer and
inline inputs, library crashes, cancels, withdraws and peer failures) checking that every
task is reported exactly once and that nothing is left behind.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from daskvine_py.errors import InvalidTransition
from daskvine_py.wire import protocol as p
from daskvine_py.wire.exits import EXIT_REJECTED
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import fetching, pipe, serving
from daskvine_py.worker import state as ws
from daskvine_py.worker.messages import (
    AnswerPeer,
    AskPeer,
    Boot,
    ClosePeer,
    EventFailed,
    FromLibrary,
    KillLibrary,
    KillProcess,
    Leave,
    LibraryDied,
    ManagerConnection,
    PeerAsked,
    PeerUnreachable,
    ProcessExited,
    ProcessFailed,
    ProcessStarted,
    RegistrationSent,
    SendStatus,
    StartLibrary,
    StartProcess,
    Stop,
    Tick,
    ToLibrary,
    Unreadable,
)
from daskvine_py.worker.state import STARTED_HOLD, WorkerState, _drop_started_ended_after
from daskvine_py.worker.store import Store

ME = "tcp://me:1"
REGISTER = p.Register(p.PROTOCOL_VERSION, "w", 1, 0, "host", ME, 1)


def make(libraries=1, slots=1, ready=True, store=None, **kwargs):
    """A worker booted with ``libraries`` libraries (ids from 1), ready unless not.

    Each pass's ``Started`` goes out with it unless ``started_hold`` is given: the tests of
    what is reported in which order read it there; the hold has tests of its own."""
    kwargs.setdefault("started_hold", 0.0)
    state = WorkerState(Store() if store is None else store, name="w", peer_address=ME, **kwargs)
    out = state.handle([Boot(REGISTER, libraries, slots)], 0.0)
    assert out == [StartLibrary(i, slots) for i in range(1, libraries + 1)]
    libs = list(state.dispatch.libraries.values())
    if ready:
        assert state.handle([FromLibrary(lib.id, pipe.Ready(), 0.0) for lib in libs], 0.0) == [
            REGISTER
        ]
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


def reply(lib, message, wall=0.0):
    """What library ``lib`` wrote, as the event the shell makes of it."""
    return FromLibrary(lib.id, message, wall)


def runs(out):
    """(library id, task ids) of each request to run tasks among the instructions."""
    return [(i.library_id, [c.task_id for c in i.request.calls]) for i in out if _is_run(i)]


def requests(out):
    """The ``pipe.Run`` requests among the instructions."""
    return [i.request for i in out if _is_run(i)]


def _is_run(instruction):
    return type(instruction) is ToLibrary and type(instruction.request) is pipe.Run


def asked(out):
    """Peer address -> the ids asked of it (``AskPeer``)."""
    return {i.address: list(i.task_ids) for i in out if type(i) is AskPeer}


def reports(out):
    """The records for the manager among the instructions."""
    return [i for i in out if type(i) in p.TO_MANAGER]


def test_a_task_with_no_inputs_runs_and_is_reported_done():
    state, (lib,) = make()
    out = state.handle([execute(1, want=True)], now=5.0)
    assert state.last_contact == 5.0
    call = pipe.Call(1, "k1", b"payload", [], keep=True, send=True)
    # Sent to run, and reported started once per pass, after every start of the pass.
    assert out == [ToLibrary(lib.id, pipe.Run([], None, [call])), p.Started((1,))]
    assert state.tasks[1].state == "running" and list(lib.sent) == [1]
    (report,) = state.handle([reply(lib, done(1, 42), wall=100.0)], 6.0)
    assert type(report) is p.TaskDone and report.task_id == 1 and report.finished == 100.0
    assert loads(report.value) == 42 and loads(state.store.get(1)) == 42
    assert not state.tasks and not lib.sent and not list(state.leaks())


def test_a_started_that_would_go_alone_waits_for_the_report_of_its_task():
    """A one-task ``compute``: the manager hears one batch (the report), not two."""
    state, (lib,) = make(started_hold=STARTED_HOLD)
    out = state.handle([execute(1)], 5.0)
    assert runs(out) == [(lib.id, [1])] and not [r for r in out if type(r) in p.TO_MANAGER]
    assert state.poll_timeout(5.0) == pytest.approx(STARTED_HOLD)  # the shell wakes for it
    (report,) = state.handle([reply(lib, done(1))], 5.0 + STARTED_HOLD / 2)
    assert type(report) is p.TaskDone and report.task_id == 1
    assert not state.held_started and state.poll_timeout(6.0) > 0.5


def test_a_held_started_goes_alone_once_due_and_first_with_other_reports():
    state, (lib, other) = make(libraries=2, started_hold=STARTED_HOLD)
    state.handle([execute(1)], 0.0)
    assert state.handle([Tick(0.0)], STARTED_HOLD / 2) == []  # not due yet
    assert state.handle([Tick(0.0)], STARTED_HOLD) == [p.Started((1,))]  # due: alone
    state.handle([execute(2)], 1.0)  # (to the other library: the first one's slot is taken)
    # A report of another task goes now, and the held Started before it (its task began
    # before anything of this pass): a crash after a start counts against retries.
    out = state.handle([LibraryDied(other.id, "killed by signal SIGKILL")], 1.0)
    reports = [r for r in out if type(r) in p.TO_MANAGER]
    assert [type(r) for r in reports[:2]] == [p.Started, p.TaskCrashed]
    assert reports[0] == p.Started((2,)) and reports[1].task_id == 2
    assert not state.held_started


def test_a_started_with_company_in_its_pass_is_not_held():
    state, (lib,) = make(slots=2, started_hold=STARTED_HOLD)
    state.handle([execute(1)], 0.0)
    state.handle([Tick(0.0)], STARTED_HOLD)  # (its Started is out)
    out = state.handle([execute(2), reply(lib, done(1))], 1.0)
    reports = [type(r) for r in out if type(r) in p.TO_MANAGER]
    assert reports == [p.TaskDone, p.Started] and not state.held_started


def test_an_output_nothing_reads_is_not_kept():
    state, (lib,) = make()
    state.handle([execute(1, keep=False)], 0.0)
    state.handle([reply(lib, done(1))], 0.0)
    assert 1 not in state.store


def test_an_output_the_cache_keeps_stays_here_only_when_too_large_to_travel_inline():
    state, (lib,) = make()
    first = state.handle([execute(task_id, keep=None, want=True) for task_id in (1, 2)], 0.0)
    # The library keeps neither live: it sends both, and the worker decides by size.
    ((run,),) = [requests(first)]
    assert [(c.keep, c.send) for c in run.calls] == [(None, True)]
    second = state.handle([reply(lib, done(1, "small"))], 0.0)
    (run,) = requests(second)
    assert [(c.keep, c.send) for c in run.calls] == [(None, True)]
    third = state.handle([reply(lib, done(2, "x" * 10 * p.INLINE_BYTES))], 0.0)
    assert 1 not in state.store and 2 in state.store  # 1: the manager holds it
    done_ = [m for m in second + third if type(m) is p.TaskDone]
    assert [m.value is not None for m in done_] == [True, True]


def test_inputs_held_or_inline_go_with_the_call():
    state, _ = make()
    state.store.put(7, dumps("seven"))
    (run,) = requests(state.handle([execute(1, held(7), inline(8, "eight"))], 0.0))
    (call,) = run.calls
    assert [(key, dep_id, loads(value)) for key, dep_id, value in call.inputs] == [
        ("k7", 7, "seven"),
        ("k8", 8, "eight"),
    ]


def test_an_input_from_a_peer_is_fetched_then_the_task_runs():
    state, (lib,) = make()
    out = state.handle([execute(1, at(7, "tcp://a:1"))], now=0.0)
    assert out == [AskPeer("tcp://a:1", (7,))] and state.tasks[1].state == "waiting"
    assert state.fetcher.fetches[7].deadline == 10.0 and state.poll_timeout(0.0) == 10.0
    out = state.handle([p.Data(7, dumps("seven"))], now=1.0)
    assert 7 in state.store and not state.fetcher.fetches and runs(out) == [(lib.id, [1])]
    assert state.last_contact == 0.0  # (a peer's answer says nothing of the manager)
    assert reports(out) == [
        p.Replicas((7,)),
        p.Started((1,)),
        p.Transfers((("tcp://a:1", dumps("seven").nbytes),)),
    ]


def test_a_peer_without_the_input_passes_the_fetch_to_the_next_and_the_last_fails_it():
    state, _ = make()
    (first,) = asked(state.handle([execute(1, at(7, "tcp://a:1", "tcp://b:1"))], 0.0))
    (second,) = asked(state.handle([p.Data(7, None)], 0.0))
    assert {first, second} == {"tcp://a:1", "tcp://b:1"}
    (failed,) = state.handle([p.Data(7, None)], 0.0)
    assert type(failed) is p.FetchFailed and failed.task_id == 1 and failed.dep_id == 7
    assert not state.tasks and not list(state.leaks())


def test_a_silent_peer_times_out_and_its_socket_is_closed():
    state, _ = make(fetch_timeout=2.0)
    state.handle([execute(1, at(7, "tcp://a:1"))], now=0.0)
    assert state.handle([Tick(1.9)], 1.9) == []
    # No holder answered: the fetch goes through the manager, and fails after that.
    assert state.handle([Tick(2.0)], 2.0) == [ClosePeer("tcp://a:1"), p.Relay((7,))]
    assert state.fetcher.fetches[7].current == fetching.RELAY
    out = state.handle([Tick(4.0)], 4.0)
    assert out[0] == ClosePeer(fetching.RELAY)  # (a peer socket by that name: none)
    assert type(out[-1]) is p.FetchFailed and not state.tasks


def test_an_input_no_holder_can_serve_directly_comes_through_the_manager():
    state, (lib,) = make(fetch_timeout=2.0)
    state.handle([execute(1, at(7, "tcp://a:1"))], now=0.0)
    assert state.handle([PeerUnreachable("tcp://a:1", (7,))], 0.5) == [p.Relay((7,))]
    out = state.handle([p.Relayed(7, dumps("seven"))], now=1.0)
    assert 7 in state.store and runs(out) == [(lib.id, [1])]
    assert not any(type(r) is p.Transfers for r in out)  # the manager counts it


def test_a_holder_uploads_what_the_manager_relays_live_or_stored():
    state, (lib,) = make()
    state.store.put(3, dumps("three"))
    _live_in(state, lib, 1)
    out = state.handle([p.Upload((3, 1, 99))], 0.0)
    assert [(type(r), r.task_id) for r in reports(out)] == [(p.Uploaded, 3), (p.Uploaded, 99)]
    assert reports(out)[1].value is None  # not held here
    assert ToLibrary(lib.id, pipe.Export([1], False)) in out  # live: exported first
    (uploaded,) = state.handle([reply(lib, pipe.Exported(1, dumps("one"), 0.0, ""))], 0.0)
    assert type(uploaded) is p.Uploaded and loads(uploaded.value) == "one"


def test_two_tasks_share_one_fetch_and_a_cancel_keeps_it_for_the_other():
    state, _ = make()
    out = state.handle([execute(1, at(7, "tcp://a:1")), execute(2, at(7, "tcp://a:1"))], 0.0)
    assert out == [AskPeer("tcp://a:1", (7,))] and state.fetcher.fetches[7].waiters == {1, 2}
    state.handle([p.Cancel((1,))], 0.0)
    assert state.fetcher.fetches[7].waiters == {2}
    state.handle([p.Cancel((2,))], 0.0)
    assert not state.fetcher.fetches and state.fetcher.slots.in_flight == 0
    assert state.handle([p.Data(7, dumps(1))], 0.0) == []  # a late reply is dropped
    assert 7 not in state.store


def test_an_input_computed_here_starts_its_dependent_when_done():
    """In a library of two slots no chain is sent: the dependent waits for the result,
    then goes to the library that holds it live, which it names instead of carrying."""
    state, (lib,) = make(slots=2)
    out = state.handle([execute(1), execute(2, computed_here(1))], 0.0)
    assert state.tasks[2].state == "waiting" and state.local_waiters == {1: {2}}
    assert runs(out) == [(lib.id, [1])]
    out = state.handle([reply(lib, done_live(1))], 0.0)
    assert state.tasks[2].state == "running" and not state.local_waiters
    assert state.tasks[2].home == lib.id and 1 in state.live and 1 not in state.store
    (run,) = requests(out)
    assert run.calls[0].inputs == [("k1", 1, None)]


def test_a_chain_goes_to_the_library_with_the_task_it_waits_for():
    """One request carries the producer and the tasks waiting here only for it, in
    order: the library runs them back to back on live results, without a round trip."""
    state, (lib,) = make()
    out = state.handle(
        [execute(1), execute(2, computed_here(1)), execute(3, computed_here(2), inline(9, "x"))],
        0.0,
    )
    (run,) = requests(out)
    assert [call.task_id for call in run.calls] == [1, 2, 3]
    assert run.calls[1].inputs == [("k1", 1, None)]
    assert run.calls[2].inputs[0] == ("k2", 2, None)
    assert all(state.tasks[t].state == "running" for t in (1, 2, 3))
    assert not state.local_waiters and list(lib.sent) == [1, 2, 3]
    assert out[-1] == p.Started((1,))  # the others wait behind it in the library's pipe
    out = state.handle([reply(lib, done_live(1))], 0.0)
    # 2 started as the reply ahead of it freed the slot: said before that reply
    assert out == [p.Started((2,)), done_record(out, 1)]
    out = state.handle([reply(lib, done_live(task_id)) for task_id in (2, 3)], 0.0)
    # 3 started and ended within this pass: its report, in the same batch, says it ran
    assert out == [done_record(out, 2), done_record(out, 3)]
    assert set(state.live.entries) == {1, 2, 3} and not list(state.leaks())


def test_a_started_is_dropped_only_for_tasks_whose_end_follows_it_in_the_batch():
    """A ``Started`` before a task's own ``TaskDone`` or ``TaskErred`` in one batch says
    nothing more (a tiny task queued in a library used to cost the manager two records);
    one whose end is not in the batch, or came before it (made anew), stays."""
    started = p.Started((1, 2, 3))
    done_1 = p.TaskDone(1, 8, 0.001, None)
    erred_2 = p.TaskErred(2, None, "tb", "ValueError: 2")
    crashed_3 = p.TaskCrashed(3, "segfault")
    out: list = [started, done_1, erred_2, crashed_3]
    _drop_started_ended_after(out)
    assert out == [p.Started((3,)), done_1, erred_2, crashed_3]  # (a crash keeps its start)
    again = p.Started((1,))
    out = [done_1, again, p.Started((2,)), erred_2]
    _drop_started_ended_after(out)
    assert out == [done_1, again, erred_2]


def done_record(out: list, task_id: int) -> p.TaskDone:
    """The ``TaskDone`` of ``task_id`` among the instructions ``out``."""
    return next(r for r in out if type(r) is p.TaskDone and r.task_id == task_id)


def test_a_task_queued_behind_a_running_one_is_reported_started_when_it_starts():
    """The manager times a task from its ``Started`` (fast abort, the slow-worker check):
    a task sent to a busy library's pipe starts only once the slot is free (the
    simulator's seeds 13, 14, 15 and 74 at 10 workers: honest workers quarantined as slow)."""
    state, (lib,) = make()
    assert state.handle([execute(1)], 0.0)[-1] == p.Started((1,))
    out = state.handle([execute(2, computed_here(1))], 0.0)
    assert list(lib.sent) == [1, 2] and not [r for r in out if type(r) is p.Started]
    out = state.handle([reply(lib, done_live(1))], 1.0)
    assert [type(r) for r in out] == [p.Started, p.TaskDone] and out[0] == p.Started((2,))
    state.handle([reply(lib, done_live(2))], 1.5)
    # one whose input failed: reported started as the slot freed, then its failure
    state.handle([execute(3), execute(4, computed_here(3))], 2.0)
    assert state.behind == {4}
    out = state.handle([reply(lib, pipe.Erred(3, None, "tb", "ValueError"))], 3.0)
    assert p.Started((4,)) in out
    out = state.handle([reply(lib, pipe.Missing(4, 3))], 3.0)
    assert not state.behind and not list(state.leaks())


def test_a_task_arriving_while_its_input_runs_goes_to_that_library_at_once():
    """It follows its producer into the library's pipe; it never waits for the
    producer's reply to pass through the worker."""
    state, (lib,) = make()
    assert runs(state.handle([execute(1)], 0.0)) == [(lib.id, [1])]
    out = state.handle([execute(2, computed_here(1))], 0.0)
    assert state.tasks[2].state == "running" and not state.local_waiters
    (run,) = requests(out)
    assert [call.task_id for call in run.calls] == [2]
    assert run.calls[0].inputs == [("k1", 1, None)] and list(lib.sent) == [1, 2]


def test_a_chained_task_whose_live_input_is_missing_is_reported_to_the_manager():
    state, (lib,) = make()
    state.handle([execute(1), execute(2, computed_here(1))], 0.0)
    out = state.handle(
        [reply(lib, pipe.Erred(1, None, "tb", "ValueError")), reply(lib, pipe.Missing(2, 1))], 0.0
    )
    assert out[-1] == p.FetchFailed(2, 1, (ME,)) and not state.tasks


def test_an_input_the_manager_thinks_is_here_but_is_not_fails_at_once():
    state, _ = make()
    out = state.handle([execute(1, computed_here(5), held(7))], 0.0)
    assert out == [p.FetchFailed(1, 7, (ME,))]
    assert not state.tasks and not state.local_waiters


def test_an_input_released_before_its_task_starts_fails_the_task():
    state, _ = make()
    state.store.put(7, dumps(7))
    out = state.handle([execute(1, held(7)), p.Release((7,))], 0.0)
    assert out == [p.FetchFailed(1, 7, (ME,))] and not state.tasks


def test_cancel_and_withdraw_drop_only_tasks_that_have_not_started():
    state, (lib,) = make()
    out = state.handle([execute(1), execute(2), execute(3), execute(4, at(9, "tcp://a:1"))], 0.0)
    assert runs(out) == [(lib.id, [1])]
    out = state.handle([p.Cancel((1, 2)), p.Withdraw((1, 3, 4, 99))], 0.0)  # 1 runs
    # 1 runs: kept, and said so; 99 is not here: not given back either (every id answered)
    assert out == [p.Withdrawn((3, 4), (1, 99))]  # (nothing started: stale ids skipped)
    assert list(state.tasks) == [1] and not state.fetcher.fetches


def test_an_execute_sent_again_while_running_is_ignored():
    state, (lib,) = make()
    state.handle([execute(1)], 0.0)
    assert state.handle([execute(1)], 0.0) == [] and list(lib.sent) == [1]


def test_a_library_death_crashes_what_it_ran_and_requeues_the_rest_in_order():
    state, (lib, other) = make(libraries=2)
    state.dispatch.recent_duration.observe(0.0001)  # tiny tasks: batches of LIBRARY_BATCH
    out = state.handle([execute(task_id) for task_id in range(1, 6)], 0.0)
    # one slot: the first runs, the others wait behind it and are not reported started
    assert runs(out) == [(lib.id, [1, 2, 3, 4, 5])] and out[-1] == p.Started((1,))
    out = state.handle([LibraryDied(lib.id, "killed by signal SIGKILL")], 0.0)
    crashed, start, run, started = out
    assert crashed == p.TaskCrashed(1, "library process killed by signal SIGKILL on worker w")
    assert start == StartLibrary(3, 1) and lib.id not in state.dispatch.libraries
    assert runs([run]) == [(other.id, [2, 3, 4, 5])] and started == p.Started((2,))
    assert state.behind == {3, 4, 5}


def test_erred_and_crashed_replies_are_reported():
    state, (lib,) = make(slots=2)
    assert runs(state.handle([execute(1), execute(2)], 0.0)) == [(lib.id, [1, 2])]
    out = state.handle(
        [
            reply(lib, pipe.Erred(2, None, "Traceback", "ValueError: x")),
            reply(lib, pipe.Crashed(1, "forked task process died")),
        ],
        0.0,
    )
    assert out == [
        p.TaskErred(2, None, "Traceback", "ValueError: x"),
        p.TaskCrashed(1, "forked task process died"),
    ]
    assert not state.tasks and not lib.sent


def test_short_tasks_get_one_more_queued_behind_the_running_one():
    state, (lib,) = make()
    state.dispatch.recent_duration.observe(0.01)  # short, not tiny
    out = state.handle([execute(task_id) for task_id in (1, 2, 3)], 0.0)
    assert runs(out) == [(lib.id, [1]), (lib.id, [2])]
    assert list(lib.sent) == [1, 2]


def test_tasks_of_two_run_configurations_never_share_a_request():
    state, (lib,) = make(slots=4)
    config = p.RunConfig(3, "function-calls", "fork", (), (), True)
    out = state.handle([config, execute(1), execute(2, run_id=3)], 0.0)
    assert runs(out) == [(lib.id, [1])]
    assert runs(state.handle([], 0.0)) == [(lib.id, [2])]  # the next pass


def test_functions_go_with_the_next_request_to_each_library_once():
    state, (lib,) = make()
    (run,) = requests(state.handle([p.Function(b"f", b"code"), execute(1)], 0.0))
    assert run.functions == [(b"f", b"code")] and lib.unsent == []
    out = state.handle([LibraryDied(lib.id, "exited with code 1")], 0.0)
    assert StartLibrary(2, 1) in out  # its successor is sent the functions known so far
    assert state.dispatch.libraries[2].unsent == [b"f"]


def test_run_configurations_are_bounded():
    state, _ = make()
    configs = [
        p.RunConfig(run_id, "tasks", "direct", (), (), True)
        for run_id in range(1, ws.MAX_RUN_CONFIGS + 2)
    ]
    state.handle(configs, 0.0)
    assert len(state.run_configs) == ws.MAX_RUN_CONFIGS and 1 not in state.run_configs


def test_task_mode_tasks_go_to_processes_one_per_process_slot():
    state, _ = make()
    config = p.RunConfig(3, "tasks", "direct", (), (), True)
    (start,) = state.handle([config, execute(1, run_id=3), execute(2, run_id=3)], 0.0)
    assert type(start) is StartProcess and start.task.id == 1 and start.call.task_id == 1
    assert list(state.dispatch.process_runnable) == [2]  # one process slot
    assert state.handle([ProcessStarted(start.task)], 0.0) == [p.Started((1,))]
    report, second = state.handle([ProcessExited(start.task, done(1), 0.0)], 0.0)
    assert type(report) is p.TaskDone and type(second) is StartProcess
    (crashed,) = state.handle([ProcessFailed(second.task, "no fork for you")], 0.0)
    assert type(crashed) is p.TaskCrashed and "no fork for you" in crashed.reason  # (2 never
    assert not state.tasks and not list(state.leaks())  # started: no Started for it)


def test_replicate_copies_a_result_nobody_waits_for():
    state, _ = make()
    state.store.put(5, dumps(5))
    assert state.handle([p.Replicate(5, ("tcp://a:1",))], 0.0) == [p.Replicas((5,))]
    assert not state.fetcher.fetches
    assert state.handle([p.Replicate(6, ("tcp://a:1",))], 0.0) == [AskPeer("tcp://a:1", (6,))]
    assert state.fetcher.fetches[6].replicate
    out = state.handle([p.Data(6, dumps(6))], 0.0)
    assert 6 in state.store and out[0] == p.Replicas((6,))


def test_an_execute_whose_handling_fails_is_crashed_and_leaves_nothing():
    state, _ = make()
    message = execute(1, computed_here(5), at(7, "tcp://a:1"))
    with mock.patch.object(fetching.Fetcher, "request_next", side_effect=RuntimeError("a bug")):
        failed, crashed = state.handle([message, p.Cancel((1,))], 0.0)
    assert type(failed) is EventFailed and failed.event is message
    why = "worker w: it could not take the task: RuntimeError('a bug')"
    assert crashed == p.TaskCrashed(1, why)
    assert not state.tasks and not state.fetcher.fetches and not state.local_waiters


def test_an_unreadable_record_crashes_its_task_and_garbage_ends_patience():
    state, _ = make()
    out = state.handle(
        [
            Unreadable(execute(2), "Execute.deps: not a DepLocation"),
            Unreadable(p.Cancel((1,)), "not an Execute: nothing to report"),
            Unreadable(None, "not a message"),
        ],
        5.0,
    )
    assert out == [
        p.TaskCrashed(2, "worker w: it could not read the task: Execute.deps: not a DepLocation")
    ]
    assert state.manager_garbled and state.last_contact == 0.0  # not heard from


def test_an_unknown_event_is_reported_and_the_others_are_taken():
    state, (lib,) = make()
    failed, run, started = state.handle([object(), execute(1)], 0.0)
    assert type(failed) is EventFailed and type(failed.error) is TypeError
    assert runs([run]) == [(lib.id, [1])] and started == p.Started((1,))


def test_an_unknown_edge_raises():
    state, _ = make()
    state.handle([execute(1)], 0.0)
    with pytest.raises(InvalidTransition, match="'running' -> 'new'"):
        state._transition(state.tasks[1], "new")
    assert set(ws._TRANSITIONS) == {
        ("new", "waiting"),
        ("new", "queued"),
        ("new", "forgotten"),
        ("waiting", "queued"),
        ("waiting", "running"),
        ("waiting", "forgotten"),
        ("queued", "waiting"),
        ("queued", "running"),
        ("queued", "forgotten"),
        ("running", "queued"),
        ("running", "forgotten"),
    }


# -- the worker's life: registration, heartbeats, the manager's silence, leaving --------------


def test_it_registers_once_every_library_is_ready():
    state, (one, two) = make(libraries=2, ready=False)
    assert state.handle([FromLibrary(one.id, pipe.Ready(), 0.0)], 0.0) == []
    assert state.handle([FromLibrary(two.id, pipe.Ready(), 0.0)], 0.0) == [REGISTER]
    # with no library at all, at once
    alone = WorkerState(Store(), name="w")
    assert alone.handle([Boot(REGISTER, 0)], 0.0) == [REGISTER]


def test_libraries_that_die_before_it_registers_make_it_leave_after_a_few():
    state, (lib,) = make(ready=False)
    for attempt in range(1, ws.MAX_START_FAILURES):
        out = state.handle([LibraryDied(lib.id + attempt - 1, "exited with code 1")], 0.0)
        assert out == [StartLibrary(lib.id + attempt, 1)]  # another takes its place
    (leave,) = state.handle([LibraryDied(ws.MAX_START_FAILURES, "exited with code 1")], 0.0)
    assert type(leave) is Leave and leave.exit_code == 5 and leave.unreachable
    assert "its library processes could not start" in leave.reason
    assert "exited with code 1" in leave.reason


def test_a_registration_lost_with_its_connection_goes_again():
    state, _ = make()
    assert state.handle([RegistrationSent(), ManagerConnection(True)], 1.0) == []
    assert state.registration_sent == 1.0 and state.last_contact == 1.0
    assert state.handle([ManagerConnection(False)], 2.0) == []
    assert state.handle([ManagerConnection(True, again=True)], 3.0) == [REGISTER]
    state.handle([p.Welcome("w", 1.0)], 4.0)
    assert state.handle([ManagerConnection(True, again=True)], 5.0) == []  # welcomed


def test_a_registration_unanswered_over_an_open_connection_waits_longer():
    state, _ = make(manager_timeout=1.0)
    state.handle([RegistrationSent(), ManagerConnection(True)], 100.0)
    assert state.handle([Tick(101.5)], 101.5) == []  # warned, and waits on
    assert state.warned_waiting and state.poll_timeout(101.5) == pytest.approx(18.5)
    (leave,) = state.handle([Tick(120.5)], 120.5)
    assert leave.exit_code == 3 and "though connected" in leave.reason
    assert state.handle([Tick(130.0)], 130.0) == []  # left once


def test_the_manager_lost_after_the_welcome_ends_the_worker():
    state, _ = make(manager_timeout=10.0)
    state.handle([RegistrationSent(), p.Welcome("w", 1.0)], 0.0)
    (leave,) = state.handle([Tick(10.5)], 10.5)
    assert leave == Leave("the manager was lost", 0, 20, unreachable=True)


def test_stop_and_shutdown_say_goodbye_once_welcomed():
    state, _ = make()
    assert state.handle([Stop("SIGTERM")], 0.0) == [Leave("SIGTERM")]  # not welcomed
    state, _ = make()
    state.handle([p.Welcome("w", 1.0)], 0.0)
    out = state.handle([p.Shutdown("done"), Stop("SIGTERM")], 0.0)
    reason = "the manager asked it to (done)"
    assert out == [p.Goodbye(reason), Leave(reason)]
    state, _ = make()
    (leave,) = state.handle([p.Rejected("version 0")], 0.0)
    assert leave.exit_code == EXIT_REJECTED and "rejected it: version 0" in leave.reason


def test_the_poll_timeout_is_the_earliest_deadline():
    state, _ = make(manager_timeout=30.0, fetch_timeout=5.0)
    assert state.poll_timeout(0.0) == 30.0  # not registered: no heartbeat is due
    state.handle([p.Welcome("w", 10.0)], now=2.0)
    assert state.handle([Tick(12.5)], 12.5) == [SendStatus(0, 0, ())]  # a heartbeat
    assert state.poll_timeout(13.0) == 9.5  # the next one
    assert not state.heartbeat_due(22.4) and state.heartbeat_due(22.6)
    state.handle([execute(1, at(7, "tcp://a:1"))], now=13.2)
    assert state.poll_timeout(14.0) == pytest.approx(4.2)  # the fetch, due at 18.2
    assert not state.manager_silent(43.1) and state.manager_silent(43.3)  # heard at 13.2


def test_a_heartbeat_carries_what_is_held_and_the_bars_since_the_last():
    state, (lib,) = make()
    state.handle([p.Welcome("w", 1.0), execute(1)], 0.0)
    state.handle([reply(lib, done_live(1, nbytes=500), wall=100.0)], 0.0)
    (status,) = state.handle([Tick(wall=1000.0)], 10.0)
    assert status.held == 500 and status.spilled == 0 and len(status.bars) == 1
    assert state.handle([Tick(1000.5)], 10.5) == []  # not due yet


def test_a_full_store_is_reported_once_each_way():
    state, _ = make()
    state.store.full = True
    out = state.handle([], 0.0) + state.handle([], 0.0)
    state.store.full = False
    out += state.handle([], 0.0)
    assert out == [p.DiskFull(True), p.DiskFull(False)]


def test_an_unreachable_peer_passes_its_fetches_on():
    state, _ = make()
    (ask,) = state.handle([execute(1, at(7, "tcp://a:1", "tcp://b:1"))], 0.0)
    (other,) = state.handle([PeerUnreachable(ask.address, ask.task_ids)], 0.0)
    assert other.address != ask.address and state.fetcher.fetches[7].current == other.address


# -- live results -------------------------------------------------------------------------


def _live_in(state, lib, task_id, nbytes=10_000, duration=0.01):
    """Result ``task_id`` computed in ``lib`` and kept live there."""
    assert runs(state.handle([execute(task_id)], 0.0)) == [(lib.id, [task_id])]
    state.handle([reply(lib, done_live(task_id, nbytes, duration))], 0.0)


def test_a_result_released_by_the_manager_is_forgotten_by_its_library():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    assert state.handle([p.Release((1,))], 0.0) == [ToLibrary(lib.id, pipe.Forget([1]))]
    assert 1 not in state.live


def test_one_release_of_many_live_results_is_one_forget_per_library():
    state, _ = make(libraries=2)
    held_by: dict[int, list[int]] = {}
    for pair in ((1, 2), (3, 4)):  # one task per library at a time
        state.handle([execute(task_id) for task_id in pair], 0.0)
        libs = {task_id: state.tasks[task_id].lib for task_id in pair}
        for task_id, lib_id in libs.items():
            held_by.setdefault(lib_id, []).append(task_id)
        state.handle([FromLibrary(libs[t], done_live(t, 10_000, 0.01), 0.0) for t in pair], 0.0)
    assert len(held_by) == 2  # both libraries hold some
    out = state.handle([p.Release((1, 2, 3, 4, 5))], 0.0)  # 5 was never here
    assert sorted(out) == [ToLibrary(lib, pipe.Forget(ids)) for lib, ids in sorted(held_by.items())]
    assert not state.live.entries


def test_a_result_released_and_made_again_in_one_batch_is_forgotten_before_it_is_made():
    """Found by the simulator (seed 146 of ``--workers 10 --tasks 200``): the manager
    releases a result kept live in a library and, in the same batch, has it made again
    (lineage). The library was sent the new call, then the ``Forget`` of the old result,
    and dropped the new one; the next task naming it there ran without it (``Missing``).
    The ``Forget`` goes first, whatever the order of the two in the batch."""
    for batch in ([p.Release((1,)), execute(1)], [execute(1), p.Release((1,))]):
        state, (lib,) = make()
        _live_in(state, lib, 1)
        out = state.handle(batch, 1.0)
        assert out == [
            ToLibrary(lib.id, pipe.Forget([1])),
            ToLibrary(
                lib.id, pipe.Run([], None, [pipe.Call(1, "k1", b"payload", [], True, False, 1)])
            ),
            p.Started((1,)),
        ]
        state.handle([reply(lib, done_live(1))], 1.1)
        assert 1 in state.live and state.live.entries[1].lib == lib.id


def test_an_execute_of_a_result_held_here_is_answered_from_it_not_run_again():
    """Found by the simulator (seed 82 of ``--workers 10 --tasks 200 --delay 0.3``): task
    2 is done here, its ``TaskDone`` slow on the way; the manager loses its input 1
    elsewhere, takes 2 back (``Cancel``) and sends both again, 2 to wait for 1 here. The
    old ``TaskDone`` then counts for 2, and the manager cancels 1, which nothing needs:
    the second 2 waited for it here for ever. Answered from the result, it waits for
    nothing, and runs nowhere a second time (seed 33: a second live copy)."""
    state, (lib,) = make()
    _live_in(state, lib, 2)
    batch = [p.Cancel((2,)), execute(1), execute(2, computed_here(1))]
    out = state.handle(batch, 1.0)
    assert runs(out) == [(lib.id, [1])]
    assert reports(out) == [p.TaskDone(2, 10_000, 0.0, None), p.Started((1,))]
    assert list(state.tasks) == [1] and not state.local_waiters
    state.handle([p.Cancel((1,))], 1.1)  # (running: it ends, reported, as usual)
    out = state.handle([reply(lib, done_live(1))], 1.2)
    assert [type(r) for r in reports(out)] == [p.TaskDone] and not list(state.leaks())
    # A small stored one goes with its value; one released in the same batch runs anew.
    state.handle([execute(3)], 2.0)
    state.handle([reply(lib, done(3, "v"))], 2.1)
    (answer,) = state.handle([execute(3)], 2.2)
    assert type(answer) is p.TaskDone and answer[:3] == (3, dumps("v").nbytes, 0.0)
    assert answer.value is not None and loads(answer.value) == "v"
    out = state.handle([execute(3), p.Release((3,))], 2.3)
    assert runs(out) == [(lib.id, [3])] and 3 not in state.store


def test_a_result_made_again_in_another_library_is_kept_in_one():
    """Found by the simulator (seed 33 of ``--workers 10 --tasks 200 --delay 0.3``): a
    result kept live in one library is made again in another (sent again, its value
    asked for): the record of the first copy was replaced by the second, and the
    ``Release`` reached only the second library; the first kept it for ever. The first
    copy stays, the second library forgets its own."""
    state, (lib, other) = make(libraries=2)
    _live_in(state, lib, 1)
    state.handle([execute(2)], 1.0)  # keeps ``lib`` busy
    assert state.tasks[2].lib == lib.id
    out = state.handle([execute(1, want=True)], 1.0)  # live only, its value asked for
    assert runs(out) == [(other.id, [1])]
    value = dumps(1)
    out = state.handle([reply(other, pipe.Done(1, value, 0.01, value.nbytes, True))], 1.1)
    assert out[0] == ToLibrary(other.id, pipe.Forget([1]))
    assert type(out[1]) is p.TaskDone and state.live.entries[1].lib == lib.id
    out = state.handle([p.Release((1,))], 1.2)
    assert out == [ToLibrary(lib.id, pipe.Forget([1]))] and 1 not in state.live


def test_a_peer_asking_for_a_live_result_is_answered_once_it_is_exported():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    out = state.handle([PeerAsked(b"peer-a", (1,)), PeerAsked(b"peer-b", (1, 2))], 0.0)
    # Exported once for both; 2 is not live here: the store's answer (None) at once.
    assert out == [
        ToLibrary(lib.id, pipe.Export([1], False)),
        AnswerPeer(b"peer-b", p.Data(2, None)),
    ]
    out = state.handle([reply(lib, pipe.Exported(1, dumps("one"), 0.001, ""))], 0.0)
    assert [i.ident for i in out] == [b"peer-a", b"peer-b"] and loads(out[0].data.value) == "one"
    assert 1 in state.store and 1 in state.live  # the copy stays for later readers


def test_an_idle_library_takes_a_task_from_a_busy_one_after_an_export():
    state, (lib0, lib1) = make(libraries=2)
    _live_in(state, lib0, 1, duration=1.0)  # long tasks: none queued behind another
    assert runs(state.handle([execute(9)], 0.0)) == [(lib0.id, [9])]  # lib0 is busy with it
    out = state.handle([execute(task_id, held(1)) for task_id in (2, 3, 4)], 0.0)
    # They wait for lib0, which holds their input; idle lib1 takes one, once it is exported.
    assert out == [ToLibrary(lib0.id, pipe.Export([1], False))]
    assert state.tasks[2].state == "waiting" and state.tasks[2].missing == {1}
    assert list(state.dispatch.homed[lib0.id]) == [3, 4]
    out = state.handle([reply(lib0, pipe.Exported(1, dumps("one"), 0.001, ""))], 0.0)
    assert runs(out) == [(lib1.id, [2])]
    (run,) = requests(out)
    assert loads(run.calls[0].inputs[0][2]) == "one"


def test_live_results_past_the_memory_limit_are_exported_to_the_store_which_spills(tmp_path):
    state, (lib,) = make(store=Store(25_000, str(tmp_path)))
    for task_id in (1, 2):
        _live_in(state, lib, task_id, nbytes=10_000)
    state.handle([execute(3)], 0.0)
    out = state.handle([reply(lib, done_live(3, 10_000))], 0.0)
    assert ToLibrary(lib.id, pipe.Export([1], True)) in out  # the oldest
    assert state.handle([], 0.0) == []  # on its way: not asked twice
    value = dumps(b"x" * 10_000)
    state.handle([reply(lib, pipe.Exported(1, value, 0.001, ""))], 0.0)
    assert 1 not in state.live and 1 in state.store and state.store.reserved == 20_000
    assert state.store.memory_bytes + state.live.nbytes <= 25_000 + value.nbytes


def test_a_live_input_that_cannot_be_serialized_fails_the_task_that_needs_it_elsewhere():
    state, (lib,) = make()
    _live_in(state, lib, 1)
    config = p.RunConfig(6, "tasks", "direct", (), (), False)
    out = state.handle([config, execute(3, held(1), run_id=6)], 0.0)  # a task process: export
    assert out == [ToLibrary(lib.id, pipe.Export([1], False))]
    assert state.tasks[3].state == "waiting" and state.live_tasks.exports[1].tasks == {3}
    out = state.handle([reply(lib, pipe.Exported(1, None, 0.0, "TypeError: a lock"))], 0.0)
    (erred,) = [r for r in out if type(r) is p.TaskErred]
    assert erred.task_id == 3 and "k1" in erred.message and "a lock" in erred.message
    assert 3 not in state.tasks and state.live.entries[1].stuck


def test_a_dead_library_loses_its_live_results_and_blames_the_task_it_was_running():
    state, (lib,) = make()
    _live_in(state, lib, 1, duration=0.0001)  # tiny: several tasks per request
    state.handle([execute(task_id) for task_id in (2, 3, 4)], 0.0)
    assert list(lib.sent) == [2, 3, 4]
    out = state.handle([LibraryDied(lib.id, "exited with code 3", running={3})], 0.0)
    crashed = [r for r in out if type(r) is p.TaskCrashed]
    assert [r.task_id for r in crashed] == [3]  # 2's reply was held, not lost to blame
    assert p.Lost((1,)) in out and 1 not in state.live
    # Its successor starts and is sent the others at once (its pipe holds them meanwhile).
    assert StartLibrary(2, 1) in out and runs(out) == [(2, [2, 4])]


def test_abort_drops_unstarted_tasks_silently_and_frees_their_fetches():
    state, _ = make()
    out = state.handle(
        [execute(1), execute(2, at(7, "tcp://a:1")), p.Abort((1, 2, 99), "run elsewhere")], 0.0
    )
    assert out == [AskPeer("tcp://a:1", (7,))]  # (asked before the abort; its answer dropped)
    assert not state.tasks and not state.fetcher.fetches and not list(state.leaks())


def test_abort_of_a_running_task_kills_its_library_and_requeues_what_else_it_ran():
    """Nothing is reported of the aborted task, even a reply that arrives before the
    kill; the other tasks the library had are not blamed (they run again) and the
    results it kept live are lost."""
    state, (lib,) = make()
    _live_in(state, lib, 1, duration=0.0001)  # tiny: several tasks per request
    assert runs(state.handle([execute(t) for t in (2, 3, 4)], 0.0)) == [(lib.id, [2, 3, 4])]
    assert state.handle([p.Abort((3,), "a straggler")], 0.0) == [KillLibrary(lib.id)]
    assert 3 not in state.tasks and state.aborting == {lib.id}
    assert state.handle([reply(lib, done(3))], 0.0) == []  # written before the kill
    out = state.handle([LibraryDied(lib.id, "killed by signal SIGKILL", running={2})], 0.0)
    assert out[:2] == [p.Lost((1,)), StartLibrary(2, 1)]  # no TaskCrashed: 2 was not at fault
    assert runs(out) == [(2, [2, 4])] and not state.aborting
    new = state.dispatch.libraries[2]
    out = state.handle([reply(new, done(2))], 0.0)
    assert out == [p.Started((4,)), done_record(out, 2)]
    out = state.handle([reply(new, done(4))], 0.0)
    assert out == [done_record(out, 4)]
    assert not list(state.leaks())


def test_a_late_reply_of_an_aborted_task_sent_again_is_not_taken_for_the_new_one():
    state, (lib, other) = make(libraries=2)
    assert runs(state.handle([execute(1)], 0.0)) == [(lib.id, [1])]
    assert state.handle([p.Abort((1,), "a straggler")], 0.0) == [KillLibrary(lib.id)]
    assert runs(state.handle([execute(1)], 0.0)) == [(other.id, [1])]  # given back to us
    out = state.handle([reply(lib, done(1, "stale"))], 0.0)  # from the library being killed
    assert not any(type(r) is p.TaskDone for r in out)
    out = state.handle([reply(other, done(1, "fresh"))], 0.0)
    (report,) = [r for r in out if type(r) is p.TaskDone]
    assert loads(report.value) == "fresh"


def test_a_task_aborted_and_sent_again_in_one_batch_survives_its_library_killed():
    """Found by the simulator (seeds 522, 884, 1724): the manager aborts a straggler and,
    with no other worker free, sends it back in the same batch. The killed library's
    death requeued the tasks it was sent by id, and found the new record, queued already
    (``InvalidTransition``); with a second library, running there (run twice)."""
    state, (lib,) = make()
    assert runs(state.handle([execute(1)], 0.0)) == [(lib.id, [1])]
    out = state.handle([p.Abort((1,), "a straggler"), execute(1)], 1.0)
    assert out == [KillLibrary(lib.id)]  # the new record waits: the one slot is taken
    out = state.handle([LibraryDied(lib.id, "killed by signal SIGKILL", ())], 1.0)
    assert out == [
        StartLibrary(2, 1),
        ToLibrary(2, pipe.Run([], None, [pipe.Call(1, "k1", b"payload", [], True, False, 1)])),
        p.Started((1,)),
    ]
    out = state.handle([reply(state.dispatch.libraries[2], done(1))], 2.0)
    assert [type(r) for r in out] == [p.TaskDone] and not list(state.leaks())


def test_a_task_aborted_and_sent_again_to_another_library_is_not_requeued_by_the_kill():
    state, (lib, other) = make(libraries=2)
    assert runs(state.handle([execute(1)], 0.0)) == [(lib.id, [1])]
    out = state.handle([p.Abort((1,), "a straggler"), execute(1)], 1.0)
    assert out[0] == KillLibrary(lib.id) and runs(out) == [(other.id, [1])]
    out = state.handle([LibraryDied(lib.id, "killed by signal SIGKILL", ())], 1.0)
    assert out == [StartLibrary(3, 1)]  # the new record runs on in the other library
    assert state.tasks[1].state == "running" and state.tasks[1].lib == other.id


def test_abort_of_a_task_process_kills_it_and_ignores_its_exit():
    state, _ = make()
    config = p.RunConfig(3, "tasks", "direct", (), (), True)
    (start,) = state.handle([config, execute(1, run_id=3)], 0.0)
    assert state.handle([ProcessStarted(start.task)], 0.0) == [p.Started((1,))]
    assert state.handle([p.Abort((1,), "a straggler")], 0.0) == [KillProcess(start.task)]
    assert not state.aborting
    crash = pipe.Crashed(1, "task process killed by signal SIGKILL")
    assert state.handle([ProcessExited(start.task, crash, 0.0)], 0.0) == []
    assert not list(state.leaks())


def _unreadable(task_id, exc):
    raise AssertionError(f"result {task_id} could not be read back") from exc


# -- a simulated worker under random events ----------------------------------------------------

PEERS = ("tcp://a:1", "tcp://b:1")


class SimulatedWorker:
    """A ``WorkerState`` with fake libraries and peers, and a manager that sends each task
    once and cancels the tasks sent ahead of an input that will not come: a shell of
    events in and instructions out, with no sockets and no processes."""

    def __init__(self, graph, slots, started_hold=0.0):
        self.state, libs = make(
            libraries=2, slots=slots, fetch_timeout=1.0, started_hold=started_hold
        )
        self.slots = slots
        self.graph = graph  #: task id -> [("local", task id) | ("peer", id, peers) | ("inline",)]
        self.now = 0.0
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
        #: tasks the worker said began running (``Started``), or ran (their report)
        self.started: set[int] = set()
        #: tasks reported done or erred since the manager last sent them: no ``Started``
        #: of them may follow
        self.ended: set[int] = set()
        #: tasks the manager aborted: nothing is reported of them
        self.aborted: set[int] = set()

    def handle(self, *events):
        """Hand the worker events and carry out its instructions, feeding back what
        they answer (libraries serve exports and forgets at once, start at once)."""
        pending = list(events)
        while pending:
            out = self.state.handle(pending, self.now)
            pending = []
            for instruction in out:
                pending += self._carry(instruction)

    def _carry(self, instruction):
        kind = type(instruction)
        if kind is ToLibrary:
            return self._to_library(instruction.library_id, instruction.request)
        if kind is StartLibrary:
            lib_id = instruction.library_id
            self.pipes[lib_id], self.lib_live[lib_id], self.doomed[lib_id] = [], set(), set()
            return [FromLibrary(lib_id, pipe.Ready(), self.now)]
        if kind is KillLibrary:
            return self._kill(instruction.library_id, set())
        if kind is AskPeer:
            self.requests.extend((instruction.address, d) for d in instruction.task_ids)
        elif kind is ClosePeer:  # its socket reset: what was asked of it is lost
            self.requests = [r for r in self.requests if r[0] != instruction.address]
        elif kind is AnswerPeer:
            self.asks[instruction.ident][1].append(instruction.data)
        elif kind in p.TO_MANAGER:
            self._report(instruction)
        else:
            raise AssertionError(f"unexpected {instruction!r}")
        return []

    def _report(self, message):
        kind = type(message)
        if kind is p.Started:
            assert not self.ended.intersection(message.task_ids), (message, self.ended)
            self.started.update(message.task_ids)
        elif kind in (p.TaskDone, p.TaskErred, p.TaskCrashed, p.FetchFailed):
            if kind in (p.TaskDone, p.TaskErred):  # it ran (a Started before it may be left out)
                self.started.add(message.task_id)
                self.ended.add(message.task_id)
            self.reports.setdefault(message.task_id, []).append(message)
            if kind is not p.TaskDone:
                self._recall_dependents(message.task_id)
        elif kind is p.Withdrawn:
            for task_id in message.task_ids:
                self.reports.setdefault(task_id, []).append(message)
                self.cancelled.discard(task_id)
                self._recall_dependents(task_id)

    def _to_library(self, lib_id, request):
        if lib_id not in self.lib_live:
            return []  # died since
        if type(request) is pipe.Run:
            self.pipes[lib_id].extend(request.calls)
            return []
        answers = []
        for task_id in request.task_ids:
            if type(request) is pipe.Export:
                held = task_id in self.lib_live[lib_id]
                value = dumps(task_id) if held else None
                exported = pipe.Exported(task_id, value, 0.0, "" if held else "not held")
                answers.append(FromLibrary(lib_id, exported, self.now))
            if type(request) is pipe.Forget or request.drop:
                self.doomed[lib_id].add(task_id)
        self._settle_doomed(lib_id)
        return answers

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
        self.handle(execute(task_id, *deps))

    def replicate(self, index, peers):
        """The manager asks for a copy of a result held by peers (``replicas=k``)."""
        self.handle(p.Replicate(1000 + index % 4, peers))

    def release(self, task_id):
        """The manager releases a result here (even one a queued task still needs: the
        worker must report that task, not lose it)."""
        self.handle(p.Release((task_id, 1000 + task_id % 4)))

    def _over(self, task_id):
        return task_id in self.reports or task_id in self.cancelled or task_id in self.aborted

    def cancel(self, task_id, withdraw=False):
        if task_id not in self.sent or self._over(task_id):
            return
        dropped = task_id in self.state.tasks and self.state.tasks[task_id].state != "running"
        if dropped and not withdraw:
            self.cancelled.add(task_id)
        self.handle((p.Withdraw if withdraw else p.Cancel)((task_id,)))
        if dropped and not withdraw:  # (a withdrawn one is recalled when it is reported)
            self._recall_dependents(task_id)

    def _settle_doomed(self, lib_id):
        """Forgotten results go once no call queued in their library reads them."""
        reading = {d for call in self.pipes[lib_id] for _, d, v in call.inputs if v is None}
        for task_id in list(self.doomed[lib_id] - reading):
            self.doomed[lib_id].discard(task_id)
            self.lib_live[lib_id].discard(task_id)

    def ask(self, index, task_id):
        """A peer asks for a result, answered as the peer server answers: from the store,
        or, for a live one, by the state once it is exported (``PeerAsked``)."""
        ident = f"peer-{index}".encode()
        if ident in self.asks:
            return
        self.asks[ident] = (task_id, [])
        answer = serving.answer(self.state.store, self.state.live, task_id, _unreadable)
        if answer is not None:
            self.asks[ident][1].append(answer)
        else:
            self.handle(PeerAsked(ident, (task_id,)))

    def _recall_dependents(self, task_id):
        """Tasks sent ahead to wait for ``task_id`` here will not get it: the manager
        calls them back (``Cancel``)."""
        for other in list(self.state.tasks.values()):
            if any(dep.task_id == task_id and dep.peers is None for dep in other.deps):
                self.cancel(other.id)

    # libraries and peers

    def start(self):
        self.handle()  # an empty pass: tasks go to libraries with free slots

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
        self.handle(FromLibrary(lib_id, reply, self.now))

    def abort(self, task_id):
        """The manager takes a task back, running or not (a straggler): the library
        running it is killed (``KillLibrary``); the others it ran are not blamed."""
        if task_id not in self.sent or self._over(task_id):
            return
        self.aborted.add(task_id)
        self.handle(p.Abort((task_id,), "a straggler"))
        self._recall_dependents(task_id)

    def die(self, index):
        busiest = sorted(self.pipes, key=lambda lib_id: -len(self.pipes[lib_id]))
        lib_id = busiest[index % len(busiest)]
        running = {call.task_id for call in self.pipes[lib_id][: self.slots]}
        for task_id in running:
            self.executed[task_id] = self.executed.get(task_id, 0) + 1  # it was running
        self.handle(*self._kill(lib_id, running))

    def _kill(self, lib_id, running):
        """Library ``lib_id`` dies, blamed for ``running``: its death, for the state
        (which starts another in its place)."""
        del self.pipes[lib_id], self.lib_live[lib_id], self.doomed[lib_id]
        return [LibraryDied(lib_id, "killed by signal SIGKILL", running)]

    def answer(self, index, how):
        if not self.requests:
            return
        address, dep_id = self.requests.pop(index % len(self.requests))
        if how == "silent":
            return
        holds = how == "data" and address == PEERS[0]
        self.handle(p.Data(dep_id, dumps(dep_id) if holds else None))

    def tick(self):
        self.now += 1.0
        self.handle(Tick(self.now))

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
                self.tick()  # (a held Started goes out)
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
    hold=st.sampled_from([0.0, STARTED_HOLD]),
)
@example(  # a second peer asks for a result the first one's ask exported to the store
    graph={1: [], 2: []},
    steps=[
        ("execute", 1),
        ("start",),
        ("execute", 2),
        ("finish", 0, "done"),
        ("start",),
        ("finish", 0, "done"),
        ("ask", 0, 2),
        ("ask", 1, 2),
    ],
    slots=1,
    recent=None,
    hold=STARTED_HOLD,
)
def test_simulated_worker_runs_each_task_once_and_leaks_nothing(graph, steps, slots, recent, hold):
    sim = SimulatedWorker(graph, slots, hold)
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


@pytest.mark.integration
def test_the_fetch_timeout_is_a_worker_flag(capsys):
    from daskvine_py.worker.shell import parse_args

    assert parse_args(["tcp://127.0.0.1:5"]).fetch_timeout == 10.0
    assert parse_args(["tcp://127.0.0.1:5", "--fetch-timeout", "2.5"]).fetch_timeout == 2.5
    with pytest.raises(SystemExit):
        parse_args(["tcp://127.0.0.1:5", "--fetch-timeout", "0"])
    assert "argument --fetch-timeout: must be > 0" in capsys.readouterr().err
