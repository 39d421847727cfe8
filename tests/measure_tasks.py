"""The functions ``test_measure`` runs as tasks, in a module that imports nothing heavy:
in ``task_mode="tasks"`` each task is a new interpreter that imports its function's
module."""

from __future__ import annotations

MB = 2**20
HUNGRY_MB = 200


def touched(megabytes: int) -> bytearray:
    """``megabytes`` resident: every page written (a fresh mapping is not resident)."""
    block = bytearray(megabytes * MB)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))
    return block


def hungry(i: int) -> int:
    block = touched(HUNGRY_MB)
    return i + block[4096]


def tiny(i: int) -> int:
    return i + 1


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def total(*parts: int) -> int:
    return sum(parts)
