"""Coffea on daskvine_py: the Dask path and the processor path, checked against coffea's own.

Small NanoAOD-like files are written with uproot; every result is compared with Dask's
synchronous scheduler or coffea's ``IterativeExecutor`` on the same files.
"""

# The imports after importorskip need coffea.
# ruff: noqa: E402
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

coffea = pytest.importorskip("coffea")

import awkward as ak
import dask
import hist
import numpy as np
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from daskvine_py import TaskFailed
from daskvine_py.coffea import (
    DaskVinePyExecutor,
    accumulation_graph,
    decompress,
    merge_partials,
)
from daskvine_py.manager.launch import spawn

pytestmark = pytest.mark.integration


class QuietNanoAODSchema(NanoAODSchema):
    """These files have no jets or electrons: skip the warning per missing cross-reference."""

    warn_missing_crossrefs = False


def write_nanoaod(path, n_events, seed):
    rng = np.random.default_rng(seed)
    counts = rng.poisson(1.6, n_events)
    total = int(counts.sum())

    def jagged(values):
        return ak.unflatten(values, counts)

    muons = ak.zip(
        {
            "pt": jagged(rng.exponential(30.0, total).astype(np.float32) + 3),
            "eta": jagged(rng.uniform(-2.4, 2.4, total).astype(np.float32)),
            "phi": jagged(rng.uniform(-np.pi, np.pi, total).astype(np.float32)),
            "mass": jagged(np.full(total, 0.10566, np.float32)),
            "charge": jagged(rng.choice(np.array([-1, 1], np.int32), total)),
        }
    )
    branches = {
        "run": np.ones(n_events, np.uint32),
        "luminosityBlock": np.ones(n_events, np.uint32),
        "event": np.arange(n_events, dtype=np.uint64),
        "Muon": muons,
        "MET_pt": rng.exponential(40.0, n_events).astype(np.float32),
        "MET_phi": rng.uniform(-np.pi, np.pi, n_events).astype(np.float32),
    }
    import uproot

    with uproot.recreate(path) as file:
        types = {k: (v.type if isinstance(v, ak.Array) else v.dtype) for k, v in branches.items()}
        file.mktree("Events", types).extend(branches)


@pytest.fixture(scope="module")
def fileset(tmp_path_factory):
    """Two datasets, three files: ``{dataset: [path, ...]}``."""
    directory = tmp_path_factory.mktemp("nanoaod")
    sizes = {"DY": [1500, 1000], "Data": [1200]}
    out = {}
    for d, (name, events) in enumerate(sizes.items()):
        out[name] = []
        for i, n in enumerate(events):
            path = str(directory / f"{name}_{i}.root")
            write_nanoaod(path, n, seed=10 * d + i)
            out[name].append(path)
    return out


def dimuon(events):
    """Events with two opposite-charge muons, their pair and MET."""
    muons = events.Muon
    selected = events[(ak.num(muons) == 2) & (ak.sum(muons.charge, axis=1) == 0)]
    return selected, selected.Muon[:, 0] + selected.Muon[:, 1]


class DimuonProcessor(processor.ProcessorABC):
    def process(self, events):
        dataset = events.metadata["dataset"]
        selected, pair = dimuon(events)
        mass = hist.Hist.new.StrCat([], growth=True, name="dataset").Reg(60, 0, 180, name="mass")
        met = hist.Hist.new.StrCat([], growth=True, name="dataset").Reg(50, 0, 200, name="met")
        return {
            "mass": mass.Double().fill(dataset=dataset, mass=pair.mass),
            "met": met.Double().fill(dataset=dataset, met=selected.MET.pt),
            "selected": {dataset: len(selected)},
            "entries": processor.value_accumulator(int, len(events)),
        }

    def postprocess(self, accumulator):
        return accumulator


class CrashingProcessor(processor.ProcessorABC):
    """Kills its process on the second chunk of DY: a crash, not an exception."""

    def process(self, events):
        if events.metadata["dataset"] == "DY" and events.metadata["entrystart"] > 0:
            os._exit(13)
        return {"n": len(events)}

    def postprocess(self, accumulator):
        return accumulator


def run_processor(executor, fileset, proc=None):
    """Both phases of Runner: preprocessing (a fresh metadata cache) and processing."""
    runner = processor.Runner(
        executor=executor, schema=QuietNanoAODSchema, chunksize=400, metadata_cache={}
    )
    return runner(fileset, proc or DimuonProcessor(), treename="Events")


@pytest.fixture(scope="module")
def iterative_output(fileset):
    return run_processor(processor.IterativeExecutor(status=False), fileset)


def assert_same_output(got, want):
    assert got["selected"] == want["selected"]
    assert got["entries"].value == want["entries"].value == 3700
    for name in ("mass", "met"):
        assert set(got[name].axes[0]) == set(want[name].axes[0])
        for dataset in want[name].axes[0]:
            assert got[name][dataset, :] == want[name][dataset, :]


# -- the Dask path ----------------------------------------------------------------------


def test_dask_path_matches_sync(shared_manager, fileset):
    pytest.importorskip("dask_awkward")
    hda = pytest.importorskip("hist.dask")
    from coffea.dataset_tools import DataGroupSpec, apply_to_fileset, preprocess

    spec = DataGroupSpec.model_validate(
        {name: {"files": {path: "Events" for path in paths}} for name, paths in fileset.items()}
    )
    available, _ = preprocess(spec, step_size=400, scheduler=shared_manager.get)
    assert available == preprocess(spec, step_size=400, scheduler="sync")[0]

    def analysis(events):
        selected, pair = dimuon(events)
        return {
            "mass": hda.Hist.new.Reg(60, 0, 180, name="mass").Double().fill(mass=pair.mass),
            "met": hda.Hist.new.Reg(50, 0, 200, name="met").Double().fill(met=selected.MET.pt),
            "selected": ak.num(selected, axis=0),
        }

    out = apply_to_fileset(analysis, available, schemaclass=QuietNanoAODSchema)
    (got,) = dask.compute(out, scheduler=shared_manager.get)
    (want,) = dask.compute(out, scheduler="sync")
    assert got.keys() == want.keys() == {"DY", "Data"}
    for dataset in want:
        assert got[dataset]["mass"] == want[dataset]["mass"]
        assert got[dataset]["met"] == want[dataset]["met"]
        assert got[dataset]["selected"] == want[dataset]["selected"] > 0
        assert want[dataset]["mass"].sum(flow=True) == want[dataset]["selected"]


# -- the processor path -----------------------------------------------------------------


def test_embedded_executor_matches_iterative(fileset, iterative_output, monkeypatch):
    """No arguments: a manager and local workers, the same ones for both phases."""
    with DaskVinePyExecutor(status=False, treereduction=2) as executor:
        manager = executor.start()
        assert len(manager.workers) >= 1
        pids = {info["pid"] for info in manager.workers.values()}
        phases = []
        original_get = manager.get

        def spy(dsk, keys, **options):
            phases.append(sorted({key[0].split("-")[0] for key in dsk}))
            return original_get(dsk, keys, **options)

        monkeypatch.setattr(manager, "get", spy)
        got = run_processor(executor, fileset)
        assert executor.start() is manager
        assert {info["pid"] for info in manager.workers.values()} == pids
    assert phases == [["accumulate", "get_metadata"], ["DimuonProcessor", "accumulate"]]
    assert_same_output(got, iterative_output)


@pytest.mark.parametrize("compression", [None, 1])
def test_given_manager_and_status(shared_manager, fileset, iterative_output, compression, capsys):
    executor = DaskVinePyExecutor(manager=shared_manager, compression=compression, status=True)
    assert_same_output(run_processor(executor, fileset), iterative_output)
    executor.close()  # a given manager stays open
    assert shared_manager.get({"x": (sum, [1, 2])}, "x") == 3
    assert "daskvine_py" in capsys.readouterr().err  # get's progress bar, on stderr


def test_listen_address_with_remote_worker(fileset, iterative_output):
    """Given an address, the executor starts no workers: one joins by itself, as remote ones do."""
    executor = DaskVinePyExecutor(manager="tcp://127.0.0.1:0", status=False, retries=0)
    proc = None
    try:
        manager = executor.start()
        assert manager.workers == {}
        proc = spawn(
            manager.address, cores=1, name="remote", connection_file=manager.connection_file
        )
        assert_same_output(run_processor(executor, fileset), iterative_output)
        assert list(manager.workers) == ["remote"]

        with pytest.raises(Exception, match="Failed processing file") as caught:
            run_processor(executor, fileset, DimuonProcessorWithBug())
        assert "daskvine_py: raised by task" in "".join(getattr(caught.value, "__notes__", []))

        # retries=0: the first crash is final, and the error names the work item
        with pytest.raises(TaskFailed) as crashed:
            run_processor(executor, fileset, CrashingProcessor())
        if sys.version_info >= (3, 11):
            assert "work item WorkItem(dataset='DY'" in "\n".join(crashed.value.__notes__)
    finally:
        executor.close()
        if proc is not None:
            assert proc.wait(timeout=20) == 0


@pytest.mark.timeout(180)
def test_executor_with_a_provider_runs_on_a_pool_and_closes_it(
    fileset, iterative_output, tmp_path, monkeypatch
):
    """``provider=``: no local worker; the pool's jobs supply the workers for both phases,
    and closing the executor cancels them."""
    providers = pytest.importorskip("parsl.providers")
    from test_pool import _env_for_jobs

    _env_for_jobs(monkeypatch)  # the jobs import this checkout and this module
    provider = providers.LocalProvider(init_blocks=0, min_blocks=0, max_blocks=2)
    provider.script_dir = str(tmp_path / "jobs")
    os.makedirs(provider.script_dir)
    executor = DaskVinePyExecutor(
        manager="tcp://127.0.0.1:0",
        provider=provider,
        max_workers=2,
        idle_timeout=60,
        pool_options={"poll_interval": 0.2},
        status=False,
    )
    with executor:
        manager = executor.start()
        assert manager.workers == {} and executor.pool is not None
        pool = executor.pool
        got = run_processor(executor, fileset)
        names = set(manager.workers)
        assert names and all(name.startswith(f"{pool.name}-") for name in names), names
        assert sum(pool.status()["jobs"].values()) <= 2
        assert executor.start() is manager and executor.pool is pool  # kept warm
        connection_file = manager.connection_file
    assert_same_output(got, iterative_output)
    assert executor.pool is None
    assert set(pool.status()["jobs"]) <= {"done", "cancelled"}, pool.status()
    deadline = time.monotonic() + 30
    while _processes_with(connection_file):  # cancelled jobs take a moment to exit
        assert time.monotonic() < deadline, _processes_with(connection_file)
        time.sleep(0.1)


def _processes_with(text):
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split() if int(pid) != os.getpid()]


class DimuonProcessorWithBug(DimuonProcessor):
    def process(self, events):
        raise ValueError("a bug in the analysis")


# -- the pieces -------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, 1])
def test_accumulation_graph_is_a_tree(compression):
    items = list(range(45))
    graph, final = accumulation_graph(
        items, lambda i: {"n": i, "seen": {i}}, treereduction=4, compression=compression
    )
    merges = [task for task in graph.values() if task[0] is merge_partials]
    assert len(graph) == 45 + 12 + 3 + 1
    assert all(len(task[2]) <= 4 for task in merges)
    assert final[0].startswith("accumulate-")
    got = decompress(dask.get(graph, final))
    assert got == processor.accumulate({"n": i, "seen": {i}} for i in items)


def test_merges_skip_missing_results():
    """Runner gives None for a file skipped as bad: merges ignore it, as accumulate does."""
    assert merge_partials(None, [None, None]) is None
    assert merge_partials(1, [None]) is None
    assert decompress(merge_partials(1, [None, {"n": 1}, {"n": 2}])) == {"n": 3}


def test_copies_share_one_manager():
    executor = DaskVinePyExecutor(workers=1, treereduction=5)
    copy = executor.copy(desc="Preprocessing", compression=None)
    assert copy._shared is executor._shared and copy.treereduction == 5
    assert executor(iter([]), len, "untouched") == ("untouched", 0)
    with pytest.raises(ValueError, match="treereduction"):
        DaskVinePyExecutor(treereduction=1)
    with pytest.raises(ValueError, match="tcp://"):
        DaskVinePyExecutor(manager="not an address")
    with pytest.raises(ValueError, match="max_workers"):
        DaskVinePyExecutor(provider=object(), max_workers=0)
    with pytest.raises(ValueError, match="pool_options"):
        DaskVinePyExecutor(provider=object(), pool_options={"cores": 4})


def test_core_never_imports_coffea():
    code = "import sys, daskvine_py; assert not [m for m in sys.modules if m.startswith('coffea')]"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
