"""The ``Caching`` component alone: hits, results read from disk, providers kept after
their run, with literal records and the other parts' operations as recording functions."""

from __future__ import annotations

from daskvine_py.scheduler.caching import Caching
from daskvine_py.scheduler.messages import (
    CacheClear,
    CacheStatus,
    NewTask,
    RunCache,
    RunDone,
    RunOutput,
)
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps, loads
from parts import context


class Host:
    """The state's side: records, and what the component calls back."""

    def __init__(self) -> None:
        self.worker = WorkerRecord(b"w", "w", 1, "tcp://w:1")
        self.moves: list = []
        self.dropped: list = []
        self.dismissed: list = []
        ctx = context(
            self.transition,
            (self.worker,),
            claims={"send": lambda w, m: self.out.append((w.name, m))},
            failures={
                "drop_run": self.dropped.append,
                "dismiss": lambda t, drop: self.dismissed.append(t.key),
            },
            copies={"lose": self.moves.append, "recompute": self.moves.append},
        )
        self.workers, self.runs, self.tasks, self.out = ctx.workers, ctx.runs, ctx.tasks, ctx.out
        self.caching = ctx.caching = Caching(ctx)

    def transition(self, task, finish, worker=None):
        self.moves.append((task.key, finish))
        task.state = finish

    def submit(self, run_id: int, key: str, info: RunCache) -> TaskRecord:
        run = self.runs[run_id] = RunRecord(run_id, 0, (key,))
        record = TaskRecord(run_id * 10, key, run, b"", (), 0, key)
        record.is_output = True
        run.tasks[key] = record
        self.tasks[record.id] = record
        self.caching.open(run, info)
        self.caching.added(run, [(NewTask(key, b"", (), (), 0), record)])
        return record


def test_statuses_are_a_str_enum_a_plan_of_plain_strings_still_matches():
    assert CacheStatus("disk") is CacheStatus.DISK and CacheStatus.DISK == "disk"
    assert [s.value for s in CacheStatus] == ["skip", "hit", "disk"]


def test_an_output_whose_key_has_a_live_result_gets_its_value_and_ends_its_run():
    host = Host()
    provider = TaskRecord(99, "a", RunRecord(5, 0, ()), b"", (), 0, "a")
    provider.state, provider.value = "memory", dumps(41)
    host.tasks[99] = provider
    host.caching.index.providers[b"ka"] = provider
    record = host.submit(1, "a-again", RunCache({"a-again": b"ka"}))
    assert host.moves == [("a-again", "released")]  # a hit: never computed
    assert host.out == [RunOutput(1, "a-again", provider.value), RunDone(1)]
    assert host.dropped == [record.run]


def test_a_result_planned_from_disk_starts_in_memory_with_its_value():
    host = Host()
    value = dumps(7)
    record = host.submit(1, "b", RunCache({"b": b"kb"}, {"b": "disk"}, {"b": value}))  # type: ignore[dict-item]
    assert host.moves == [("b", "memory")] and record.value is value
    assert [type(i) for i in host.out] == [RunOutput, RunDone]
    assert loads(host.out[0].value) == 7


def test_a_provider_outlives_its_run_until_the_cache_is_cleared():
    host = Host()
    info = RunCache({"c": b"kc"})
    record = host.submit(1, "c", info)
    assert host.caching.index.providers == {b"kc": record} and record.waiters == 1
    record.state, record.nbytes = "memory", 100
    record.hold(host.worker)
    host.caching.done(record, p.TaskDone(10, 100, 0.5, None), host.worker)
    assert host.caching.index.seconds == {b"kc": 0.5}
    host.caching.drop(record.run)
    index = host.caching.index
    assert record.run is host.caching.owner and not record.deps
    assert (index.entries, index.nbytes) == (1, 100)
    assert info.stats["misses"] == 1 and info.stats["tasks_run"] == 1
    host.caching.on_clear(CacheClear())
    assert host.dismissed == ["c"] and index.clears == 1
    assert (index.entries, index.nbytes) == (0, 0) and not index.providers
