"""How long a run's fetched inputs stay on the node (``cache_inputs="run"|"worker"|
"forever"``): the claims on entries, their cleanups, and the worker's part.

The pure tests drive ``InputCache`` objects directly: two objects hold their locks on
separate descriptors, as two processes do. The end-to-end test runs a real manager and
local workers against the standard library's HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import test_inputs
from daskvine_py import inputs
from daskvine_py.errors import ProtocolError
from daskvine_py.inputs import store
from daskvine_py.inputs.store import Identity, InputCache, claim, claim_owner
from daskvine_py.options import INPUT_LIFETIMES, RunOptions
from daskvine_py.wire import protocol as p
from daskvine_py.worker import inputs_keeper
from daskvine_py.worker.inputs_keeper import InputsKeeper
from daskvine_py.worker.messages import EndRunInputs
from test_inputs import _Server, _write

cache_dir = test_inputs.cache_dir  # (fixtures)
http_server = test_inputs.http_server

# -- pure: names, options, the wire ---------------------------------------------------


def test_lifetimes_are_the_same_everywhere():
    assert INPUT_LIFETIMES == store.LIFETIMES == inputs.LIFETIMES == ("run", "worker", "forever")


def test_claim_names_and_their_owners():
    assert claim("forever") == "forever"
    assert claim("worker", "12-ab") == "worker.12-ab"
    assert claim("run", "12-ab", 7) == "run.7.12-ab"
    assert claim_owner("worker.12-ab") == claim_owner("run.7.12-ab") == "12-ab"
    assert claim_owner("forever") is None and claim_owner("junk") is None
    with pytest.raises(ValueError, match="lifetime"):
        claim("week", "12-ab")
    with pytest.raises(ValueError, match="owner"):
        claim("run", "a/b", 1)


def test_cache_inputs_option_is_a_lifetime():
    assert RunOptions(cache_inputs=True).cache_inputs == "worker"
    assert RunOptions(cache_inputs=False).cache_inputs == ""
    assert RunOptions(cache_inputs=None).cache_inputs == ""
    for lifetime in INPUT_LIFETIMES:
        options = RunOptions(cache_inputs=lifetime)
        assert options.cache_inputs == lifetime and not options.default_execution
    assert RunOptions().default_execution
    for bad in ("week", 1, "RUN"):
        with pytest.raises(ValueError, match="cache_inputs must be one of"):
            RunOptions(cache_inputs=bad)
    with pytest.raises(ValueError, match="cache_inputs"):
        with inputs.using("week"):
            pass


def test_wire_carries_the_lifetime_and_the_run_end():
    config = p.RunConfig(3, "function-calls", "direct", (), (), False, None, (), "run")
    p.check_fields(config)
    p.check_fields(p.RunEnded(3))
    assert p.RunEnded in p.TO_WORKER
    with pytest.raises(ProtocolError):
        p.check_fields(config._replace(inputs="week"))
    with pytest.raises(ProtocolError):
        p.check_fields(config._replace(inputs=True))
    (back,) = p.unpack(p.encode([p.RunEnded(3)]), p.TO_WORKER)
    assert back == p.RunEnded(3)


def test_the_worker_state_turns_a_run_end_into_a_cleanup():
    from test_worker_state import make  # (a state with no processes)

    state, _ = make()
    assert EndRunInputs(5) in state.handle([p.RunEnded(5)], 1.0)


# -- pure: claims and cleanups, no server ---------------------------------------------

MINE = "111-aaaa"
OTHER = "222-bbbb"


def _fill(cache: InputCache, name: str, claims: list[str]) -> str:
    """An entry of 100 bytes, used by ``cache`` and claimed for ``claims``; its key."""
    identity = Identity(f"http://h/{name}", 100, "etag=1")
    cache.use(identity.key, 1.0)
    cache.fill(identity, lambda part: Path(part).write_bytes(b"x" * 100), 1.0)
    cache.claim(identity.key, claims)
    return identity.key


def _keys(root: Path) -> set[str]:
    return {place.name for place in (root / "entries").iterdir()}


def test_a_run_end_removes_its_entries_and_spares_those_in_use(tmp_path):
    with InputCache(str(tmp_path), 10**6) as worker, InputCache(str(tmp_path), 10**6) as lib:
        worker.own(MINE)
        one = _fill(lib, "one", [claim("run", MINE, 1)])
        two = _fill(lib, "two", [claim("run", MINE, 1)])
        other_run = _fill(lib, "three", [claim("run", MINE, 2)])
        lib.release()
        lib.use(two, 1.0)  # a task of this library still holds it
        ended = worker.end_run(MINE, 1)
        assert ended.removed == [one] and ended.spared == [two]
        assert _keys(tmp_path) == {two, other_run}
        assert worker.tidy().spared == [two]  # still in use: kept
        lib.release()
        assert worker.tidy().removed == [two]  # free now: no claim keeps it
        assert _keys(tmp_path) == {other_run}
        assert worker.end_run(MINE, 2).removed == [other_run]


def test_the_longest_lifetime_asked_for_keeps_an_entry(tmp_path):
    """What another worker claims for its life, or anyone for ever, outlives this
    worker's run and the worker itself; a run claim of the other's, its run."""
    with (
        InputCache(str(tmp_path), 10**6) as mine,
        InputCache(str(tmp_path), 10**6) as other,
        InputCache(str(tmp_path), 10**6) as lib,
    ):
        mine.own(MINE)
        other.own(OTHER)
        kept = _fill(lib, "kept", [claim("run", MINE, 1), "forever"])
        shared = _fill(lib, "shared", [claim("run", MINE, 1), claim("worker", OTHER)])
        theirs = _fill(lib, "theirs", [claim("worker", MINE), claim("run", OTHER, 9)])
        lib.release()
        assert mine.end_run(MINE, 1).removed == []
        assert mine.end_worker(MINE).removed == []
        assert _keys(tmp_path) == {kept, shared, theirs}
        assert other.end_run(OTHER, 9).removed == [theirs]
        assert other.end_worker(OTHER).removed == [shared]
        assert _keys(tmp_path) == {kept}
        assert os.listdir(tmp_path / "entries" / kept) == [".claim.forever", ".complete", "kept"]


def test_a_dead_workers_claims_go_at_the_next_cleanup(tmp_path):
    """A worker killed with SIGKILL leaves its claims: its owner lock is free then, and
    any cleanup of the node drops them (and its lock file)."""
    with InputCache(str(tmp_path), 10**6) as lib, InputCache(str(tmp_path), 10**6) as mine:
        mine.own(MINE)
        dead = InputCache(str(tmp_path), 10**6)
        dead.own(OTHER)
        key = _fill(lib, "left", [claim("worker", OTHER), claim("run", OTHER, 3)])
        lib.release()
        assert mine.tidy().removed == []  # its owner lives
        os.close(dead._owner[1])  # (dies: its lock goes with its descriptors)
        assert mine.tidy().removed == [key]
        assert not (tmp_path / "owners" / f"{OTHER}.lock").exists()
        assert (tmp_path / "owners" / f"{MINE}.lock").exists()
        mine.disown()
        assert not (tmp_path / "owners" / f"{MINE}.lock").exists()


def test_a_claim_made_meanwhile_keeps_the_entry(tmp_path, monkeypatch):
    """A cleanup looks again under the entry's locks: a claim made between its look and
    its removal (by a process that then released it) keeps the entry."""
    with InputCache(str(tmp_path), 10**6) as worker, InputCache(str(tmp_path), 10**6) as lib:
        worker.own(MINE)
        key = _fill(lib, "late", [claim("run", MINE, 1)])
        lib.release()
        claims = worker._claims

        def late(asked: str) -> list[str]:
            found = claims(asked)
            (tmp_path / "entries" / asked / ".claim.forever").touch()  # (after the look)
            return found

        monkeypatch.setattr(worker, "_claims", late)
        assert worker.end_run(MINE, 1) == store.Cleanup([], [])
        assert _keys(tmp_path) == {key}


def test_lru_ignores_claims(tmp_path):
    with InputCache(str(tmp_path), 150) as lib:
        old = _fill(lib, "old", ["forever"])
        time.sleep(0.01)
        lib.release()
        new = _fill(lib, "new", ["forever"])
        assert lib.evict(room=0) == [old]
        assert _keys(tmp_path) == {new}


# -- a process's claims: ``inputs.using`` over HTTP --------------------------------------


def _claims_on(root: Path) -> dict[str, set[str]]:
    return {
        place.name: {n[len(store.CLAIM) :] for n in os.listdir(place) if n.startswith(store.CLAIM)}
        for place in (root / "entries").iterdir()
    }


def test_using_claims_for_each_run_running_then_releases(cache_dir, http_server, monkeypatch):
    monkeypatch.setenv(inputs.OWNER_VARIABLE, MINE)
    for name in ("a", "b", "c"):
        _write(http_server.directory / name, name.encode() * 1000, 1_700_000_000)
    with inputs.using("run", 4):
        inputs.local_path(http_server.url("a"))
        with inputs.using("forever", 5):
            inputs.local_path(http_server.url("b"))
        with InputCache(str(cache_dir), 0) as other:  # still held: nothing goes
            assert other.evict() == []
    inputs.local_path(http_server.url("c"))  # in no run: for the worker's life
    claims = sorted(sorted(names) for names in _claims_on(cache_dir).values())
    assert claims == [["forever", "run.4.111-aaaa"], ["run.4.111-aaaa"], ["worker.111-aaaa"]]
    inputs.release()
    with InputCache(str(cache_dir), 10**6) as worker:
        worker.own(MINE)
        assert len(worker.end_run(MINE, 4).removed) == 1  # "a"; "b" is kept for ever
        assert len(worker.end_worker(MINE).removed) == 1  # "c"
    assert list(_claims_on(cache_dir).values()) == [{"forever"}]
    monkeypatch.delenv(inputs.OWNER_VARIABLE)
    inputs.release()
    path = inputs.local_path(http_server.url("a"))  # no worker around: for ever
    assert Path(path).read_bytes() == b"a" * 1000
    assert list(_claims_on(cache_dir).values()) == [{"forever"}, {"forever"}]


# -- the worker's part ------------------------------------------------------------------


@pytest.fixture
def keeper_env(monkeypatch):
    """The variables an ``InputsKeeper`` sets in this process, restored after the test:
    else the workers later tests start would inherit this one's cache and owner."""
    for name in (
        inputs_keeper.ROOT_VARIABLE,
        inputs_keeper.BYTES_VARIABLE,
        inputs.OWNER_VARIABLE,
    ):
        monkeypatch.setenv(name, "")  # (so that its absence, if so, is what comes back)
        monkeypatch.delenv(name)


def test_the_worker_names_the_cache_for_its_libraries(tmp_path, keeper_env):
    keeper = InputsKeeper(str(tmp_path / "node"), 5 * 2**20)
    assert os.environ[inputs_keeper.ROOT_VARIABLE] == str(tmp_path / "node")
    assert os.environ[inputs_keeper.BYTES_VARIABLE] == str(5 * 2**20)
    assert os.environ[inputs.OWNER_VARIABLE] == keeper.owner
    assert not (tmp_path / "node").exists()  # nothing made before a run asks
    keeper.own()
    assert (tmp_path / "node" / "owners" / f"{keeper.owner}.lock").exists()
    with InputCache(str(tmp_path / "node"), 10**6) as lib:
        key = _fill(lib, "x", [claim("run", keeper.owner, 3)])
        held = _fill(lib, "y", [claim("worker", keeper.owner)])
    keeper.end_run(EndRunInputs(3))
    assert _keys(tmp_path / "node") == {held}
    keeper.close()
    assert _keys(tmp_path / "node") == set()
    assert key != held


def test_the_worker_looks_again_at_what_was_in_use(tmp_path, monkeypatch, keeper_env):
    monkeypatch.setattr(inputs_keeper, "RETRY_FIRST", 0.0)
    keeper = InputsKeeper(str(tmp_path), None)
    keeper.own()
    with InputCache(str(tmp_path), 10**6) as lib:
        _fill(lib, "x", [claim("run", keeper.owner, 3)])
        keeper.end_run(EndRunInputs(3))
        keeper.retry(time.monotonic())
        assert len(_keys(tmp_path)) == 1  # in use still
    keeper.retry(time.monotonic())
    assert _keys(tmp_path) == set()
    keeper.close()


# -- end to end: a manager, local workers, an HTTP server ---------------------------------

FILES = {"one.bin": 30_000, "two.bin": 50_000, "three.bin": 70_000}


def _graph(server: _Server) -> tuple[dict[str, tuple[object, ...]], list[str]]:
    """One task per file: the size of its local copy (read through the cache)."""
    dsk: dict[str, tuple[object, ...]] = {
        name: (os.path.getsize, (inputs.local_path, server.url(name))) for name in FILES
    }
    return dsk, list(FILES)


def _wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _entries(root: Path) -> set[str]:
    entries = root / "entries"
    return {p.name for p in entries.iterdir()} if entries.exists() else set()


@pytest.fixture
def served(http_server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name, size in FILES.items():
        _write(http_server.directory / name, os.urandom(size), 1_700_000_000)
    monkeypatch.setenv("DASKVINE_PY_INPUT_CACHE", str(tmp_path / "node"))
    return http_server


def _run(manager, server: _Server, lifetime: str) -> int:
    """One run over the files; the GETs the server answered meanwhile."""
    before = server.count("GET")
    dsk, keys = _graph(server)
    got = manager.get(dsk, keys, cache_inputs=lifetime)
    assert list(got) == list(FILES.values())
    return server.count("GET") - before


def test_lifetimes_end_to_end(served, tmp_path):
    from daskvine_py import Manager

    root = tmp_path / "node"
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        assert _run(manager, served, "run") == len(FILES)
        assert _wait_for(lambda: _entries(root) == set()), _entries(root)  # workers alive

        assert _run(manager, served, "worker") == len(FILES)
        time.sleep(0.5)
        assert len(_entries(root)) == len(FILES)
        assert _run(manager, served, "worker") == 0  # the same workers: all kept
    assert _wait_for(lambda: _entries(root) == set()), _entries(root)  # they exited

    with Manager() as manager:
        manager.start_workers(2, cores=1)
        assert _run(manager, served, "forever") == len(FILES)
    assert len(_entries(root)) == len(FILES)  # their workers exited: kept
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        assert _run(manager, served, "run") == 0  # new workers: nothing from the server
        # A "run" cleanup does not remove what was kept for ever.
        time.sleep(0.5)
        assert len(_entries(root)) == len(FILES)
    assert len(_entries(root)) == len(FILES)


def test_a_worker_stopped_by_a_signal_leaves_nothing(served, tmp_path):
    """SIGTERM: the worker cleans up as it exits. SIGKILL: it cannot; the next worker of
    the node drops the dead one's claims as it starts, and what they kept goes."""
    import signal

    from daskvine_py import Manager

    root = tmp_path / "node"
    with Manager() as manager:
        (first,) = manager.start_workers(1, cores=1)
        assert _run(manager, served, "worker") == len(FILES)
        assert len(_entries(root)) == len(FILES)
        first.send_signal(signal.SIGTERM)
        first.wait(30)
        assert _wait_for(lambda: _entries(root) == set()), _entries(root)

        (second,) = manager.start_workers(1, cores=1)
        assert _run(manager, served, "worker") == len(FILES)
        second.kill()
        second.wait(30)
        time.sleep(0.5)
        assert len(_entries(root)) == len(FILES)  # nobody to clean up
        manager.start_workers(1, cores=1)
        assert _wait_for(lambda: _entries(root) == set()), _entries(root)
