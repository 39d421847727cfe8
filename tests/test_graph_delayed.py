"""Many ``dask.delayed`` objects in one ``compute``: their graph is read without the
optimizer's cull layer by layer (``graph.skip_delayed_cull``), and computed right."""

from __future__ import annotations

from operator import neg

import dask
import pytest
from dask.base import collections_to_expr

from daskvine_py.plan import graph


def _expression(objects):
    return collections_to_expr(objects).optimize()


def test_the_delayed_optimizer_s_cull_is_skipped_and_the_read_culls_alone():
    objects = [dask.delayed(neg)(i) for i in range(300)]
    unused = dask.delayed(neg)(-1)  # in no object's graph: never read
    objects.append(dask.delayed(neg)(objects[0]))
    expr = _expression(objects)
    if type(expr).__name__ != "_HLGExprSequence":
        pytest.skip(f"this Dask hands {type(expr).__name__} over, not a sequence of graphs")
    graph.skip_delayed_cull(expr)
    assert "_optimized_dsk" in vars(expr)  # dask's optimizer did not run
    keys = [o.key for o in objects]
    plan = graph.read(expr, keys)
    assert set(plan.outputs) == set(keys) and unused.key not in plan.nodes
    assert len(plan.nodes) == 301


def test_with_delayed_fusion_on_dask_s_optimizer_runs():
    objects = [dask.delayed(neg)(i) for i in range(5)]
    with dask.config.set({"optimization.fuse.delayed": True}):
        expr = _expression(objects)
        graph.skip_delayed_cull(expr)
        assert "_optimized_dsk" not in vars(expr)


def test_thousands_of_delayed_objects_match_sync(shared_manager):
    objects = [dask.delayed(neg)(i) for i in range(2_000)]
    chained = dask.delayed(sum)(objects[:100])
    got = dask.compute(*objects, chained, scheduler=shared_manager.get)
    assert got == dask.compute(*objects, chained, scheduler="sync")
