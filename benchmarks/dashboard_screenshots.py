"""Screenshots of the live dashboard's pages for docs/live.md, taken by headless Chromium
while a run goes on.

    python benchmarks/dashboard_screenshots.py [--out docs/images] [--workers 3] [--smoke]

A manager with local workers of one core runs a graph that fails (a separate ``get``, so
that the failures page lists it with its traceback), then a graph of a few categories of
small tasks that move arrays between workers; while that one runs, each page
(``live.pages.PAGES``) is drawn into ``OUT/dashboard-<page>.png``. The result is
checked against dask's synchronous scheduler. A status page stays open (its fragment
fetched every second) from the start, as a user's tab would: the pages keep the past only
from the first request on. The task stream's bars come from the
workers' heartbeats (``Status.activity``): a worker that sends none leaves it empty.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import dask
import numpy as np

from daskvine_py import Manager
from daskvine_py.live.pages import PAGES

#: Seconds the graph's tasks sleep (a load twice this): what makes the run last; none
#: when dask's own scheduler checks the result here.
PAUSE = 0.01


def load(i: int) -> np.ndarray:
    time.sleep(2 * PAUSE)
    return np.random.default_rng(i).random(40_000)


def clean(a: np.ndarray) -> np.ndarray:
    time.sleep(PAUSE)
    return a[a > 0.1]


def histogram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(PAUSE)
    return np.histogram(np.concatenate([a, b]), bins=32, range=(0.0, 1.0))[0]


def merge(*parts: np.ndarray) -> np.ndarray:
    return np.sum(parts, axis=0)


def _check(constant: float) -> float:
    if not 0.0 < constant < 1.0:
        raise ValueError(f"calibration constant {constant} is out of range")
    return constant


def calibrate(constant: float) -> float:
    return _check(constant)


def graph(n: int) -> tuple[dict[Any, Any], Any]:
    """``n`` arrays loaded, cleaned, histogrammed with their neighbour's (a move between
    workers as often as not), and merged by eights."""
    dsk: dict[Any, Any] = {}
    for i in range(n):
        dsk[("load", i)] = (load, i)
        dsk[("clean", i)] = (clean, ("load", i))
    for i in range(n):
        dsk[("histogram", i)] = (histogram, ("clean", i), ("clean", (i + 1) % n))
    level = [("histogram", i) for i in range(n)]
    depth = 0
    while len(level) > 1:
        depth += 1
        groups = [level[j : j + 8] for j in range(0, len(level), 8)]
        level = [("merge", depth, j) for j in range(len(groups))]
        for key, group in zip(level, groups, strict=True):
            dsk[key] = (merge, *group)
    return dsk, level[0]


def _keep_open(link: str, stop: threading.Event) -> None:
    """What an open status page asks for, every second until ``stop``."""
    fragment = link.replace("/status?", "/status?fragment=1&")
    while not stop.wait(1.0):
        with urllib.request.urlopen(fragment, timeout=30) as response:
            response.read()


def screenshot(chromium: str, url: str, path: Path, profile: Path) -> None:
    """``url`` drawn into ``path`` after two seconds of its script's redraws."""
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--window-size=1100,1400",
            "--virtual-time-budget=2500",
            f"--screenshot={path}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 or not path.exists() or path.read_bytes()[:4] != b"\x89PNG":
        raise RuntimeError(f"chromium failed on {url}: {done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--arrays", type=int, default=1500, help="arrays in the graph")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--smoke", action="store_true", help="a small graph")
    args = parser.parse_args(argv)
    if args.smoke:
        args.arrays, args.workers = 100, 2
    if not Path(args.chromium).exists():
        if not args.smoke:
            parser.error(f"no Chromium at {args.chromium}")
        print(f"no Chromium at {args.chromium}: no screenshots")
        args.chromium = None
    args.out.mkdir(parents=True, exist_ok=True)
    dsk, key = graph(args.arrays)

    with Manager() as manager, tempfile.TemporaryDirectory() as scratch:
        manager.start_workers(args.workers, cores=1)
        link = manager.dashboard_link
        assert link is not None, "this manager has no dashboard"
        print(link, flush=True)
        stop = threading.Event()
        tab = threading.Thread(target=_keep_open, args=(link, stop), daemon=True)
        tab.start()  # a page open since the start: the charts have a past to draw
        try:
            manager.get({"constant": 1.5, "calibrated": (calibrate, "constant")}, "calibrated")
        except ValueError as exc:
            print("the failed run:", exc, flush=True)

        got: list[Any] = []
        run = threading.Thread(target=lambda: got.append(manager.get(dsk, key)))
        run.start()
        while run.is_alive() and manager.live()["totals"]["tasks_done"] < len(dsk) // 4:
            time.sleep(0.2)
        for name, _ in PAGES if args.chromium else ():
            path = args.out / f"dashboard-{name}.png"
            screenshot(
                args.chromium,
                link.replace("/status?", f"/{name}?"),
                path,
                Path(scratch) / "profile",
            )
            live = manager.live()["totals"]
            print(
                f"{path}: {path.stat().st_size / 1e3:.0f} kB ({live['tasks_done']:,} tasks done)",
                flush=True,
            )
        if not run.is_alive():
            print(
                "warning: the run ended before the last screenshot; try more --arrays",
                file=sys.stderr,
            )
        run.join()
        stop.set()
        tab.join()
    global PAUSE
    PAUSE = 0.0  # (here only: the workers' copies of the functions keep theirs)
    assert np.array_equal(got[0], dask.get(dsk, key)), "the result differs from dask's"
    print("result equals dask's synchronous scheduler: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
