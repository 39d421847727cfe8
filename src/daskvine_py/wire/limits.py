"""The process's limit of open files, raised as far as it may go: the manager and the
worker both hold a file descriptor per connection, and login nodes often set a soft
limit of 1,024 under a much higher hard one."""

from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not on this platform: no limit is known, none is enforced
    resource = None  # type: ignore[assignment]


def raise_open_files() -> tuple[int | None, int | None]:
    """Raise the soft limit of open files to the hard one; the (soft, hard) limits now,
    None for unlimited or not known here."""
    if resource is None:
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # an unlimited hard limit beyond the kernel's
            pass
    infinity = resource.RLIM_INFINITY
    return (None if soft == infinity else soft), (None if hard == infinity else hard)


def open_count() -> int:
    """Descriptors open in this process now (0 when it cannot be told)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory))
        except OSError:
            continue
    return 0
