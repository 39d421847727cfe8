"""The per-node software cache (``software/node_cache.py``): fetched once per node,
unpacked atomically, refused with a reason, evicted least recently used but never in use.

The environments are real: a self-contained prefix copied from this interpreter (its
binary, libpython and a trimmed stdlib), venvs, and a venv uv builds from local wheels.
Their ``dask`` is a one-line stand-in: it is enough for the cache's check that the
environment imports ``dask`` (a library could not run with it). ``cloudpickle`` is the
real package, copied.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.metadata
import io
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import venv
import zipfile
from pathlib import Path

import cloudpickle
import msgpack
import pytest

from daskvine_py.software import node_cache
from daskvine_py.software.node_cache import NodeCache, Prepared, SoftwareUnfit
from daskvine_py.software.spec import (
    ARCHIVE,
    REQUIREMENTS,
    Code,
    Environment,
    NodeFacts,
    Software,
    glibc,
    software_key,
)

SRC = str(Path(node_cache.__file__).resolve().parents[2])
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
DASK_STUB = '__version__ = "0.0.0"  # a stand-in: the cache only checks that it imports\n'


# -- building archives ------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tar_of(directory: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name)
    return archive


def tar_with(archive: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    """A tar.gz of ``{name: (content, mode)}``."""
    with tarfile.open(archive, "w:gz") as tar:
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return archive


def environment_of(archive: Path, name: str, python: str = PYTHON, **fields: str) -> Environment:
    return Environment(
        ARCHIVE,
        sha256(archive),
        archive.stat().st_size,
        name,
        python,
        platform.machine(),
        glibc(),
        **fields,
    )


def code_of(archive: Path, *modules: str) -> Code:
    return Code(sha256(archive), archive.stat().st_size, modules)


def software_of(environment: Environment | None = None, code: Code | None = None) -> Software:
    return Software(software_key(environment, code), environment, code, ())


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{PYTHON}" / "site-packages"


def add_packages(site: Path, dask: bool = True) -> None:
    site.mkdir(parents=True, exist_ok=True)
    for module in (cloudpickle, msgpack):
        shutil.copytree(
            Path(module.__file__).parent,
            site / module.__name__,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    if dask:
        (site / "dask").mkdir()
        (site / "dask" / "__init__.py").write_text(DASK_STUB)


@pytest.fixture(scope="session")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Environment, Path]:
    """A self-contained environment: this interpreter's binary, libpython and stdlib
    (without its tests, GUI and site-packages), with cloudpickle and a stand-in dask."""
    base = Path(sys.base_prefix)
    binary = base / "bin" / f"python{PYTHON}"
    stdlib = base / "lib" / f"python{PYTHON}"
    if not binary.is_file() or not (stdlib / "os.py").is_file():
        pytest.skip(f"this Python's prefix {base} is not laid out as bin/ and lib/")
    work = tmp_path_factory.mktemp("prefix")
    prefix = work / "env"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(binary, prefix / "bin" / binary.name)
    (prefix / "bin" / "python3").symlink_to(binary.name)
    (prefix / "lib").mkdir()
    for library in (base / "lib").glob(f"libpython{PYTHON}*.so*"):
        shutil.copy2(library, prefix / "lib" / library.name, follow_symlinks=False)
    shutil.copytree(
        stdlib,
        prefix / "lib" / stdlib.name,
        ignore=shutil.ignore_patterns(
            "site-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip",
            "lib2to3", "distutils", "pydoc_data", "__pycache__", "config-3.*", "_test*",
        ),
    )  # fmt: skip
    add_packages(site_packages(prefix))
    archive = tar_of(prefix, work / "env.tar.gz")
    return environment_of(archive, "prefix"), archive


#: conda-pack's script stands in: it says where it ran (its prefix is rewritten to there)
CONDA_UNPACK = """
import os, sys
prefix = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(prefix, "unpacked-at"), "w") as file:
    file.write(prefix + " " + sys.prefix)
"""


def venv_archive(work: Path, dask: bool = True, conda_unpack: bool = False) -> Path:
    """A venv (its interpreter a symbolic link to this one's base), as venv-pack packs one."""
    prefix = work / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    add_packages(site_packages(prefix), dask=dask)
    if conda_unpack:
        (prefix / "bin" / "conda-unpack").write_text(CONDA_UNPACK)
    return tar_of(prefix, work / "venv.tar.gz")


class Source:
    """The transfer layer's stand-in: copies archives it holds, counts the calls."""

    def __init__(self, *archives: Path, delay: float = 0.0, corrupt: bool = False) -> None:
        self.archives = {sha256(path): path for path in archives}
        self.delay = delay
        self.corrupt = corrupt
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, key: str, size: int, destination: str) -> None:
        with self._lock:
            self.calls.append(key)
        time.sleep(self.delay)
        data = self.archives[key].read_bytes()
        if self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        Path(destination).write_bytes(data)


def left_in(root: Path) -> dict[str, list[str]]:
    return {part: sorted(os.listdir(root / part)) for part in ("env", "code", "archives")}


# -- an environment reaches the node once -----------------------------------------------


CHILD = """
import pickle, shutil, sys, time
from daskvine_py.software.node_cache import NodeCache

root, software_file, archive, count = sys.argv[1:]
with open(software_file, "rb") as file:
    software = pickle.load(file)

def fetch(key, size, destination):
    with open(count, "a") as file:
        file.write(key + "\\n")
    time.sleep(0.5)
    shutil.copyfile(archive, destination)

cache = NodeCache(root)
prepared = cache.prepare(software, fetch)
print(prepared.python, len(cache.built))
cache.close()
"""


@pytest.mark.integration
def test_two_workers_and_a_process_on_one_node_fetch_and_unpack_once(
    tmp_path: Path, prefix: tuple[Environment, Path]
) -> None:
    prefix_archive, prefix_file = prefix
    root = tmp_path / "software"
    software = software_of(prefix_archive)
    (tmp_path / "software.pickle").write_bytes(pickle.dumps(software))
    count = tmp_path / "fetches"
    count.touch()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(tmp_path / "software.pickle"),
         str(prefix_file), str(count)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    source = Source(prefix_file, delay=0.5)
    caches = [NodeCache(str(root)), NodeCache(str(root))]
    results: list[Prepared] = []
    threads = [
        threading.Thread(target=lambda c=cache: results.append(c.prepare(software, source)))
        for cache in caches
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    child_python, child_built = out.split()

    place = root / "env" / prefix_archive.key
    assert len(results) == 2
    assert {prepared.python for prepared in results} == {child_python}
    assert len(source.calls) + len(count.read_text().split()) == 1
    assert sum(len(cache.built) for cache in caches) + int(child_built) == 1
    assert Path(child_python).parent.parent == place
    assert (place / ".complete").is_file() and int((place / ".size").read_text()) > 0
    assert caches[0].archive_path(prefix_archive.key) == str(root / "archives" / prefix_archive.key)
    assert [name for name in os.listdir(root / "env") if name.endswith(".tmp")] == []

    # what the libraries start with: the environment's interpreter, its own libpython
    prepared = results[0]
    assert prepared.env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(place / "lib")
    assert prepared.pythonpath == () and prepared.key == software.key
    probe = (
        "import sys, cloudpickle, dask; print(sys.prefix); "
        "print([l.split()[-1] for l in open('/proc/self/maps') if 'libpython' in l][:1])"
    )
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [prepared.python, "-c", probe],
        env={**environ, **prepared.env},
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == str(place)
    if list((place / "lib").glob("libpython*")):
        assert str(place / "lib") in lines[1]

    # a restarted worker finds it there: nothing fetched, nothing unpacked
    for cache in caches:
        cache.close()
    again = NodeCache(str(root))
    assert again.prepare(software, Source(prefix_file)).python == child_python
    assert again.built == []
    again.close()


def test_code_alone_runs_with_the_workers_python(tmp_path: Path) -> None:
    archive = tmp_path / "code.zip"
    with zipfile.ZipFile(archive, "w") as opened:
        opened.writestr("mymodule.py", "ANSWER = 42\n")
        opened.writestr("mypackage/__init__.py", "")
    code = code_of(archive, "mymodule", "mypackage")
    source = Source(archive)
    with NodeCache(str(tmp_path / "software")) as cache:
        prepared = cache.prepare(software_of(code=code), source)
        place = tmp_path / "software" / "code" / code.key
        assert prepared == Prepared(sys.executable, {}, (str(place),), software_of(code=code).key)
        assert (place / "mymodule.py").read_text() == "ANSWER = 42\n"
        assert (place / "mypackage" / "__init__.py").is_file()
        assert cache.archive_path(code.key) == str(tmp_path / "software" / "archives" / code.key)
        cache.prepare(software_of(code=code), source)
    assert source.calls == [code.key] and cache.built == [code.key]
    assert NodeCache(str(tmp_path / "software")).archive_path("0" * 64) is None


# -- refused, with the reason ------------------------------------------------------------


def test_a_corrupt_archive_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python3": (b"#!/bin/sh\n", 0o755)})
    environment = environment_of(archive, "local")
    root = tmp_path / "software"
    with NodeCache(str(root)) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(environment), Source(archive, corrupt=True))
    assert "the archive of the environment 'local' arrived corrupt" in caught.value.reason
    assert str(environment.size) in caught.value.reason
    assert left_in(root) == {"env": [], "code": [], "archives": []}
    assert {name.rsplit(".", 1)[1] for name in os.listdir(root / "locks")} <= {"lock", "use"}


def test_a_failing_fetch_is_refused_with_its_error(tmp_path: Path) -> None:
    def fetch(key: str, size: int, destination: str) -> None:
        Path(destination).write_bytes(b"half")
        raise ConnectionRefusedError("no source answered")

    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python3": (b"#!/bin/sh\n", 0o755)})
    with NodeCache(str(tmp_path / "software")) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(environment_of(archive, "local")), fetch)
    assert caught.value.reason == (
        "fetching the archive of the environment 'local' failed: no source answered"
    )
    assert left_in(tmp_path / "software")["archives"] == []


def test_the_nodes_facts_refuse_an_archive_before_fetching(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python3": (b"#!/bin/sh\n", 0o755)})
    source = Source(archive)
    other = environment_of(archive, "local")._replace(machine="sparc64")
    newer = environment_of(archive, "local")._replace(glibc="2.99")
    node = NodeFacts(PYTHON, platform.machine(), "2.36")
    with NodeCache(str(tmp_path / "software")) as cache:
        with pytest.raises(SoftwareUnfit, match="built for sparc64, this node is"):
            cache.prepare(software_of(other), source)
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(newer), source, node=node)
    assert caught.value.reason == (
        "the environment 'local' needs glibc 2.99 or newer, this node has 2.36"
    )
    assert source.calls == []


def test_an_interpreter_that_fails_is_refused_with_its_last_words(tmp_path: Path) -> None:
    script = (
        b"#!/bin/sh\necho starting >&2\necho 'libfoo.so.1: cannot open shared object' >&2\nexit 1\n"
    )
    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python3": (script, 0o755)})
    environment = environment_of(archive, "broken")
    root = tmp_path / "software"
    with NodeCache(str(root)) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(environment), Source(archive))
    assert caught.value.reason == (
        "the interpreter of the environment 'broken' (bin/python3) failed on this node: "
        "libfoo.so.1: cannot open shared object"
    )
    assert left_in(root) == {"env": [], "code": [], "archives": []}


def test_an_interpreter_for_another_machine_is_refused(tmp_path: Path) -> None:
    true = shutil.which("true")
    if true is None or Path(true).read_bytes()[:4] != b"\x7fELF":
        pytest.skip("no ELF binary to rewrite")
    binary = bytearray(Path(true).read_bytes())
    machine = 0xB7 if int.from_bytes(binary[18:20], sys.byteorder) != 0xB7 else 0x3E
    binary[18:20] = machine.to_bytes(2, sys.byteorder)  # e_machine: aarch64 (or x86-64)
    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python": (bytes(binary), 0o755)})
    with NodeCache(str(tmp_path / "software")) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(environment_of(archive, "foreign")), Source(archive))
    assert caught.value.reason == (
        "the interpreter of the environment 'foreign' (bin/python) does not run on this node: "
        "Exec format error"
    )


def test_an_old_python_and_a_missing_interpreter_are_refused(tmp_path: Path) -> None:
    old = tar_with(tmp_path / "old.tar.gz", {"bin/python3": (b"#!/bin/sh\necho 3.9\n", 0o755)})
    empty = tar_with(tmp_path / "empty.tar.gz", {"README": (b"nothing here\n", 0o644)})
    with NodeCache(str(tmp_path / "software")) as cache:
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(environment_of(old, "old", python="")), Source(old))
        assert caught.value.reason == (
            "the environment 'old' runs Python 3.9, daskvine_py's libraries need 3.10 or newer"
        )
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(environment_of(empty, "empty")), Source(empty))
        assert caught.value.reason == (
            "the environment 'empty' holds no interpreter: no bin/python3 or bin/python in it"
        )
        outside = environment_of(empty, "outside", interpreter="../../../usr/bin/python3")
        with pytest.raises(SoftwareUnfit, match="names an interpreter outside itself"):
            cache.prepare(software_of(outside), Source(empty))


@pytest.mark.integration
def test_an_environment_without_dask_or_of_another_python_is_refused(tmp_path: Path) -> None:
    archive = venv_archive(tmp_path, dask=False)
    root = tmp_path / "software"
    with NodeCache(str(root)) as cache:
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(environment_of(archive, "nodask")), Source(archive))
        assert caught.value.reason == (
            "the environment 'nodask' lacks dask (No module named 'dask'): "
            "libraries need cloudpickle, dask, msgpack in it"
        )
        other = environment_of(archive, "other", python="3.10" if PYTHON != "3.10" else "3.11")
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(other), Source(archive))
        assert caught.value.reason == (
            f"the environment 'other' runs Python {PYTHON}, it was made for Python {other.python}"
        )
    assert left_in(root) == {"env": [], "code": [], "archives": []}


@pytest.mark.integration
def test_a_venv_archive_is_used_where_it_lands(tmp_path: Path) -> None:
    """A venv-pack-like archive: its interpreter a link to the node's own base Python;
    its conda-unpack (as conda-pack's archives have) runs in the environment's place."""
    archive = venv_archive(tmp_path, conda_unpack=True)
    zipped = tmp_path / "code.zip"
    with zipfile.ZipFile(zipped, "w") as opened:
        opened.writestr("mymodule.py", "ANSWER = 42\n")
    software = software_of(environment_of(archive, "venv"), code_of(zipped, "mymodule"))
    with NodeCache(str(tmp_path / "software")) as cache:
        prepared = cache.prepare(software, Source(archive, zipped))
    place = tmp_path / "software" / "env" / sha256(archive)
    assert prepared.pythonpath == (str(tmp_path / "software" / "code" / sha256(zipped)),)
    done = subprocess.run(
        [
            prepared.python,
            "-c",
            "import sys, cloudpickle as c, mymodule as m; print(sys.prefix, c.__file__, m.ANSWER)",
        ],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": os.pathsep.join(prepared.pythonpath),
            **prepared.env,
        },
        capture_output=True,
        text=True,
        check=True,
    )
    prefix, module, answer = done.stdout.split()
    assert prefix == str(place) and module.startswith(str(place)) and answer == "42"
    assert (place / "unpacked-at").read_text() == f"{place} {place}"


def test_a_prepare_waits_for_the_worker_preparing_at_most_its_timeout(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "env.tar.gz", {"bin/python3": (b"#!/bin/sh\n", 0o755)})
    environment = environment_of(archive, "local")
    root = tmp_path / "software"
    cache = NodeCache(str(root))
    with open(root / "locks" / f"{environment.key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another worker is unpacking it
        with pytest.raises(SoftwareUnfit) as caught:
            cache.prepare(software_of(environment), Source(archive), timeout=0.2)
    assert caught.value.reason == (
        "waited 0.2 s for another worker of this node to prepare the environment 'local'"
    )
    cache.close()


def test_leftovers_of_a_worker_that_died_unpacking_are_removed(tmp_path: Path) -> None:
    archive = tmp_path / "code.zip"
    with zipfile.ZipFile(archive, "w") as opened:
        opened.writestr("mymodule.py", "")
    code = code_of(archive, "mymodule")
    root = tmp_path / "software"
    NodeCache(str(root)).close()
    (root / "code" / f".{code.key}.999999.tmp" / "half").mkdir(parents=True)
    (root / "code" / code.key).mkdir()  # renamed, never marked complete
    (root / "archives" / f"{code.key}.part").write_bytes(b"half")
    with NodeCache(str(root)) as cache:
        cache.prepare(software_of(code=code), Source(archive))
    assert left_in(root) == {"env": [], "code": [code.key], "archives": [code.key]}
    assert sorted(os.listdir(root / "code" / code.key)) == [".complete", ".size", "mymodule.py"]


# -- unpacking safely --------------------------------------------------------------------


@pytest.mark.parametrize("filters", [True, False], ids=["tar-filter", "own-check"])
@pytest.mark.parametrize(
    "members",
    [
        [("../evil", tarfile.REGTYPE, "")],
        [("dir/../../evil", tarfile.REGTYPE, "")],
        [("lib", tarfile.SYMTYPE, "/etc"), ("lib/evil", tarfile.REGTYPE, "")],
        [("hard", tarfile.LNKTYPE, "../../etc/passwd")],
    ],
    ids=["dotdot", "inner-dotdot", "through-a-link", "hard-link-out"],
)
def test_members_leaving_the_directory_are_refused(
    tmp_path: Path, filters: bool, members: list[tuple[str, bytes, str]]
) -> None:
    if filters and not hasattr(tarfile, "tar_filter"):
        pytest.skip("this Python's tarfile has no filters")
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    with tarfile.open(archive) as tar, pytest.raises(tarfile.TarError):
        node_cache._extract(tar, str(tmp_path / "out"), filters=filters)
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("filters", [True, False], ids=["tar-filter", "own-check"])
def test_an_absolute_name_lands_inside(tmp_path: Path, filters: bool) -> None:
    if filters and not hasattr(tarfile, "tar_filter"):
        pytest.skip("this Python's tarfile has no filters")
    archive = tar_with(tmp_path / "env.tar.gz", {f"{tmp_path}/evil": (b"x", 0o644)})
    with tarfile.open(archive) as tar:
        node_cache._extract(tar, str(tmp_path / "out"), filters=filters)
    assert (tmp_path / "out" / str(tmp_path).lstrip("/") / "evil").read_bytes() == b"x"
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("filters", [True, False], ids=["tar-filter", "own-check"])
def test_absolute_symbolic_links_inside_an_environment_are_kept(
    tmp_path: Path, filters: bool
) -> None:
    if filters and not hasattr(tarfile, "tar_filter"):
        pytest.skip("this Python's tarfile has no filters")
    archive = tmp_path / "env.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("bin/python3")
        info.type, info.linkname = tarfile.SYMTYPE, sys.executable
        tar.addfile(info)
        info = tarfile.TarInfo("bin/tool")
        info.size, info.mode = 3, 0o4777
        tar.addfile(info, io.BytesIO(b"abc"))
    with tarfile.open(archive) as tar:
        node_cache._extract(tar, str(tmp_path / "out"), filters=filters)
    assert os.readlink(tmp_path / "out" / "bin" / "python3") == sys.executable
    assert (tmp_path / "out" / "bin" / "tool").stat().st_mode & 0o7777 == 0o755


# -- least recently used, never in use ---------------------------------------------------


def test_the_least_recently_used_entry_not_in_use_is_evicted(tmp_path: Path) -> None:
    archives = []
    for index in range(3):
        archive = tmp_path / f"code{index}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as opened:
            opened.writestr(f"module{index}.py", os.urandom(100_000))
        archives.append(archive)
    codes = [code_of(archive, f"module{index}") for index, archive in enumerate(archives)]
    softwares = [software_of(code=code) for code in codes]
    source = Source(*archives)
    root = tmp_path / "software"
    limit = 500_000  # two entries (zip and unzipped: about 200 kB each), not three
    other = NodeCache(str(root), limit=limit)  # another worker of the node
    cache = NodeCache(str(root), limit=limit)

    def used(index: int, seconds_ago: float) -> None:
        marker = root / "code" / codes[index].key / ".complete"
        os.utime(marker, (time.time() - seconds_ago,) * 2)

    other.prepare(softwares[0], source)  # the oldest, and in use by the other worker
    used(0, 100)
    cache.prepare(softwares[1], source)
    used(1, 50)
    cache.release(softwares[1].key)
    cache.prepare(softwares[2], source)  # over the limit: the oldest not in use goes
    assert left_in(root)["code"] == sorted([codes[0].key, codes[2].key])
    assert left_in(root)["archives"] == sorted([codes[0].key, codes[2].key])
    assert cache.archive_path(codes[1].key) is None

    # all in use: over the limit, nothing goes; released, the oldest goes
    cache.prepare(softwares[1], source)
    assert len(left_in(root)["code"]) == 3
    assert cache.evict() == []
    other.close()
    used(0, 200)
    assert cache.evict() == [codes[0].key]
    assert left_in(root)["code"] == sorted([codes[1].key, codes[2].key])
    assert source.calls == [codes[0].key, codes[1].key, codes[2].key, codes[1].key]
    cache.close()


def test_the_default_root_is_node_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DASKVINE_PY_SOFTWARE_CACHE", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # a node's local scratch
    monkeypatch.setattr(node_cache.tempfile, "tempdir", None)
    root = node_cache.default_root()
    assert root == f"{tmp_path}/daskvine_py-{os.getuid()}/software"
    NodeCache(root).close()
    os.chmod(os.path.dirname(root), 0o777)  # anyone could have put an environment there
    with pytest.raises(PermissionError, match="DASKVINE_PY_SOFTWARE_CACHE"):
        NodeCache(root)
    monkeypatch.setenv("DASKVINE_PY_SOFTWARE_CACHE", "/var/cache/mine")
    assert node_cache.default_root() == "/var/cache/mine"


# -- requirements built with uv ----------------------------------------------------------


def wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel, written by hand (no build backend needed)."""
    info = f"{name}-{version}.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as opened:
        for name_, text in contents.items():
            opened.writestr(name_, text)
        opened.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cloudpickle's wheel (downloaded: PyPI) and a stand-in dask's, in one directory."""
    if node_cache._find_uv() is None:
        pytest.skip("uv is not installed (pip install uv)")
    directory = tmp_path_factory.mktemp("wheels")
    msgpack_version = importlib.metadata.version("msgpack")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         "--dest", str(directory), f"cloudpickle=={cloudpickle.__version__}",
         f"msgpack=={msgpack_version}"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"could not download cloudpickle's wheel: {done.stderr.strip()[-300:]}")
    wheel(directory, "dask", "0.0.0", {"dask/__init__.py": DASK_STUB})
    return directory


def requirements(text: str, name: str = "requirements.txt") -> Environment:
    key = hashlib.sha256(f"{text}\0{PYTHON}".encode()).hexdigest()
    return Environment(REQUIREMENTS, key, 0, name, PYTHON, "", "", requirements=text)


@pytest.fixture
def offline(wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv finds packages in the local wheel directory only (the user's index settings
    reach it through the worker's environment)."""
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


@pytest.mark.integration
@pytest.mark.usefixtures("offline")
def test_requirements_are_built_with_uv_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = requirements("cloudpickle\ndask\nmsgpack\n")
    root = tmp_path / "software"
    with NodeCache(str(root)) as cache:
        prepared = cache.prepare(software_of(environment), Source())
    place = root / "env" / environment.key
    assert cache.built == [environment.key]
    assert prepared.python == str(place / "bin" / "python3")
    assert prepared.env == {"VIRTUAL_ENV": str(place)}
    assert (place / "requirements.txt").read_text() == "cloudpickle\ndask\nmsgpack\n"
    done = subprocess.run(
        [prepared.python, "-c", "import cloudpickle; print(cloudpickle.__file__)"],
        env={"PATH": os.environ["PATH"], **prepared.env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith(str(place))

    # another worker, or this one restarted: ready, uv not run again (it could not be)
    monkeypatch.setattr(node_cache, "_find_uv", lambda: None)
    with NodeCache(str(root)) as again:
        assert again.prepare(software_of(environment), Source()) == prepared
        assert again.built == []


@pytest.mark.integration
@pytest.mark.usefixtures("offline")
def test_uv_failing_is_refused_with_its_words(tmp_path: Path) -> None:
    environment = requirements("cloudpickle\nno-such-package-anywhere\n")
    root = tmp_path / "software"
    with NodeCache(str(root)) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(environment), Source())
    assert caught.value.reason.startswith(
        "uv (building the environment 'requirements.txt') failed on this node: "
    )
    assert "no-such-package-anywhere" in caught.value.reason
    assert left_in(root)["env"] == []


@pytest.mark.integration
@pytest.mark.usefixtures("offline")
def test_a_pylock_file_is_built_with_uv(tmp_path: Path) -> None:
    uv = node_cache._find_uv()
    assert uv is not None
    (tmp_path / "requirements.in").write_text("cloudpickle\ndask\nmsgpack\n")
    done = subprocess.run(
        [uv, "pip", "compile", "requirements.in", "--format", "pylock.toml", "-o", "pylock.toml",
         "--python-version", PYTHON],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"this uv writes no pylock.toml: {done.stderr.strip()[-200:]}")
    environment = requirements((tmp_path / "pylock.toml").read_text(), "pylock.toml")
    with NodeCache(str(tmp_path / "software")) as cache:
        prepared = cache.prepare(software_of(environment), Source())
    place = tmp_path / "software" / "env" / environment.key
    assert (place / "pylock.toml").is_file()
    assert prepared.python == str(place / "bin" / "python3")


def test_requirements_without_uv_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_cache, "_find_uv", lambda: None)
    with NodeCache(str(tmp_path / "software")) as cache, pytest.raises(SoftwareUnfit) as caught:
        cache.prepare(software_of(requirements("cloudpickle\n")), Source())
    assert caught.value.reason == (
        "building the environment 'requirements.txt' needs uv on this node: pip install uv"
    )
    assert left_in(tmp_path / "software")["env"] == []
