"""A key's category, as ``dask.utils.key_split`` names it, without dask and without a cache.

Both sides name tasks by category: the worker's live-view bars (``worker.activity``) and
the manager's records of each task it submits (``NewTask.prefix``). Dask's ``key_split``
keeps the last 100,000 keys it saw, so a big graph's keys stay alive after its run and
each new key costs a miss; this names the usual shapes ("name-token", a tuple key) at once
and agrees with dask on any other (``tests/test_activity.py``).
"""

from __future__ import annotations

#: The prefix of a key that has no name dask would recognise.
OTHER = "Other"

_HEX = frozenset("0123456789abcdef")


def key_prefix(name: object) -> str:
    """The prefix of a key as ``dask.utils.key_split`` gives it (a key's category), for
    a worker that does not import dask: ``('sum-aggregate-a1b2', 3)`` -> "sum-aggregate",
    ``'inc-<32 hex digits>'`` -> "inc", a bare token -> "data"; never raises."""
    if type(name) is str:  # the usual shape, "name-token" (a delayed's key: unique)
        head, dash, rest = name.partition("-")
        if dash and head[:1].isalpha() and len(head) != 32 and not rest[:1].isalpha():
            return head
    while type(name) is tuple:
        if not name:
            return OTHER
        name = name[0]
    if type(name) is bytes:
        try:
            name = name.decode()
        except UnicodeDecodeError:
            return OTHER
    if not isinstance(name, str):
        return OTHER
    words = name.split("-")
    head = words[0]
    if not head:
        return OTHER
    if not head[0].isalpha():  # e.g. a stringified tuple key, "('x-1', 0)"
        head = head.split(",", 1)[0].strip("_'()\"")
    kept = [head]
    for word in words[1:]:
        # Words of letters belong to the name, but for eight letters that may be a hex
        # token (dask tests only the first letter: "abcdefab" ends the name).
        if not word.isalpha() or (len(word) == 8 and word[0] in "abcdef"):
            break
        kept.append(word)
    prefix = "-".join(kept) if len(kept) > 1 else head
    if not prefix:
        return OTHER
    if len(prefix) == 32 and _HEX.issuperset(prefix):
        return "data"
    if prefix[0] == "<":  # an object's repr: "<module.Class object at 0x...>"
        inner = prefix.strip("<>").split()
        if not inner:
            return OTHER
        prefix = inner[0].rpartition(".")[2]
    return prefix
