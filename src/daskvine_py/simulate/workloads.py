"""The graphs a simulation runs, and what each must give: seeded generators of plain Dask
graphs and their reference results.

Every task is ``(count, *input_keys)`` or ``(boom, *input_keys)``, functions of this
module so that they travel by reference and compute for real in the simulated libraries:
``count`` returns ``1 + sum(inputs)`` (a result counts the tasks beneath it, with
multiplicity, so a task lost, doubled or fed the wrong input changes it) and ``boom``
raises ``TaskRaised``. ``reference`` evaluates a graph in this process, key by key, and
says for each output its value or that it fails; ``dask.get`` gives the same values
(``tests/test_simulate.py`` checks that).

A workload also declares each task's simulated duration (seconds at a worker of speed 1)
and its result's size in bytes: the simulated library reads them by key.

The shapes: ``random`` (any DAG: each task reads up to three earlier ones), ``chains``
(independent linear chains, with relays between them), ``dv3`` (the DV3 shape of
``benchmarks/swarm_workloads.py`` in small: loads, histogram fills reading each, a fan-in
8 accumulation tree per dataset, one final merge) and ``flat`` (independent tasks, each
an output).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

Key = Hashable

#: The shapes ``make`` knows.
SHAPES = ("random", "chains", "dv3", "flat")


class TaskRaised(Exception):
    """What ``boom`` raises: the error a task really raised, which a run must end with."""


def count(*inputs: int) -> int:
    """A task's honest work: one plus what its inputs counted."""
    return 1 + sum(inputs)


def boom(*inputs: int) -> int:
    """A task whose code raises, whatever its inputs."""
    raise TaskRaised(f"boom after {len(inputs)} inputs")


@dataclass
class Workload:
    """A graph, the keys asked of it, and what its tasks pretend to cost."""

    name: str
    graph: dict[Key, Any]
    outputs: list[Key]
    #: simulated seconds of each task at a worker of speed 1
    durations: dict[Key, float] = field(default_factory=dict)
    #: bytes of each task's result, as reported (the value itself stays small)
    nbytes: dict[Key, int] = field(default_factory=dict)
    #: the remote file each task reads through its node's input cache, and its bytes
    #: (``with_inputs``): none, unless given
    reads: dict[Key, tuple[str, int]] = field(default_factory=dict)

    @property
    def raises(self) -> bool:
        """Whether some task of the graph raises (every task is needed by an output)."""
        return any(task[0] is boom for task in self.graph.values())


def reference(workload: Workload) -> dict[Key, int | TaskRaised]:
    """Each output's value, or the ``TaskRaised`` that its lineage raises; computed here,
    in the graph's order (every generator lists a task after its inputs)."""
    values: dict[Key, int | TaskRaised] = {}
    for key, (func, *deps) in workload.graph.items():
        inputs = [values[dep] for dep in deps]
        failed = next((v for v in inputs if isinstance(v, TaskRaised)), None)
        if failed is not None:
            values[key] = failed
            continue
        try:
            values[key] = func(*inputs)
        except TaskRaised as exc:
            values[key] = exc
    return {key: values[key] for key in workload.outputs}


def make(shape: str, rng: random.Random, tasks: int, fail: float = 0.0) -> Workload:
    """A workload of about ``tasks`` tasks of ``shape``; each task raises with
    probability ``fail``."""
    maker: Callable[[random.Random, int], Workload] = _MAKERS[shape]
    workload = maker(rng, max(1, tasks))
    if fail > 0:
        for key, task in list(workload.graph.items()):
            if rng.random() < fail:
                workload.graph[key] = (boom, *task[1:])
    for key in workload.graph:
        workload.durations[key] = _duration(rng)
        workload.nbytes[key] = rng.choice((8, 100, 1000, 100_000, 2_000_000))
    return workload


def with_inputs(
    workload: Workload, total_bytes: int, chunks_per_file: int, rng: random.Random
) -> Workload:
    """``workload`` with its tasks that read no other (a DV3's loads) reading remote
    files: ``chunks_per_file`` consecutive ones, on average, a chunk each of one file (as
    an analysis splits its files into chunks), the files' sizes summing to about
    ``total_bytes``."""
    leaves = [key for key, task in workload.graph.items() if len(task) == 1]
    files: list[list[Key]] = []
    at = 0
    while at < len(leaves):
        count = max(1, round(rng.uniform(0.5, 1.5) * chunks_per_file))
        files.append(leaves[at : at + count])
        at += count
    per_chunk = total_bytes // max(1, len(leaves))
    for i, chunks in enumerate(files):
        url = f"root://storage.example.org//store/file-{i}.root"
        for key in chunks:
            workload.reads[key] = (url, per_chunk * len(chunks))
    return workload


def _duration(rng: random.Random) -> float:
    """Mostly short tasks, some long: log-uniform over 1 ms .. 2 s."""
    return float(10 ** rng.uniform(-3, 0.3))


def _random(rng: random.Random, tasks: int) -> Workload:
    graph: dict[Key, Any] = {}
    keys: list[str] = []
    for i in range(tasks):
        key = f"t-{i}"
        width = rng.choice((0, 1, 1, 2, 3)) if keys else 0
        deps = rng.sample(keys[-20:], min(width, len(keys[-20:])))
        graph[key] = (count, *deps)
        keys.append(key)
    read = {dep for task in graph.values() for dep in task[1:]}
    sinks = [key for key in keys if key not in read]
    extra = rng.sample(keys, min(len(keys), rng.randint(0, 2)))
    return Workload("random", graph, list(dict.fromkeys(sinks + extra)))


def _chains(rng: random.Random, tasks: int) -> Workload:
    graph: dict[Key, Any] = {}
    count_ = max(1, tasks // 6)
    ends: list[str] = []
    previous_end: str | None = None
    for c in range(count_):
        key = ""
        for link in range(max(1, tasks // count_)):
            key = f"chain{c}-{link}"
            deps: tuple[str, ...] = () if link == 0 else (f"chain{c}-{link - 1}",)
            if link == 0 and previous_end is not None and rng.random() < 0.3:
                deps = (previous_end,)  # a relay: the next chain starts from this one's end
            graph[key] = (count, *deps)
        ends.append(key)
        previous_end = key
    read = {dep for task in graph.values() for dep in task[1:]}
    outputs: list[Key] = [key for key in ends if key not in read]
    if not outputs:
        outputs = [ends[-1]]
    return Workload("chains", graph, outputs)


def _dv3(rng: random.Random, tasks: int) -> Workload:
    graph: dict[Key, Any] = {}
    fills_per_load = 3
    datasets = max(1, min(3, tasks // 12))
    loads = max(1, tasks // (2 * (fills_per_load + 1)))
    per_set: list[list[str]] = [[] for _ in range(datasets)]
    for i in range(loads):
        load = f"load-{i}"
        graph[load] = (count,)
        for h in range(fills_per_load):
            fill = f"fill-{i}-{h}"
            graph[fill] = (count, load)
            per_set[i % datasets].append(fill)
    tops: list[str] = []
    for d, level in enumerate(per_set):
        depth = 0
        while len(level) > 1:
            merged = []
            for j in range(0, len(level), 8):
                key = f"acc-{d}-{depth}-{j // 8}"
                graph[key] = (count, *level[j : j + 8])
                merged.append(key)
            level, depth = merged, depth + 1
        tops.extend(level)
    graph["final"] = (count, *tops)
    return Workload("dv3", graph, ["final"])


def _flat(rng: random.Random, tasks: int) -> Workload:
    graph: dict[Key, Any] = {f"flat-{i}": (count,) for i in range(tasks)}
    return Workload("flat", graph, list(graph))


_MAKERS: dict[str, Callable[[random.Random, int], Workload]] = {
    "random": _random,
    "chains": _chains,
    "dv3": _dv3,
    "flat": _flat,
}
