"""Cache keys (issue 17): what changes a task's key and what does not. Pure: no workers."""

from __future__ import annotations

import importlib
import os
import sys
import time

import dask
from dask import delayed

from daskvine_py import uncached
from daskvine_py.cache_keys import KeyMaker, annotated_off, code_digests, task_keys
from daskvine_py.graph import build_plan
from daskvine_py.serialize import TaskEncoder


def keys_of(value, memo=None):
    dsk = value.__dask_graph__()
    plan = build_plan(dsk, value.__dask_keys__(), fuse=False)  # as cached runs plan
    maker = KeyMaker(TaskEncoder(), memo if memo is not None else code_digests())
    keys = task_keys(plan, maker, annotated_off(dsk))
    return sorted(keys.values(), key=lambda k: k or b"")  # (names order the plan)


def test_a_fused_chain_has_its_last_links_key_and_follows_every_link():
    def chain(n, step):
        return delayed(str)(delayed(abs)(delayed(abs)(-n) + step))

    def key(value, fuse):
        plan = build_plan(value.__dask_graph__(), value.__dask_keys__(), fuse=fuse)
        keys = task_keys(plan, KeyMaker(TaskEncoder(), code_digests()))
        return keys[value.key], len(plan.nodes)

    fused, unfused = key(chain(1, 2), True), key(chain(1, 2), False)
    assert fused[1] < unfused[1] and fused[0] == unfused[0] is not None
    assert key(chain(1, 3), True)[0] != fused[0]  # a literal of an inner link


def test_keys_ignore_dask_names_and_follow_arguments():
    def graph(n):
        return delayed(sum)([delayed(abs)(-n), delayed(abs)(2)])

    assert keys_of(graph(1)) == keys_of(graph(1))  # delayed's uuid names differ
    # abs(2) is the same work in both; abs(-n) and the sum are not
    assert len(set(keys_of(graph(1))) & set(keys_of(graph(3)))) == 1


MODULE = """
def helper(x):
    return x + {inc}


def stage(x):
    return helper(x) * 2
"""


def test_a_module_functions_key_follows_its_code_and_its_helpers_not_its_lines(tmp_path):
    sys.path.insert(0, str(tmp_path))
    try:
        path = tmp_path / "cachekeys_stage.py"
        path.write_text(MODULE.format(inc=1))
        module = importlib.import_module("cachekeys_stage")
        first = keys_of(delayed(module.stage)(1))
        path.write_text("\n\n# moved down\n" + MODULE.format(inc=1))
        module = importlib.reload(module)
        assert keys_of(delayed(module.stage)(1)) == first  # same code, other lines
        path.write_text(MODULE.format(inc=2))  # only the helper changes
        module = importlib.reload(module)
        assert keys_of(delayed(module.stage)(1)) != first
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cachekeys_stage", None)


def test_a_local_files_size_and_mtime_are_in_the_key(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("one")
    first = keys_of(delayed(os.path.getsize)(str(path)))
    as_path = keys_of(delayed(os.path.getsize)(path))
    time.sleep(0.01)
    path.write_text("two!")
    assert keys_of(delayed(os.path.getsize)(str(path))) != first
    assert keys_of(delayed(os.path.getsize)(path)) != as_path  # an os.PathLike too
    missing = keys_of(delayed(os.path.getsize)("root://remote/file.root"))
    assert missing == keys_of(delayed(os.path.getsize)("root://remote/file.root"))


def test_sets_are_keyed_by_their_sorted_members():
    assert keys_of(delayed(len)({"a", "b", "c"})) == keys_of(delayed(len)({"c", "a", "b"}))


def test_uncached_functions_and_annotations_make_tasks_and_their_readers_keyless():
    @uncached
    def now():
        return time.time()

    stamp = delayed(now)()
    assert keys_of(delayed(str)(stamp)) == [None, None]
    with dask.annotate(cache=False):
        first = delayed(abs)(-1)
    second = delayed(abs)(first)
    assert keys_of(second) == [None, None]
