"""The caller's side of an environment: packed, read or described, and keyed by content.

``environment_of(spec)`` turns what a run names as ``environment=`` into the descriptor
that travels (``spec.Environment``) and the local archive the manager serves:

- ``"local"``: the caller's own running environment, packed into a relocatable
  ``tar.gz`` once and kept in the cache directory;
- a path to an archive the user built (``.tar.gz``, ``.tgz``, ``.tar``: conda-pack,
  venv-pack, or ours), read as it is;
- a requirements or lock file (``*.txt``, ``requirements*.in``, ``pylock.toml``,
  ``pylock.*.toml``): nothing is packed, each node builds it with ``uv``.

How "local" is packed
---------------------
venv-pack does not carry the interpreter: a node would need the same Python at the same
absolute path, which is what nodes that share no files with the caller lack; uv's
relocatable venvs still point at a base interpreter outside them. conda-pack is the
maintained tool for conda environments, and carries the C libraries conda installed. So:

- a conda environment (``sys.prefix`` has ``conda-meta/``) is packed with ``conda_pack``
  when it is importable (without it, with our packer and a warning: conda's own C
  libraries, which its extension modules link to, would be missing); its archive holds
  ``bin/conda-unpack``, which rewrites the prefixes conda recorded, for the node to run
  once after unpacking;
- anything else (a venv, or a plain CPython install) is packed by ``pack_prefix``
  into a self-contained prefix: the base interpreter (``bin/python3.X``, the real file,
  and a ``bin/python3`` link), ``lib/libpython3*.so*`` when the interpreter was built
  with a shared libpython, the standard library without its ``site-packages``, tests,
  ``idlelib``, ``tkinter``, ``turtledemo``, ``ensurepip`` and the static
  ``libpython3.X.a`` (45 MB, for linking only), and every active site-packages directory
  (the venv's; the base's when the venv includes system site-packages or there is no
  venv; the user's when it is active), merged into ``lib/python3.X/site-packages`` (or
  where a distribution's patched ``site`` looks instead, Debian's ``dist-packages``; the
  first directory on ``sys.path`` wins a name two of them hold). ``__pycache__`` is kept:
  a node's first import of each module would otherwise compile it. The environment's
  ``bin/`` scripts and C headers are not packed (libraries import, they run no
  commands); an editable install's ``.pth`` travels but names the caller's directory:
  its code travels in the code archive (``code``).

The unpacked prefix finds its standard library and site-packages from where its
interpreter lies (CPython's ``getpath``), so it runs from any directory. An interpreter
built with a shared libpython (pyenv's, as here) finds it through a RUNPATH naming the
original absolute ``lib`` directory: the node starts it with
``LD_LIBRARY_PATH=<unpacked>/lib`` always, so the descriptor records nothing for it.
Only the interpreter and libpython travel, not the system's C libraries (OpenSSL,
libffi, ...): the nodes are assumed to be the caller's kind of machine and distribution
(``spec.unfit`` checks the machine and glibc); a conda environment carries its own.

Compression is gzip level 1: on a LAN the archive's transfer costs less than packing
it (see ``COMPRESS_LEVEL`` for the measurement).

Keys and the cache
------------------
An archive's identity (``Environment.key``) is the sha256 of its bytes: nodes verify what
they fetch against it. Reading every file of an environment at each run to decide whether
it changed would cost as much as packing it, so "local" packs are named in the cache by a
key over what an install changes (``local_key``): the Python build, the machine and C
library, the base interpreter's file, and for each site-packages directory the names in
it, each ``*.dist-info/RECORD``'s size and modification time and every ``.pth`` file's
text. An unchanged environment is a cache hit without packing; a file edited by hand
inside site-packages goes unnoticed (reinstall the package, or remove the cache entry).

The cache directory is ``$DASKVINE_PY_CACHE_DIR``, else ``$XDG_CACHE_HOME/daskvine_py``,
else ``~/.cache/daskvine_py``; environments live in its ``environments/``: a pack is
``<local key>.tar.gz`` beside ``<local key>.json`` (the descriptor's fields, the
archive's sha256 and size among them). Archives are written under a temporary name and
renamed into place; the ``KEEP_LOCAL`` most recently used packs are kept. A user's
archive is hashed once per (path, size, modification time): the result is remembered in
the process and in ``archive-<hash of its path>.json``.

A user's archive is assumed built on the caller's kind of machine (its machine and glibc
are the caller's); its Python version and interpreter are read from its member names.

Nothing here imports dask: the worker process runs from a small install.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import hashlib
import json
import logging
import os
import platform
import re
import site
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from daskvine_py.software import spec
from daskvine_py.software.spec import ARCHIVE, REQUIREMENTS, Environment

logger = logging.getLogger("daskvine_py.software")

#: What ``environment=`` names for the caller's own running environment.
LOCAL = "local"
#: Our packing's format: a change to what ``pack_prefix`` writes bumps it, so packs made
#: before are misses rather than archives of another shape.
FORMAT = 1
#: gzip level of "local" packs. Measured packing a small venv over pyenv's 3.11 (94 MB
#: of files, the standard library mostly): level 1 took 1.2 s for 33.5 MB, level 6 3.2 s
#: for 29.8 MB, level 9 13.7 s for 29.6 MB. On a LAN the 12% more bytes cost less than
#: the wait: packing, not transfer, is what the user sits through. This project's own
#: venv (numpy, pandas, dask, parsl...: 606 MB in 20,000 files) packs in 17 s (10 s of
#: CPU) into 216 MB.
COMPRESS_LEVEL = 1
#: "local" packs kept in the cache: the newest, for switching between a few
#: environments (or versions of one) without repacking; older ones are removed.
KEEP_LOCAL = 3
#: Archives a user may name (by suffix); requirements and lock files (by name pattern).
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
REQUIREMENTS_PATTERNS = ("*.txt", "requirements*.in", "pylock.toml", "pylock.*.toml")
ACCEPTED = (
    "'local', an archive (.tar.gz, .tgz, .tar) or a requirements or lock file "
    "(*.txt, requirements*.in, pylock.toml, pylock.*.toml)"
)
#: Top-level entries of the standard library's directory that are not packed.
STDLIB_SKIPPED = frozenset(
    {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
)
#: Temporary files older than this (seconds) are leftovers of a killed packer.
STALE_TEMPORARY = 3600.0
_TEMPORARY = ".packing-"
_CHUNK = 1 << 20

_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: member names of an archive that say its Python: ``bin/python3.X`` (the interpreter) or
#: ``lib/python3.X/``, at the top or under one directory
_INTERPRETER_MEMBER = re.compile(r"^((?:[^/]+/)?)bin/python(3\.\d+)$")
_LIB_MEMBER = re.compile(r"^((?:[^/]+/)?)lib/python(3\.\d+)(?:/|$)")

# In-process memos: the caller asks at every ``get`` that ships software, and an
# unchanged environment must cost no more than its key. Keyed by content (or by file
# stamps), so they are never stale; the files they name are checked to still exist.
_LOCK = threading.Lock()
#: (environments directory, local key) -> the descriptor and archive of that pack
_LOCAL_PACKS: dict[tuple[str, str], tuple[Environment, str]] = {}
#: (path, size, mtime_ns) of a user's archive -> (sha256, size, python, interpreter)
_ARCHIVES: dict[tuple[str, int, int], tuple[str, int, str, str]] = {}


class Packed(NamedTuple):
    """An archive ``pack_prefix`` wrote."""

    key: str  #: sha256 (hex) of its bytes
    size: int  #: its bytes
    files: int  #: members (files, links and directories; 0: by conda-pack, uncounted)
    content: int  #: bytes of the files in it, uncompressed (0: by conda-pack)


def default_cache_dir() -> str:
    """Where the caller keeps packed environments and code archives."""
    explicit = os.environ.get("DASKVINE_PY_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "daskvine_py")


def environment_of(
    spec_: str | os.PathLike[str], cache_dir: str | None = None
) -> tuple[Environment, str | None]:
    """The descriptor of what ``environment=`` names, and the archive to serve (None for
    a requirements file).

    Raises ``ValueError`` for a path that does not exist, is not a readable archive, or
    is none of what is accepted (``ACCEPTED``).
    """
    name = os.fspath(spec_)
    if name == LOCAL:
        return local_environment(cache_dir)
    path = os.path.abspath(os.path.expanduser(name))
    base = os.path.basename(path).lower()
    if any(fnmatch.fnmatchcase(base, pattern) for pattern in REQUIREMENTS_PATTERNS):
        return requirements_of(path, name), None
    if base.endswith(ARCHIVE_SUFFIXES):
        return archive_of(path, name, cache_dir)
    raise ValueError(f"environment={name!r} ({path}) is none of what is accepted: {ACCEPTED}")


# -- "local" --------------------------------------------------------------------------


def local_environment(cache_dir: str | None = None) -> tuple[Environment, str]:
    """The running environment, packed (or found packed) in the cache."""
    return pack_environment(sys.prefix, sys.base_prefix, local_site_dirs(), cache_dir)


def local_site_dirs() -> list[str]:
    """The running environment's site-packages directories, in ``sys.path`` order.

    The venv's (or the install's) own, the base's when they are visible (a venv with
    system site-packages, or no venv) and the user's when it is active: the directories
    ``site`` put on ``sys.path``, resolved.
    """
    candidates: list[str] = []
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    getsitepackages: Callable[[], list[str]] | None = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        candidates.extend(getsitepackages())
    paths = sysconfig.get_paths()
    candidates.extend((paths["purelib"], paths["platlib"]))
    order: dict[str, int] = {}
    for index, entry in enumerate(sys.path):
        if entry:
            order.setdefault(os.path.realpath(entry), index)
    found = {os.path.realpath(candidate) for candidate in candidates}
    active = [path for path in found if path in order and os.path.isdir(path)]
    return sorted(active, key=lambda path: order[path])


def local_key(prefix: str, base_prefix: str, site_dirs: Sequence[str]) -> str:
    """The key a pack of this environment is cached under, from what an install changes
    (the module docstring says what), without reading the packages' files."""
    digest = hashlib.sha256()

    def put(*parts: object) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode("utf-8", "replace")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)

    put(FORMAT, sys.version, platform.machine(), spec.glibc(), prefix, base_prefix)
    interpreter = base_interpreter(base_prefix)
    stat = os.stat(interpreter)
    put(interpreter, stat.st_size, stat.st_mtime_ns)
    conda_meta = os.path.join(prefix, "conda-meta")
    if os.path.isdir(conda_meta):
        put("conda-meta", *sorted(os.listdir(conda_meta)))
    for directory in site_dirs:
        put("site", directory)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            put("-")
            continue
        for name in names:
            put(name)
            path = os.path.join(directory, name)
            if name.endswith(".dist-info"):
                put(*_stamp(os.path.join(path, "RECORD")))
            elif name.endswith(".egg-info"):
                put(*_stamp(os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path))
            elif name.endswith(".pth"):
                try:
                    with open(path, "rb") as file:
                        put(file.read())
                except OSError:
                    put("-")
    return digest.hexdigest()


def _stamp(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def pack_environment(
    prefix: str,
    base_prefix: str,
    site_dirs: Sequence[str],
    cache_dir: str | None = None,
    name: str = LOCAL,
) -> tuple[Environment, str]:
    """The environment at ``prefix`` packed into the cache (``pack_prefix``), or the
    pack already there when its ``local_key`` is unchanged: returns its descriptor and
    the archive's path."""
    directory = _environments_dir(cache_dir)
    key = local_key(prefix, base_prefix, site_dirs)
    with _LOCK:
        known = _LOCAL_PACKS.get((directory, key))
    if known is not None and os.path.isfile(known[1]):
        return known[0]._replace(name=name), known[1]
    archive = os.path.join(directory, f"{key}.tar.gz")
    sidecar = os.path.join(directory, f"{key}.json")
    environment = _read_sidecar(sidecar, archive, name)
    if environment is None:
        os.makedirs(directory, exist_ok=True)
        started = time.monotonic()
        with _temporary(directory, ".tar.gz") as temporary:
            packed = pack_prefix(prefix, base_prefix, site_dirs, temporary)
            os.replace(temporary, archive)
        environment = Environment(
            kind=ARCHIVE,
            key=packed.key,
            size=packed.size,
            name=name,
            python=_PYTHON,
            machine=platform.machine(),
            glibc=spec.glibc(),
            interpreter=f"bin/python{_PYTHON}",
        )
        _write_json(sidecar, {"origin": LOCAL, **_fields(environment)})
        logger.info(
            "Packed the environment %s in %.1f s: %d files, %.1f MB into %.1f MB (%s)",
            prefix,
            time.monotonic() - started,
            packed.files,
            packed.content / 1e6,
            packed.size / 1e6,
            archive,
        )
        _prune(directory, KEEP_LOCAL)
    else:
        with contextlib.suppress(OSError):
            os.utime(sidecar)  # most recently used: kept by ``_prune``
    with _LOCK:
        _LOCAL_PACKS[(directory, key)] = (environment, archive)
    return environment, archive


def base_interpreter(base_prefix: str) -> str:
    """The real file of the interpreter installed at ``base_prefix``."""
    candidate = os.path.join(base_prefix, "bin", f"python{_PYTHON}")
    if not os.path.exists(candidate):
        candidate = getattr(sys, "_base_executable", "") or sys.executable
    return os.path.realpath(candidate)


def pack_prefix(prefix: str, base_prefix: str, site_dirs: Sequence[str], output: str) -> Packed:
    """Write the environment at ``prefix`` (over the interpreter installed at
    ``base_prefix``, with the packages of ``site_dirs``, first one first) into a
    relocatable ``tar.gz`` at ``output``.

    A conda environment goes through ``conda_pack`` when it is importable; anything else
    becomes the self-contained prefix the module docstring describes. The interpreter at
    ``base_prefix`` must be a build of the running Python (its standard library's layout
    is read from ``sysconfig``).
    """
    if os.path.isdir(os.path.join(prefix, "conda-meta")):
        try:
            import conda_pack  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            logger.warning(
                "%s is a conda environment and conda-pack is not installed: packing its "
                "Python without the C libraries conda installed (pip install conda-pack)",
                prefix,
            )
        else:
            conda_pack.pack(
                prefix=prefix,
                output=output,
                format="tar.gz",
                compress_level=COMPRESS_LEVEL,
                ignore_editable_packages=True,
                force=True,
                n_threads=-1,
            )
            key, size = _hash_file(output)
            return Packed(key, size, 0, 0)
    with open(output, "wb") as raw:
        hashing = _HashingWriter(raw)
        with (
            gzip.GzipFile(
                filename="", mode="wb", compresslevel=COMPRESS_LEVEL, fileobj=hashing, mtime=0
            ) as compressed,
            tarfile.TarFile(
                fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT, copybufsize=_CHUNK
            ) as tar,
        ):
            writer = _TarWriter(tar)
            _write_base(writer, base_prefix)
            site_arc = _archive_site_dir(base_prefix)
            taken: set[str] = set()
            for directory in site_dirs:
                if os.path.isdir(directory):
                    writer.tree(directory, site_arc, skip=lambda rel: rel in taken, top=True)
                    taken.update(os.listdir(directory))
        raw.flush()
        os.fsync(raw.fileno())
    return Packed(hashing.digest.hexdigest(), hashing.size, writer.members, writer.content)


def _write_base(writer: _TarWriter, base_prefix: str) -> None:
    """The interpreter, libpython and the standard library of ``base_prefix``."""
    interpreter = base_interpreter(base_prefix)
    writer.file(interpreter, f"bin/python{_PYTHON}")
    writer.link("bin/python3", f"python{_PYTHON}")
    libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(libdir, str) and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = os.path.join(base_prefix, os.path.relpath(libdir, sys.base_prefix))
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(libdir)):
                if fnmatch.fnmatchcase(entry, "libpython3*.so*"):
                    path = os.path.join(libdir, entry)
                    writer.tree_entry(path, f"lib/{entry}", os.path.realpath(libdir))
    variables = {
        "installed_base": base_prefix,
        "installed_platbase": base_prefix,
        "base": base_prefix,
        "platbase": base_prefix,
    }
    scheme = "posix_prefix" if "posix_prefix" in sysconfig.get_scheme_names() else None
    paths = (
        sysconfig.get_paths(scheme, vars=variables)
        if scheme
        else sysconfig.get_paths(vars=variables)
    )
    for stdlib in dict.fromkeys((paths["stdlib"], paths["platstdlib"])):
        if os.path.isdir(stdlib):
            arc = os.path.relpath(stdlib, base_prefix).replace(os.sep, "/")
            writer.tree(stdlib, arc, skip=_stdlib_skipped)


def _stdlib_skipped(rel: str) -> bool:
    top, _, rest = rel.partition("/")
    if not rest:
        return top in STDLIB_SKIPPED
    return top.startswith("config-") and fnmatch.fnmatchcase(rest, "libpython*.a")


def _archive_site_dir(base_prefix: str) -> str:
    """Where the unpacked interpreter looks for site-packages: ``lib/python3.X/
    site-packages``, or what a distribution's patched ``site`` looks at instead."""
    default = f"lib/python{_PYTHON}/site-packages"
    getsitepackages: Callable[[list[str]], list[str]] | None = getattr(
        site, "getsitepackages", None
    )
    if getsitepackages is None:
        return default
    for path in getsitepackages([base_prefix]):
        rel = os.path.relpath(path, base_prefix)
        if not rel.startswith(os.pardir):
            return rel.replace(os.sep, "/")
    return default


class _HashingWriter:
    """A file that hashes and counts what is written through it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        written: int = self.raw.write(view)
        return written

    def flush(self) -> None:
        self.raw.flush()


class _HashingReader:
    """A file that hashes and counts what is read through it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        return data


class _TarWriter:
    """Members written into a tar: files, relative links, directories; each name once
    (the first wins), owned by nobody in particular."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.names: set[str] = set()
        self.members = 0
        self.content = 0

    def _info(self, name: str, stat: os.stat_result | None, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if stat is not None:
            info.mtime = int(stat.st_mtime)
            info.mode = stat.st_mode & 0o7777
        if kind == tarfile.DIRTYPE:
            info.mode |= 0o700
        elif kind == tarfile.SYMTYPE:
            info.mode = 0o777
        else:
            info.mode |= 0o600
        return info

    def file(self, path: str, name: str) -> None:
        if name in self.names:
            return
        with open(path, "rb") as source:
            stat = os.fstat(source.fileno())
            info = self._info(name, stat, tarfile.REGTYPE)
            info.size = stat.st_size
            self.tar.addfile(info, source)
        self.names.add(name)
        self.members += 1
        self.content += stat.st_size

    def link(self, name: str, target: str) -> None:
        if name in self.names:
            return
        info = self._info(name, None, tarfile.SYMTYPE)
        info.linkname = target
        self.tar.addfile(info)
        self.names.add(name)
        self.members += 1

    def directory(self, name: str, stat: os.stat_result | None) -> None:
        if name in self.names:
            return
        self.tar.addfile(self._info(name, stat, tarfile.DIRTYPE))
        self.names.add(name)
        self.members += 1

    def tree(
        self,
        root: str,
        arc: str,
        skip: Callable[[str], bool] = lambda rel: False,
        top: bool = False,
    ) -> None:
        """``root``'s content under ``arc`` (sorted, so the same tree gives the same
        bytes); ``skip`` is asked about each entry's path relative to ``root``, and, when
        ``top``, only about the top-level ones."""
        self.directory(arc, _lstat(root))
        self._walk(root, "", arc, os.path.realpath(root), skip, top, {os.path.realpath(root)})

    def _walk(
        self,
        directory: str,
        rel: str,
        arc: str,
        top_real: str,
        skip: Callable[[str], bool],
        top_only: bool,
        seen: set[str],
    ) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            logger.warning("Not packed (unreadable): %s: %s", directory, exc)
            return
        for entry in names:
            entry_rel = f"{rel}/{entry}" if rel else entry
            if (not top_only or not rel) and skip(entry_rel):
                continue
            path = os.path.join(directory, entry)
            name = f"{arc}/{entry}"
            if os.path.islink(path):
                self.tree_entry(path, name, top_real, entry_rel, skip, top_only, seen)
                continue
            stat = _lstat(path)
            if stat is None:
                continue
            if _is_dir(stat):
                self.directory(name, stat)
                self._walk(path, entry_rel, name, top_real, skip, top_only, seen)
            elif _is_file(stat):
                self.file(path, name)

    def tree_entry(
        self,
        path: str,
        name: str,
        top_real: str,
        rel: str = "",
        skip: Callable[[str], bool] = lambda rel: False,
        top_only: bool = False,
        seen: set[str] | None = None,
    ) -> None:
        """One entry that may be a link: a relative link that stays inside ``top_real``
        is kept as a link; any other is replaced by what it points to."""
        if os.path.islink(path):
            target = os.readlink(path)
            resolved = os.path.realpath(path)
            inside = resolved == top_real or resolved.startswith(top_real + os.sep)
            if not os.path.isabs(target) and inside and os.path.exists(resolved):
                self.link(name, target)
                return
            path = resolved
        stat = _lstat(path)
        if stat is None:
            return  # a dangling link
        if _is_dir(stat):
            seen = seen if seen is not None else set()
            if path in seen:
                return  # a cycle
            seen.add(path)
            self.directory(name, stat)
            self._walk(path, rel, name, top_real, skip, top_only, seen)
        elif _is_file(stat):
            self.file(path, name)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is_dir(stat: os.stat_result) -> bool:
    return (stat.st_mode & 0o170000) == 0o040000


def _is_file(stat: os.stat_result) -> bool:
    return (stat.st_mode & 0o170000) == 0o100000


# -- a user's archive ------------------------------------------------------------------


def archive_of(path: str, name: str, cache_dir: str | None = None) -> tuple[Environment, str]:
    """The descriptor of an archive the user built (hashed once per path, size and
    modification time), and its path."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ValueError(
            f"environment={name!r}: {path} does not exist (accepted: {ACCEPTED})"
        ) from exc
    if not _is_file(stat):
        raise ValueError(f"environment={name!r}: {path} is not a file (accepted: {ACCEPTED})")
    stamp = (path, stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        known = _ARCHIVES.get(stamp)
    if known is None:
        sidecar = os.path.join(
            _environments_dir(cache_dir),
            f"archive-{hashlib.sha256(path.encode('utf-8', 'replace')).hexdigest()[:32]}.json",
        )
        known = _read_archive_sidecar(sidecar, stamp)
        if known is None:
            known = _read_archive(path, name)
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(sidecar), exist_ok=True)
                _write_json(
                    sidecar,
                    {
                        "path": path,
                        "size": stat.st_size,
                        "mtime_ns": stat.st_mtime_ns,
                        "key": known[0],
                        "archive_size": known[1],
                        "python": known[2],
                        "interpreter": known[3],
                    },
                )
        with _LOCK:
            _ARCHIVES[stamp] = known
    key, size, python, interpreter = known
    environment = Environment(
        kind=ARCHIVE,
        key=key,
        size=size,
        name=name,
        python=python,
        machine=platform.machine(),
        glibc=spec.glibc(),
        interpreter=interpreter,
    )
    return environment, path


def _read_archive(path: str, name: str) -> tuple[str, int, str, str]:
    """An archive's sha256, size, Python and interpreter, in one pass over its bytes."""
    interpreter = python = ""
    lib_python = ""
    with open(path, "rb") as raw:
        reader = _HashingReader(raw)
        try:
            with tarfile.open(fileobj=reader, mode="r|*") as tar:  # type: ignore[call-overload]
                for member in tar:
                    member_name = member.name
                    while member_name.startswith("./"):
                        member_name = member_name[2:]
                    found = _INTERPRETER_MEMBER.match(member_name)
                    if found and (not interpreter or len(member_name) < len(interpreter)):
                        interpreter, python = member_name, found.group(2)
                    elif not lib_python:
                        lib = _LIB_MEMBER.match(member_name)
                        if lib:
                            lib_python = lib.group(2)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ValueError(
                f"environment={name!r}: {path} is not a readable tar archive ({exc}); "
                f"accepted: {ACCEPTED}"
            ) from exc
        while reader.read(_CHUNK):
            pass
    return reader.digest.hexdigest(), reader.size, python or lib_python, interpreter


def _read_archive_sidecar(
    sidecar: str, stamp: tuple[str, int, int]
) -> tuple[str, int, str, str] | None:
    record = _read_json(sidecar)
    if record is None:
        return None
    try:
        if (record["path"], record["size"], record["mtime_ns"]) != stamp:
            return None
        return (
            str(record["key"]),
            int(record["archive_size"]),
            str(record["python"]),
            str(record["interpreter"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


# -- requirements ------------------------------------------------------------------------


def requirements_of(path: str, name: str) -> Environment:
    """A requirements or lock file, built on each node with its own Python."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"environment={name!r}: {path} cannot be read ({exc}); accepted: {ACCEPTED}"
        ) from exc
    digest = hashlib.sha256(text.encode("utf-8"))
    digest.update(b"\0python " + _PYTHON.encode())
    return Environment(
        kind=REQUIREMENTS,
        key=digest.hexdigest(),
        size=0,
        name=name,
        python="",
        machine="",
        glibc="",
        requirements=text,
    )


# -- the cache directory ------------------------------------------------------------------


def _environments_dir(cache_dir: str | None) -> str:
    base = cache_dir if cache_dir is not None else default_cache_dir()
    return os.path.join(os.path.abspath(os.path.expanduser(base)), "environments")


@contextlib.contextmanager
def _temporary(directory: str, suffix: str) -> Any:
    """A temporary file's path in ``directory``, removed unless it was renamed away."""
    descriptor, path = tempfile.mkstemp(dir=directory, prefix=_TEMPORARY, suffix=suffix)
    os.close(descriptor)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _hash_file(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _fields(environment: Environment) -> dict[str, Any]:
    fields = environment._asdict()
    del fields["name"]
    return fields


def _read_sidecar(sidecar: str, archive: str, name: str) -> Environment | None:
    """The descriptor a sidecar holds, if its archive is there whole."""
    record = _read_json(sidecar)
    if record is None:
        return None
    try:
        fields = {field: record[field] for field in Environment._fields if field != "name"}
        environment = Environment(name=name, **fields)
        if os.stat(archive).st_size != environment.size:
            return None
    except (KeyError, TypeError, OSError):
        return None
    return environment


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_json(path: str, record: dict[str, Any]) -> None:
    directory = os.path.dirname(path)
    with _temporary(directory, ".json") as temporary:
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(record, file, sort_keys=True)
        os.replace(temporary, path)


def _prune(directory: str, keep: int) -> None:
    """Keep the ``keep`` most recently used "local" packs of ``directory`` (and remove
    what killed packers left)."""
    packs: list[tuple[float, str]] = []
    now = time.time()
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if entry.startswith(_TEMPORARY):
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > STALE_TEMPORARY:
                    os.unlink(path)
            continue
        if entry.endswith(".json") and not entry.startswith("archive-"):
            record = _read_json(path)
            if record is not None and record.get("origin") == LOCAL:
                with contextlib.suppress(OSError):
                    packs.append((os.stat(path).st_mtime, entry[: -len(".json")]))
    packs.sort(reverse=True)
    for _, key in packs[keep:]:
        for suffix in (".tar.gz", ".json"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, key + suffix))
        with _LOCK:
            _LOCAL_PACKS.pop((directory, key), None)
        logger.info("Removed the environment pack %s from the cache (%d newer kept)", key, keep)
