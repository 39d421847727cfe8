"""Dimuon mass and MET of events with two opposite-charge muons: a Coffea analysis on daskvine_py.

One command, on this machine (an embedded manager, one local worker per core)::

    python examples/coffea_analysis.py

With no ``--sample`` it first writes small NanoAOD-like files (a Drell-Yan-like sample with a
Z peak and a ttbar-like one with real MET) and checks the result against coffea's
``IterativeExecutor``. On workers of other machines, listen on an address they can reach and
start ``python -m daskvine_py.worker --connection-file PATH --cores 12`` on each node, with the
connection file the script prints::

    python examples/coffea_analysis.py --listen tcp://0.0.0.0:9123 \\
        --sample DY='/store/dy/*.root' --sample TT='/store/tt/*.root'

(The generated files are written to ``--workdir``: a directory every worker must see.)
``--dask`` runs the same analysis the Dask way: ``coffea.dataset_tools.apply_to_fileset``
filling ``hist.dask`` histograms, computed with ``dask.compute(..., scheduler=manager.get)``
and checked against Dask's synchronous scheduler.

With ``--dask --cache``, results are reused by content across computes (``get(cache=True)``,
docs/cache.md); ``--cache-dir DIR`` keeps them on disk for the next process too.
``--rerun`` shows what that buys in one session: the analysis, again unchanged, then with
only the histogramming changed (``--mass-bins``), printing each run's time and tasks run::

    python examples/coffea_analysis.py --dask --cache --rerun
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import awkward as ak
import hist
import numpy as np
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from daskvine_py.coffea import DaskVinePyExecutor

MUON_MASS = 0.10566  # GeV


class SmallNanoAODSchema(NanoAODSchema):
    """NanoAOD without the collections these files leave out: no warning per missing index."""

    warn_missing_crossrefs = False


class DimuonAnalysis(processor.ProcessorABC):
    """Events with exactly two opposite-charge muons: their mass, the event's MET.

    ``dask=True`` books ``hist.dask`` histograms for ``apply_to_fileset``; otherwise plain
    ``hist`` histograms for ``processor.Runner``.
    """

    def __init__(self, dask: bool = False, mass_bins: int = 120) -> None:
        self.dask = dask
        self.mass_bins = mass_bins

    def process(self, events: Any) -> dict[str, Any]:
        dataset = events.metadata["dataset"]
        muons = events.Muon
        selected = events[(ak.num(muons) == 2) & (ak.sum(muons.charge, axis=1) == 0)]
        dimuon = selected.Muon[:, 0] + selected.Muon[:, 1]
        if self.dask:
            import hist.dask as hda

            new = hda.Hist.new
        else:
            new = hist.Hist.new
        mass = new.StrCat([], growth=True, name="dataset").Reg(
            self.mass_bins, 0, 240, name="mass", label=r"$m_{\mu\mu}$ [GeV]"
        )
        met = new.StrCat([], growth=True, name="dataset").Reg(
            50, 0, 250, name="met", label=r"$p_T^{miss}$ [GeV]"
        )
        return {
            "mass": mass.Double().fill(dataset=dataset, mass=dimuon.mass),
            "met": met.Double().fill(dataset=dataset, met=selected.MET.pt),
            "events": {dataset: ak.num(events, axis=0)},
            "selected": {dataset: ak.num(selected, axis=0)},
        }

    def postprocess(self, accumulator: dict[str, Any]) -> dict[str, Any]:
        return accumulator


# -- a sample to run on when none is given ---------------------------------------------


def write_nanoaod(path: str, n_events: int, seed: int, z_fraction: float, met_scale: float) -> None:
    """A NanoAOD-like TTree: ``nMuon``, ``Muon_*``, ``MET_*`` and the event ids.

    A ``z_fraction`` of the events holds an opposite-charge muon pair whose mass follows a
    Breit-Wigner at the Z mass; every event gets Poisson-many extra random muons.
    """
    rng = np.random.default_rng(seed)
    extra = rng.poisson(0.4, n_events)
    has_z = rng.random(n_events) < z_fraction
    counts = extra + 2 * has_z
    total = int(counts.sum())
    pt = rng.exponential(25.0, total) + 5.0
    eta = rng.uniform(-2.4, 2.4, total)
    phi = rng.uniform(-np.pi, np.pi, total)
    charge = rng.choice(np.array([-1, 1]), total)
    # The Z pair is each such event's first two muons; choose their pt for the wanted mass.
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])[has_z]
    n_z = len(first)
    mass = np.clip(91.19 + 2.5 / 2 * rng.standard_cauchy(n_z), 50.0, 200.0)
    ratio = rng.uniform(0.5, 2.0, n_z)
    closeness = np.cosh(eta[first] - eta[first + 1]) - np.cos(phi[first] - phi[first + 1])
    pt[first + 1] = np.sqrt(mass**2 / (2 * ratio * np.maximum(closeness, 1e-3)))
    pt[first] = ratio * pt[first + 1]
    charge[first] = -charge[first + 1]

    def per_event(values: np.ndarray, dtype: type) -> ak.Array:
        return ak.unflatten(values.astype(dtype), counts)

    muons = ak.zip(
        {
            "pt": per_event(pt, np.float32),
            "eta": per_event(eta, np.float32),
            "phi": per_event(phi, np.float32),
            "mass": per_event(np.full(total, MUON_MASS), np.float32),
            "charge": per_event(charge, np.int32),
        }
    )
    branches = {
        "run": np.ones(n_events, np.uint32),
        "luminosityBlock": np.ones(n_events, np.uint32),
        "event": np.arange(n_events, dtype=np.uint64),
        "Muon": muons,
        "MET_pt": rng.exponential(met_scale, n_events).astype(np.float32),
        "MET_phi": rng.uniform(-np.pi, np.pi, n_events).astype(np.float32),
    }
    import uproot

    with uproot.recreate(path) as file:
        # mktree's default names give NanoAOD's nMuon / Muon_pt branches
        types = {k: (v.type if isinstance(v, ak.Array) else v.dtype) for k, v in branches.items()}
        file.mktree("Events", types).extend(branches)


def generated_sample(directory: str, events_per_file: int) -> dict[str, list[str]]:
    """Write two files for each of two datasets into ``directory``; return the fileset."""
    kinds = {"DYJetsToLL": (0.7, 20.0), "TTTo2L2Nu": (0.0, 80.0)}
    fileset: dict[str, list[str]] = {}
    for d, (name, (z_fraction, met_scale)) in enumerate(kinds.items()):
        fileset[name] = []
        for i in range(2):
            path = os.path.join(directory, f"{name}_{i}.root")
            write_nanoaod(path, events_per_file, 10 * d + i, z_fraction, met_scale)
            fileset[name].append(os.path.abspath(path))
    return fileset


# -- the two ways to run it -----------------------------------------------------------------


def run_processor(
    fileset: dict[str, list[str]], executor: processor.ExecutorBase, chunksize: int
) -> dict[str, Any]:
    """The processor path: ``processor.Runner`` with ``executor`` (preprocessing included)."""
    runner = processor.Runner(
        executor=executor, schema=SmallNanoAODSchema, chunksize=chunksize, metadata_cache={}
    )
    return runner(fileset, DimuonAnalysis(), treename="Events")


def run_dask(
    fileset: dict[str, list[str]], scheduler: Any, chunksize: int, mass_bins: int = 120
) -> dict[str, Any]:
    """The Dask path: preprocess, ``apply_to_fileset``, one ``dask.compute``."""
    import dask
    from coffea.dataset_tools import DataGroupSpec, apply_to_fileset, preprocess

    spec = DataGroupSpec.model_validate(
        {name: {"files": {path: "Events" for path in paths}} for name, paths in fileset.items()}
    )
    available, _ = preprocess(spec, step_size=chunksize, scheduler=scheduler)
    analysis = DimuonAnalysis(dask=True, mass_bins=mass_bins)
    graphs = apply_to_fileset(analysis, available, SmallNanoAODSchema)
    (per_dataset,) = dask.compute(graphs, scheduler=scheduler)
    # one output, as Runner gives: histograms summed over datasets, counts merged
    return processor.accumulate(per_dataset.values())


def summary(out: dict[str, Any]) -> str:
    lines = []
    for dataset in sorted(out["events"]):
        mass = out["mass"][dataset, :]
        met = out["met"][dataset, :]
        centers = mass.axes[0].centers
        peak = centers[int(np.argmax(mass.values()))]
        mean_met = float(np.average(met.axes[0].centers, weights=met.values() + 1e-12))
        lines.append(
            f"{dataset:12s} {out['events'][dataset]:>9,} events  {out['selected'][dataset]:>8,} "
            f"with two opposite-charge muons  mass peak {peak:6.1f} GeV  mean MET "
            f"{mean_met:5.1f} GeV"
        )
    return "\n".join(lines)


def same_output(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same counts, and per dataset the same bin values (category order may differ)."""
    if a["events"] != b["events"] or a["selected"] != b["selected"]:
        return False
    return all(
        a[name].axes[1] == b[name].axes[1]
        and np.array_equal(a[name][dataset, :].values(), b[name][dataset, :].values())
        for name in ("mass", "met")
        for dataset in a["events"]
    )


def parse_sample(specs: Sequence[str]) -> dict[str, list[str]]:
    fileset: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, pattern = spec.partition("=")
        if not sep:
            raise SystemExit(f"--sample takes NAME=FILES, not {spec!r}")
        paths = sorted(glob.glob(pattern)) or [pattern]  # not a local glob: a URL, say
        fileset.setdefault(name, []).extend(paths)
    return fileset


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sample",
        action="append",
        default=[],
        metavar="NAME=FILES",
        help="a dataset and its files (a glob or a URL); repeatable",
    )
    parser.add_argument(
        "--listen",
        metavar="ADDRESS",
        help="listen for remote workers here, e.g. tcp://0.0.0.0:9123",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local workers (default: one per core; none with --listen)",
    )
    parser.add_argument(
        "--dask",
        action="store_true",
        help="the Dask path (apply_to_fileset, hist.dask) instead of Runner",
    )
    parser.add_argument("--chunksize", type=int, default=25_000, help="events per chunk")
    parser.add_argument(
        "--cache", action="store_true", help="--dask: reuse results by content (get(cache=True))"
    )
    parser.add_argument(
        "--cache-dir", default=None, help="--dask --cache: keep results in this directory too"
    )
    parser.add_argument("--mass-bins", type=int, default=120, help="bins of the mass histogram")
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="--dask --cache: run again unchanged, then with --mass-bins doubled; time each",
    )
    parser.add_argument(
        "--events", type=int, default=100_000, help="events per generated file (without --sample)"
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to write generated files (default: a temporary directory)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with coffea's IterativeExecutor / Dask's sync scheduler "
        "(always done on the generated sample)",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        if args.sample:
            fileset = parse_sample(args.sample)
        else:
            fileset = generated_sample(scratch, args.events)
            args.check = True
        executor = DaskVinePyExecutor(manager=args.listen, workers=args.workers, status=False)
        with executor:
            manager = executor.start()
            if args.listen:
                print(
                    "workers connect with: python -m daskvine_py.worker "
                    f"--connection-file {manager.connection_file} --cores N"
                )
            print(f"manager {manager.address}, workers connected: {len(manager.workers)}")
            get = manager.get
            if args.cache:
                get = functools.partial(manager.get, cache=True, cache_dir=args.cache_dir)
            runs = [("", args.mass_bins)]
            if args.rerun:
                doubled = 2 * args.mass_bins
                runs += [
                    (" again, unchanged", args.mass_bins),
                    (f" again, {doubled} mass bins", doubled),
                ]
            for what, bins in runs:
                started = time.perf_counter()
                if args.dask:
                    out = run_dask(fileset, get, args.chunksize, bins)
                else:
                    out = run_processor(fileset, executor, args.chunksize)
                elapsed = time.perf_counter() - started
                how = "dask.compute(scheduler=manager.get)" if args.dask else "Runner"
                n = len(manager.workers)
                cache = manager.last_run.cache if args.dask else None
                ran = f", {cache['tasks_run']} tasks run" if cache else ""
                print(f"{how}{what} on {n} worker{'s' * (n != 1)} in {elapsed:.2f} s{ran}")
        print(summary(out))
        if not args.check:
            return 0
        if args.dask:
            reference = run_dask(fileset, "sync", args.chunksize, runs[-1][1])
            against = "Dask's sync scheduler"
        else:
            reference = run_processor(
                fileset, processor.IterativeExecutor(status=False), args.chunksize
            )
            against = "coffea's IterativeExecutor"
        same = same_output(out, reference)
        print(f"same histograms and counts as {against}: {'yes' if same else 'NO'}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
