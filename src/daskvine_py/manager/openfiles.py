"""How many workers the manager's open files allow (``RLIMIT_NOFILE``), and what it says
past that.

Each worker's connection holds one file descriptor in the manager (its TCP socket, in
libzmq's I/O thread). Login nodes often set a soft limit of 1,024, so the manager raises
its soft limit to the hard one at start (``limits.raise_open_files``; the worker does the
same), then keeps ``RESERVE`` descriptors for its own files (reports, pipes to processes
it starts, connections accepted but not registered yet) and refuses registrations beyond
the rest with a ``Rejected`` naming the limit and how to raise it. Running out for real
would show as a bare "Too many open files" somewhere, or as libzmq retrying ``accept``
for good while workers wait.
"""

from __future__ import annotations

from daskvine_py.wire.limits import open_count, raise_open_files

#: Descriptors kept for the manager's own files, beyond those open when it starts.
RESERVE = 64
#: Descriptors one registered worker costs the manager (measured: its TCP connection).
FDS_PER_WORKER = 1


class OpenFiles:
    """The workers this process's open files allow, measured once, when it starts
    (``capacity``: None when there is no limit to speak of)."""

    __slots__ = ("limit", "hard", "capacity")

    def __init__(self) -> None:
        self.limit, self.hard = raise_open_files()
        self.capacity: int | None = None
        if self.limit is not None:
            spare = self.limit - open_count() - RESERVE
            self.capacity = max(0, spare // FDS_PER_WORKER)

    def full(self, registered: int) -> bool:
        return self.capacity is not None and registered >= self.capacity

    def reason(self) -> str:
        """Why a worker is refused, and what to do about it."""
        hard = "unlimited" if self.hard is None else self.hard
        return (
            f"the manager cannot take more workers: its limit of open files (RLIMIT_NOFILE "
            f"{self.limit}, hard limit {hard}) allows {self.capacity} workers, one file "
            f"each, beside {RESERVE} kept for its own. Raise it in the shell that starts "
            "the manager (ulimit -n N, up to the hard limit, which an administrator sets), "
            "or connect fewer workers"
        )
