"""The dask.distributed side of issue 28: a swarm workload on in-process workers, tasks sleeping.

    python benchmarks/swarm_distributed.py --workload dv3-large --workers 20 --threads 12
        [--scale S] [--tasks T] [--task-seconds S] [--seed N] [--timeout 300] [--tuned]
        [--json OUT]
    python benchmarks/swarm_distributed.py --smoke

The graph is the one ``swarm.py`` gives daskvine_py's simulated workers (``swarm_workloads``),
passed to ``Client.get``; here every task really sleeps its declared seconds, on
``LocalCluster(processes=False)``: the scheduler, every worker and every task thread live in
this process, so the run costs one process however many workers it has. Results are small
ints, so no declared bytes move: this side measures scheduling, not data transfer.

A failure (a timeout, an exception, a wrong result) is an outcome: it is recorded in
``error`` and the cluster is torn down within ``timeout`` (the run gets what the join left,
less a reserve for the teardown). The script exits 0 when the result was right, 2 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import re
import resource
import sys
import threading
import time
import warnings
from typing import Any

import dask
from distributed import Client, LocalCluster, Worker, wait
from distributed.diagnostics.plugin import SchedulerPlugin

from swarm_workloads import NAMES, Workload, build, set_sleep

log = logging.getLogger("swarm_distributed")

NOTE = (
    "in-process workers (LocalCluster processes=False): scheduler, workers and task threads "
    "share this process, so its CPU time counts all of them; tasks sleep, results are small "
    "ints (declared sizes are not moved); memory_limit=0 (the shared RSS would pause "
    "every worker otherwise); the soft limit of open files raised to the hard one"
)


class _LocalWorker(Worker):
    """A worker whose HTTP server (one per worker, even without a dashboard) binds 127.0.0.1."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(dashboard=False, dashboard_address="127.0.0.1:0")
        super().__init__(*args, **kwargs)


class _Completions(SchedulerPlugin):
    """Counts the tasks that finished (re-runs included) and the seconds they declared."""

    name = "swarm-completions"

    def __init__(self, seconds: dict[Any, float]) -> None:
        self.seconds = seconds
        self.done = 0
        self.task_seconds = 0.0
        self.erred = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing":
            if finish == "memory":
                self.done += 1
                self.task_seconds += self.seconds.get(key, 0.0)
            elif finish == "erred":
                self.erred += 1


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return round(int(match.group(1)) / 1024, 1) if match else None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


#: ``tuned``: what a user with hundreds of workers in one process would turn down first. Idle,
#: 200 in-process workers cost about 0.6 of a core with the defaults, 0.3 with these.
TUNED = {
    "distributed.worker.profile.enabled": False,  # a sampler per worker, every 10 ms
    "distributed.admin.tick.interval": "1s",  # a blocked-loop check per worker, every 20 ms
}


def run_distributed(
    workload: Workload, workers: int, threads: int, timeout: float, tuned: bool = False
) -> dict[str, Any]:
    """Run ``workload`` on ``workers`` in-process workers of ``threads`` threads each.

    ``tuned``: with ``TUNED`` set (the defaults otherwise)."""
    with dask.config.set(TUNED if tuned else {}):
        out = _run(workload, workers, threads, timeout)
    out["config"] = TUNED if tuned else "defaults"
    return out


def _run(workload: Workload, workers: int, threads: int, timeout: float) -> dict[str, Any]:
    cores = workers * threads
    out: dict[str, Any] = {
        "system": "distributed",
        "workload": workload.name,
        "workers": workers,
        "threads": threads,
        "cores": cores,
        "workers_registered": 0,
        "join_s": None,
        "tasks": workload.tasks,
        "tasks_done": 0,
        "tasks_erred": 0,
        "result_ok": False,
        "makespan_s": None,
        "elapsed_s": None,
        "ideal_s": round(workload.ideal_s(cores), 3),
        "total_work_s": workload.total_work_s,
        "critical_path_s": workload.critical_path_s,
        "busy_fraction": None,
        "scheduler_cpu_us_per_task": None,
        "loop_cpu_us_per_task": None,
        "rss_mb": None,
        "peak_rss_mb": None,
        "teardown_s": None,
        "error": None,
        "note": NOTE,
    }
    start = time.monotonic()
    # kept for the teardown; a loop jammed by hundreds of workers may still overrun it
    reserve = min(30.0, max(2.0, 0.2 * timeout))

    def left(margin: float = 0.0) -> float:
        return max(0.1, start + timeout - margin - time.monotonic())

    counter = _Completions({k: t[1] for k, t in workload.graph.items()})
    cluster: LocalCluster | None = None
    client: Client | None = None
    set_sleep(True)
    log.info("starting %d workers x %d threads", workers, threads)
    try:
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=False,
            dashboard_address=None,
            silence_logs=logging.ERROR,
            memory_limit=0,
            worker_class=_LocalWorker,
            # the scheduler's HTTP server too, without the dashboard
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            timeout=left(reserve),
        )
        client = Client(cluster, timeout=left(reserve))
        client.wait_for_workers(workers, timeout=left(reserve))
        out["join_s"] = round(time.monotonic() - start, 3)
        log.info("%d workers joined in %.1f s", workers, out["join_s"])
        scheduler = cluster.scheduler
        assert scheduler is not None  # started by now
        out["workers_registered"] = len(scheduler.workers)
        scheduler.add_plugin(counter)
        # the event loop's own CPU (scheduler and worker coroutines), apart from task threads
        loop0 = client.run_on_scheduler(time.thread_time)
        cpu0 = time.process_time()
        t0 = time.monotonic()
        try:
            futures = client.get(workload.graph, workload.keys, sync=False)
            log.info("graph of %d tasks submitted in %.1f s", workload.tasks, time.monotonic() - t0)
            wait(futures if isinstance(futures, list) else [futures], timeout=left(reserve))
            result = client.gather(futures)
            out["makespan_s"] = round(time.monotonic() - t0, 3)
            out["result_ok"] = workload.result_ok(result)
            if not out["result_ok"]:
                out["error"] = "wrong result"
        finally:
            elapsed = time.monotonic() - t0
            out["elapsed_s"] = round(elapsed, 3)
            cpu = time.process_time() - cpu0
            # per task run: all of them when the result came, those done when it did not
            ran = workload.tasks if out["result_ok"] else max(counter.done, 1)
            out["scheduler_cpu_us_per_task"] = round(cpu / ran * 1e6, 1)
            out["rss_mb"] = _status_mb("VmRSS")
            out["peak_rss_mb"] = _status_mb("VmHWM")
            out["tasks_done"] = counter.done
            out["tasks_erred"] = counter.erred
            out["busy_fraction"] = round(counter.task_seconds / (cores * elapsed), 4)
            if out["result_ok"]:  # a jammed loop would keep us waiting for this figure
                loop = client.run_on_scheduler(time.thread_time) - loop0
                out["loop_cpu_us_per_task"] = round(loop / ran * 1e6, 1)
    except Exception as exc:  # a failure is an outcome to report
        if isinstance(exc, TimeoutError):
            out["error"] = (
                f"timeout after {time.monotonic() - start:.1f} s "
                f"({counter.done} of {workload.tasks} tasks done)"
            )
        else:
            out["error"] = _short(exc)
    finally:
        set_sleep(False)  # wakes the tasks still asleep: the workers can close at once
        limit = left()
        log.info("run over after %.1f s (%s); tearing down", time.monotonic() - start, out["error"])
        out["teardown_s"], abandoned = _teardown(client, cluster, limit)
        if abandoned:
            out["error"] = (out["error"] or "") + f"; teardown unfinished after {limit:.1f} s"
    return out


def _teardown(
    client: Client | None, cluster: LocalCluster | None, limit: float
) -> tuple[float, bool]:
    """Close the client and the cluster in a thread; give up after ``limit`` s (True if so)."""

    def close() -> None:
        for thing in (client, cluster):
            if thing is not None:
                try:
                    thing.close(timeout=limit)
                except Exception:  # a failing close leaves nothing to do
                    pass

    t0 = time.monotonic()
    closer = threading.Thread(target=close, name="swarm-teardown", daemon=True)
    closer.start()
    closer.join(limit)
    return round(time.monotonic() - t0, 3), closer.is_alive()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=NAMES, default="dv3-large")
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--task-seconds", type=float, default=None)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every duration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="for the whole run, s")
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--tuned", action="store_true", help="profiler off, ticks every 1 s")
    parser.add_argument("--smoke", action="store_true", help="tiny: 200 tasks, 4 workers x 2")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workload, args.tasks, args.scale = "dv3-large", 200, 0.01
        args.workers, args.threads, args.timeout = 4, 2, 60.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    warnings.filterwarnings("ignore", module="distributed")  # large-graph and GC chatter
    # past its own timeout the run is stuck where no timeout reaches: say where, and exit
    faulthandler.dump_traceback_later(args.timeout + 30, exit=True)
    # what a user with hundreds of workers in one process would do first
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workload = build(args.workload, args.tasks, args.task_seconds, args.seed, args.scale)
    out = run_distributed(workload, args.workers, args.threads, args.timeout, args.tuned)
    out["scale"] = args.scale
    text = json.dumps(out, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(
        f"{out['workload']} on {out['workers']} x {out['threads']} (distributed"
        f"{', tuned' if args.tuned else ''}): "
        f"{out['tasks_done']}/{out['tasks']} tasks, makespan {out['makespan_s']} s, "
        f"ideal {out['ideal_s']} s, busy {out['busy_fraction']}, "
        f"{out['scheduler_cpu_us_per_task']} us CPU/task, result ok {out['result_ok']}, "
        f"error {out['error']}"
    )
    print("RESULT " + json.dumps(out))
    sys.stdout.flush()
    if out["error"] and "teardown unfinished" in out["error"]:
        os._exit(0 if out["result_ok"] else 2)  # threads of the abandoned cluster stay behind
    return 0 if out["result_ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
