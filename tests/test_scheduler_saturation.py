"""The ``Saturation`` component alone: how many tasks a worker holds beyond its cores."""

from __future__ import annotations

from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.scheduler.saturation import Saturation
from parts import context


def test_extras_follow_the_estimates_a_fixed_setting_or_the_slots_held_back():
    held: dict[str, int] = {}
    ctx = context(constraints={"held_back": lambda w: held.get(w.name, 0)})
    durations = ctx.durations
    sizing = Saturation(ctx, max_extra_tasks_per_core=8)
    w = WorkerRecord(b"w", "w", 4, "tcp://w:1")
    t = TaskRecord(1, "x", RunRecord(1, 0, ()), b"", (), 0, "inc")
    assert sizing.extra(w, t) == 4  # unknown duration: one extra per core
    durations.observe("inc", 1e-6)  # tiny tasks: as many as the bound allows
    assert sizing.extra(w, t) == 4 * 8
    durations.observe("inc", 10.0)
    durations.observe("inc", 10.0)
    assert sizing.extra(w, t) == 1  # long tasks: one round trip is nothing
    sizing.fixed_extra_tasks_per_core = 2
    assert sizing.extra(w, t) == 8
    # An annotated task taking three slots there: the worker holds nothing beyond them.
    w.holding[t] = None
    held["w"] = 3
    assert sizing.extra(w, t) == -3
