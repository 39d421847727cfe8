"""A dashboard page left open, as a process of its own: what a browser's tab asks.

    python benchmarks/page_poller.py LINK [--pages status,stream] [--interval 1.0]

``LINK`` is ``Manager.dashboard_link``; ``--smoke`` polls a manager of its own twice.
Every ``--interval`` seconds it asks for each page's content (``<page>?fragment=1``,
what the page's script fetches to redraw), with the token, until SIGTERM or SIGINT; then
it prints one line, ``polled N pages, E errors``, and how long the answers took. By
default the two heaviest pages (the status page and the task stream), where a browser
shows one.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("link", nargs="?")
    parser.add_argument("--pages", default="status,stream")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="poll a manager of this process's own for two rounds (no link given)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        return _smoke(args.pages)
    if args.link is None:
        parser.error("the dashboard's link is needed")
    return _poll(args.link, args.pages, args.interval, None)


def _smoke(pages: str) -> int:
    from daskvine_py import Manager

    with Manager() as manager:
        assert manager.dashboard_link is not None
        return _poll(manager.dashboard_link, pages, 0.1, rounds=2)


def _poll(link: str, pages: str, interval: float, rounds: int | None) -> int:
    """Ask for the pages every ``interval`` s, ``rounds`` times (None: until a signal)."""
    parts = urllib.parse.urlsplit(link)
    token = urllib.parse.parse_qs(parts.query)["token"][0]
    base = f"{parts.scheme}://{parts.netloc}"
    urls = [f"{base}/{page}?fragment=1&token={token}" for page in pages.split(",")]
    stop = False

    def halt(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, halt)
    signal.signal(signal.SIGINT, halt)
    polled = errors = 0
    waits: list[float] = []
    while not stop and (rounds is None or polled + errors < rounds * len(urls)):
        due = time.monotonic() + interval
        for url in urls:
            asked = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=30) as reply:
                    reply.read()
                polled += 1
                waits.append(time.monotonic() - asked)
            except (urllib.error.URLError, OSError):
                errors += 1
        while not stop and time.monotonic() < due:
            time.sleep(min(0.05, max(0.0, due - time.monotonic())))
    waited = ""
    if waits:
        median, longest = statistics.median(waits), max(waits)
        waited = f", answered in {median:.3f} s (median), {longest:.3f} s (max)"
    print(f"polled {polled} pages, {errors} errors{waited}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
