"""A library process's entry point (``multiprocessing``'s target): its thread pools fit
its tasks' cores (``threads``), then it serves its worker (``library.main``)."""

from __future__ import annotations

from typing import Any

from daskvine_py.worker import library, threads


def main(cores: int, *args: Any) -> None:
    """A library process (``library.main`` with ``args``) whose pools fit ``cores``."""
    threads.start(cores)
    library.main(*args)
