"""Nodes that share no files with the caller, for the software tests.

A "node" here is a worker process in a mount namespace of its own (``unshare -m``) where
a tmpfs lies over each path the caller's environment and code live in: the caller's
venv, the repository (an editable install's source), the directory of the user's
modules. It runs from a small install (``worker_only_install``): a venv holding only
daskvine_py and the packages of pyproject's ``worker`` extra, copied from the caller's
install (no index is needed, and the copy is what ``pip install --no-deps`` would lay
down), so anything a task needs must come from the software the run ships. What most
tests ship is ``small_environment``: a venv holding only what libraries need, copied the
same way, which packs and unpacks in seconds.

Needs root and ``unshare`` (util-linux); ``unavailable()`` says why not.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent


def unavailable() -> str | None:
    """Why nodes cannot be made here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux's"
    if os.geteuid() != 0:
        return "mounting a tmpfs in a mount namespace needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=10
    )
    if probe.returncode:
        return f"unshare -m fails here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def worker_extra() -> list[str]:
    """The distributions of pyproject's ``worker`` extra, by name."""
    with open(REPO / "pyproject.toml", "rb") as file:
        extra = tomllib.load(file)["project"]["optional-dependencies"]["worker"]
    return [re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in extra]


def _top_level_paths(distribution: str) -> list[Path]:
    """The files and directories a distribution installed at the top of site-packages
    (its packages, its ``.libs``, its ``.dist-info``)."""
    dist = importlib.metadata.distribution(distribution)
    tops = set()
    for file in dist.files or ():
        parts = Path(file).parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
            tops.add(parts[0])
    root = Path(dist.locate_file(""))
    return [root / top for top in sorted(tops) if (root / top).exists()]


def _venv_with(venv: Path, distributions: Sequence[str]) -> Path:
    """A venv at ``venv`` (made unless it is there) holding copies of the caller's installs
    of ``distributions``; its site-packages directory."""
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for name in distributions:
        for path in _top_level_paths(name):
            target = site / path.name
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True)
            else:
                shutil.copy2(path, target)
    return site


def requirement_closure(names: Sequence[str]) -> list[str]:
    """The installed distributions ``names`` and everything they require (without extras,
    markers evaluated here), by name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.requires(name) or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return sorted(found)


def small_environment(directory: Path) -> tuple[Path, Path]:
    """A venv in ``directory`` holding only what a library needs to run tasks
    (``node_cache.NEEDED``: cloudpickle, dask, msgpack) and what those require, copied
    from the caller's install: an environment to ship that packs and unpacks in seconds,
    where the caller's own (numpy, pandas, the test tools...) takes tens of seconds.
    Its prefix and its site-packages directory."""
    from daskvine_py.software.node_cache import NEEDED

    venv = directory / "venv"
    return venv, _venv_with(venv, requirement_closure(NEEDED))


def worker_only_install(directory: Path) -> Path:
    """A venv in ``directory`` holding daskvine_py (a copy of this checkout's package) and
    the ``worker`` extra's packages only; its interpreter's path."""
    venv = directory / "venv"
    site = _venv_with(venv, worker_extra())
    package = site / "daskvine_py"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(
        REPO / "src" / "daskvine_py", package, ignore=shutil.ignore_patterns("__pycache__")
    )
    return venv / "bin" / "python"


def add_uv(python: Path) -> None:
    """Put the caller's ``uv`` beside the small install's interpreter (``pip install uv``
    on a node that builds requirements files)."""
    found = shutil.which("uv") or str(Path(sys.prefix) / "bin" / "uv")
    shutil.copy2(found, python.parent / "uv")


def hidden_paths(*more: str | os.PathLike[str]) -> list[str]:
    """The caller's environment and code, as a node that shares no files sees them:
    hidden. The venv (``sys.prefix``) and the repository, and ``more``."""
    paths = {os.path.realpath(sys.prefix), str(REPO)}
    paths.update(os.path.realpath(path) for path in more)
    return sorted(paths)


#: Run by ``sh -c`` in the new mount namespace: a tmpfs over each hidden path, then the
#: worker. ``$1``: how many paths; then the paths; then the command.
_HIDE = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'mount -t tmpfs -o size=1m none "$1"; shift; n=$((n-1)); done; exec "$@"'
)


def start_node_worker(
    python: Path,
    connection_file: str,
    hide: Sequence[str],
    software_cache: Path,
    name: str,
    log: Path,
    cores: int = 1,
) -> subprocess.Popen[bytes]:
    """A worker of the small install ``python`` joining with ``connection_file``, with
    ``hide`` covered by empty tmpfs mounts and its node's cache at ``software_cache``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "DASKVINE_PY_SOFTWARE"))
    }
    path = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    path = [p for p in path if not p.startswith(sys.prefix)]
    env["PATH"] = os.pathsep.join([str(python.parent), *path])  # its install's own bin
    command = [
        str(python),
        "-m",
        "daskvine_py.worker",
        "--connection-file",
        connection_file,
        "--cores",
        str(cores),
        "--name",
        name,
        "--software-cache",
        str(software_cache),
        "--manager-timeout",
        "60",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", _HIDE, "sh"]
            + [str(len(hide)), *hide, *command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Stop a node's worker (SIGTERM, then SIGKILL to its whole group); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return proc.wait(timeout)
