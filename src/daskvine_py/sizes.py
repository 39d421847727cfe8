"""Sizes for people to read: what the report, the dashboard and the terminal's status
view print, so that the three agree (a layer below all of them)."""

from __future__ import annotations


def byte_size(value: float) -> str:
    """``1234567`` -> "1.2 MB": powers of 1,000, whole bytes below one kB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value} TB"


def peak_memory(mib: float) -> str:
    """A task's peak memory as ``peak_memory_mb`` holds it (MiB, its own growth above
    its process's size as it began) -> "12.5 MiB"; "< 1 MiB" below one, 0 included.

    A small task grows its process by a few pages or by none (the pages were resident
    already), so most tasks measure under 1 MiB, many 0: "0.0" would read as not
    measured, or as a task that took no memory at all."""
    if mib < 1:
        return "< 1 MiB"
    return f"{mib:,.0f} MiB" if mib >= 100 else f"{mib:.1f} MiB"
