"""Copies that cannot be had from a peer go through the manager (``Relay``).

A component of ``state.SchedulerState``. A worker that can reach no holder of an input (a
firewall between hosts, a peer address that does not route) says so (``Relay``); one
holder is asked to upload the result to the manager (``Upload``), which forwards it to
every worker waiting for it (``Relayed``). Slower than a peer transfer, but it does not
fail the task. Each pair of workers that cannot reach each other is logged once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from daskvine_py.scheduler.messages import BytesRelayed
from daskvine_py.scheduler.records import WorkerRecord
from daskvine_py.wire import protocol as p

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context

logger = logging.getLogger("daskvine_py.manager")


class Relays:
    """Inputs waiting to go through the manager; see the module docstring.

    It reads the context's ``tasks`` and ``workers``, appends to its ``out``; its
    messages go through ``Claims.send``.
    """

    __slots__ = ("tasks", "workers", "out", "send", "waiting", "unreachable_pairs")

    def __init__(self, ctx: Context) -> None:
        self.tasks = ctx.tasks
        self.workers = ctx.workers
        self.out = ctx.out
        self.send = ctx.claims.send
        #: input id -> workers waiting for it through the manager
        self.waiting: dict[int, set[WorkerRecord]] = {}
        #: the (holder, reader) names already reported unable to reach each other
        self.unreachable_pairs: set[tuple[str, str]] = set()

    def on_relay(self, worker: WorkerRecord, msg: p.Relay) -> None:
        """``worker`` could reach no holder of these inputs: one holder uploads each to
        the manager, which forwards it (``on_uploaded``)."""
        for dep_id in msg.task_ids:
            dep = self.tasks.get(dep_id)
            holders = [] if dep is None or dep.state != "memory" else list(dep.who_has)
            holders = [h for h in holders if h is not worker]
            if not holders:
                self.send(worker, p.Relayed(dep_id, None))
                continue
            waiting = self.waiting.get(dep_id)
            if waiting is None:
                waiting = self.waiting[dep_id] = set()
                holder = min(holders, key=lambda h: h.name)
                self.send(holder, p.Upload((dep_id,)))
                pair = (holder.name, worker.name)
                if pair not in self.unreachable_pairs:
                    self.unreachable_pairs.add(pair)
                    logger.warning(
                        "worker %s cannot fetch results from worker %s (%s); they go "
                        "through the manager",
                        worker.name,
                        holder.name,
                        holder.peer_address,
                    )
            waiting.add(worker)

    def on_uploaded(self, worker: WorkerRecord, msg: p.Uploaded) -> None:
        """A result arrived (or, ``value`` None, could not be had): forward it to the
        workers waiting for it that are still connected."""
        task = self.tasks.get(msg.task_id)
        run_id = task.run.id if task is not None else 0
        for reader in self.waiting.pop(msg.task_id, ()):
            if self.workers.get(reader.id) is reader:
                self.send(reader, p.Relayed(msg.task_id, msg.value))
                if msg.value is not None:
                    nbytes = msg.value.nbytes
                    self.out.append(BytesRelayed(run_id, worker.name, reader.name, nbytes))
