"""Dask annotations: what each graph form carries, and the settings they make per task.

``dask.annotate(...)`` marks the layers built inside it; what reaches a scheduler depends
on the graph form Dask hands it (the table per collection is in ``docs/dask-knobs.md``,
"What reaches the scheduler"):

- a ``HighLevelGraph`` (dask before 2025.4): each layer's ``annotations``, a value or a
  function of the key, for every key of the layer;
- an expression (dask 2025.4 on): ``__dask_annotations__()``, which Dask fills from the
  layers of the graphs the expression wraps, already as ``{annotation: {key: value}}``;
- a plain task mapping: nothing. Low-level fusion (on by default for arrays and bags)
  turns a graph into one, so annotations of fused collections never arrive, as with
  ``dask.distributed``.

Honoured: ``priority``, ``retries``, ``resources`` (``cores``, ``memory`` in MB),
``workers``, ``allow_other_workers`` and ``category`` (the name its memory is sized by,
instead of its key's prefix) for the scheduler, and ``cache`` (``uncached_keys``) for the
result cache, whose pass this package's pipeline runs; any other annotation is ignored.
Every reader here is pure, and costs a few attribute lookups per layer when nothing is
annotated.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

Key = Hashable

#: The annotations that mean something here; distributed's names and meanings.
HONOURED = ("priority", "retries", "resources", "workers", "allow_other_workers", "category")
#: What ``read`` keeps: those, and ``cache`` (``dask.annotate(cache=False)``: tasks the
#: result cache leaves alone), so that the graph's layers are read once for both.
READ = (*HONOURED, "cache")
#: What a task may ask for in ``resources``: task slots, MB of the worker's memory, GPUs.
RESOURCES = ("cores", "memory", "gpus")
MB = 2**20


@dataclass(frozen=True)
class Placement:
    """Where a task may run and what it holds there while it is processing.

    Tasks without one run anywhere and take one slot; a worker holds them beyond its
    slots (saturation). A task with one is placed only where it fits, and nothing else
    goes beyond that worker's slots while it is there (``scheduler.constraints``).
    """

    #: task slots it takes (a worker's ``--cores``, or its libraries' slots)
    cores: int = 1
    #: bytes of the worker's ``--memory`` it reserves (annotated in MB)
    memory: int = 0
    #: GPUs it takes, its own while it runs (a worker's ``--gpus``)
    gpus: int = 0
    #: names or host names of the workers it may run on; None: any
    workers: frozenset[str] | None = None
    #: ``allow_other_workers``: any worker will do while none of ``workers`` is connected
    loose: bool = False

    def describe(self) -> str:
        """What it asks for, in words, for error messages."""
        parts = [f"{self.cores} core{'s' if self.cores != 1 else ''}"]
        if self.memory:
            parts.append(f"{self.memory / MB:g} MB of memory")
        if self.gpus:
            parts.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")
        if self.workers is not None:
            parts.append(f"workers {sorted(self.workers)}")
            if self.loose:
                parts[-1] += " (or others while none of them is connected)"
        return ", ".join(parts)


@dataclass(frozen=True)
class RunSettings:
    """What a run's annotations ask of the scheduler, beyond priorities (which the
    manager folds into the plan's order)."""

    #: re-runs allowed per task after crashes or lost workers, overriding ``get(retries=)``
    retries: Mapping[Key, int]
    #: where each constrained task may run
    placements: Mapping[Key, Placement]
    #: one key per distinct placement, to check each against the workers and name it
    examples: Mapping[Placement, Key]
    #: the category each task is sized by (``scheduler.sizing``), when not its prefix
    categories: Mapping[Key, str] = field(default_factory=dict)


def read(dsk: Any) -> dict[str, dict[Key, Any]]:
    """The annotations ``dsk`` carries, as ``{annotation: {key: value}}``; {} for none.

    Of a ``HighLevelGraph``, only those in ``READ``; an expression hands over all of its own.
    """
    expression_annotations = getattr(dsk, "__dask_annotations__", None)
    if expression_annotations is not None and not isinstance(dsk, Mapping):
        return dict(expression_annotations() or {})
    layers = getattr(dsk, "layers", None)
    if not isinstance(layers, Mapping):
        return {}
    found: dict[str, dict[Key, Any]] = {}
    for layer in layers.values():
        annotations = getattr(layer, "annotations", None)
        if not annotations:
            continue
        for name, value in annotations.items():
            if name not in READ:
                continue
            per_key = found.setdefault(name, {})
            if callable(value):
                per_key.update((key, value(key)) for key in layer)
            else:
                per_key.update(dict.fromkeys(layer, value))
    return found


def annotated_keys(annotations: Mapping[str, Mapping[Key, Any]]) -> set[Key]:
    """The keys that carry an annotation honoured here."""
    keys: set[Key] = set()
    for name, per_key in annotations.items():
        if name in HONOURED:
            keys.update(per_key)
    return keys


def uncached_keys(annotations: Mapping[str, Mapping[Key, Any]]) -> set[Key]:
    """Keys that ``dask.annotate(cache=False)`` covers, of the annotations a graph carried
    (``Plan.annotations``): an expression's ``__dask_annotations__`` (blockwise fusion
    drops those of fused layers, as it does for distributed) or a ``HighLevelGraph``'s
    layers, read once with the graph (``read``)."""
    return {key for key, value in annotations.get("cache", {}).items() if value is False}


def annotated_off(dsk: Any) -> set[Key]:
    """``uncached_keys`` of the graph ``dsk`` itself (for tools: ``get`` reads a graph
    once, into its plan)."""
    try:
        found = read(dsk)
    except Exception:  # an expression that cannot say: as if it had none
        return set()
    return uncached_keys(found)


def settle(
    annotations: Mapping[str, Mapping[Key, Any]], keys: Iterable[Key]
) -> tuple[dict[Key, float], RunSettings | None]:
    """Validated settings for the tasks ``keys``: user priorities, and the rest.

    Raises ``ValueError`` naming the key and the annotation for a value that means
    nothing here (a priority that is not a number, a resource workers do not offer).
    """
    if not any(name in annotations for name in HONOURED):
        return {}, None
    wanted = keys if isinstance(keys, Mapping | set | frozenset) else set(keys)
    priorities = {
        key: _number(key, "priority", value)
        for key, value in annotations.get("priority", {}).items()
        if key in wanted and value is not None
    }
    retries = {
        key: _retries(key, value)
        for key, value in annotations.get("retries", {}).items()
        if key in wanted and value is not None
    }
    placements = _placements(annotations, wanted)
    categories = {
        key: _category(key, value)
        for key, value in annotations.get("category", {}).items()
        if key in wanted and value is not None
    }
    if not retries and not placements and not categories:
        return priorities, None
    examples: dict[Placement, Key] = {}
    for key, placement in placements.items():
        examples.setdefault(placement, key)
    return priorities, RunSettings(retries, placements, examples, categories)


def reprioritize(priorities: Mapping[Key, int], user: Mapping[Key, float]) -> dict[Key, int]:
    """Dask's order with user priorities first: higher runs first (as in distributed),
    Dask's order among equals. Ranks, so that they stay small integers."""
    ranked = sorted(priorities, key=lambda key: (-user.get(key, 0), priorities[key]))
    return {key: rank for rank, key in enumerate(ranked)}


def _placements(annotations: Mapping[str, Mapping[Key, Any]], wanted: Any) -> dict[Key, Placement]:
    resources = annotations.get("resources", {})
    workers = annotations.get("workers", {})
    loose = annotations.get("allow_other_workers", {})
    interned: dict[Placement, Placement] = {}  # one object per distinct placement
    placements: dict[Key, Placement] = {}
    for key in {*resources, *workers}:
        if key not in wanted:
            continue
        cores, memory, gpus = _resources(key, resources.get(key))
        names = _workers(key, workers.get(key))
        allow = loose.get(key, False)
        if not isinstance(allow, bool):
            raise ValueError(
                f"task {key!r}: allow_other_workers must be True or False, not {allow!r}"
            )
        placement = Placement(cores, memory, gpus, names, allow and names is not None)
        if placement != _ANYWHERE:
            placements[key] = interned.setdefault(placement, placement)
    return placements


_ANYWHERE = Placement()


def _resources(key: Key, value: Any) -> tuple[int, int, int]:
    if value is None:
        return 1, 0, 0
    if not isinstance(value, Mapping):
        raise ValueError(f"task {key!r}: resources must be a dict, not {value!r}")
    unknown = sorted(set(value) - set(RESOURCES), key=str)
    if unknown:
        raise ValueError(
            f"task {key!r} asks for resources {dict(value)!r}: daskvine_py workers offer "
            f"only cores, memory (MB) and gpus, not {', '.join(map(repr, unknown))}"
        )
    cores = _whole(key, "cores", value.get("cores", 1), 1)
    memory = _number(key, "resources['memory']", value.get("memory", 0))
    if memory < 0:
        raise ValueError(f"task {key!r}: resources['memory'] must be >= 0 MB, not {memory!r}")
    return cores, int(memory * MB), _whole(key, "gpus", value.get("gpus", 0), 0)


def _whole(key: Key, resource: str, value: Any, least: int) -> int:
    """A count of ``resources`` (2.0 is 2), at least ``least``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(
            f"task {key!r}: resources[{resource!r}] must be a whole number "
            f">= {least}, not {value!r}"
        )
    return value


def _workers(key: Key, value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else value
    try:
        names = frozenset(names)
    except TypeError:
        names = None
    if names is None or not all(isinstance(name, str) for name in names):
        raise ValueError(
            f"task {key!r}: workers must be a worker name or a list of them, not {value!r}"
        )
    return names or None


def _number(key: Key, name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"task {key!r}: the {name} annotation must be a number, not {value!r}")
    return cast(float, value)  # as it is: an int stays one


def _category(key: Key, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"task {key!r}: category must be a non-empty string, not {value!r}")
    return value


def _retries(key: Key, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"task {key!r}: retries must be a whole number >= 0, not {value!r}")
    return value
