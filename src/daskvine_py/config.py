"""The ``daskvine_py`` section of ``dask.config``: a default for every option and setting.

``daskvine_py.yaml`` (next to this module) ships the built-in defaults; importing this
module registers them with ``dask.config.update_defaults``, as distributed does with its
own, so anything the user set the ways Dask reads its config wins over them:
``dask.config.set``, YAML files in Dask's config directories and ``DASK_DASKVINE_PY__...``
environment variables. An explicit argument wins over all of these.

- ``daskvine_py.get.<option>``: the options of ``Manager.get`` (``RunOptions``);
- ``daskvine_py.manager.<setting>``: the settings of ``Manager(...)`` (``ManagerOptions``).

Names may use ``-`` or ``_``, as everywhere in Dask's config. A name that is not an
option, or a value an option refuses, is a ``ValueError`` naming the config key.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import dask.config
import yaml

from daskvine_py.options import ManagerOptions, RunOptions

#: The file of built-in defaults, shipped with the package.
DEFAULTS_FILE = pathlib.Path(__file__).with_name("daskvine_py.yaml")

with open(DEFAULTS_FILE) as _file:
    DEFAULTS: dict[str, Any] = yaml.safe_load(_file)

dask.config.update_defaults(DEFAULTS)

_SECTIONS = {"get": RunOptions, "manager": ManagerOptions}
_NAMES = {name: frozenset(f.name for f in fields(kind)) for name, kind in _SECTIONS.items()}
_RUN_NAMES = _NAMES["get"]
#: ``daskvine_py.get`` as shipped: a config equal to it needs no check, name by name
_GET = DEFAULTS["daskvine_py"]["get"]


def section(name: str) -> dict[str, Any]:
    """``daskvine_py.<name>`` as it is now, names with ``_``."""
    top = dask.config.get("daskvine_py", default=None) or {}
    for key in top:
        if str(key) not in _SECTIONS:
            where = "get" if str(key).replace("-", "_") in _RUN_NAMES else "manager"
            raise ValueError(
                f"dask.config 'daskvine_py.{key}' is not a section of daskvine_py: options "
                f"go in 'daskvine_py.get', settings in 'daskvine_py.manager' (here, "
                f"'daskvine_py.{where}.{key}'?)"
            )
    found = top.get(name) or {}
    if not isinstance(found, Mapping):
        raise ValueError(f"dask.config 'daskvine_py.{name}' must be a mapping, not {found!r}")
    known = _NAMES[name]
    values = {}
    for key, value in found.items():
        option = str(key).replace("-", "_")
        if option not in known:
            raise ValueError(
                f"dask.config 'daskvine_py.{name}.{key}' is not a setting of daskvine_py; "
                f"'daskvine_py.{name}' takes {sorted(known)}"
            )
        values[option] = value
    return values


def run_options(kwargs: Mapping[str, Any]) -> RunOptions:
    """The options of one ``get``: its arguments, else ``daskvine_py.get``."""
    top = dask.config.get("daskvine_py", default=None)
    if isinstance(top, Mapping) and top.keys() <= _SECTIONS.keys() and top.get("get") == _GET:
        return RunOptions.from_kwargs(kwargs)  # nothing set: the records' own defaults
    configured = section("get")
    if configured == _GET:
        return RunOptions.from_kwargs(kwargs)
    try:
        defaults = RunOptions(**configured)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"dask.config 'daskvine_py.get': {exc}") from None
    return RunOptions.from_kwargs(kwargs, defaults)


def manager_options(
    host: str | None, port: int | None, settings: Mapping[str, Any]
) -> ManagerOptions:
    """The settings of a ``Manager``: its arguments, else ``daskvine_py.manager``."""
    values = section("manager")
    given = dict(settings)
    if host is not None:
        given["host"] = host
    if port is not None:
        given["port"] = port
    unknown = set(given) - {f.name for f in fields(ManagerOptions)}
    if unknown:
        raise TypeError(f"Manager() got unknown setting(s) {sorted(unknown)}")
    configured = {k: v for k, v in values.items() if k not in given}
    try:
        return ManagerOptions(**{**configured, **given})
    except (TypeError, ValueError) as exc:
        from_config = {
            k: v for k, v in configured.items() if v != DEFAULTS["daskvine_py"]["manager"][k]
        }
        if not from_config:
            raise
        raise ValueError(f"{exc} (with dask.config 'daskvine_py.manager': {from_config})") from exc
