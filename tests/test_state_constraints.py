"""Annotated tasks in the scheduler state (resources, restrictions, per-task retries),
driven with literal events and a simulated cluster: no sockets, no processes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskvine_py.plan.annotations import MB, Placement, RunSettings
from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from test_state import SimulatedCluster, random_graphs, sends

W1, W2 = b"w1", b"w2"


def joined(worker: bytes, cores: int = 1, memory_mb: int = 1000) -> s.WorkerJoined:
    name = worker.decode()
    return s.WorkerJoined(worker, name, cores, f"tcp://{name}", memory_mb * MB, f"host-{name}")


def annotated(placements=None, retries=None) -> RunSettings:
    placements = placements or {}
    examples: dict = {}
    for key, placement in placements.items():
        examples.setdefault(placement, key)
    return RunSettings(retries or {}, placements, examples)


def run_of(keys, placements=None, retries=None, run_retries=3, deps=None, run_id=1):
    deps = deps or {}
    tasks = [s.NewTask(k, b"", (), deps.get(k, ()), i) for i, k in enumerate(keys)]
    outputs = [k for k in keys if not any(k in d for d in deps.values())]
    settings_ = annotated(placements, retries)
    return s.SubmitRun(run_id, tasks, outputs, run_retries, settings=settings_)


def executed(out) -> dict[str, bytes]:
    return {
        i.message.key: i.worker for i in out if type(i) is s.Send and type(i.message) is p.Execute
    }


def done(worker: bytes, task_id: int):
    return s.FromWorker(worker, p.TaskDone(task_id, 8, 0.01, dumps(0)))


def test_a_two_core_task_goes_where_two_slots_are_free_and_takes_both():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=4)
    two = Placement(cores=2)
    out = st_.handle(
        [joined(W1, cores=1), joined(W2, cores=2), run_of(["big", "a", "b", "c"], {"big": two})]
    )
    placed = executed(out)
    assert placed["big"] == W2
    # While it runs there, w2 holds nothing beyond its two slots: the other tasks, and the
    # extras that saturation would give, go to w1.
    assert [k for k, w in placed.items() if w == W2] == ["big"]
    assert st_.workers[W2].processing.keys() == {st_.runs[1].tasks["big"]}
    big_id = st_.runs[1].tasks["big"].id
    out = st_.handle([done(W2, big_id)])
    assert set(executed(out).values()) <= {W2}  # the rest may go to w2 again, now it is free


def test_memory_is_reserved_and_a_task_goes_only_where_it_fits():
    st_ = s.SchedulerState()
    big = Placement(memory=600 * MB)
    out = st_.handle(
        [
            joined(W1, cores=4, memory_mb=500),
            joined(W2, cores=4, memory_mb=1000),
            run_of(["m1", "m2"], {"m1": big, "m2": big}),
        ]
    )
    # Only w2 has the memory, and only for one of them at a time.
    assert executed(out) == {"m1": W2}
    out = st_.handle([done(W2, st_.runs[1].tasks["m1"].id)])
    assert executed(out) == {"m2": W2}


def test_a_task_waiting_for_room_holds_its_worker_back_from_new_work():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    st_.handle([joined(W2, cores=2)])
    out = st_.handle([run_of(["a", "b"], run_id=1)])
    assert executed(out) == {"a": W2, "b": W2}
    # A two-core task arrives while both slots are busy, with small tasks behind it.
    out = st_.handle([run_of(["big", "c", "d"], {"big": Placement(cores=2)}, run_id=2)])
    assert executed(out) == {}
    tasks = st_.runs[1].tasks
    out = st_.handle([done(W2, tasks["a"].id)])
    assert executed(out) == {}  # the free slot waits for the big task, not for "c"
    out = st_.handle([done(W2, tasks["b"].id)])
    assert executed(out) == {"big": W2}


def test_a_task_no_worker_can_hold_fails_its_run_naming_the_key_and_the_ask():
    st_ = s.SchedulerState()
    out = st_.handle([joined(W1), joined(W2), run_of(["x", "huge"], {"huge": Placement(cores=4)})])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "huge" and failed.run_id == 1
    assert "4 cores" in failed.message and "w1 (1 core," in failed.message
    assert not st_.runs and not st_.tasks and not st_.ctx.constraints.placing


def test_an_impossible_task_deep_in_the_graph_fails_the_run_at_submission():
    st_ = s.SchedulerState()
    st_.handle([joined(W1)])
    out = st_.handle([run_of(["a", "b"], {"b": Placement(memory=10**6 * MB)}, deps={"b": ("a",)})])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "b" and "MB of memory" in failed.message
    assert executed(out) == {}  # failed before anything of it was sent


def test_without_workers_an_annotated_run_waits_rather_than_fails():
    st_ = s.SchedulerState()
    out = st_.handle([run_of(["big"], {"big": Placement(cores=2)})])
    assert out == []
    out = st_.handle([joined(W1, cores=1)])
    assert [i.key for i in out if type(i) is s.RunFailed] == ["big"]
    st_ = s.SchedulerState()
    st_.handle([run_of(["big"], {"big": Placement(cores=2)})])
    assert executed(st_.handle([joined(W2, cores=2)])) == {"big": W2}


def test_workers_restrict_placement_by_name_or_host():
    st_ = s.SchedulerState()
    only_w2 = Placement(workers=frozenset({"w2"}))
    on_host = Placement(workers=frozenset({"host-w1"}))
    out = st_.handle(
        [
            joined(W1, cores=4),
            joined(W2, cores=4),
            run_of(["a", "b", "c"], {"a": only_w2, "b": only_w2, "c": on_host}),
        ]
    )
    assert executed(out) == {"a": W2, "b": W2, "c": W1}


def test_allow_other_workers_applies_only_while_none_named_is_connected():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=0)
    loose = Placement(workers=frozenset({"w2"}), loose=True)
    out = st_.handle([joined(W1), run_of(["a"], {"a": loose})])
    assert executed(out) == {"a": W1}  # nobody named w2: anywhere
    out = st_.handle([joined(W2), run_of(["b", "c"], {"b": loose, "c": loose}, run_id=2)])
    assert executed(out) == {"b": W2}  # w2 is here now: it waits for w2, not for w1
    strict = Placement(workers=frozenset({"nobody"}))
    out = st_.handle([run_of(["d"], {"d": strict}, run_id=3)])
    (failed,) = [i for i in out if type(i) is s.RunFailed]
    assert failed.key == "d" and "workers ['nobody']" in failed.message


def test_annotated_retries_override_the_runs():
    st_ = s.SchedulerState()
    st_.handle([joined(W1), run_of(["a", "b"], retries={"a": 2, "b": 0}, run_retries=5)])
    a, b = (st_.runs[1].tasks[k] for k in "ab")
    for attempt in (1, 2):
        out = st_.handle([s.FromWorker(W1, p.TaskCrashed(a.id, "killed"))])
        assert not [i for i in out if type(i) is s.RunFailed] and a.attempts == attempt
    out = st_.handle([s.FromWorker(W1, p.TaskCrashed(a.id, "killed"))])
    assert [(i.key, i.crashed) for i in out if type(i) is s.RunFailed] == [("a", True)]
    st_ = s.SchedulerState()
    st_.handle([joined(W1, cores=2), run_of(["a", "b"], retries={"b": 0}, run_retries=5)])
    st_.handle([s.FromWorker(W1, p.Started((1, 2)))])  # both running when W1 is lost
    out = st_.handle([s.WorkerLost(W1, "killed")])
    assert [i.key for i in out if type(i) is s.RunFailed] == ["b"]


def test_annotated_tasks_are_never_taken_back_for_idle_workers():
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=4)
    near = Placement(memory=1 * MB)
    st_.handle([joined(W1, cores=1), run_of(["a", "b", "c"], {k: near for k in "abc"})])
    assert len(st_.workers[W1].processing) == 1  # placed only where a slot is free
    st_ = s.SchedulerState(fixed_extra_tasks_per_core=4)
    st_.handle([joined(W1, cores=1), run_of(list("abcde"), {"e": near})])
    out = st_.handle([joined(W2)])
    withdrawn = [m.task_ids for m in sends(out, p.Withdraw)]
    assert withdrawn and st_.runs[1].tasks["e"].id not in withdrawn[0]


def test_a_dependent_with_a_placement_is_not_sent_ahead():
    st_ = s.SchedulerState()
    out = st_.handle(
        [joined(W1, cores=2), run_of(["a", "b"], {"b": Placement(cores=2)}, deps={"b": ("a",)})]
    )
    assert executed(out) == {"a": W1}
    out = st_.handle([done(W1, st_.runs[1].tasks["a"].id)])
    assert executed(out) == {"b": W1}


# -- a simulated cluster of workers of different sizes, with random placements ----------


class PlacingCluster(SimulatedCluster):
    """Checks, after every step, that no worker holds more than it can run at once, nor a
    task anywhere it may not run."""

    sizes = {b"w0": (1, 500), b"w1": (2, 2000), b"w2": (4, 1000)}

    def join(self, name: bytes):
        self.stores[name] = {}
        self.queued[name] = []
        cores, memory = self.sizes.get(name, (2, 1000))
        self.apply([s.WorkerJoined(name, name.decode(), cores, name.decode(), memory * MB)])

    def apply(self, events):
        super().apply(events)
        for worker in self.state.workers.values():
            annotated = [t for t in worker.processing if t.placement is not None]
            for task in annotated:
                names = task.placement.workers
                assert names is None or worker.name in names or task.placement.loose
            if any(t.placement.cores > 1 for t in annotated):
                # What could run at once: tasks sent ahead wait for a task there first.
                startable = [t for t in worker.processing if t.missing == 0]
                slots = sum(t.placement.cores if t.placement else 1 for t in startable)
                assert slots <= worker.cores, (worker, worker.processing)
            memory = sum(t.placement.memory for t in annotated)
            assert memory <= worker.memory


placements = st.sampled_from(
    [
        None,
        Placement(cores=2),
        Placement(cores=4),
        Placement(memory=800 * MB),
        Placement(workers=frozenset({"w1"})),
        Placement(cores=2, workers=frozenset({"w1", "w2"})),
        Placement(workers=frozenset({"w9"}), loose=True),
    ]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(), seed=st.integers(0, 10**6), losses=st.integers(0, 2), data=st.data())
def test_random_placements_never_overfill_a_worker_and_every_run_ends(graph, seed, losses, data):
    deps, outputs = graph
    chosen = {k: data.draw(placements) for k in deps}
    chosen = {k: v for k, v in chosen.items() if v is not None}
    cluster = PlacingCluster(seed)
    for name in PlacingCluster.sizes:
        cluster.join(name)
    tasks = [s.NewTask(k, b"", (), deps[k], i) for i, k in enumerate(deps)]
    cluster.apply([s.SubmitRun(1, tasks, outputs, 3, settings=annotated(chosen))])
    for _ in range(10_000):
        if not any(cluster.queued.values()) and not cluster.pending:
            break
        if losses and cluster.rng.random() < 0.05:  # preempted, and back (same size)
            losses -= 1
            name = cluster.rng.choice(sorted(cluster.stores))
            cluster.lose(name)
            cluster.join(name)
            continue
        cluster.step()
    assert cluster.done.get(1) == "done", cluster.done
    state = cluster.state
    assert not state.tasks and not state.runs and not state.ctx.constraints.placing


def test_an_annotated_task_of_a_lost_worker_is_placed_again_by_the_same_rules():
    st_ = s.SchedulerState()
    two = Placement(cores=2)
    st_.handle([joined(W1, cores=2), joined(W2, cores=2), run_of(["big"], {"big": two})])
    holder = st_.runs[1].tasks["big"].worker.id
    other = W2 if holder == W1 else W1
    out = st_.handle([s.WorkerLost(holder, "preempted")])
    assert executed(out) == {"big": other}
    assert st_.ctx.constraints.room(st_.workers[other]) == 0  # its two slots are taken


def test_a_task_whose_capable_workers_left_waits_for_one_to_join():
    st_ = s.SchedulerState()
    two = Placement(cores=2)
    st_.handle([joined(W1, cores=1), joined(W2, cores=2), run_of(["big"], {"big": two})])
    out = st_.handle([s.WorkerLost(W2, "preempted")])
    assert out == [] and st_.runs[1].tasks["big"].state == "ready"
    out = st_.handle([joined(b"w3", cores=2)])
    assert executed(out) == {"big": b"w3"}
