"""The workloads of issue 28, shaped like the TaskVine paper's runs, as plain Dask graphs.

Every task of every workload is ``(sim_task, seconds, nbytes, *input_keys)``: what it would
cost and how big its result would be are part of the graph, so the same graph runs

- on dask.distributed (``swarm_distributed.py``), where ``set_sleep(True)`` makes each task
  really sleep its ``seconds``, and
- on the swarm of simulated workers (``swarm.py``), which calls the task (no sleep), reads
  what it declared in ``DECLARED`` and pretends it ran that long and produced that many bytes.

A task returns ``1 + sum(inputs)``: the final value counts the tasks beneath it (with
multiplicity where a result feeds several tasks), so a lost or doubled task changes it.
``Workload.expected`` is that value, computed while building the graph, without running it.

The shapes (seeds/003, "Reshaping HEP Applications ... Using TaskVine"):

``dv3-large``
    17,000 tasks (Table II): processing tasks, one per chunk of events, then an accumulation
    tree to one histogram (Fig. 3). Durations: "a majority of tasks have execution times
    between 1s and 10s" (Fig. 8); we draw them from a log-normal of median 2.5 s (sigma 0.6)
    cut to [1, 10] s, so most are short and about one in nine is over 5 s. Merges take
    0.1-0.5 s, with fan-in 8 (Dask's default ``split_every`` for bag reductions).
``dv3-huge``
    185,000 tasks, 10,000 ready at the start (Fig. 15): the same data "performing more
    extensive computation". Each of the 10,000 chunks is loaded by a task with no inputs,
    then 15 histogram fills read it; the fills of each of 12 datasets are accumulated per
    histogram, and the 180 per-dataset histograms into one final result. The merges take what
    is left of 185,000, so their fan-in averages about 7 (never over 8).
``flat``
    N independent tasks of one duration; every task is an output, the result N ones.
``million``
    10^6 independent leaves and a fan-in-8 tree over them, level by level: 1,142,860 tasks,
    the graph measured in issue 28. No-ops by default.

Result sizes (``nbytes``). The paper gives the input (1.2 TB for DV3-Large, i.e. about
70 MB read per processing task) but not the histograms. Ours are our estimate of a Coffea
output: tens of ``hist`` histograms of a few thousand weighted bins, about 1 MB, drawn
log-uniform in [256 KB, 4 MB]; a merge of histograms with the same binning is as big as its
biggest input. A dv3-huge load holds the chunk's columns an analysis reads: drawn in
[16, 64] MB (a quarter of the 120 MB a chunk of 1.2 TB in 10,000 is on disk).
"""

from __future__ import annotations

import math
import os
import random
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: What the last call of ``sim_task`` declared: ``[seconds, nbytes]`` (overwritten by each).
DECLARED: list[Any] = [0.0, 0]
#: Whether ``sim_task`` really sleeps (dask.distributed) or only declares (the swarm).
SLEEP = False
#: A pipe made readable to wake the tasks still asleep, so a cluster given up on can close.
#: Each sleeper polls it on its own (no lock shared by thousands of sleeping threads).
_WAKE: tuple[int, int] | None = None


def sim_task(seconds: float, nbytes: int, *inputs: int) -> int:
    """The one task of every workload: ``1 + sum(inputs)``, pretending to cost ``seconds``."""
    DECLARED[0] = seconds
    DECLARED[1] = nbytes
    if SLEEP and seconds > 0:
        _sleep(seconds)
    return 1 + sum(inputs)


def _sleep(seconds: float) -> None:
    wake = _WAKE
    if wake is None:
        time.sleep(seconds)
        return
    poller = select.poll()
    poller.register(wake[0], select.POLLIN)
    poller.poll(seconds * 1000)


def set_sleep(on: bool) -> None:
    """Tasks sleep from now on, or not; turning it off also wakes the tasks asleep."""
    global SLEEP, _WAKE
    SLEEP = on
    if on and _WAKE is None:
        _WAKE = os.pipe()
    elif not on and _WAKE is not None:
        # written: the sleepers return; closed: those about to poll it return at once
        os.write(_WAKE[1], b"x")
        os.close(_WAKE[0])
        os.close(_WAKE[1])
        _WAKE = None


@dataclass
class Workload:
    name: str
    #: a plain Dask graph: key -> ``(sim_task, seconds, nbytes, *input_keys)``
    graph: dict[Any, Any]
    #: the output keys: a list for ``flat``, one key otherwise
    keys: Any
    tasks: int
    total_work_s: float
    critical_path_s: float
    ready_at_start: int
    #: what ``get(graph, keys)`` returns (a list where ``keys`` is a list)
    expected: Any

    def ideal_s(self, cores: int) -> float:
        return max(self.total_work_s / cores, self.critical_path_s)

    def result_ok(self, result: Any) -> bool:
        """Whether a ``get`` returned ``expected`` (a tuple of results counts as a list)."""
        if isinstance(self.keys, list):
            return isinstance(result, (list, tuple)) and list(result) == self.expected
        return bool(result == self.expected)


# -- sizes -----------------------------------------------------------------------------------

DV3_LARGE_TASKS = 17_000
DV3_HUGE_TASKS = 185_000
DV3_HUGE_READY = 10_000
DV3_HUGE_FILLS = 15  # histogram fills per chunk
DV3_HUGE_DATASETS = 12
FLAT_TASKS = 10_000
MILLION_LEAVES = 1_000_000
FAN_IN = 8

KB = 1 << 10
MB = 1 << 20
HIST_BYTES = (256 * KB, 4 * MB)
COLUMNS_BYTES = (16 * MB, 64 * MB)
#: a no-op's result: one small int
INT_BYTES = 8


class _Draw:
    """Seeded durations and sizes, scaled."""

    def __init__(self, seed: int, scale: float) -> None:
        self.rng = random.Random(seed)
        self.scale = scale

    def processing_s(self) -> float:
        while True:  # a log-normal cut to [1, 10] s by rejection (no spikes at the ends)
            s = self.rng.lognormvariate(math.log(2.5), 0.6)
            if 1.0 <= s <= 10.0:
                return round(s * self.scale, 6)

    def merge_s(self) -> float:
        return round(self.rng.uniform(0.1, 0.5) * self.scale, 6)

    def log_uniform(self, bounds: tuple[int, int]) -> int:
        lo, hi = bounds
        return int(math.exp(self.rng.uniform(math.log(lo), math.log(hi))))


# -- accumulation trees ----------------------------------------------------------------------


def min_merges(n: int, fan_in: int = FAN_IN) -> int:
    """The fewest merges of at most ``fan_in`` inputs that reduce ``n`` results to one."""
    return 0 if n <= 1 else -(-(n - 1) // (fan_in - 1))


class _Builder:
    """A graph under construction, with its totals kept as tasks are added in topological order."""

    def __init__(self) -> None:
        self.graph: dict[Any, Any] = {}
        self.finish: dict[Any, float] = {}  # the longest path ending with each task
        self.total_work = 0.0
        self.ready = 0

    def add(self, key: str, seconds: float, nbytes: int, inputs: Sequence[str] = ()) -> None:
        self.graph[key] = (sim_task, seconds, nbytes, *inputs)
        self.finish[key] = seconds + max((self.finish[k] for k in inputs), default=0.0)
        self.total_work += seconds
        if not inputs:
            self.ready += 1

    def reduce(
        self,
        prefix: str,
        items: Sequence[tuple[str, int]],
        merges: int,
        draw: Callable[[], float],
    ) -> tuple[str, int]:
        """Merge ``items`` (key, nbytes) into one with exactly ``merges`` tasks, first in first out.

        The merges' inputs are spread evenly (``merges >= min_merges(len(items))`` keeps each
        at most ``FAN_IN``); a merge's result is as big as its biggest input.
        """
        if merges < min_merges(len(items)):
            raise ValueError(f"{len(items)} results need at least {min_merges(len(items))} merges")
        queue = deque(items)
        base, extra = divmod(len(items) - 1, merges) if merges else (0, 0)
        for i in range(merges):
            group = [queue.popleft() for _ in range(base + 1 + (i < extra))]
            key = f"{prefix}-{i}"
            nbytes = max(nb for _, nb in group)
            self.add(key, draw(), nbytes, [k for k, _ in group])
            queue.append((key, nbytes))
        (root,) = queue
        return root


def _spread(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders), summing exactly."""
    whole = sum(weights)
    if whole == 0:
        return [total] + [0] * (len(weights) - 1)
    shares = [total * w / whole for w in weights]
    out = [int(s) for s in shares]
    order = sorted(range(len(weights)), key=lambda i: out[i] - shares[i])
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


# -- the workloads ---------------------------------------------------------------------------


def dv3_large(tasks: int = DV3_LARGE_TASKS, seed: int = 0, scale: float = 1.0) -> Workload:
    if tasks < 1:
        raise ValueError("dv3-large needs at least 1 task")
    # the most processing tasks whose tree (fan-in <= 8) still fits in ``tasks``
    chunks = 1
    while chunks + 1 + min_merges(chunks + 1) <= tasks:
        chunks += 1
    draw = _Draw(seed, scale)
    b = _Builder()
    items = []
    for i in range(chunks):
        nbytes = draw.log_uniform(HIST_BYTES)
        b.add(f"process-{i}", draw.processing_s(), nbytes)
        items.append((f"process-{i}", nbytes))
    root, _ = b.reduce("accumulate", items, tasks - chunks, draw.merge_s)
    return _workload("dv3-large", b, root, expected=tasks)


def dv3_huge(tasks: int = DV3_HUGE_TASKS, seed: int = 0, scale: float = 1.0) -> Workload:
    chunks, fills = _huge_shape(tasks)
    datasets = min(DV3_HUGE_DATASETS, chunks)
    draw = _Draw(seed, scale)
    # datasets of uneven sizes, each at least one chunk
    per_dataset = [
        1 + n for n in _spread(chunks - datasets, [draw.rng.randint(1, 4) for _ in range(datasets)])
    ]
    trees = [n for n in per_dataset for _ in range(fills)]  # one tree per dataset and histogram
    need = [min_merges(n) for n in trees] + [min_merges(len(trees))]
    surplus = tasks - chunks * (1 + fills) - sum(need)
    merges = [
        m + s
        for m, s in zip(
            need, _spread(surplus, [max(n - 1, 0) for n in trees] + [len(trees) - 1]), strict=True
        )
    ]
    b = _Builder()
    roots = []
    first = 0
    tree = 0
    for d, n in enumerate(per_dataset):
        hists: list[list[tuple[str, int]]] = [[] for _ in range(fills)]
        for c in range(first, first + n):
            b.add(f"load-{c}", draw.processing_s(), draw.log_uniform(COLUMNS_BYTES))
            for h in range(fills):
                nbytes = draw.log_uniform(HIST_BYTES)
                b.add(f"fill-{c}-{h}", draw.processing_s(), nbytes, [f"load-{c}"])
                hists[h].append((f"fill-{c}-{h}", nbytes))
        first += n
        for h in range(fills):
            roots.append(b.reduce(f"accumulate-{d}-{h}", hists[h], merges[tree], draw.merge_s))
            tree += 1
    root, _ = b.reduce("combine", roots, merges[-1], draw.merge_s)
    # every task counts once on its way to the root, but a load once per fill reading it
    return _workload("dv3-huge", b, root, expected=tasks + (fills - 1) * chunks)


def _huge_shape(tasks: int) -> tuple[int, int]:
    """(chunks, fills per chunk) in dv3-huge's proportions, leaving room for the merges."""
    chunks = max(1, round(tasks * DV3_HUGE_READY / DV3_HUGE_TASKS))
    while chunks >= 1:
        datasets = min(DV3_HUGE_DATASETS, chunks)
        for fills in range(DV3_HUGE_FILLS, 0, -1):
            # a bound on the trees' fewest merges however the chunks fall into datasets:
            # the sum of ceil(x_d / 7) is at most floor(sum x_d / 7) + datasets
            worst = fills * ((chunks - datasets) // (FAN_IN - 1) + datasets)
            if tasks - chunks * (1 + fills) >= worst + min_merges(datasets * fills):
                return chunks, fills
        chunks -= 1
    raise ValueError(f"dv3-huge cannot be shaped in {tasks} tasks")


def flat(tasks: int = FLAT_TASKS, seconds: float = 1.0, scale: float = 1.0) -> Workload:
    b = _Builder()
    task = (sim_task, seconds * scale, INT_BYTES)  # one tuple shared by every task: compact
    keys = [f"flat-{i}" for i in range(tasks)]
    b.graph = dict.fromkeys(keys, task)
    b.total_work = tasks * seconds * scale
    b.ready = tasks
    return Workload(
        "flat",
        b.graph,
        keys,
        tasks,
        b.total_work,
        seconds * scale if tasks else 0.0,
        tasks,
        [1] * tasks,
    )


def million(leaves: int = MILLION_LEAVES, seconds: float = 0.0, scale: float = 1.0) -> Workload:
    """``leaves`` independent tasks and a tree over them, fan-in 8 level by level.

    Built without the per-task bookkeeping of the other workloads (every duration is the
    same, so the critical path is the depth) so that 10^6 leaves take a couple of seconds.
    """
    s = seconds * scale
    leaf = (sim_task, s, INT_BYTES)
    level = [f"leaf-{i}" for i in range(leaves)]
    graph: dict[Any, Any] = dict.fromkeys(level, leaf)
    depth = 1
    while len(level) > 1:
        depth += 1
        up = []
        for j, start in enumerate(range(0, len(level), FAN_IN)):
            key = f"sum-{depth}-{j}"
            graph[key] = (sim_task, s, INT_BYTES, *level[start : start + FAN_IN])
            up.append(key)
        level = up
    tasks = len(graph)
    return Workload("million", graph, level[0], tasks, tasks * s, depth * s, leaves, tasks)


def _workload(name: str, b: _Builder, keys: Any, expected: Any) -> Workload:
    return Workload(
        name,
        b.graph,
        keys,
        len(b.graph),
        round(b.total_work, 6),
        round(max(b.finish.values(), default=0.0), 6),
        b.ready,
        expected,
    )


NAMES = ("dv3-large", "dv3-huge", "flat", "million")


def build(
    name: str,
    tasks: int | None = None,
    task_seconds: float | None = None,
    seed: int = 0,
    scale: float = 1.0,
) -> Workload:
    """One of ``NAMES``. ``tasks``: the total (dv3-*, flat) or the leaves (million);
    ``task_seconds``: the one duration of flat (1 s) and million (0 s); ``scale`` multiplies
    every duration."""
    if name == "dv3-large":
        return dv3_large(tasks or DV3_LARGE_TASKS, seed, scale)
    if name == "dv3-huge":
        return dv3_huge(tasks or DV3_HUGE_TASKS, seed, scale)
    if name == "flat":
        return flat(
            FLAT_TASKS if tasks is None else tasks,
            1.0 if task_seconds is None else task_seconds,
            scale,
        )
    if name == "million":
        return million(tasks or MILLION_LEAVES, task_seconds or 0.0, scale)
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(NAMES)}")


def critical_path(graph: dict[Any, Any]) -> float:
    """The longest path by declared durations of a graph of ``sim_task`` tuples (any order)."""
    finish: dict[Any, float] = {}
    for key in graph:
        stack = [key]
        while stack:
            k = stack[-1]
            if k in finish:
                stack.pop()
                continue
            deps = [d for d in graph[k][3:] if d not in finish]
            if deps:
                stack.extend(deps)
                continue
            finish[k] = graph[k][1] + max((finish[d] for d in graph[k][3:]), default=0.0)
            stack.pop()
    return max(finish.values(), default=0.0)
