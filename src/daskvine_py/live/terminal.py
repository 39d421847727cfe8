"""``python -m daskvine_py status``: a running manager's live snapshot in a terminal.

It asks over the manager's own port with the keys of its connection file, as a factory's
``StatusClient`` does (so it works from a login node), and prints the workers, the tasks
by state, the runs in progress, each category's figures and the busiest workers; with
``--watch``, again every few seconds until Ctrl-C (docs/live.md).

Without ``--connection-file`` it asks the only manager of this user whose connection file
is in the default directory (``security.default_connection_dir``: where managers write
theirs) and may be running; when several may, it lists them and asks for one. A file
whose manager has exited (on this host) is refused at once, as a worker refuses it,
rather than waited on for ``--timeout`` seconds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from daskvine_py.batch.status import ManagerRefused, ManagerUnreachable, StatusClient
from daskvine_py.sizes import byte_size, peak_memory
from daskvine_py.wire import security

#: Workers shown, the busiest first (by tasks held).
BUSIEST = 10
#: Categories shown, the most tasks first.
CATEGORIES = 20
#: Clears a terminal and puts the cursor home (``--watch`` on a terminal).
_CLEAR = "\x1b[H\x1b[2J"
#: Exit statuses: the manager could not be asked (or none runs); several run and none
#: was named.
EXIT_FAILED = 1
EXIT_CHOOSE = 2


def status(
    connection_file: str | None,
    watch: float | None = None,
    timeout: float = 10.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the manager's snapshot once (``watch`` None) or every ``watch`` seconds until
    Ctrl-C; the exit status: 0, or ``EXIT_FAILED`` with a message on ``err`` when the
    manager cannot be asked (its file stale, no answer in ``timeout`` seconds, refused, an
    unusable connection file). ``connection_file`` None: the only manager that may be
    running in the default directory (``EXIT_CHOOSE``, listing them, if several may;
    ``EXIT_FAILED`` if none). ``out``, ``err``: ``sys.stdout``, ``sys.stderr`` as they are
    when it is called."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if connection_file is None:
        directory = security.default_connection_dir()
        running = running_managers(directory)
        if len(running) != 1:
            err.write(_not_one(directory, running))
            return EXIT_CHOOSE if running else EXIT_FAILED
        connection_file = running[0][0]
    try:
        client = StatusClient(connection_file, name="status", timeout=timeout)
    except security.StaleConnectionFile as exc:
        err.write(f"daskvine_py status: {exc}\n")
        return EXIT_FAILED
    except (OSError, ValueError, security.SecurityError) as exc:
        err.write(f"daskvine_py status: cannot use {connection_file}: {exc}\n")
        return EXIT_FAILED
    with client:
        try:
            while True:
                try:
                    snapshot = client.live()
                except (ManagerUnreachable, ManagerRefused) as exc:
                    err.write(f"daskvine_py status: {exc}\n")
                    return EXIT_FAILED
                text = render(snapshot, client.address)
                if watch is not None and out.isatty():
                    text = _CLEAR + text
                out.write(text + "\n")
                out.flush()
                if watch is None:
                    return 0
                sleep(watch)
        except KeyboardInterrupt:
            return 0


def running_managers(directory: str) -> list[tuple[str, security.Connection]]:
    """The connection files in ``directory`` whose manager may be running: all but the
    stale ones (one of another host, which shares the home directory, cannot be judged
    from here: only asking it would tell)."""
    return [(path, c) for path, c in security.connection_files(directory) if not c.manager_gone()]


def _not_one(directory: str, running: list[tuple[str, security.Connection]]) -> str:
    """What to say when no connection file, or several, could be the one meant."""
    if not running:
        return (
            f"daskvine_py status: no manager of this user is running: no connection file "
            f"of a running manager in {directory}. A manager whose file is elsewhere "
            "(Manager(connection_file=...)) needs --connection-file PATH\n"
        )
    lines = [
        f"daskvine_py status: {len(running)} managers may be running (connection files in "
        f"{directory}); name one with --connection-file PATH:"
    ]
    for path, connection in running:
        try:
            written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(path).st_mtime))
        except OSError:
            written = "?"
        where = f"host {connection.host or '?'}, process {connection.pid or '?'}"
        lines.append(f"  {path}  {connection.address}  ({where}, started {written})")
    return "\n".join(lines) + "\n"


def render(snapshot: dict[str, Any], address: str = "") -> str:
    """The snapshot as the lines of the view."""
    totals = snapshot["totals"]
    manager = snapshot["manager"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot["t"]))
    runs = snapshot["runs"]
    lines = [
        f"manager {address}  up {_seconds(manager['uptime_s'])}, "
        f"CPU {_seconds(manager['cpu_s'])}  ({when})",
        f"workers {totals['workers']}  cores {totals['cores']}  "
        f"tasks: waiting {totals['waiting']}  ready {totals['ready']}  "
        f"processing {totals['processing']} (running {totals['running']})  "
        f"done {totals['tasks_done']}  failed {totals['tasks_failed']}",
        f"moved {byte_size(totals['bytes_moved'])}  stored {byte_size(totals['stored_bytes'])}  "
        f"spilled {byte_size(totals['spilled_bytes'])}",
    ]
    if runs:
        lines.append("")
        lines.append("runs in progress:")
        now = snapshot["t"]
        for run in runs:
            lines.append(
                f"  run {run['id']}: {run['done']} of {run['tasks']} tasks done, "
                f"{run['failed']} failed, for {_seconds(max(0.0, now - run['started']))}"
            )
    categories = sorted(snapshot["categories"].items(), key=lambda item: -item[1]["tasks"])
    if categories:
        lines.append("")
        lines.append(
            f"{'category':<24} {'done':>8} {'failed':>7} {'wall s':>9} {'CPU s':>9} {'peak':>9}"
        )
        for name, c in categories[:CATEGORIES]:
            lines.append(
                f"{name[:24]:<24} {c['tasks']:>8} {c['failed']:>7} {c['wall_s']:>9.1f} "
                f"{c['cpu_s']:>9.1f} {_peak(c):>9}"
            )
        if len(categories) > CATEGORIES:
            lines.append(f"  ({len(categories) - CATEGORIES} more)")
    workers = sorted(snapshot["workers"], key=lambda w: (-w["tasks"], w["name"]))
    lines.append("")
    if not workers:
        lines.append("no workers connected")
        return "\n".join(lines)
    lines.append(f"busiest workers ({min(BUSIEST, len(workers))} of {len(workers)}):")
    lines.append(
        f"  {'name':<20} {'host':<16} {'cores':>5} {'tasks':>6} {'resident':>9} "
        f"{'stored':>9} {'spilled':>9} {'heard':>6}"
    )
    for w in workers[:BUSIEST]:
        note = f"  quarantined: {w['quarantined']}" if w["quarantined"] else ""
        lines.append(
            f"  {w['name'][:20]:<20} {w['hostname'][:16]:<16} {w['cores']:>5} {w['tasks']:>6} "
            f"{byte_size(w['resident']):>9} {byte_size(w['stored_bytes']):>9} "
            f"{byte_size(w['spilled_bytes']):>9} {w['last_heard_s']:>5.1f}s{note}"
        )
    return "\n".join(lines)


def _peak(category: dict[str, Any]) -> str:
    """Its largest task's own growth; blank where none of its tasks was measured (every
    one failed)."""
    if not (category["tasks"] or category.get("exhausted")):
        return ""
    return peak_memory(category["peak_memory_mb"])


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
