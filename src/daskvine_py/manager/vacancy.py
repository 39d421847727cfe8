"""Runs that wait with no worker: when the manager warns, when it gives up, and what it says.

Bookkeeping for the I/O loop (no I/O), driven by ``now`` on its timer, never per task:
the loop tells it of handshakes the ROUTER refused for keys (``refused``, from
``handshakes``), and while runs wait with no worker registered asks it what to do
(``check``): fail them with ``NoWorkersLeft`` when every local worker has ended and none
other is connected, else warn once per such stretch, after ``NO_WORKER_GRACE`` seconds,
saying how to add workers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import zmq

from daskvine_py.errors import NoWorkersLeft
from daskvine_py.manager.launch import how_they_ended

#: Seconds runs may wait with no worker registered before the manager warns. Shorter
#: tells sooner of a forgotten ``start_workers``; longer stays quiet while workers start
#: (a local one takes a second or two on a loaded machine) or one replaces another.
NO_WORKER_GRACE = 5.0


class Vacancy:
    """Whether runs wait with no worker, since when, and what the manager has said."""

    __slots__ = ("grace", "since", "warned", "refused_wrong_keys", "refused_no_keys")

    def __init__(self) -> None:
        #: seconds of waiting before the warning (read when made, so tests may shorten it)
        self.grace = NO_WORKER_GRACE
        #: since when runs have waited with no worker registered (None: they have not)
        self.since: float | None = None
        #: whether this stretch was warned of: once per stretch
        self.warned = False
        #: handshakes refused since the start: with wrong keys, and without keys
        self.refused_wrong_keys = 0
        self.refused_no_keys = 0

    def refused(self, event: int, value: int) -> None:
        """A failed handshake from the ROUTER's monitor; other failures (garbage, a cut
        connection) are the drop log's business, not a worker's."""
        wrong_keys = value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or wrong_keys:
            self.refused_wrong_keys += 1
        elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            self.refused_no_keys += 1

    def clear(self) -> None:
        """A worker is registered, or no run waits: the stretch ends."""
        self.since, self.warned = None, False

    def check(
        self,
        now: float,
        runs: list[int],
        local: Sequence[subprocess.Popen[bytes]],
        exited: int,
        pool_sizing: bool,
        last_lost: tuple[str, str] | None,
        connection_file: str | None,
    ) -> tuple[str | None, list[tuple[int, NoWorkersLeft]]]:
        """``runs`` wait and no worker is registered: the runs to fail, if every one of the
        ``local`` workers has ended (``exited`` of them; none could come back), else the
        warning to log (None: not yet, or said already).

        A pool sizing workers to the work may still bring some, so its runs wait on, warned.
        """
        if local and exited == len(local) and not pool_sizing:
            ended = how_they_ended(local)
            return None, [
                (run_id, NoWorkersLeft(self.failure(run_id, ended, connection_file)))
                for run_id in runs
            ]
        return self.warning(now, runs, last_lost, pool_sizing, connection_file), []

    def warning(
        self,
        now: float,
        runs: list[int],
        last_lost: tuple[str, str] | None,
        pool_sizing: bool,
        connection_file: str | None,
    ) -> str | None:
        """The warning to log now for ``runs`` waiting with no worker, or None (not yet,
        or said already)."""
        if self.since is None:
            self.since = now
        if self.warned or now - self.since < self.grace:
            return None
        self.warned = True
        notes = []
        wrong, keyless = self.refused_wrong_keys, self.refused_no_keys
        if wrong or keyless:
            said = []
            if wrong:
                said.append(
                    f"{_count(wrong, 'handshake')} with wrong keys (another "
                    "manager's connection file, or an old one)"
                )
            if keyless:
                said.append(f"{_count(keyless, 'handshake')} without keys (no connection file)")
            notes.append(
                f"this manager refused {' and '.join(said)}: give those workers this "
                "manager's connection file"
            )
        if last_lost is not None:
            name, reason = last_lost
            notes.append(f"the last worker, {name}, was lost: {reason}")
        if pool_sizing:
            notes.append("a worker pool is sizing workers to the work: its jobs may be queued")
        listed = ", ".join(map(str, runs))
        waiting = f"run {listed} has" if len(runs) == 1 else f"runs {listed} have"
        return (
            f"{waiting} waited {now - self.since:.0f} s with no worker connected; nothing "
            f"runs until one joins: {how_to_add_workers(connection_file)}"
            + "".join(f". Note: {note}" for note in notes)
        )

    def failure(self, run_id: int, ended: str, connection_file: str | None) -> str:
        """Why run ``run_id`` fails when every local worker has ended (``ended``: how)."""
        return (
            f"run {run_id} cannot go on: every worker this manager started has ended, and "
            f"no other is connected: {ended}. To go on, {how_to_add_workers(connection_file)}"
        )


def how_to_add_workers(connection_file: str | None) -> str:
    """What to do about a manager with no worker: the two ways to add some."""
    path = connection_file or "PATH (the manager's connection_file)"
    return (
        "start local workers with manager.start_workers(n), or workers anywhere that can "
        f"reach this manager with: python -m daskvine_py.worker --connection-file {path}"
    )


def _count(n: int, word: str) -> str:
    """``1 handshake``, ``2 handshakes``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
