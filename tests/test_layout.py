"""What docs/architecture.md says about the modules, checked against their source."""

from __future__ import annotations

import ast
from pathlib import Path

import daskvine_py

PACKAGE = Path(daskvine_py.__file__).parent


def _imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports, anywhere in it (functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_the_modules_that_import_dask_are_the_ones_the_architecture_lists():
    importing = {path.stem for path in PACKAGE.glob("*.py") if "dask" in _imports(path)}
    # docs/architecture.md, "Only graph.py, rewrite.py, cache_walk.py, cache_keys.py, config.py,
    # callbacks.py, manager.py, local.py and library.py import dask"
    assert importing == {
        "graph",
        "rewrite",
        "cache_walk",
        "cache_keys",
        "config",
        "callbacks",
        "manager",
        "local",
        "library",
    }
