"""Coffea's Dask path on workers that a pool on a batch system supplies.

    python examples/coffea_pool.py                                  # jobs are local processes
    python examples/coffea_pool.py --batch slurm --partition debug --max-workers 4 --cores 2 \\
        --workdir /shared/scratch

The analysis is ``examples/coffea_analysis.py``'s (``apply_to_fileset`` filling ``hist.dask``
histograms); here it is computed with ``dask.compute(..., scheduler=manager.get)`` while
``manager.scale(provider, ...)`` keeps worker jobs sized to the work: none before the graph,
up to ``--max-workers`` while it runs, none again ``--idle-timeout`` seconds after it ends.
The provider is Parsl's ``LocalProvider`` by default (jobs are processes of this machine),
``SlurmProvider`` with ``--batch slurm``. The result is checked against Dask's synchronous
scheduler.

With Slurm, the jobs must see this Python, this directory (the analysis is imported from
``coffea_analysis.py``), the manager's connection file (under the home directory by default)
and the generated files (``--workdir``): a shared file system. The manager listens on every
interface, so that jobs on other nodes reach it.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from coffea_analysis import generated_sample, run_dask, same_output, summary
from daskvine_py import Manager


def make_provider(args: argparse.Namespace) -> Any:
    """The batch system's provider; its jobs import what this script imports."""
    from parsl.launchers import SimpleLauncher
    from parsl.providers import LocalProvider, SlurmProvider

    worker_init = f"export PYTHONPATH={':'.join(p for p in sys.path if p)}"
    if args.batch == "local":
        return LocalProvider(
            init_blocks=0, min_blocks=0, max_blocks=args.max_workers, worker_init=worker_init
        )
    return SlurmProvider(
        partition=args.partition,
        nodes_per_block=1,
        init_blocks=0,
        max_blocks=args.max_workers,
        walltime="00:30:00",
        launcher=SimpleLauncher(),
        exclusive=False,
        cores_per_node=args.cores,
        mem_per_node=math.ceil(args.memory / 1024),  # GB
        worker_init=worker_init,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", choices=["local", "slurm"], default="local")
    parser.add_argument("--partition", default="debug", help="the Slurm partition")
    parser.add_argument("--max-workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker job")
    parser.add_argument("--memory", type=int, default=2000, help="MB per worker job")
    parser.add_argument("--idle-timeout", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--events", type=int, default=50_000, help="events per generated file")
    parser.add_argument("--chunksize", type=int, default=10_000, help="events per chunk")
    parser.add_argument(
        "--workdir", default=None, help="where to write the files (default: a temporary one)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        fileset = generated_sample(scratch, args.events)
        host = "127.0.0.1" if args.batch == "local" else "0.0.0.0"
        with Manager(host=host) as manager:
            pool = manager.scale(
                make_provider(args),
                max_workers=args.max_workers,
                cores=args.cores,
                memory=args.memory,
                idle_timeout=args.idle_timeout,
                poll_interval=0.5,
            )
            print(f"manager {manager.address}; pool {pool.name}: {pool.status()['jobs']}")
            started = time.perf_counter()
            out = run_dask(fileset, manager.get, args.chunksize)
            elapsed = time.perf_counter() - started
            status = pool.status()
            print(
                f"dask.compute(scheduler=manager.get) in {elapsed:.1f} s, starting with no "
                f"worker; jobs {status['jobs']}, workers {status['workers']}"
            )
            idle = time.perf_counter()
            while manager.workers or {"pending", "running"} & set(pool.status()["jobs"]):
                time.sleep(0.2)
            print(
                f"every job ended {time.perf_counter() - idle:.1f} s after the last task "
                f"(idle timeout {args.idle_timeout:g} s): {pool.status()['jobs']}"
            )
            failures = pool.status()["failures"]
        print(summary(out))
        for failure in failures:
            print("job failure:", failure)
        same = same_output(out, run_dask(fileset, "sync", args.chunksize))
        print(f"same histograms and counts as Dask's sync scheduler: {'yes' if same else 'NO'}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
