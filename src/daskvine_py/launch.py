"""Starting worker processes on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


def spawn(
    address: str,
    cores: int = 1,
    name: str | None = None,
    extra_args: Sequence[str] = (),
    **popen_options: Any,
) -> subprocess.Popen:
    """Start ``python -m daskvine_py.worker`` as a child process that sees our ``sys.path``.

    Functions that cloudpickle sends by reference (defined in the caller's own modules)
    then import on the worker, as they would under multiprocessing's spawn.
    """
    env = dict(os.environ)
    paths = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    args = [sys.executable, "-m", "daskvine_py.worker", address, "--cores", str(cores)]
    if name:
        args += ["--name", name]
    return subprocess.Popen(
        [*args, *extra_args], env=env, stdin=subprocess.DEVNULL, **popen_options
    )
