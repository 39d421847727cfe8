"""The big-graph workload of ``harness.py``, one system per process so its memory is its own.

    python benchmarks/biggraph.py --system daskvine_py [--tasks 200000] [--workers 2]
                                  [--repeat 1] [--smoke]

It starts the system, runs a small graph of the same shape (untimed), builds a raw dict of
about ``--tasks`` trivial tasks (see ``workloads.big_graph``), and for each repeat measures:

- ``seconds``: from calling ``get`` until it returned, the result checked;
- ``first_dispatch_s`` (daskvine_py only): from calling ``get`` until the manager sent the
  first task to a worker (``systems.FirstDispatch`` watches the manager's sends);
- ``peak_rss_mb``: this process's peak resident memory during ``get`` (``VmHWM``, reset
  before each run through ``/proc/self/clear_refs``). The manager, the distributed scheduler
  and the local schedulers all run in this process, their workers elsewhere;
- ``kb_per_task``: that peak minus the resident memory just before the first ``get`` (the
  user's graph is already built then), per task.

``harness.py`` runs it as a child and reads the line starting with ``RESULT``. It exits
non-zero when a run failed or computed a wrong result (the ``RESULT`` line says why).
``--smoke`` (a test that the script still runs, a few seconds, numbers meaningless):
about 2,000 tasks, once, on daskvine_py unless ``--system`` says otherwise; for daskvine_py
it also fails if the first-task probe saw no task leave.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from systems import FirstDispatch, start
from workloads import big_graph, big_graph_expected, count_tasks, same


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _terminate(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt  # the harness stops us with SIGTERM: clean up as on Ctrl-C


#: ``--smoke``: the tasks of the big graph
SMOKE_TASKS = 2_000


def run(system: str, tasks: int, workers: int, repeat: int, smoke: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"system": system, "runs": []}
    with start(system, workers) as running:
        out["startup_s"] = running.startup
        probe = FirstDispatch(running.manager) if running.manager is not None else None
        small, small_keys = big_graph(1_000)  # untimed: ships the functions, imports
        if not same(list(running.get(small, small_keys)), big_graph_expected(1_000)):
            raise AssertionError(f"{system} computed a wrong result for the small big graph")
        dsk, keys = big_graph(tasks)
        expected = big_graph_expected(tasks)
        out["tasks"] = count_tasks(dsk)
        baseline = None
        for i in range(repeat):
            running.settle()
            gc.collect()
            resettable = _reset_peak()
            before = _status_kb("VmRSS") or 0
            # Later runs start from what the allocator kept of earlier ones: count from
            # before the first.
            baseline = before if baseline is None else baseline
            if probe is not None:
                probe.reset()
            begun = time.perf_counter()
            got = running.get(dsk, keys)
            seconds = time.perf_counter() - begun
            peak = _status_kb("VmHWM") or 0
            if not same(list(got), expected):
                raise AssertionError(f"{system} computed a wrong result for the big graph")
            if smoke and probe is not None and probe.first is None:
                raise AssertionError("FirstDispatch saw no task sent: the probe is broken")
            result = {
                "seconds": seconds,
                "first_dispatch_s": None
                if probe is None or probe.first is None
                else probe.first - begun,
                "peak_rss_mb": peak / 1024,
                "rss_before_mb": before / 1024,
                "kb_per_task": (peak - baseline) / out["tasks"] if resettable else None,
            }
            out["runs"].append(result)
            first = result["first_dispatch_s"]
            print(
                f"{system} big graph run {i + 1}/{repeat}: {seconds:.2f} s, first task "
                f"{'-' if first is None else f'{first:.2f} s'}, peak {peak / 1024:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
            del got
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--system", default=None, help="e.g. daskvine_py, distributed, sync (smoke: daskvine_py)"
    )
    parser.add_argument("--tasks", type=int, default=None, help="200,000 (smoke: 2,000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny, once: does it still run?")
    args = parser.parse_args(argv)
    if args.system is None:
        if not args.smoke:
            parser.error("--system is required")
        args.system = "daskvine_py"
    if args.tasks is None:
        args.tasks = SMOKE_TASKS if args.smoke else 200_000
    signal.signal(signal.SIGTERM, _terminate)
    try:
        out = run(args.system, args.tasks, args.workers, args.repeat, smoke=args.smoke)
    except Exception as exc:
        out = {"system": args.system, "error": f"{type(exc).__name__}: {exc}"}
    print("RESULT " + json.dumps(out), flush=True)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
