"""Benchmarks cannot rot: every script in ``benchmarks/`` runs with ``--smoke`` and exits 0.

Each smoke run is tiny (seconds, numbers meaningless) but still checks its results against
Dask's synchronous scheduler where it computes any, and exits non-zero on a wrong result or
an exception. Each runs as a subprocess in a session of its own, with this checkout's
``src`` first on ``PYTHONPATH``; whatever it leaves running is killed with its session.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
#: Seconds one smoke run may take (a few, on an idle machine).
TIMEOUT = 120

#: (id, script, its arguments, a pattern its stdout must match, modules it needs).
#: ``{root}`` in an argument is this checkout.
SMOKES = [
    (
        "harness",
        "harness.py",
        ["--smoke"],
        r"workload\s+tasks\s+system\s+median s.*\n-+\n(.*\n)*biggraph .*daskvine_py"
        r"(.*\n)*wide .*daskvine_py(.*\n)*matching \(ReadyQueue\)",
        (),
    ),
    # every variant of daskvine_py systems.py knows, and the peer, on one workload
    (
        "harness-variants",
        "harness.py",
        [
            "--smoke",
            "--only",
            "chain",
            "--systems",
            "distributed",
            "--prefetch",
            "1",
            "--progress",
            "--event-log",
            "--insecure",
            "--cache",
            "--verify",
            "0.5",
        ],
        r"[\s\S]*".join(
            rf"{re.escape(name)}\s+\d+\.\d+"
            for name in (
                "daskvine_py[verify=0.5]",
                "daskvine_py[cache]",
                "daskvine_py[insecure]",
                "daskvine_py[progress]",
                "daskvine_py[event-log]",
                "daskvine_py[prefetch=1]",
                "distributed",
            )
        ),
        ("distributed",),
    ),
    (
        "bench_state",
        "bench_state.py",
        ["--smoke"],
        r"2,000 tasks on 20 x 12, batches of 64: \d+\.\d+ us of CPU per task",
        (),
    ),
    (
        "bench_measure",
        "bench_measure.py",
        ["--smoke"],
        r"ratio\n(.*\n)*tree10k\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+",
        (),
    ),
    (
        "bench_dashboard",
        "bench_dashboard.py",
        ["--smoke"],
        r"noop \(300 tasks\)\s+closed( +[\d.]+){4}\n\s+open( +[\d.]+){4}\n"
        r"\s+ratio( +([\d.]+|nan)){3}"  # (nan: no CPU tick in so short a run)
        r"(.*\n)*results right",
        (),
    ),
    (
        "dashboard_screenshots",
        "dashboard_screenshots.py",
        ["--smoke"],
        r"(dashboard-failures.png: \d+ kB|no screenshots)(.*\n)*result equals dask's synchronous"
        r" scheduler: yes",
        (),
    ),
    (
        "bench_resources",
        "bench_resources.py",
        ["--smoke"],
        r"mode max: [\d.]+ s, result right\n(.*\n)*mode fixed: [\d.]+ s, result right"
        r"(.*\n)*a task larger than a worker: ResourceExhausted: .*whale",
        (),
    ),
    (
        "bench_peer_flood",
        "bench_peer_flood.py",
        ["--smoke"],
        r"answers per request of 10000 ids: \[4096\]\n(.*\n)*worker RSS MB before",
        (),
    ),
    (
        "interleave",
        "interleave.py",
        ["{root}", "{root}", "--smoke"],
        r"after/before\n(.*\n)*chain\s+daskvine_py\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+",
        (),
    ),
    (
        "biggraph",
        "biggraph.py",
        ["--smoke"],
        r'RESULT \{"system": "daskvine_py", "runs": \[\{"seconds": [\d.]+, '
        r'"first_dispatch_s": [\d.]+',
        (),
    ),
    ("bench_cache", "bench_cache.py", ["--smoke"], r"rerun, last stage changed\s+\d", ()),
    (
        "bench_cache-coffea",
        "bench_cache.py",
        ["coffea", "--smoke"],
        r"^coffea: (.*\n)*rerun, last stage changed\s+\d",
        ("coffea",),
    ),
    ("bench_cache_keys", "bench_cache_keys.py", ["--smoke"], r"\ndataframe\s+\d+\s+\d", ()),
    (
        "bench_cache_overhead",
        "bench_cache_overhead.py",
        ["--smoke"],
        r"on/off\n(.*\n)*dataframe\s+\d",
        (),
    ),
    (
        "bench_coffea_dask",
        "bench_coffea_dask.py",
        ["--smoke"],
        r"\ndaskvine_py\s+\d+\.\d+(.*\n)*distributed\s+\d",
        ("coffea", "distributed"),
    ),
    (
        "bench_inputs-coffea",
        "bench_inputs.py",
        ["--smoke"],
        r"root://, cache: second\s+\d+\s+[\d.]+\s+0\s+0\.00\s+[\d.]+",
        ("coffea", "XRootD", "fsspec_xrootd"),
    ),
    (
        "bench_flood",
        "bench_flood.py",
        ["--smoke"],
        r"\nwrong-key .*wrong results 0  attacker answered 0",
        (),
    ),
    (
        "bench_library_pipe",
        "bench_library_pipe.py",
        ["--smoke"],
        r"median round trip [\d.]+ us \(Done\)",
        (),
    ),
    (
        "bench_library_transfer",
        "bench_library_transfer.py",
        ["--smoke"],
        r"\n\s+0\.1MB\s+shm-mapped\s+\d",
        (),
    ),
    (
        "bench_latency",
        "bench_latency.py",
        ["--smoke"],
        r"\nget\s+[\d.]+ ms\s+[\d.]+ ms\s+[\d.]+x\ncompute\s+[\d.]+ ms(.*\n)*"
        r"\s+manager's I/O thread\s+[\d.]+(.*\n)*\s+all of them\s+[\d.]+",
        (),
    ),
    (
        "bench_million",
        "bench_million.py",
        ["--smoke", "--systems", "daskvine_py,sync"],
        r"\ndaskvine_py\s+1,000\s+1,144\s+[\d.]+\s+[\d.]+(.*\n)*sync\s+1,000",
        (),
    ),
    (
        # the simulation of issue 40: the script exits 1 unless, at each disk bound, the
        # second run with locality reads strictly less from storage than without, every
        # file is read from storage in the first run, a node with no disk bound reads
        # each file from storage once, and the same seed gives the same numbers
        "bench_input_locality",
        "bench_input_locality.py",
        ["--smoke"],
        r"\nlocality on, unbounded disk\s+2\s+[\d.]+(.*\n)*locality off, 5 GB disk\s+2\s+"
        r"(.*\n)*the same seed again \(locality on, unbounded disk\): the same numbers"
        r"(.*\n)*checks: passed",
        (),
    ),
    ("bench_matching", "bench_matching.py", ["--smoke"], r"1,000 random\s+heapq\s+\d", ()),
    (
        "bench_modes",
        "bench_modes.py",
        ["--smoke"],
        r"numpy\s+function-calls/fork\s+numpy,pandas\s+\d(.*\n)*\nclosure over 1 MB",
        (),
    ),
    ("bench_rewrite", "bench_rewrite.py", ["--smoke"], r"\n\s+4\s+\d+\s+\d+\.\d+", ()),
    ("bench_security", "bench_security.py", ["--smoke"], r"\nnoop-dict\s+on [\d.]+ s", ()),
    (
        "bench_software",
        "bench_software.py",
        ["--smoke"],
        r"4 workers, archive 2 MiB: the manager's host sent [\d.]+x the archive .* errors 0",
        (),
    ),
    (
        "bench_wire",
        "bench_wire.py",
        ["--smoke"],
        r"\nmsgpack\s+[\d.]+\s+[\d.]+\s+[\d.]+\npickle\s+[\d.]+(.*\n)*msgpack/pickle\s+\d"
        r"(.*\n)*per record type(.*\n)*Execute\s+pickle\s+[\d.]+"
        r"(.*\n)*typical batch\s+msgpack\s+\d",
        (),
    ),
    (
        "swarm",
        "swarm.py",
        ["--smoke", "--workload", "dv3-large", "--preempt", "0.5"],
        r'"result_ok": true.*"preempted": [1-9]',
        (),
    ),
    (
        # the same at another timing: replies sooner, in random orders (issue 38); the
        # script exits 1 on any ejection of its honest workers or call without its inputs
        "swarm-fast",
        "swarm.py",
        ["--smoke", "--workload", "dv3-large", "--preempt", "0.5", "--speedup", "4"]
        + ["--jitter", "0.002"],
        r'"result_ok": true.*"ejected": \[\], "missing_inputs": 0',
        (),
    ),
    (
        "swarm-faulty",
        "swarm.py",
        ["--smoke", "--workload", "dv3-large", "--black-holes", "0.25", "--stragglers", "0.25"],
        r'"result_ok": true.*"black_holes": \["sim-\d+"\].*"quarantined": \[[^]]*"sim-',
        (),
    ),
    (
        "page_poller",
        "page_poller.py",
        ["--smoke"],
        r"polled 4 pages, 0 errors, answered in [\d.]+ s \(median\), [\d.]+ s \(max\)",
        (),
    ),
    (
        "swarm-dashboard",
        "swarm.py",
        ["--smoke", "--workload", "flat", "--dashboard"],
        r'"result_ok": true.*"dashboard": "polled [1-9]\d* pages, 0 errors, answered',
        (),
    ),
    (
        "swarm-both",
        "swarm.py",
        ["--smoke", "--workload", "flat", "--system", "both"],
        r"makespan: daskvine_py [\d.]+ s, distributed [\d.]+ s",
        ("distributed",),
    ),
    (
        "swarm_distributed",
        "swarm_distributed.py",
        ["--smoke"],
        r'RESULT \{"system": "distributed", "workload": "dv3-large".*"result_ok": true',
        ("distributed",),
    ),
    (
        "churn",
        "churn.py",
        ["--smoke"],
        r"\nchurn\s+makespan\s+[\d.]+ s\s+kills\s+1\s+.*result right\n"
        r"result equals dask's synchronous scheduler: yes",
        (),
    ),
    (
        "bench_shuffle",
        "bench_shuffle.py",
        ["--smoke"],
        r"\nset_index\s+daskvine_py\s+\d(.*\n)*set_index\s+distributed\s+\d",
        ("distributed",),
    ),
]


def runnable_scripts() -> set[str]:
    """The scripts in benchmarks/ meant to be run (the others are modules they import)."""
    return {
        path.name
        for path in BENCHMARKS.glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }


def test_every_runnable_script_has_a_smoke_run():
    assert {script for _, script, *_ in SMOKES} == runnable_scripts()


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize(
    "script, args, expected, needs", [s[1:] for s in SMOKES], ids=[s[0] for s in SMOKES]
)
def test_smoke(script, args, expected, needs, tmp_path):
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} --smoke needs {module}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("DASK_SCHEDULER", None)
    command = [sys.executable, str(BENCHMARKS / script)]
    command += [arg.format(root=ROOT) for arg in args]
    # A session of its own: the workers, libraries and clusters it starts are killed with it.
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,  # anything it writes stays in the test's directory
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{script} --smoke ran longer than {TIMEOUT} s\n{stdout}\n{stderr[-3000:]}")
    finally:
        _kill_session(proc)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{stdout}\n{stderr[-3000:]}"
    assert re.search(expected, stdout), f"{script} printed no {expected!r}:\n{stdout}"


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill whatever is left of ``proc``'s session (it leads its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing of it is left
