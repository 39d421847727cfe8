"""The caller's side of software (issue 39): environments packed, read and described by
content (``software.pack``), and the caller's own modules zipped (``software.code``)."""

from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daskvine_py.software import code, pack, spec
from daskvine_py.software.spec import ARCHIVE, REQUIREMENTS

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _site(root: Path, packages: tuple[str, ...] = ("dvtestpkg",)) -> Path:
    """A site-packages directory holding tiny packages (no interpreter is started)."""
    site_dir = root / "lib" / f"python{PYTHON}" / "site-packages"
    for name in packages:
        (site_dir / name).mkdir(parents=True)
        (site_dir / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    return site_dir


def _extract(archive: str, destination: Path) -> None:
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(destination, filter="tar")
        else:  # before 3.11.4
            tar.extractall(destination)


@pytest.fixture
def no_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packs without the interpreter and its standard library (100 MB, a second to
    pack): for tests of keys and of the cache, which do not run what they pack."""
    monkeypatch.setattr(pack, "_write_base", lambda writer, base_prefix: None)


@pytest.fixture
def fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process remembers, as a new process would."""
    monkeypatch.setattr(pack, "_LOCAL_PACKS", {})
    monkeypatch.setattr(pack, "_ARCHIVES", {})
    monkeypatch.setattr(code, "_ARCHIVER", code._Archiver())


# -- "local" ----------------------------------------------------------------------------


@pytest.mark.integration
def test_a_packed_venv_runs_where_it_is_unpacked(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    base_python = pack.base_interpreter(sys.base_prefix)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_dir = venv / "lib" / f"python{PYTHON}" / "site-packages"
    (site_dir / "dvtestpkg").mkdir()
    (site_dir / "dvtestpkg" / "__init__.py").write_text("NAME = 'dvtestpkg'\n")

    output = str(tmp_path / "venv.tar.gz")
    packed = pack.pack_prefix(str(venv), sys.base_prefix, [str(site_dir)], output)
    assert packed.key == _sha256(output)
    assert packed.size == os.path.getsize(output)

    unpacked = tmp_path / "elsewhere" / "env"
    _extract(output, unpacked)
    names = {path.relative_to(unpacked).as_posix() for path in unpacked.rglob("*")}
    assert f"bin/python{PYTHON}" in names and "bin/python3" in names
    assert f"lib/python{PYTHON}/site-packages/dvtestpkg/__init__.py" in names
    assert f"lib/python{PYTHON}/os.py" in names
    assert f"lib/python{PYTHON}/lib-dynload" in names
    for left_out in ("test", "idlelib", "tkinter", "turtledemo", "ensurepip"):
        assert f"lib/python{PYTHON}/{left_out}" not in names

    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LD_LIBRARY_PATH": str(unpacked / "lib"),
    }
    out = subprocess.run(
        [
            str(unpacked / "bin" / f"python{PYTHON}"),
            "-c",
            "import dvtestpkg, json, sys; print(dvtestpkg.NAME); print(sys.prefix)",
        ],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    name, prefix = out.stdout.split()
    assert name == "dvtestpkg"
    assert os.path.realpath(prefix) == os.path.realpath(unpacked)


def test_an_unchanged_environment_is_a_hit_and_a_new_package_a_new_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memos: None, no_base: None
) -> None:
    prefix = tmp_path / "env"
    site_dir = _site(prefix)
    cache = str(tmp_path / "cache")
    args = (str(prefix), sys.base_prefix, [str(site_dir)])

    first, archive = pack.pack_environment(*args, cache_dir=cache)
    assert first.kind == ARCHIVE and first.name == "local"
    assert first.key == _sha256(archive) and first.size == os.path.getsize(archive)
    assert (first.python, first.interpreter) == (PYTHON, f"bin/python{PYTHON}")
    assert (first.machine, first.glibc) == (platform.machine(), spec.glibc())
    written = os.stat(archive).st_mtime_ns

    # in this process, and in a new one (the cache directory's sidecar)
    assert pack.pack_environment(*args, cache_dir=cache) == (first, archive)
    monkeypatch.setattr(pack, "_LOCAL_PACKS", {})
    assert pack.pack_environment(*args, cache_dir=cache) == (first, archive)
    assert os.stat(archive).st_mtime_ns == written

    key = pack.local_key(*args)
    (site_dir / "dvother").mkdir()
    (site_dir / "dvother" / "__init__.py").write_text("")
    assert pack.local_key(*args) != key

    monkeypatch.setattr(pack, "KEEP_LOCAL", 1)
    second, second_archive = pack.pack_environment(*args, cache_dir=cache)
    assert second_archive != archive and second.key != first.key
    assert not os.path.exists(archive), "only the newest pack is kept"
    with tarfile.open(second_archive) as tar:
        assert f"lib/python{PYTHON}/site-packages/dvother/__init__.py" in tar.getnames()


def test_the_key_follows_what_an_install_changes(tmp_path: Path) -> None:
    prefix = tmp_path / "env"
    site_dir = _site(prefix)
    args = (str(prefix), sys.base_prefix, [str(site_dir)])
    keys = {pack.local_key(*args)}

    record = site_dir / "dvtestpkg-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("dvtestpkg/__init__.py,,\n")
    keys.add(pack.local_key(*args))
    os.utime(record, ns=(1, 1))  # reinstalled: RECORD rewritten
    keys.add(pack.local_key(*args))
    (site_dir / "extra.pth").write_text("/somewhere\n")
    keys.add(pack.local_key(*args))
    (site_dir / "extra.pth").write_text("/elsewhere\n")
    keys.add(pack.local_key(*args))
    assert len(keys) == 5
    assert pack.local_key(*args) in keys  # nothing changed: the same key


def test_local_is_the_running_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memos: None, no_base: None
) -> None:
    site_dir = _site(tmp_path / "env")
    monkeypatch.setattr(pack, "local_site_dirs", lambda: [str(site_dir)])
    environment, archive = pack.environment_of("local", cache_dir=str(tmp_path / "cache"))
    assert archive is not None and archive.startswith(str(tmp_path / "cache" / "environments"))
    assert environment.key == _sha256(archive)
    assert (environment.name, environment.python) == ("local", PYTHON)
    assert spec.unfit(environment, spec.node_facts()) is None
    with tarfile.open(archive) as tar:
        assert f"lib/python{PYTHON}/site-packages/dvtestpkg/__init__.py" in tar.getnames()


def test_local_site_dirs_are_the_active_ones() -> None:
    dirs = pack.local_site_dirs()
    assert dirs and all(os.path.isdir(path) for path in dirs)
    real_path = [os.path.realpath(entry) for entry in sys.path if entry]
    assert all(path in real_path for path in dirs)


# -- a user's archive --------------------------------------------------------------------


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_users_archive_is_keyed_by_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memos: None
) -> None:
    archive = _tar(
        tmp_path / "env.tar.gz",
        {"lib/python3.12/os.py": b"", "bin/python3.12": b"\x7fELF", "bin/python3": b""},
    )
    cache = str(tmp_path / "cache")
    environment, path = pack.environment_of(archive, cache_dir=cache)
    assert path == str(archive)
    assert environment.kind == ARCHIVE and environment.name == str(archive)
    assert environment.key == _sha256(archive)
    assert environment.size == archive.stat().st_size
    assert (environment.python, environment.interpreter) == ("3.12", "bin/python3.12")
    assert (environment.machine, environment.glibc) == (platform.machine(), spec.glibc())

    # unchanged: not read again, in this process or the next (the sidecar)
    def unread(path: str, name: str) -> tuple[str, int, str, str]:
        raise AssertionError("an unchanged archive was read again")

    monkeypatch.setattr(pack, "_read_archive", unread)
    assert pack.environment_of(archive, cache_dir=cache)[0] == environment
    monkeypatch.setattr(pack, "_ARCHIVES", {})
    assert pack.environment_of(archive, cache_dir=cache)[0] == environment
    monkeypatch.undo()

    _tar(archive, {"lib/python3.12/os.py": b"changed", "bin/python3.12": b"\x7fELF"})
    os.utime(archive, ns=(10**18, 10**18))
    rebuilt, _ = pack.environment_of(archive, cache_dir=cache)
    assert rebuilt.key == _sha256(archive) != environment.key


def test_an_archive_says_its_python_from_its_members(tmp_path: Path, fresh_memos: None) -> None:
    cache = str(tmp_path / "cache")
    plain = _tar(tmp_path / "env.tar", {"./lib/python3.10/site-packages/x.py": b"x"}, "w")
    environment, _ = pack.environment_of(str(plain), cache_dir=cache)
    assert (environment.python, environment.interpreter) == ("3.10", "")
    assert environment.key == _sha256(plain)

    nested = _tar(tmp_path / "env.tgz", {"myenv/bin/python3.13": b"", "myenv/lib/python3.13/": b""})
    environment, _ = pack.environment_of(str(nested), cache_dir=cache)
    assert (environment.python, environment.interpreter) == ("3.13", "myenv/bin/python3.13")

    nothing = _tar(tmp_path / "data.tar.gz", {"README": b"no python here"})
    environment, _ = pack.environment_of(str(nothing), cache_dir=cache)
    assert (environment.python, environment.interpreter) == ("", "")


def test_what_is_not_an_environment_is_refused_by_name(tmp_path: Path) -> None:
    missing = tmp_path / "missing.tar.gz"
    with pytest.raises(ValueError, match="missing.tar.gz") as raised:
        pack.environment_of(missing, cache_dir=str(tmp_path))
    assert "local" in str(raised.value)  # what is accepted

    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"this is no archive at all" * 100)
    with pytest.raises(ValueError, match="garbage.tar.gz"):
        pack.environment_of(garbage, cache_dir=str(tmp_path))

    other = tmp_path / "env.zip"
    other.write_bytes(b"PK")
    with pytest.raises(ValueError, match="env.zip"):
        pack.environment_of(other, cache_dir=str(tmp_path))

    with pytest.raises(ValueError, match="requirements.txt"):
        pack.environment_of(tmp_path / "requirements.txt")


# -- requirements ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["requirements.txt", "requirements-dev.in", "pylock.toml", "pylock.run.toml"]
)
def test_a_requirements_file_travels_as_text(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("msgpack>=1.0\n")
    environment, archive = pack.environment_of(path)
    assert archive is None
    assert environment.kind == REQUIREMENTS and environment.name == str(path)
    assert environment.requirements == "msgpack>=1.0\n"
    assert (environment.python, environment.machine, environment.glibc) == ("", "", "")
    assert environment.size == 0

    path.write_text("msgpack>=1.0\ncloudpickle\n")
    changed, _ = pack.environment_of(path)
    assert changed.key != environment.key
    assert changed.requirements == "msgpack>=1.0\ncloudpickle\n"


# -- the caller's code -------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project of the caller's on ``sys.path``: a module and a package, imported."""
    root = tmp_path / "project"
    package = root / "mypkg"
    (package / "__pycache__").mkdir(parents=True)
    (root / "analysis.py").write_text("def f(x):\n    return x + 1\n")
    (package / "__init__.py").write_text("from mypkg.sub import g\n")
    (package / "sub.py").write_text("def g(x):\n    return 2 * x\n")
    (package / "data.json").write_text('{"a": 1}\n')
    (package / ".hidden").write_text("secret\n")
    (package / "__pycache__" / "sub.cpython-311.pyc").write_bytes(b"\0")
    (root / "nspace").mkdir()  # a namespace package's portion
    (root / "nspace" / "part.py").write_text("H = 3\n")
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        __import__("analysis")
        __import__("mypkg.sub")
        __import__("nspace.part")
        yield root
    finally:
        sys.path.remove(str(root))
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _zip_files(path: str) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_callers_modules_travel_and_nothing_of_the_environment(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memos: None
) -> None:
    cache = str(tmp_path / "cache")
    found = code.code_archive(code.default_roots(), cache_dir=cache)
    assert found is not None
    described, path = found
    assert path == os.path.join(cache, "code", f"{described.key}.zip")
    assert described.key == _sha256(path) and described.size == os.path.getsize(path)
    assert {"analysis", "mypkg", "nspace"} <= set(described.modules)

    files = _zip_files(path)
    assert files["analysis.py"] == (project / "analysis.py").read_bytes()
    for name in ("mypkg/__init__.py", "mypkg/sub.py", "mypkg/data.json", "nspace/part.py"):
        assert files[name] == (project / name).read_bytes()
    assert "mypkg/.hidden" not in files
    assert not any("__pycache__" in name for name in files)
    tops = {name.split("/")[0] for name in files}
    for environment_module in ("daskvine_py", "json", "os.py", "pytest", "_pytest", "zmq"):
        assert environment_module not in tops
    assert "daskvine_py" not in described.modules

    # unchanged: the same archive; the same files from scratch: the same bytes
    assert code.code_archive(code.default_roots(), cache_dir=cache) == found
    monkeypatch.setattr(code, "_ARCHIVER", code._Archiver())
    assert code.code_archive(code.default_roots(), cache_dir=cache) == found

    module = project / "analysis.py"
    module.write_text("def f(x):\n    return x + 2\n")
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = code.code_archive(code.default_roots(), cache_dir=cache)
    assert changed is not None and changed[0].key != described.key
    assert _zip_files(changed[1])["analysis.py"] == module.read_bytes()
    assert os.path.exists(path), "earlier archives are kept"


def test_a_name_the_environment_holds_does_not_travel(
    project: Path, tmp_path: Path, fresh_memos: None
) -> None:
    roots = (*code.default_roots(), str(project))
    found = code.code_archive(roots, cache_dir=str(tmp_path / "cache"))
    if found is not None:
        assert not {"analysis", "mypkg"} & set(found[0].modules)


def test_no_modules_of_the_callers_no_archive(tmp_path: Path, fresh_memos: None) -> None:
    assert code.code_archive([os.sep], cache_dir=str(tmp_path)) is None
