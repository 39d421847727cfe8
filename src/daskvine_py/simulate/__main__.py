"""``python -m daskvine_py.simulate --seeds N``: run seeds, print what broke, exit 1 if any.

Prints the seeds run, the steps taken and every invariant broken (with its seed, step and
simulated time); ``--json OUT`` writes ``seeds``, ``steps`` and ``violations`` (a list)
there. A seed replays exactly: ``--seeds 1 --first-seed S`` shows seed S again.

Sets of strings and of records iterate in an order that depends on Python's hash seed,
and the state machines iterate some: the command runs itself again under
``PYTHONHASHSEED=0`` when started with another, so that a seed means the same run in
every process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from daskvine_py.simulate.simulation import Config, Simulation

#: The hash seed every simulation runs under (see the module docstring).
HASH_SEED = "0"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m daskvine_py.simulate",
        description="Deterministic simulation of the scheduler's and workers' state machines.",
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument("--workers", type=int, default=4, help="workers at the start")
    parser.add_argument("--tasks", type=int, default=40, help="tasks per run, at most")
    parser.add_argument(
        "--liar",
        type=float,
        default=0.0,
        help="probability that a seed's second worker answers every task wrong",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=None,
        metavar="S",
        help="typical one-way network delay in seconds (default 0.003); stalls, 1 in 100 "
        "messages, last 5 to 50 times as long, at most 10 s (a third of the time a silent "
        "worker is given: longer is a lost worker, rightly): a loaded manager or swarm",
    )
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    return parser.parse_args(argv)


def run(seeds: range, config: Config, echo: bool = True) -> dict[str, Any]:
    """Run ``seeds``; their steps and violations (as dicts)."""
    steps = 0
    violations = []
    for seed in seeds:
        outcome = Simulation(seed, config).run()
        steps += outcome.steps
        for violation in outcome.violations:
            violations.append(violation.as_dict())
            if echo:
                print(violation, flush=True)
    return {"seeds": len(seeds), "steps": steps, "violations": violations}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        command = sys.argv[1:] if argv is None else list(argv)
        os.execv(sys.executable, [sys.executable, "-m", "daskvine_py.simulate", *command])
    # The components log what they judge (a false claim, a quarantine) at WARNING: the
    # violations say it once, with their seed; the rest is noise here.
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(message)s")
    config = Config(workers=args.workers, tasks=args.tasks, liar=args.liar)
    if args.delay is not None:
        config.delay = (min(0.0001, args.delay), args.delay)
        config.stall = (min(5 * args.delay, 10.0), min(50 * args.delay, 10.0))
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()
    result = run(seeds, config, echo=not args.quiet)
    seconds = time.perf_counter() - started
    broken = len({v["seed"] for v in result["violations"]})
    print(
        f"{result['seeds']} seeds, {result['steps']} steps in {seconds:.1f} s; "
        f"{len(result['violations'])} violations in {broken} seeds"
    )
    if args.json is not None:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
