"""The ready queue: priorities, targets, soft targeting, lazy removal."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import daskvine_py.scheduler.matching as matching
from daskvine_py.scheduler.matching import ReadyQueue


def test_lowest_priority_first():
    q = ReadyQueue()
    for item, prio in [("c", 3), ("a", 1), ("b", 2)]:
        q.push(item, prio)
    assert [q.pop_for("w"), q.pop_for("w"), q.pop_for("w"), q.pop_for("w")] == ["a", "b", "c", None]


def test_targeted_work_goes_to_its_worker_first_but_is_stolen_when_idle():
    q = ReadyQueue()
    q.push("for-w1", 5, target="w1")
    q.push("anyone", 10)
    assert q.pop_for("w1") == "for-w1"  # its own beats the shared one of lower priority
    q.push("for-w1-again", 5, target="w1")
    assert q.pop_for("w2") == "anyone"  # w2 prefers shared work
    assert q.pop_for("w2") == "for-w1-again"  # then steals rather than idle
    assert q.pop_for("w2") is None and len(q) == 0


def test_removed_and_repushed_items_are_not_duplicated():
    q = ReadyQueue()
    q.push("x", 1, target="w1")
    q.remove("x")
    assert "x" not in q and q.pop_for("w1") is None
    q.push("y", 1, target="w1")
    q.push("y", 2)  # re-push replaces the targeted entry
    assert q.pop_for("w2") == "y" and q.pop_for("w1") is None


def test_forgetting_a_target_moves_its_work_to_everyone():
    q = ReadyQueue()
    q.push("a", 1, target="lost")
    q.forget_target("lost")
    assert q.pop_for("w9") == "a"


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 5), st.sampled_from([None, "w1", "w2"])),
        max_size=200,
    ),
    seed=st.integers(0, 1000),
)
def test_every_pushed_item_pops_exactly_once(ops, seed):
    rng = random.Random(seed)
    q = ReadyQueue()
    live = {}
    for item, prio, target in ops:
        q.push(item, prio, target)
        live[item] = prio
        if rng.random() < 0.2:
            gone = rng.choice(sorted(live))
            q.remove(gone)
            del live[gone]
    popped = []
    while (item := q.pop_for(rng.choice(["w1", "w2", "w3"]))) is not None:
        popped.append(item)
    assert sorted(popped) == sorted(live)


def test_peek_shows_what_pop_would_take():
    q = ReadyQueue()
    q.push("mine", 2, target="w1")
    q.push("shared", 1)
    assert q.peek_for("w1") == "shared" == q.pop_for("w1")
    assert q.peek_for("w2") == "mine" and len(q) == 1
    assert q.pop_for("w2") == "mine" and q.peek_for("w2") is None


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.integers(0, 1 << 20), max_size=3000),
    pops=st.lists(st.integers(0, 50), max_size=40),
    chunk=st.sampled_from([1, 2, 3, 8]),
)
def test_lane_pops_in_sorted_order_across_chunk_splits(values, pops, chunk):
    """Small chunks force every split and refill path; order must match sorting."""
    import daskvine_py.scheduler.matching as matching

    old, matching.CHUNK = matching.CHUNK, chunk
    try:
        lane = matching.Lane()
        reference = []
        rng = random.Random(len(values))
        for value in values:
            lane.push(value)
            reference.append(value)
            if rng.random() < 0.1:  # interleave pops with pushes
                for _ in range(rng.choice(pops or [0])):
                    if reference:
                        smallest = min(reference)
                        reference.remove(smallest)
                        assert lane.first() == smallest
                        assert lane.pop() == smallest
        assert sorted(lane) == sorted(reference) and len(lane) == len(reference)
        assert [lane.pop() for _ in range(len(reference))] == sorted(reference)
        assert lane.first() is None
    finally:
        matching.CHUNK = old


def test_stealing_takes_the_best_of_all_targets_and_its_lane_stays_bounded():
    q = ReadyQueue()
    for i in range(100):
        q.push(("w", i), 1000 - i, target=f"w{i % 10}")
    assert q.pop_for("idle") == ("w", 99)  # the lowest priority of any worker's lane
    # Owners taking their own work leave dead entries in the steal lane; they are dropped.
    for _ in range(20_000):
        q.push("x", 5, target="w1")
        assert q.pop_for("w1") in ("x", ("w", 91), ("w", 81), ("w", 71))
    assert q._all is None or len(q._all) < 2 * len(q) + 4096 + 1
    assert len(q._items) <= 2 * len(q) + matching.STALE_SLACK + 1


@pytest.mark.parametrize("slack", [matching.STALE_SLACK, 2])
@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 30),
            st.integers(0, 9),
            st.sampled_from(["w1", "w2", "w3", None]),
            st.sampled_from(["push", "pop", "steal", "remove"]),
        ),
        max_size=300,
    )
)
def test_a_steal_always_takes_the_best_task_of_any_lane(slack, ops):
    """Against a model: a worker with nothing of its own or shared takes the task of
    lowest priority (then oldest) among everyone's targeted work. With almost no slack
    (2), re-pushes renumber the tickets and rebuild the lanes again and again, and the
    list of tickets stays within twice the live items at each push (where it grows)."""
    q = ReadyQueue()
    model: dict = {}  # item -> (priority, push order, target)
    with patched(matching, STALE_SLACK=slack):
        for n, (item, prio, target, op) in enumerate(ops):
            _apply(q, model, n, item, prio, target, op)
            assert len(q) == len(model)
        rest = []
        while (got := q.pop_for("idle")) is not None:
            rest.append(got)
        assert sorted(map(str, rest)) == sorted(map(str, model))


def _apply(q: ReadyQueue, model: dict, n: int, item, prio, target, op) -> None:
    """One operation on the queue and on its model; pops checked against the model."""
    if op == "push":
        q.push(item, prio, target)
        model[item] = (prio, n, target)
        assert len(q._items) <= 2 * len(q) + matching.STALE_SLACK + 1
    elif op == "remove" and model:
        gone = sorted(model)[item % len(model)]
        q.remove(gone)
        del model[gone]
    elif op == "pop":  # w1 takes its own or shared work, if any
        mine = [k for k, v in model.items() if v[2] in ("w1", None)]
        got = q.pop_for("w1", steal=False)
        expected = min(mine, key=lambda k: model[k][:2]) if mine else None
        assert got == expected
        model.pop(got, None)
    elif op == "steal" and not any(v[2] in ("idle", None) for v in model.values()):
        got = q.pop_for("idle")
        expected = min(model, key=lambda k: model[k][:2]) if model else None
        assert got == expected
        model.pop(got, None)


@contextlib.contextmanager
def patched(module: Any, **values: Any) -> Iterator[None]:
    """``module``'s constants set to ``values`` meanwhile (hypothesis runs many examples in
    one test call: a fixture would patch them once for all)."""
    old = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(module, name, value)
