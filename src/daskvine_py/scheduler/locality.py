"""Where tasks go for their inputs: locality targets, sending ahead, siblings together.

A component of ``state.SchedulerState``. A ready task is queued for the worker holding most
of its input bytes (``target``): its inputs' results, and the remote files it reads where
a worker's node holds them in its input cache (``files_held``, from ``TaskDone.inputs``);
a task whose inputs are all being computed on one worker is sent there before they are
done (``send_ahead``), so the worker starts it without a manager round trip; and tasks
without inputs, which have no locality of their own, are queued for the worker that took
a sibling (``pull_siblings``), so the inputs of one reader meet instead of one of them
crossing between workers; and so are the readers of a remote file no node holds yet,
for the worker that took the first (``pull_readers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskvine_py.scheduler.messages import WorkerId
from daskvine_py.scheduler.records import InputFile, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

#: Links of a linear chain sent ahead beyond saturation: fewer manager round trips; each
#: is committed to that worker (a worker lost mid-chain re-runs them elsewhere).
CHAIN_AHEAD = 256
#: Peers named to a worker as sources of one input file (``peer_sources``): the first
#: that answers serves it; more would only be asked after failures.
PEER_SOURCES = 3
#: Sibling co-assignment's bounds (``pull_siblings``): readers of the task taken, and
#: inputs of each reader (``SchedulerState(sibling_inputs=...)``). A combine step of a
#: tree (8 inputs by default) fits; a shuffle's all-to-all does not, nor would it gain.
#: ``SIBLING_INPUTS`` also bounds the inputs of a reader sent ahead for several of them.
SIBLING_READERS = 4
SIBLING_INPUTS = 8


def files_held(
    files: dict[str, InputFile],
    worker: WorkerRecord,
    reads: tuple[tuple[str, int, int, str], ...],
) -> None:
    """``worker``'s task obtained these files through its node's input cache
    (``TaskDone.inputs``): the node holds them now, whatever their source; those its
    cache let go (``INPUT_DROPPED``) it no longer holds. A copy other
    than the one known (the server's changed) makes this node its only known holder."""
    for url, nbytes, source, version in reads:
        file = files.get(url)
        if source == p.INPUT_DROPPED:  # (its node's cache let it go)
            if file is not None and worker in file.holders:
                file.holders.discard(worker)
                worker.files.discard(file)
                if not file.holders:
                    file.drawn_to = None  # (its next readers may gather again)
            continue
        if file is None:  # read though not found in its arguments: its later readers may be
            file = files[url] = InputFile(url)
        if file.version != version or file.nbytes != nbytes:
            for holder in file.holders:
                holder.files.discard(file)
            file.holders.clear()
            file.nbytes, file.version = nbytes, version
        if worker not in file.holders:
            file.holders.add(worker)
            worker.files.add(file)


def peer_sources(
    task: TaskRecord, worker: WorkerRecord, most: int = PEER_SOURCES
) -> tuple[tuple[str, int, str, tuple[str, ...]], ...]:
    """The files ``task`` reads that ``worker``'s node lacks and other workers' nodes
    hold, with where those serve them (``FetchInputs.files``): up to ``most`` sources
    each, from other caches than the worker's (workers of one node share theirs)."""
    found = []
    for file in task.reads:
        if worker in file.holders or not file.version:
            continue
        sources = tuple(
            holder.file_address
            for holder in file.holders
            if holder.file_address and holder.file_cache != worker.file_cache  # ("": unknown)
        )[:most]
        if sources:
            found.append((file.url, file.nbytes, file.version, sources))
    return tuple(found)


def files_lost(worker: WorkerRecord) -> None:
    """``worker`` left: the files of its node are no longer known there."""
    for file in worker.files:
        file.holders.discard(worker)
        if not file.holders:
            file.drawn_to = None
    worker.files.clear()


def target(task: TaskRecord, full: set[WorkerRecord]) -> WorkerId | None:
    """The worker holding most of the task's input bytes, if any (not a ``full`` one):
    its inputs' results, and the remote files it reads where a node's input cache holds
    them (``reads``)."""
    if not task.deps and not task.reads:
        return None
    held: dict[WorkerRecord, int] = {}
    for dep in task.deps:
        size = dep.nbytes + 1
        for holder in dep.who_has:
            held[holder] = held.get(holder, 0) + size
    for file in task.reads:
        size = file.nbytes + 1
        for holder in file.holders:
            held[holder] = held.get(holder, 0) + size
    if full:
        held = {w: size for w, size in held.items() if not w.full}
    if not held:
        return None
    return max(held, key=held.__getitem__).id


class Locality:
    """Sending ahead and sibling pulls; see the module docstring (``target`` is a function).

    It reads the context's ``queue``; ``extra(worker, task)``: the tasks ``worker`` holds
    beyond its cores for one like ``task`` (``Saturation``); ``transition(task,
    "processing", worker)``: send a task.
    """

    __slots__ = ("queue", "extra", "transition", "chain_ahead", "sibling_inputs")

    def __init__(
        self, ctx: Context, chain_ahead: int = CHAIN_AHEAD, sibling_inputs: int = SIBLING_INPUTS
    ) -> None:
        self.queue = ctx.queue
        self.extra = ctx.saturation.extra
        self.transition = ctx.transition
        #: links of a linear chain sent ahead beyond saturation (``send_ahead``)
        self.chain_ahead = chain_ahead
        #: input-less tasks are queued for the worker of a sibling when their reader has
        #: at most this many inputs (``pull_siblings``; 0: never)
        self.sibling_inputs = sibling_inputs

    def pull_siblings(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Queue the input-less siblings of ``task`` (other inputs of the tasks it feeds)
        for the worker that took it.

        Tasks without inputs have no locality of their own, and taken one per worker in
        turn, the two halves of a pair (``x[i, j]`` and ``x[j, i]`` of ``x + x.T``, the
        partitions one combine step reads) land on different workers: every reader then
        copies one of them across. Queued for the same worker they meet there. It is a
        target like any other: an idle worker still takes them (soft targeting). Bounded
        to tasks read by few with few inputs, so an all-to-all step costs nothing here.

        Only as many as the worker has room for now: one whose cores are all taken would
        hold the rest in its lane until they free, while other workers ran later tasks
        first (``dv3-large``: groups started 8 s after their turn, then long tasks in a
        tail of their own). Siblings it has no room for stay where any worker takes them.
        """
        dependents = task.dependents
        limit = self.sibling_inputs
        if len(dependents) > SIBLING_READERS or not limit:
            return
        room = None  # (found at the first sibling: most tasks have none)
        queue = self.queue
        for dependent in dependents:
            deps = dependent.deps
            if len(deps) > limit:
                continue
            for sibling in deps:
                if (
                    sibling.state == "ready"
                    and not sibling.pulled
                    and not sibling.deps
                    and sibling.placement is None
                ):
                    if room is None:
                        room = worker.cores + self.extra(worker, task) - worker.startable()
                    if room <= 0:
                        return
                    sibling.pulled = True
                    queue.push(sibling, sibling.priority, worker.id)
                    room -= 1
                    if not room:
                        return

    def pull_readers(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """``task``, a reader of remote files, goes to ``worker``: it is no longer waiting
        for a place, and the other ready readers of each file no node holds yet are queued
        for ``worker`` too (once per file: the first reader sent decides).

        Readers are targeted when they become ready (``target``), but the readers of a
        file read for the first time are all ready at once, before any node holds it: each
        would land on whichever worker asks, and each such node would fetch the whole file
        from storage. Queued where the first went, they find it there. A soft target like
        any other: an idle worker still takes them (and fetches the file, or pulls it from
        that node: ``FetchInputs``)."""
        queue = self.queue
        for file in task.reads:
            file.readers.pop(task, None)
            if file.holders or file.drawn_to is not None:
                continue
            file.drawn_to = worker
            for reader in file.readers:
                if reader.state == "ready" and reader.placement is None:
                    queue.push(reader, reader.priority, worker.id)

    def send_ahead(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Send dependents of ``task`` (just given to ``worker``) there now, when every
        input they miss is being computed there (``_behind``): ``task`` alone, or it and
        its siblings (the pair ``x[i, j]``, ``x[j, i]`` that ``pull_siblings`` put on one
        worker, say).

        The worker starts them the moment their inputs are ready, without a round trip to
        the manager: a chain of small tasks runs at the worker's pace. Bounded by the
        worker's saturation, counting every task it holds (the round's bound counts only
        those that can start: ``WorkerRecord.ahead``). A strictly linear chain goes
        further (``chain_ahead`` more): it runs in order anyway, so handing it to one
        worker whole costs no parallelism.
        """
        if worker.full:
            return
        extra = self.extra
        transition = self.transition
        while True:
            if task.unread is None:  # a cached output, maybe not kept there: at every link
                return  # of the chain (a follower can be one: ``Caching.added``)
            follower = next((d for d in task.dependents if _behind(d, worker)), None)
            if follower is None or follower.placement is not None:  # annotated: placed alone
                return
            bound = worker.cores + extra(worker, follower)
            if len(task.dependents) == 1 and len(follower.deps) == 1:
                bound += self.chain_ahead
            if len(worker.processing) >= bound:
                return
            transition(follower, "processing", worker)
            task = follower


def _behind(task: TaskRecord, worker: WorkerRecord) -> bool:
    """Whether waiting ``task`` can be sent ahead to ``worker``: each input it misses
    is being computed there (one missing input: the one just sent, checked in O(1))."""
    if task.state != "waiting":
        return False
    missing = task.missing
    if missing == 1:
        return True
    if missing > SIBLING_INPUTS or len(task.deps) > SIBLING_INPUTS:
        return False
    return all(
        dep.state == "memory" or (dep.worker is worker and dep.unread is not None)
        for dep in task.deps
    )
