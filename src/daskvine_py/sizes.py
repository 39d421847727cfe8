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
