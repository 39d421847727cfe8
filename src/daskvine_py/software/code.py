"""The caller's own code: the modules no environment holds, in a zip named by its content.

A run's tasks call the caller's functions by reference (cloudpickle pickles an imported
module's function by its module's name), so a node needs the modules themselves: those
of the working directory, of a project on ``sys.path``, of an editable install. They are
what ``sys.modules`` holds from outside the environment's roots (``default_roots``:
the prefixes and the site-packages directories), less daskvine_py (each worker brings
its own) and ``__main__`` (cloudpickle ships its functions by value).

Each such module is shipped with its whole top-level package: the package's directory
(its modules and small data files: nothing hidden, no ``__pycache__``, no file over
``MAX_FILE``) or the single module's file, at the top of the zip, so the zip (or the
directory it is unpacked into) goes on a library's ``sys.path`` as it is. Where a
top-level name was found at two places, the one ``sys.modules`` holds goes; a top-level
package that the environment holds does not go at all, even when one of its submodules
was loaded from elsewhere.

The zip's entries are sorted by name and carry a fixed timestamp, so the same files give
the same bytes and the same key (the sha256 of the bytes): nodes keep one copy per
content. ``code_archive`` runs at every ``get`` that ships software, so what it found is
remembered per (path, size, modification time) of every file involved: an unchanged set
costs one look at ``sys.modules`` and a ``stat`` of each file; a changed one is zipped
again (a few milliseconds for a small project). Zips are kept in the cache directory's
``code/`` (``pack.default_cache_dir``), the ``KEEP`` most recently used.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import site
import sys
import sysconfig
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from daskvine_py.software import pack
from daskvine_py.software.spec import Code

logger = logging.getLogger("daskvine_py.software")

#: The package a worker brings itself, and the modules cloudpickle ships by value.
OWN = "daskvine_py"
MAIN_MODULES = frozenset({"__main__", "__mp_main__"})
#: Files larger than this are left out (data, not code; the zip travels at every change).
MAX_FILE = 16 * 2**20
#: A code archive past this size is logged (once per content): it is zipped again, and
#: fetched by every node again, at every change of any file in it.
LARGE = 64 * 2**20
#: Code archives kept in the cache: enough for a session's edits back and forth.
KEEP = 20
#: Archives remembered in the process, by the stamps of their files.
MEMO = 16
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
_TEMPORARY = ".zipping-"

#: (name in the zip, path, size, mtime_ns) of each file, sorted by name
_Files = tuple[tuple[str, str, int, int], ...]


def default_roots() -> tuple[str, ...]:
    """Where the running environment's modules live: its prefixes and site-packages
    directories (resolved); modules from anywhere else are the caller's own."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    getsitepackages = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        candidates.extend(getsitepackages())
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    paths = sysconfig.get_paths()
    candidates.extend((paths["purelib"], paths["platlib"], paths["stdlib"], paths["platstdlib"]))
    return tuple(dict.fromkeys(os.path.realpath(path) for path in candidates))


def code_archive(
    environment_roots: Sequence[str], cache_dir: str | None = None
) -> tuple[Code, str] | None:
    """The caller's own modules (outside ``environment_roots``) zipped into the cache:
    their descriptor and the zip's path; None when there are none."""
    return _ARCHIVER.archive(environment_roots, cache_dir)


class _Archiver:
    """What ``code_archive`` remembers between calls (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: tuple[str, ...] = ()
        #: a module's ``__file__`` -> its real path, or "" when under the roots
        self._outside: dict[str, str] = {}
        #: (code directory, files) -> the archive made of them
        self._made: OrderedDict[tuple[str, _Files], tuple[Code, str]] = OrderedDict()
        #: archives whose size was already logged
        self._large: set[str] = set()

    def archive(
        self, environment_roots: Sequence[str], cache_dir: str | None
    ) -> tuple[Code, str] | None:
        with self._lock:
            roots = tuple(os.path.realpath(root) for root in environment_roots)
            if roots != self._roots:
                self._roots, self._outside = roots, {}
            places = self._places()
            if not places:
                return None
            files = _files(places)
            directory = os.path.join(
                os.path.abspath(os.path.expanduser(cache_dir or pack.default_cache_dir())),
                "code",
            )
            made = self._made.get((directory, files))
            if made is not None and os.path.isfile(made[1]):
                self._made.move_to_end((directory, files))
                return made
            made = _write(directory, files, tuple(sorted(places)))
            self._made[(directory, files)] = made
            while len(self._made) > MEMO:
                self._made.popitem(last=False)
            if made[0].size > LARGE and made[0].key not in self._large:
                self._large.add(made[0].key)
                logger.warning(
                    "The code shipped to workers (%s) is %.0f MB, zipped again at each change",
                    ", ".join(made[0].modules),
                    made[0].size / 1e6,
                )
            return made

    def _real(self, file: str) -> str:
        """``file``'s real path, or "" when it is under the roots (or is no file)."""
        real = self._outside.get(file)
        if real is None:
            real = os.path.realpath(file)
            if not os.path.isfile(real) or _under(real, self._roots):
                real = ""
            self._outside[file] = real
        return real

    def _places(self) -> dict[str, list[tuple[str, str]]]:
        """Each top-level name to ship -> (what, name in the zip) of its package's
        directories or its module's file."""
        tops: set[str] = set()
        for name, module in list(sys.modules.items()):
            top = name.partition(".")[0]
            if top in tops or top == OWN or top in MAIN_MODULES:
                continue
            file = _file_of(module)
            if file is not None and self._real(file):
                tops.add(top)
        places: dict[str, list[tuple[str, str]]] = {}
        for top in tops:
            top_module = sys.modules.get(top)
            file = _file_of(top_module)
            if file is not None:
                real = self._real(file)
                if not real:
                    continue  # the environment holds this top-level name
                if os.path.basename(real).startswith("__init__."):
                    places[top] = [(os.path.dirname(real), top)]
                else:
                    places[top] = [(real, os.path.basename(file))]
                continue
            # a namespace package: its portions outside the roots
            portions = [
                os.path.realpath(path)
                for path in getattr(top_module, "__path__", None) or ()
                if isinstance(path, str)
            ]
            outside = [
                (path, top)
                for path in dict.fromkeys(portions)
                if os.path.isdir(path) and not _under(path, self._roots)
            ]
            if outside:
                places[top] = outside
        return places


def _file_of(module: object) -> str | None:
    try:
        file = getattr(module, "__file__", None)
    except Exception:  # a lazy or broken module: nothing to ship from it
        return None
    return file if isinstance(file, str) and file else None


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _files(places: dict[str, list[tuple[str, str]]]) -> _Files:
    """Every file to ship with its stamps (the first place of a name wins)."""
    found: dict[str, tuple[str, int, int]] = {}
    for top in sorted(places):
        for path, arc in places[top]:
            if os.path.isdir(path):
                _walk(path, arc, found, {path})
            else:
                _add(path, arc, found)
    return tuple(sorted((arc, path, size, mtime) for arc, (path, size, mtime) in found.items()))


def _add(path: str, arc: str, found: dict[str, tuple[str, int, int]]) -> None:
    if arc in found:
        return
    try:
        stat = os.stat(path)
    except OSError:
        return
    if stat.st_size <= MAX_FILE:
        found[arc] = (path, stat.st_size, stat.st_mtime_ns)


def _walk(directory: str, arc: str, found: dict[str, tuple[str, int, int]], seen: set[str]) -> None:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        name = f"{arc}/{entry.name}"
        try:
            if entry.is_dir():
                real = os.path.realpath(entry.path)
                if real not in seen:  # a link back up would loop
                    seen.add(real)
                    _walk(entry.path, name, found, seen)
            elif entry.is_file() and name not in found:
                stat = entry.stat()
                if stat.st_size <= MAX_FILE:
                    found[name] = (entry.path, stat.st_size, stat.st_mtime_ns)
        except OSError:
            continue


def _write(directory: str, files: _Files, modules: tuple[str, ...]) -> tuple[Code, str]:
    """Zip ``files`` (the same files give the same bytes) into ``directory``."""
    started = time.monotonic()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for arc, path, _, _ in files:
            try:
                with open(path, "rb") as file:
                    data = file.read()
                mode = os.stat(path).st_mode
            except OSError as exc:
                logger.warning("Not shipped (unreadable): %s: %s", path, exc)
                continue
            info = zipfile.ZipInfo(arc, _TIMESTAMP)
            info.external_attr = (0o755 if mode & 0o111 else 0o644) << 16
            archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
    content = buffer.getbuffer()
    key = hashlib.sha256(content).hexdigest()
    path = os.path.join(directory, f"{key}.zip")
    os.makedirs(directory, exist_ok=True)
    if os.path.isfile(path) and os.path.getsize(path) == len(content):
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used: kept by ``_prune``
    else:
        temporary = os.path.join(directory, f"{_TEMPORARY}{os.getpid()}-{threading.get_ident()}")
        try:
            with open(temporary, "wb") as file:
                file.write(content)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        _prune(directory, KEEP)
        logger.info(
            "Zipped the code of %s: %d files, %.1f kB in %.3f s",
            ", ".join(modules),
            len(files),
            len(content) / 1e3,
            time.monotonic() - started,
        )
    return Code(key=key, size=len(content), modules=modules), path


def _prune(directory: str, keep: int) -> None:
    """Keep the ``keep`` most recently used zips of ``directory``."""
    zips: list[tuple[float, str]] = []
    for entry in os.listdir(directory):
        if entry.endswith(".zip"):
            with contextlib.suppress(OSError):
                zips.append((os.stat(os.path.join(directory, entry)).st_mtime, entry))
    zips.sort(reverse=True)
    for _, entry in zips[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, entry))


_ARCHIVER = _Archiver()
