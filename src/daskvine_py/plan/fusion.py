"""Linear chains of tasks become one task: a chain runs without a round trip per link.

A task whose only reader is the next task, whose only input is it, is a link of a chain:
nothing but that reader ever needs its result, and the reader cannot start before it.
Sending each link on its own costs a manager -> worker -> library round trip per link
and a state record per link on both sides, for no parallelism. ``fuse_chains`` hands up
to ``FUSE_LIMIT`` links to one worker as one task: a ``Chain`` that the library runs
link by link, passing each result straight to the next (one partition's pipeline, a
linear chain of ``inc``). The chain takes its last link's key, so its readers and the
outputs see nothing change; its first link's inputs are its inputs.

What a chain changes for users: it is one task to the scheduler (one retry, one
progress step, one line in the report, named by its last key); a link that raises is
named by its own key (``link_key``). Outputs and tasks read by several tasks are never
fused away. ``get(..., fuse=False)`` turns this off.

Pure graph code, like ``graph.py``: no sockets, no processes, no serialization.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Mapping
from typing import Any

Key = Hashable

#: Most links in one chain. Longer chains become several, one after the other: a lost
#: worker or a retry then repeats at most this many links, and progress still moves.
FUSE_LIMIT = 128

#: Attribute set on an exception raised by a link that is not the chain's last: the key
#: of that link, for the error the caller sees.
LINK_KEY = "_daskvine_py_link_key"


class Chain:
    """Links run in order, each reading the one before: one task for the scheduler."""

    __slots__ = ("links",)

    def __init__(self, links: list[tuple[Key, Any]]) -> None:
        #: [(key, node), ...]: the first reads the chain's inputs, each other the one before
        self.links = links

    @property
    def key(self) -> Key:
        return self.links[-1][0]

    @property
    def dependencies(self) -> frozenset[Key]:
        """The chain's inputs: its first link's."""
        return frozenset(self.links[0][1].dependencies)

    def __call__(self, values: Mapping[Key, Any]) -> Any:
        key = None
        try:
            for key, node in self.links:
                values = {key: node(values)}
        except BaseException as exc:
            if key != self.key:
                _blame(exc, key)
            raise
        return values[key]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Chain, (self.links,))

    def __repr__(self) -> str:
        return f"Chain({len(self.links)} links, {self.links[0][0]!r} .. {self.key!r})"


def _blame(exc: BaseException, key: Key) -> None:
    try:
        setattr(exc, LINK_KEY, key)
    except Exception:  # an exception type that takes no attributes: the chain's key names it
        pass


def link_key(exc: BaseException) -> Key | None:
    """The key of the chain link that raised ``exc`` (None: not raised inside a chain,
    or by its last link, whose key is the task's)."""
    return getattr(exc, LINK_KEY, None)


def fuse_chains(
    nodes: dict[Key, Any],
    dependencies: dict[Key, frozenset[Key]],
    readers: dict[Key, int],
    outputs: list[Key],
    limit: int = FUSE_LIMIT,
    unfusable: Container[Key] = (),
) -> tuple[dict[Key, Any], dict[Key, frozenset[Key]], dict[Key, int]]:
    """``nodes`` with every linear chain of at least two links made one ``Chain``.

    A link is fused into its reader when it is not an output, has exactly one reader,
    and that reader has no other input; neither may be ``unfusable`` (tasks with
    settings of their own: annotations). Returns the new nodes, dependencies and
    readers (the same objects when nothing fuses).
    """
    # The one reader of each key read once, when that reader reads nothing else.
    next_link: dict[Key, Key] = {}
    for key, deps in dependencies.items():
        if len(deps) == 1:
            (dep,) = deps
            if readers.get(dep) == 1 and key not in unfusable and dep not in unfusable:
                next_link[dep] = key
    for key in outputs:
        next_link.pop(key, None)
    if not next_link:
        return nodes, dependencies, readers
    previous = {reader: dep for dep, reader in next_link.items()}
    # Copies patched chain by chain (C-speed copies: chains are often few in a big graph);
    # a chain takes its last link's place, so the order of the keys stays theirs.
    fused_nodes = dict(nodes)
    fused_deps = dict(dependencies)
    fused_readers = dict(readers)
    cut: dict[Key, list[Key]] = {}  # chains cut in parts: the parts' keys, at the chain's end
    for key in previous:
        if key in next_link:
            continue  # a link before the last: its chain is built from its last link
        # ``key`` ends a chain: walk back to its first link, cutting every ``limit``.
        links = [key]
        while links[-1] in previous:
            links.append(previous[links[-1]])
        links.reverse()
        if len(links) > limit:
            cut[key] = links[limit - 1 :: limit] + ([key] if len(links) % limit else [])
        for start in range(0, len(links), limit):
            part = links[start : start + limit]
            last = part[-1]
            if len(part) > 1:
                fused_nodes[last] = Chain([(k, nodes[k]) for k in part])
                for inner in part[:-1]:
                    del fused_readers[inner], fused_nodes[inner], fused_deps[inner]
            fused_deps[last] = dependencies[part[0]]
    if cut:  # the parts of a cut chain all stand where the chain ends, in their order
        moved = {part for parts in cut.values() for part in parts[:-1]}
        fused_nodes = {
            part: fused_nodes[part]
            for key in fused_nodes
            if key not in moved
            for part in cut.get(key, (key,))
        }
    return fused_nodes, fused_deps, fused_readers
