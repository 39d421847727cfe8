"""A worker pool on Slurm that grows to the work and shrinks to nothing when idle.

    python examples/slurm_pool.py [--partition debug] [--max-workers 2] [--tasks 200]

Run it on a login node of a Slurm cluster with a shared home directory (the connection
file and this Python must be visible on the compute nodes), or on this machine after
``scripts/slurm-single-node.sh start``. It prints ``squeue`` before, during and after,
and the times that matter: from the first submission to the first task finished, and
from the last task to the last job gone. Without Slurm's commands it says so and exits
with status 3.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time

import dask.bag as db

from daskvine_py import Manager


def square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def squeue(prefix: str) -> str:
    """The queue's lines of this pool's jobs (Parsl appends a time to each job's name)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T %M"], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if prefix in line]
    return "; ".join(lines) or "(empty)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partition", default="debug")
    parser.add_argument("--max-workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--idle-timeout", type=float, default=5.0)
    args = parser.parse_args()
    # Without Slurm (or Parsl) there is nothing to show: say so in one line.
    missing = [name for name in ("sbatch", "squeue", "scancel") if shutil.which(name) is None]
    if missing:
        print(
            f"slurm_pool.py needs Slurm: {', '.join(missing)} not found on PATH "
            "(scripts/slurm-single-node.sh start sets one up here)",
            file=sys.stderr,
        )
        return 3
    try:
        from parsl.launchers import SimpleLauncher
        from parsl.providers import SlurmProvider
    except ImportError as exc:
        print(
            f"slurm_pool.py needs Parsl ({exc}): pip install 'daskvine-py[batch]'", file=sys.stderr
        )
        return 3
    provider = SlurmProvider(
        partition=args.partition,
        nodes_per_block=1,
        init_blocks=0,
        walltime="00:30:00",
        launcher=SimpleLauncher(),
        exclusive=False,
        scheduler_options="#SBATCH --cpus-per-task=1 --mem=1000",
        worker_init=f"export PYTHONPATH={':'.join(sys.path)}",
    )
    with Manager() as manager:
        pool = manager.scale(
            provider,
            max_workers=args.max_workers,
            cores=1,
            idle_timeout=args.idle_timeout,
            poll_interval=0.5,
        )
        names = f"daskvine-{pool.name}-"
        print("squeue before:", squeue(names))
        total = db.from_sequence(range(args.tasks), npartitions=args.tasks // 4).map(square).sum()
        begun = time.monotonic()
        first = {}

        def watch() -> None:  # when the first worker joins, and what the queue says then
            while not manager.workers and time.monotonic() - begun < 300:
                time.sleep(0.05)
            first.update(joined=time.monotonic() - begun, queue=squeue(names))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = total.compute(scheduler=manager.get)
        ran = time.monotonic() - begun
        watcher.join(1)
        print(
            f"first worker joined {first.get('joined', float('nan')):.1f} s after the "
            f"graph was submitted; squeue then: {first.get('queue')}"
        )
        print(f"sum of squares: {result} (expected {sum(x * x for x in range(args.tasks))})")
        print(f"jobs while it ran: {pool.status()['jobs']}; squeue: {squeue(names)}")
        print(f"from submitting to the graph's end, starting with no worker: {ran:.1f} s")
        idle = time.monotonic()
        while manager.workers or any(s in pool.status()["jobs"] for s in ("pending", "running")):
            time.sleep(0.2)
        gone = time.monotonic() - idle
        print(
            f"from the last task to every job ended: {gone:.1f} s (idle_timeout "
            f"{args.idle_timeout} s)"
        )
        print("squeue after:", squeue(names), "| jobs:", pool.status()["jobs"])
    return 0 if result == sum(x * x for x in range(args.tasks)) else 1


if __name__ == "__main__":
    sys.exit(main())
