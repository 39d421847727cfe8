"""What docs/architecture.md says about the packages, checked against their source."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import daskvine_py

PACKAGE = Path(daskvine_py.__file__).parent
ROOT = PACKAGE.parent.parent


def _imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports, anywhere in it (functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def test_the_modules_that_import_dask_are_the_ones_the_architecture_lists():
    importing = {_module(path) for path in PACKAGE.rglob("*.py") if "dask" in _imports(path)}
    # docs/architecture.md, "Who imports dask"
    assert importing == {
        "plan.graph",
        "plan.rewrite",
        "cache.walk",
        "cache.keys",
        "config",
        "manager.callbacks",
        "demo",
        "__main__",
        "worker.measure",
    }


def test_every_package_says_what_it_owns_and_what_it_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, init


@pytest.mark.integration
@pytest.mark.skipif(
    not (ROOT / "pyproject.toml").exists()
    or shutil.which("lint-imports") is None
    and not (Path(sys.prefix) / "bin" / "lint-imports").exists(),
    reason="an installed copy, or no import-linter",
)
def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.prefix) / "bin" / "lint-imports")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def _imported_modules(path: Path) -> set[str]:
    """The package's modules ``path`` imports, anywhere in it, as dotted names."""
    package = _module(path).split(".")[:-1]  # (of an __init__ too: its own package)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(["daskvine_py", *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("daskvine_py."):
                dotted = name.removeprefix("daskvine_py.")
                if (PACKAGE / dotted.replace(".", "/")).with_suffix(".py").exists():
                    found.add(dotted)
    return found


def test_no_module_imports_itself_through_others():
    """No import circle, not even one that only type checkers follow."""
    graph = {_module(path): _imported_modules(path) for path in PACKAGE.rglob("*.py")}
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            circle = trail[trail.index(module) :] + [module]
            raise AssertionError("import circle: " + " -> ".join(circle))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
