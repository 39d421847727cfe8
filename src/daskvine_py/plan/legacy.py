"""Light legacy tasks, read as they are: ``LegacyCall``.

Legacy tasks whose arguments are all keys or scalars (``(inc, ("x", 1))``, the bulk of a
big hand-built graph) are not converted: building a ``Task`` costs several microseconds,
which for 10^5 tasks is seconds before the first task can run. They become ``LegacyCall``
objects, which hold the original tuple and run it the way its ``Task`` would
(``graph.convert`` makes Dask's own node of every other value).

Below ``graph`` and ``rewrite``, which both tell these tasks apart. Pure: no sockets, no
processes, no dask.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Mapping
from typing import Any

Key = Hashable


class LegacyCall:
    """A legacy task ``(func, *args)`` whose arguments are keys or scalars, unconverted.

    Called with its inputs by key, it calls ``func`` with each argument that is a key
    replaced by that input: what ``convert_legacy_task`` would build, without building
    it. ``light_dependencies`` decides which tasks qualify and finds ``dependencies``.
    """

    __slots__ = ("task", "dependencies")
    # Pickled as ``daskvine_py.LegacyCall`` (the package gives it lazily): a payload per
    # task names it, and the short module saves bytes on each (as ``resident``'s does).
    __module__ = "daskvine_py"

    def __init__(
        self, task: tuple[Any, ...], dependencies: frozenset[Key] | tuple[int, ...]
    ) -> None:
        self.task = task
        if type(dependencies) is tuple:  # unpickled: the positions of the keys in ``task``
            dependencies = frozenset([task[i] for i in dependencies]) if dependencies else NO_KEYS
        self.dependencies = dependencies

    def __call__(self, values: Mapping[Key, Any]) -> Any:
        task = self.task
        if not self.dependencies:
            return task[0](*task[1:])
        deps = self.dependencies
        return task[0](*[values[arg] if arg in deps else arg for arg in task[1:]])

    def __reduce__(self) -> tuple[Any, ...]:
        # The keys are in the task already: their positions are a few bytes (a payload
        # per task, 10^6 of them in a big graph), the keys again dozens.
        deps = self.dependencies
        positions = (
            tuple([i for i, arg in enumerate(self.task) if i and arg in deps]) if deps else ()
        )
        return (LegacyCall, (self.task, positions))

    def __repr__(self) -> str:
        return f"LegacyCall({self.task!r})"


#: The dependencies of every task that has none: one object, not one per leaf (216 bytes).
NO_KEYS: frozenset[Key] = frozenset()

#: Scalar argument types that ``convert_legacy_task`` checks against the graph's keys...
_KEY_SCALARS = frozenset({int, float, str, bool})
#: ...and scalars it passes through as they are.
_PLAIN_SCALARS = frozenset({bytes, type(None)})


def light_dependencies(value: Any, keys: Container[Key]) -> frozenset[Key] | None:
    """The dependencies of a legacy task made of keys and scalars; None for anything else.

    Exact types only: a subclass, a container, a dict or a nested task may mean something
    else to Dask, so those tasks are converted by Dask itself.
    """
    if type(value) is not tuple or not value or not callable(value[0]):
        return None
    deps = []
    for arg in value[1:]:
        kind = type(arg)
        if kind in _KEY_SCALARS:
            if arg in keys:
                deps.append(arg)
        elif kind is tuple:
            try:
                if arg not in keys:
                    return None  # a literal tuple, or a nested task
            except TypeError:  # unhashable inside
                return None
            deps.append(arg)
        elif kind not in _PLAIN_SCALARS:
            return None
    return frozenset(deps) if deps else NO_KEYS
