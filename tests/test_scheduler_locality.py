"""The ``Locality`` component alone: targets, sibling pulls and sending ahead, driven with
literal records and a transition that only records its calls."""

from __future__ import annotations

from daskvine_py.scheduler.locality import Locality, target
from daskvine_py.scheduler.matching import ReadyQueue
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from parts import context


def worker(name: str, cores: int = 1) -> WorkerRecord:
    return WorkerRecord(name.encode(), name, cores, f"tcp://{name}:1")


def task(run: RunRecord, id: int, *deps: TaskRecord, state: str = "waiting") -> TaskRecord:
    record = TaskRecord(id, f"t{id}", run, b"", (), id, "t")
    record.state = state  # type: ignore[assignment]
    record.deps = deps
    for dep in deps:
        dep.add_dependent(record)
    return record


def make(moves: Moves, queue: ReadyQueue[TaskRecord] | None = None, **settings) -> Locality:
    """A ``Locality`` whose workers hold no extras (saturation)."""
    ctx = context(moves, saturation={"extra": lambda w, t: 0})
    if queue is not None:
        ctx.queue = queue
    return Locality(ctx, **settings)


class Moves(list):
    """A transition that records (task id, new state, worker name) and sets the state."""

    def __call__(self, task, finish, worker=None):
        self.append((task.id, finish, worker and worker.name))
        task.state = finish
        if finish == "processing":
            worker.processing[task] = None


def test_the_target_is_the_holder_of_most_input_bytes_and_never_a_full_worker():
    run = RunRecord(1, 0, ())
    a, b = worker("a"), worker("b")
    small, big = task(run, 1, state="memory"), task(run, 2, state="memory")
    small.nbytes, big.nbytes = 10, 1000
    small.hold(a)
    big.hold(a)
    big.hold(b)
    reader = task(run, 3, small, big)
    assert target(reader, set()) == b"a"  # a holds both
    a.full = True
    assert target(reader, {a}) == b"b"
    assert target(task(run, 4), set()) is None  # no inputs: no locality


def test_input_less_siblings_are_queued_for_the_worker_that_took_one():
    run = RunRecord(1, 0, ())
    queue: ReadyQueue[TaskRecord] = ReadyQueue()
    x, y = task(run, 1, state="processing"), task(run, 2, state="ready")
    task(run, 3, x, y)  # x + y: one reader of both; x was just given to w
    queue.push(y, y.priority)
    locality = make(Moves(), queue)
    w = worker("w")
    locality.pull_siblings(x, w)
    assert y.pulled and queue.peek_for(b"w", False) is y
    assert queue.peek_for(b"other", False) is None  # targeted at w now (others may steal)
    off = make(Moves(), sibling_inputs=0)
    z, v = task(run, 4, state="processing"), task(run, 5, state="ready")
    task(run, 6, z, v)
    off.pull_siblings(z, w)
    assert not v.pulled


def test_only_as_many_siblings_are_pulled_as_the_worker_has_room_for_now():
    """A worker whose cores are taken would hold its pulls until they free, while other
    workers ran later tasks first: what it has no room for stays shared."""
    run = RunRecord(1, 0, ())
    queue: ReadyQueue[TaskRecord] = ReadyQueue()
    w = worker("w", cores=3)
    x = task(run, 1, state="processing")
    w.processing[x] = None
    siblings = [task(run, i, state="ready") for i in range(2, 6)]
    task(run, 6, x, *siblings)  # one reader of all five
    for sibling in siblings:
        queue.push(sibling, sibling.priority)
    locality = make(Moves(), queue)
    locality.pull_siblings(x, w)
    assert [s.pulled for s in siblings] == [True, True, False, False]  # room for two
    assert queue.peek_for(b"other", False) is siblings[2]  # the rest: anyone's
    busy = worker("busy", cores=1)
    z, v = task(run, 7, state="processing"), task(run, 8, state="ready")
    busy.processing[z] = None
    task(run, 9, z, v)
    locality.pull_siblings(z, busy)
    assert not v.pulled  # its one core is taken


def test_a_chain_is_sent_ahead_to_the_worker_computing_its_head_up_to_the_bound():
    run = RunRecord(1, 0, ())
    head = task(run, 1, state="processing")
    links = [head]
    for i in range(2, 7):
        links.append(task(run, i, links[-1]))
    for link in links[1:]:
        link.missing = 1
    w = worker("w", cores=1)
    w.processing[head] = None
    head.worker = w
    moves = Moves()
    make(moves, chain_ahead=2).send_ahead(head, w)
    # One core, no extras: the bound is 1 + chain_ahead 2 tasks held, head included.
    assert moves == [(2, "processing", "w"), (3, "processing", "w")]
    # A full worker, or a task whose follower waits for another worker too, gets none.
    moves.clear()
    w.full = True
    make(moves).send_ahead(links[3], w)
    assert moves == []
