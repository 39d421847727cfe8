"""A library process's entry point (``multiprocessing``'s target): it sees the GPUs its
worker gave it, its thread pools fit its tasks' cores (``threads``), then it serves its
worker (``library.main``)."""

from __future__ import annotations

import os
from typing import Any

from daskvine_py.worker import library, threads
from daskvine_py.worker.gpus import VISIBLE


def main(cores: int, *args: Any) -> None:
    """A library process (``library.main`` with ``args``) whose pools fit ``cores``."""
    threads.start(cores)
    library.main(*args)


def main_seeing(visible: str, cores: int, *args: Any) -> None:
    """``main`` in a process that sees only the devices ``visible`` names (set before
    anything can initialize CUDA)."""
    os.environ[VISIBLE] = visible
    main(cores, *args)
