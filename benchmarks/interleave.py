"""Two checkouts of daskvine_py, benchmarked alternately in the same minutes.

    python benchmarks/interleave.py BEFORE AFTER [--rounds 3] [--smoke] [harness options...]

``BEFORE`` and ``AFTER`` are directories holding a checkout (a ``git worktree`` of the
older commit, say, and this one). Each round runs this directory's ``harness.py`` once
against each checkout's ``src`` (on ``PYTHONPATH``, so the manager and its local workers
import that code), alternating which goes first, with the harness options given (e.g.
``--only chain,tree10k,noop-dict --systems daskvine_py --repeat 3``). A noisy host drifts
by more than a refactor should change anything; alternating lets both sides share the
drift. Prints, per workload and system, the median of each side's medians and the ratio
after/before (below 1: the new code is faster). It exits non-zero when a harness run
failed (a wrong result included) or nothing was measured.

``--smoke`` (a test that it still runs; BEFORE and AFTER may be the same checkout): one
round, the harness with ``--smoke`` and, unless harness options are given, only
``--only chain,noop-dict --systems daskvine_py``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: ``--smoke``: the harness options unless others are given
SMOKE_HARNESS = ["--only", "chain,noop-dict", "--systems", "daskvine_py"]


def run_side(checkout: Path, harness_args: list[str]) -> dict[tuple[str, str], float]:
    with tempfile.TemporaryDirectory(prefix="interleave-") as folder:
        out = os.path.join(folder, "run.json")
        env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
        subprocess.run(
            [sys.executable, str(HERE / "harness.py"), *harness_args, "--json", out],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with open(out) as file:
            data = json.load(file)
    medians = {}
    for result in data["results"]:
        if result.get("median_s") is not None:
            medians[(result["workload"], result["system"])] = result["median_s"]
    return medians


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    before, after, *rest = argv
    rounds = 3
    smoke = "--smoke" in rest
    if smoke:
        rest.remove("--smoke")
        rounds = 1
    if "--rounds" in rest:
        at = rest.index("--rounds")
        rounds = int(rest[at + 1])
        del rest[at : at + 2]
    if smoke:
        rest = ["--smoke", *(rest or SMOKE_HARNESS)]
    sides = {"before": Path(before).resolve(), "after": Path(after).resolve()}
    seen: dict[str, dict[tuple[str, str], list[float]]] = {
        "before": defaultdict(list),
        "after": defaultdict(list),
    }
    for round_ in range(rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for side in order:
            try:
                medians = run_side(sides[side], rest)
            except subprocess.CalledProcessError as exc:
                print(f"the harness failed on {side} ({sides[side]}): exit {exc.returncode}")
                return 1
            for pair, median in medians.items():
                seen[side][pair].append(median)
            print(f"round {round_ + 1}/{rounds}: {side} done", flush=True)
    if not seen["before"]:
        print("nothing was measured")
        return 1
    header = f"{'workload':<16} {'system':<24} {'before s':>10} {'after s':>10}"
    print(f"\n{header} {'after/before':>13}")
    for pair in sorted(seen["before"]):
        old = statistics.median(seen["before"][pair])
        new = statistics.median(seen["after"].get(pair, [float("nan")]))
        print(f"{pair[0]:<16} {pair[1]:<24} {old:>10.4f} {new:>10.4f} {new / old:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
