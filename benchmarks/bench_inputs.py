"""The Coffea Dask path reading its inputs from a real XRootD server, with and without the
node's input cache (``cache_inputs=True``), against the same analysis over local files.

    python benchmarks/bench_inputs.py SAMPLES_DIR [--copies 50] [--chunksize 10] [--workers 2 4]
    python benchmarks/bench_inputs.py --smoke [SAMPLES_DIR]   # does it still run?

Run it with the Coffea venv's interpreter, as root or a user that can start Debian's
``xrootd`` (``tests/xrootd.py`` starts it on 127.0.0.1, as the tests do). ``SAMPLES_DIR``
holds coffea's ``nano_dy.root`` and ``nano_dimuon.root``; each is served ``--copies``
times, so the graph has many chunk tasks. The server, the manager and the workers share
the machine's cores.

Per number of one-core workers (all on this one node, sharing its input cache): the
run over local paths, over ``root://`` without the cache, and with it (first and second
run, the cache empty before the first). For each: seconds, the files the server opened
(its ``ofs.trace open`` log), the bytes it read from its files (``rchar`` of
``/proc/PID/io``: xrootd reads with ``pread``), and for the cache the bytes it holds.
Every result is checked against Dask's sync scheduler over the local files.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "examples"), str(HERE.parent / "tests")]


def rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as file:
        for line in file:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def opened(log: Path, since: int) -> int:
    text = log.read_bytes()[since:].decode(errors="replace")
    return len(re.findall(r"ofs_open: \S+ fn=(\S+)", text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?")
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--chunksize", type=int, default=10)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.copies, args.workers = 2, [2]
    elif not args.samples:
        parser.error("SAMPLES_DIR is needed (or --smoke, which can write its own)")

    import dask
    from coffea import processor

    from bench_coffea_dask import build, write_samples
    from coffea_analysis import SmallNanoAODSchema, same_output
    from daskvine_py import Manager
    from xrootd import XRootDServer

    with tempfile.TemporaryDirectory(prefix="bench-inputs-") as scratch, XRootDServer() as server:
        samples, schema = args.samples, None
        if samples is None:
            samples, schema = os.path.join(scratch, "samples"), SmallNanoAODSchema
            os.mkdir(samples)
            write_samples(samples)
        local: dict[str, list[str]] = {}
        remote: dict[str, list[str]] = {}
        for name in ("nano_dy", "nano_dimuon"):
            for i in range(args.copies):
                url = server.put(os.path.join(samples, f"{name}.root"), f"{name}_{i}.root")
                remote.setdefault(name, []).append(url)
                local.setdefault(name, []).append(str(server.directory / f"{name}_{i}.root"))
        total = sum(os.path.getsize(p) for paths in local.values() for p in paths)
        files = sum(len(paths) for paths in local.values())
        pid = server.pid
        assert pid is not None

        def graphs(fileset: dict[str, list[str]]) -> Any:
            return build(fileset, args.copies, args.chunksize, scratch, schema)

        (reference,) = dask.compute(graphs(local), scheduler="sync")
        reference = processor.accumulate(reference.values())
        print(f"{files} files, {total / 2**20:.1f} MiB in all; chunks of {args.chunksize} events")
        print(f"{'workers':>7} {'run':<24} {'tasks':>6} {'seconds':>8} {'opened':>7} "
              f"{'server read MiB':>15} {'cached MiB':>10}")  # fmt: skip
        for workers in args.workers:
            cache = Path(scratch) / f"inputs-{workers}"
            os.environ["DASKVINE_PY_INPUT_CACHE"] = str(cache)
            with Manager() as manager:
                manager.start_workers(workers, cores=1)
                dask.compute(graphs(local), scheduler=manager.get)  # warm: libraries' imports
                for label, fileset, options in (
                    ("local files", local, {}),
                    ("root://", remote, {}),
                    ("root://, cache: first", remote, {"cache_inputs": True}),
                    ("root://, cache: second", remote, {"cache_inputs": True}),
                ):
                    built = graphs(fileset)  # (preprocessing reads here, not timed)
                    since, before = server.log.stat().st_size, rchar(pid)
                    began = time.perf_counter()
                    (got,) = dask.compute(built, scheduler=manager.get, **options)
                    took = time.perf_counter() - began
                    read = rchar(pid) - before
                    if not same_output(processor.accumulate(got.values()), reference):
                        raise SystemExit(f"{label}: the result differs from the sync scheduler's")
                    held = sum(p.stat().st_size for p in cache.rglob("*.root") if p.is_file())
                    print(f"{workers:>7} {label:<24} {manager.last_run.tasks:>6} {took:>8.2f} "
                          f"{opened(server.log, since):>7} {read / 2**20:>15.2f} "
                          f"{held / 2**20:>10.2f}")  # fmt: skip
            shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
