"""A library process's entry point (``multiprocessing``'s target): it sees the GPUs its
worker gave it, its thread pools fit its tasks' cores (``threads``), then it serves its
worker (``library.main``).

Run as ``python -m daskvine_py.worker.library_process PIPE_FD TABLE_FD CORES NAME DIR
SLOTS`` it is a library of shipped software: started by the worker with that software's
interpreter (``host.start_library_with``), its pipe and slot table inherited as
descriptors."""

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


def main_from_command_line(argv: list[str]) -> None:
    """A library started as a command (see the module docstring)."""
    import ctypes
    import mmap
    from multiprocessing.connection import Connection

    pipe_fd, table_fd, cores, name, tasks_dir, slots = argv
    conn = Connection(int(pipe_fd))
    size = 2 * int(slots) * ctypes.sizeof(ctypes.c_longlong)
    table = mmap.mmap(int(table_fd), size)
    os.close(int(table_fd))
    running = (ctypes.c_longlong * (2 * int(slots))).from_buffer(table)
    main(int(cores), conn, name, (), tasks_dir, int(slots), running)


if __name__ == "__main__":
    import sys

    main_from_command_line(sys.argv[1:])
