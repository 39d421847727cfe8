"""The scheduler state alone, per task: what the manager's I/O thread spends in
``SchedulerState.handle`` for a ``flat`` graph, without sockets, workers or a caller.

    PYTHONPATH=src python benchmarks/bench_state.py [--tasks 100000] [--workers 20]
                                                   [--cores 12] [--batch 64] [--repeat 5]
                                                   [--profile OUT] [--smoke]

``--tasks`` independent tasks (one output each, as ``swarm.py --workload flat`` submits
them) go to ``--workers`` workers of ``--cores`` cores. Each pass, every worker reports
``Started`` for the tasks it was sent and ``TaskDone`` for up to ``--batch`` of them, as
the real workers' batches do under load; ``handle`` answers with the next tasks. It
prints, best and median of ``--repeat`` runs, µs of CPU per task for the whole run
(submission, dispatch, reports, the run's end) and the passes it took. Every task's
value must come back once, or it exits non-zero. ``--profile OUT``: one more run under
cProfile, written to OUT. ``--smoke``: 2,000 tasks, twice (numbers meaningless).
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import time
from typing import Any

from daskvine_py.scheduler import state as s
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps


def one_run(tasks: int, workers: int, cores: int, batch: int) -> tuple[float, int]:
    """CPU seconds of one run and the passes it took."""
    st = s.SchedulerState()
    names = [f"w{i}".encode() for i in range(workers)]
    keys = [f"flat-{i}" for i in range(tasks)]
    new = [s.NewTask(key, b"payload", (), (), i, "flat", 0) for i, key in enumerate(keys)]
    value = dumps(8)
    joined = [s.WorkerJoined(w, w.decode(), cores, f"tcp://{w.decode()}") for w in names]
    sent: dict[bytes, list[int]] = {w: [] for w in names}
    outputs = 0
    passes = 0
    start = time.process_time()
    out = st.handle([*joined, s.SubmitRun(1, new, keys, 0)], 0.0)
    now = 0.0
    while True:
        for instruction in out:
            kind = type(instruction)
            if kind is s.Send and type(instruction.message) is p.Execute:
                sent[instruction.worker].append(instruction.message.task_id)
            elif kind is s.RunOutput:
                outputs += 1
            elif kind is s.RunDone:
                return time.process_time() - start, passes
            elif kind is s.RunAborted or kind is s.RunFailed:
                raise RuntimeError(f"the run failed: {instruction}")
        events: list[Any] = []
        for worker, ids in sent.items():
            if not ids:
                continue
            taken, sent[worker] = ids[:batch], ids[batch:]
            events.append(s.FromWorker(worker, p.Started(tuple(taken))))
            events.extend(s.FromWorker(worker, p.TaskDone(i, 8, 0.01, value)) for i in taken)
        if not events:
            raise RuntimeError(f"stuck after {outputs} of {tasks} outputs")
        now += 0.01
        passes += 1
        out = st.handle(events, now)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--cores", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.repeat = 2_000, 2
    per_task = []
    passes = 0
    for _ in range(args.repeat):
        seconds, passes = one_run(args.tasks, args.workers, args.cores, args.batch)
        per_task.append(seconds / args.tasks * 1e6)
    print(
        f"{args.tasks:,} tasks on {args.workers} x {args.cores}, batches of {args.batch}: "
        f"{min(per_task):.2f} us of CPU per task (best; median {statistics.median(per_task):.2f}), "
        f"{passes} passes"
    )
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(one_run, args.tasks, args.workers, args.cores, args.batch)
        profile.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
