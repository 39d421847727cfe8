"""The ``Copies`` component alone: replicas, copies reported gone, and lineage."""

from __future__ import annotations

from daskvine_py.scheduler.copies import Copies
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from parts import context


def make(cache_runs: dict | None = None):
    names = (b"a", b"b", b"c")
    sent: list = []
    moves: list = []
    payloads: list = []

    def transition(task, finish, worker=None):
        moves.append((task.id, finish))
        task.state = finish

    def cache_lost(lost):
        return [t for t in lost if t.key != "cached"]

    ctx = context(
        transition,
        tuple(WorkerRecord(n, n.decode(), 1, f"tcp://{n.decode()}:1") for n in names),
        claims={"send": lambda w, m: sent.append((w.name, m))},
        caching={"lost": cache_lost, "payload": payloads.append},
    )
    ctx.cache_runs.update(cache_runs or {})
    copies = Copies(ctx)
    return copies, ctx.workers, ctx.tasks, sent, moves, payloads


def chain(tasks, run, *states):
    """x1 <- x2 <- ... with the given states; each reads the one before."""
    records = []
    for i, state in enumerate(states, 1):
        t = TaskRecord(i, f"x{i}", run, b"code", (), i, "x")
        t.state = state
        if records:
            t.deps = (records[-1],)
            records[-1].add_dependent(t)
        tasks[i] = t
        records.append(t)
    return records


def test_replicas_go_to_the_least_loaded_other_workers_and_copies_are_recorded():
    copies, workers, tasks, sent, moves, _ = make()
    run = RunRecord(1, 0, (), replicas=2)
    (x,) = chain(tasks, run, "memory")
    a, b, c = workers.values()
    x.hold(a)
    b.has_what.add(TaskRecord(9, "other", run, b"", (), 9, "o"))  # b holds more
    copies.replicate(x, a)
    assert sent == [("c", p.Replicate(1, ("tcp://a:1",)))]
    copies.on_replicas(c, p.Replicas((1, 42)))  # 42: unknown, released there
    assert x.who_has == {a, c} and x in c.has_what
    assert sent[-1] == ("c", p.Release((42,)))


def test_a_lost_last_copy_that_is_still_read_is_computed_again_from_its_lineage():
    copies, workers, tasks, sent, moves, _ = make()
    run = RunRecord(1, 0, ())
    x1, x2, x3 = chain(tasks, run, "released", "memory", "waiting")
    a = workers[b"a"]
    x2.hold(a)
    a.has_what.add(x2)
    x2.waiters = 1  # x3 reads it
    copies.on_lost(a, p.Lost((2,)))
    # x2 is released, then recomputed: its input x1, released too, first.
    assert moves == [(2, "released"), (2, "waiting"), (1, "ready")]
    assert copies.recomputed == 2 and x2.missing == 1 and x1.waiters == 1


def test_a_task_that_fails_on_a_worker_said_to_hold_it_loses_that_copy():
    copies, workers, tasks, sent, moves, _ = make()
    run = RunRecord(1, 0, ())
    (x,) = chain(tasks, run, "memory")
    a, b = workers[b"a"], workers[b"b"]
    x.hold(a)
    x.hold(b)
    copies.not_held(1, a)
    assert x.who_has == {b} and moves == []  # another copy remains
    copies.not_held(1, b)
    assert moves == [(1, "released")]  # nobody needs it: not recomputed


def test_lineage_asks_the_cache_for_payloads_it_deferred_and_skips_cached_results():
    copies, workers, tasks, sent, moves, payloads = make(cache_runs={1: object()})
    run = RunRecord(1, 0, ())
    (x,) = chain(tasks, run, "released")
    x.payload = b""
    copies.recompute(x)
    assert payloads == [x] and moves == [(1, "ready")]
    cached = TaskRecord(5, "cached", run, b"", (), 5, "c")
    cached.state, cached.waiters = "memory", 1
    copies.lose([cached])
    assert moves == [(1, "ready")]  # the cache forgot it: not the state's to recompute
