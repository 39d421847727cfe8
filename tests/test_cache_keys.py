"""Cache keys (issue 17): what changes a task's key and what does not. Pure: no workers."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import operator
import os
import struct
import sys
import time

import dask
import numpy as np
import pytest
from dask import delayed
from dask._task_spec import Alias, Task, TaskRef
from dask._task_spec import List as DaskList
from dask._task_spec import Tuple as DaskTuple
from hypothesis import given, settings
from hypothesis import strategies as st

from daskvine_py import uncached
from daskvine_py.cache.keys import KeyMaker, code_digests, task_keys
from daskvine_py.plan.annotations import annotated_off
from daskvine_py.plan.graph import build_plan
from daskvine_py.wire.serialize import TaskEncoder


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


@contextlib.contextmanager
def importable(tmp_path, name):
    """``(path, load)``: write ``MODULE`` to ``path``, then ``load()`` imports it afresh."""
    path = tmp_path / f"{name}.py"
    sys.path.insert(0, str(tmp_path))
    try:
        yield path, lambda: importlib.reload(importlib.import_module(name))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_a_module_functions_key_follows_its_code_and_its_helpers_not_its_lines(tmp_path):
    with importable(tmp_path, "cachekeys_stage") as (path, load):
        path.write_text(MODULE.format(inc=1))
        first = keys_of(delayed(load().stage)(1))
        path.write_text("\n\n# moved down\n" + MODULE.format(inc=1))
        assert keys_of(delayed(load().stage)(1)) == first  # same code, other lines
        path.write_text(MODULE.format(inc=2))  # only the helper changes
        assert keys_of(delayed(load().stage)(1)) != first


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


def _file_keys(path):
    """The keys of a task reading ``path``, named as a string and as an ``os.PathLike``."""
    return keys_of(delayed(os.path.getsize)(str(path))), keys_of(delayed(os.path.getsize)(path))


def test_a_local_files_mtime_alone_changes_the_key(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("one")
    before = path.stat()
    first = _file_keys(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns + 10**9)
    changed = _file_keys(path)
    assert changed[0] != first[0]
    assert changed[1] != first[1]


def test_a_local_files_size_alone_changes_the_key(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("one")
    before = path.stat()
    first = _file_keys(path)
    path.write_text("three")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the mtime restored
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size + 2, before.st_mtime_ns)
    changed = _file_keys(path)
    assert changed[0] != first[0]
    assert changed[1] != first[1]
    # The same size and mtime again: the same key (the check above is no accident of time).
    path.write_text("one")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _file_keys(path) == first


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


# -- the canonical tree (cache.walk): what a key tells apart and what it does not ---------


def walk_helper(x):
    return x + 1


class Box:
    """A small user class: the walker does not know it, the key pickler pickles it."""

    def __init__(self, value):
        self.value = value


def task_key(*args, keys=None, **kwargs):
    """The key of ``Task("t", walk_helper, *args, **kwargs)``, ``keys`` the inputs'."""
    maker = KeyMaker(TaskEncoder(), code_digests())
    maker.keys.update(keys or {})
    return maker.key(Task("t", walk_helper, *args, **kwargs))


def strictly(value):
    """``value`` as a comparable that tells types apart throughout (``1``, ``1.0`` and
    ``True``; a list and a tuple), floats by their bits (``-0.0`` is not ``0.0``, a NaN is
    itself) and a dict's items in their order (a key keeps it)."""
    kind = type(value)
    if kind is float:
        return (float, struct.pack("<d", value))
    if kind in (list, tuple):
        return (kind, tuple(strictly(item) for item in value))
    if kind is dict:
        return (dict, tuple((strictly(k), strictly(v)) for k, v in value.items()))
    if kind in (set, frozenset):
        return (kind, frozenset(strictly(member) for member in value))
    return (kind, value)


def fresh(value):
    """An equal copy in which no string or bytes is the same object as in ``value``."""
    kind = type(value)
    if kind is str:
        return "".join(list(value)) if len(value) > 1 else value
    if kind is bytes:
        return bytes(bytearray(value))
    if kind in (list, tuple):
        return kind(fresh(item) for item in value)
    if kind is dict:
        return {fresh(k): fresh(v) for k, v in value.items()}
    if kind in (set, frozenset):
        return kind(fresh(member) for member in value)
    return value


@pytest.fixture(scope="module")
def empty_dir(tmp_path_factory):
    """Where the hypothesis tests run: no string they draw names a file there."""
    return tmp_path_factory.mktemp("empty")


_hashables = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 1.0, 1, True, 0, False, float("nan")])
    | st.text(alphabet="abxy-/.", max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_literals = st.recursive(
    _hashables,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_hashables, inner, max_size=3)
        | st.sets(_hashables, max_size=3)
    ),
    max_leaves=12,
)


@settings(deadline=None, max_examples=300)
@given(
    first=st.lists(_literals, max_size=3), other=st.lists(_literals, max_size=3), same=st.booleans()
)
def test_arguments_have_equal_keys_exactly_when_equal_in_value_and_type(
    empty_dir, first, other, same
):
    second = fresh(first) if same else other
    cwd = os.getcwd()
    os.chdir(empty_dir)  # (no string drawn names a file there)
    try:
        equal = task_key(*first) == task_key(*second)
        assert task_key(*first) is not None
    finally:
        os.chdir(cwd)
    assert equal == (strictly(first) == strictly(second))


def twists(value):
    """Copies of ``value`` with one thing in it changed: a type (``1``, ``1.0``, ``True``;
    a list and a tuple; a set and a frozenset; a str and bytes), a float's sign, a
    dict's order."""
    kind = type(value)
    if kind is bool:
        yield int(value)
    elif kind is int:
        yield float(value) if abs(value) < 2**53 else value + 1
        if value in (0, 1):
            yield bool(value)
    elif kind is float:
        yield -value
        if value == value and abs(value) < 2**53 and value.is_integer():
            yield int(value)
    elif kind is str:
        yield value.encode()
    elif kind is bytes:
        yield value.decode("latin-1")
    elif value is None:
        yield ()
    elif kind in (list, tuple):
        yield (tuple if kind is list else list)(value)
        for i, item in enumerate(value):
            for twisted in twists(item):
                yield kind([*value[:i], twisted, *value[i + 1 :]])
    elif kind is dict:
        if len(value) > 1:
            yield dict(reversed(value.items()))
        for name, item in value.items():
            for twisted in twists(item):
                yield {**value, name: twisted}
    elif kind in (set, frozenset):
        yield (frozenset if kind is set else set)(value)
        for member in value:
            for twisted in twists(member):
                try:
                    yield kind((value - {member}) | {twisted})
                except TypeError:  # (unhashable)
                    pass


@settings(deadline=None, max_examples=200)
@given(value=st.lists(_literals, max_size=3))
def test_a_change_of_type_sign_or_order_anywhere_changes_the_key(empty_dir, value):
    cwd = os.getcwd()
    os.chdir(empty_dir)
    try:
        key = task_key(*value)
        for i, arg in enumerate(value):  # (the list is the arguments: its type is not)
            for twisted in twists(arg):
                args = [*value[:i], twisted, *value[i + 1 :]]
                equal = task_key(*args) == key
                assert equal == (strictly(args) == strictly(value)), args
    finally:
        os.chdir(cwd)


def test_a_tasks_keyword_arguments_are_in_its_key_but_a_containers_constructor():
    assert task_key(1, axis=0) != task_key(1, axis=1) != task_key(1)
    assert task_key(1, axis=0) != task_key(1, other=0)
    assert task_key(DaskList(1, 2)) == task_key(DaskList(1, 2)) != task_key(DaskTuple(1, 2))
    assert task_key(DaskList(1, 2)) != task_key(DaskList(2, 1))


def test_equal_strings_give_equal_keys_whether_or_not_they_are_one_object():
    text = "a string long enough to be its own object" * 2
    copied = "".join(list(text))
    assert copied is not text
    assert task_key((text, text), {text: 1}) == task_key((text, copied), {copied: 1})


def test_an_input_differs_from_literals_that_look_like_its_encoding():
    from daskvine_py.cache.walk import REF

    key = b"k" * 20
    keys = {"x": key}
    as_input = task_key(TaskRef("x"), keys=keys)
    assert as_input is not None
    assert task_key(Alias("y", "x"), keys=keys) == as_input  # both read x
    for literal in ("x", ("x",), (REF, key), ("ref", key), key, [REF, key]):
        assert task_key(literal, keys=keys) != as_input
    assert task_key(TaskRef("x"), keys={"x": b"j" * 20}) != as_input
    assert task_key(TaskRef("missing"), keys=keys) is None


def test_an_unknown_objects_content_is_in_the_key():
    array = np.arange(6.0)
    changed = array.copy()
    changed[3] = -1.0
    assert task_key(array) == task_key(array.copy()) != task_key(changed)
    assert task_key(Box(1)) == task_key(Box(1)) != task_key(Box(2))
    assert task_key(Box([1, 2])) != task_key(Box((1, 2)))
    assert task_key(Box(1), "a") != task_key(Box(1), "b")


def test_numpy_arrays_and_dtypes_are_keyed_by_dtype_shape_and_values():
    array = np.arange(6, dtype="<i4").reshape(2, 3)
    readonly = array.copy()
    readonly.flags.writeable = False
    first = task_key(array)
    assert task_key(readonly) == first  # writeable or not: the same values
    assert task_key(np.asfortranarray(array)) == first  # in memory another way round
    assert task_key(array.T) == task_key(np.ascontiguousarray(array.T)) != first
    assert task_key(array.reshape(3, 2)) != first  # the same bytes, another shape
    assert task_key(array.astype(">i4")) != first  # another byte order
    assert task_key(array.view("<u4")) != first  # the same bytes, another type
    days = np.array(["2024-01-01"], dtype="M8[D]")
    assert task_key(days) != task_key(days.astype("M8[s]"))
    objects = np.array([1, "a", None], dtype=object)
    assert task_key(objects) == task_key(objects.copy()) != task_key(objects[:2])
    records = np.zeros(2, dtype=[("a", "<f8"), ("b", "<i4")])
    renamed = np.zeros(2, dtype=[("c", "<f8"), ("b", "<i4")])
    assert task_key(records) != task_key(renamed)
    assert task_key(np.dtype("f8")) != task_key(np.dtype("f4"))
    assert task_key(np.dtype("f8")) != task_key(np.dtype("f8", metadata={"unit": "m"}))
    assert task_key(Box(array)) != task_key(Box(array + 1))


def test_a_numpy_seed_sequence_is_keyed_by_what_makes_it():
    seeds = np.random.SeedSequence(7, spawn_key=(3,))
    first = task_key(seeds)
    assert task_key(np.random.SeedSequence(7, spawn_key=(3,))) == first
    assert task_key(np.random.SeedSequence(7, spawn_key=(4,))) != first
    assert task_key(np.random.SeedSequence(8, spawn_key=(3,))) != first
    assert task_key(np.random.SeedSequence(7, spawn_key=(3,), pool_size=8)) != first
    assert task_key((7, (3,))) != first  # not a tuple of what makes it
    spawned = np.random.SeedSequence(7, spawn_key=(3,))
    spawned.spawn(1)  # its children so far are part of it
    assert task_key(spawned) != first
    # Entropy drawn from the OS (no seed): two such differ; a sequence is pickled.
    assert task_key(np.random.SeedSequence()) != task_key(np.random.SeedSequence())
    assert task_key(np.random.SeedSequence([1, 2])) != task_key(np.random.SeedSequence([1, 3]))


def test_a_function_inside_a_user_object_follows_its_code(tmp_path):
    with importable(tmp_path, "cachekeys_inside") as (path, load):
        path.write_text(MODULE.format(inc=1))
        first = task_key(Box(load().stage))
        path.write_text(MODULE.format(inc=1) + "\n\n# a comment\n")
        assert task_key(Box(load().stage)) == first
        path.write_text(MODULE.format(inc=2))  # the helper it calls changes
        module = load()
        assert task_key(Box(module.stage)) != first
        assert task_key(functools.partial(module.stage, 1)) is not None


def test_a_file_inside_a_user_object_is_in_the_key(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("one")
    first = task_key(Box(str(path)))
    time.sleep(0.01)
    path.write_text("two!")
    assert task_key(Box(str(path))) != first


def fused(inc_literal, names, external="ext"):
    """``(a + inc) * 2``, fused into one task, reading ``external``; inner names made
    from ``names``, as Dask makes tokens."""
    a, b = f"a-{names}", f"b-{names}"
    first = Task(a, operator.add, TaskRef(external), inc_literal)
    second = Task(b, operator.mul, TaskRef(a), 2)
    return Task.fuse(first, second)


def fused_key(node, keys):
    maker = KeyMaker(TaskEncoder(), code_digests())
    maker.keys.update(keys)
    return maker.key(node)


def test_a_fused_tasks_key_follows_its_literals_and_inputs_not_its_inner_names():
    keys = {"ext": b"e" * 20, "other": b"o" * 20}
    first = fused_key(fused(1, "tok1"), keys)
    assert first is not None
    assert fused_key(fused(1, "tok2"), keys) == first  # other tokens, same work
    assert fused_key(fused(3, "tok1"), keys) != first  # an inner literal
    assert fused_key(fused(1, "tok1", external="other"), keys) != first  # another input
    assert fused_key(fused(1, "tok1"), {"ext": None}) is None  # a keyless input
    # Which inner task reads which: b(a) against a task reading the input directly.
    a = Task("a", operator.add, TaskRef("ext"), 1)
    swapped = Task.fuse(
        a, Task("b", operator.mul, TaskRef("ext"), 2), Task("c", max, TaskRef("a"), TaskRef("b"))
    )
    plain = Task.fuse(
        a, Task("b", operator.mul, TaskRef("a"), 2), Task("c", max, TaskRef("a"), TaskRef("b"))
    )
    assert fused_key(swapped, keys) != fused_key(plain, keys)


def test_a_fused_task_inside_a_fused_task_reads_its_inputs_by_place():
    keys = {"ext": b"e" * 20}

    def nested(names, literal):
        inner = fused(literal, names)  # reads ext; named b-{names}
        outer = Task(f"c-{names}", operator.neg, TaskRef(f"b-{names}"))
        return Task.fuse(inner, outer)

    first = fused_key(nested("one", 1), keys)
    assert first is not None
    assert fused_key(nested("two", 1), keys) == first
    assert fused_key(nested("one", 5), keys) != first


def test_deep_and_shared_structures_are_keyed_or_keyless_never_a_crash():
    deep = nested = []
    for _ in range(5_000):
        nested.append([])
        nested = nested[0]
    assert task_key(deep) is None or len(task_key(deep)) == 20  # keyless, cleanly
    shallow = [1]
    for _ in range(400):  # past MAX_NEST: the key pickler takes what is below
        shallow = [shallow]
    assert task_key(shallow) == task_key(copy.deepcopy(shallow)) is not None
    assert task_key(shallow) != task_key([shallow])
    shared = [1]
    for _ in range(60):  # 2**60 leaves walked one by one; the pickler's memo takes it
        shared = [shared, shared]
    started = time.perf_counter()
    assert task_key(shared) is not None
    assert time.perf_counter() - started < 30


def test_an_uncached_callable_object_or_partial_makes_the_task_keyless():
    class Clock:
        def __call__(self):
            return time.time()

    clock = uncached(Clock())
    maker = KeyMaker(TaskEncoder(), code_digests())
    assert maker.key(Task("t", clock)) is None

    @uncached
    def now(offset):
        return time.time() + offset

    assert maker.key(Task("t", functools.partial(now, 1))) is None
    assert maker.key(Task("t", walk_helper, now)) is None  # as an argument too


def test_a_repack_is_keyed_by_its_graph_not_its_uuids():
    import dask.array as da
    from dask.base import unpack_collections

    x = da.ones(3, chunks=3)

    def key(structure):
        _, repack = unpack_collections(structure)  # names made with fresh uuids
        return task_key(repack)

    first = key([x, {"a": x, "b": 2}])
    assert first is not None
    assert key([x, {"a": x, "b": 2}]) == first
    assert key([x, {"a": x, "b": 3}]) != first
    assert key([x, {"b": 2, "a": x}]) != first
