"""Runs and their tasks arriving: ``SubmitRun`` and ``ExtendRun`` into records.

A component of ``state.SchedulerState``. Each task becomes a ``TaskRecord`` linked to its
inputs (``deps``, ``dependents``), with its two counters set (``missing``: inputs not in
memory; ``waiters``: readers still to run, given by the caller or, in a run that is still
arriving, counted as readers come); annotated runs get their placements (``Constraints``),
verified runs their sample (``Verification``), cached runs their hits (``Caching``); what
can run goes to "ready".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from daskvine_py.scheduler.messages import RUN_PRIORITY_BITS, ExtendRun, NewTask, SubmitRun
from daskvine_py.scheduler.records import InputFile, RunRecord, TaskRecord

if TYPE_CHECKING:
    from daskvine_py.scheduler.context import Context


class Submission:
    """Adds the tasks of runs submitted and extended; see the module docstring.

    It shares the context's ``runs``, ``tasks``, ``input_files`` and ``cache_runs``
    (tested for emptiness); ``new_id`` gives task ids; ``mark`` (``Constraints.mark``), ``sample``
    (``Verification.added``) and ``caching`` the other components'.
    """

    __slots__ = (
        "runs",
        "tasks",
        "transition",
        "new_id",
        "mark",
        "sample",
        "caching",
        "cache_runs",
        "input_files",
    )

    def __init__(self, ctx: Context) -> None:
        self.runs = ctx.runs
        self.tasks = ctx.tasks
        self.transition = ctx.transition
        self.new_id = ctx.new_id
        self.mark = ctx.constraints.mark
        self.sample = ctx.verification.added
        self.caching = ctx.caching
        self.cache_runs = ctx.cache_runs
        self.input_files = ctx.input_files

    def input_files_of(self, urls: tuple[str, ...]) -> tuple[InputFile, ...]:
        """The records of the files a task reads (made on first sight)."""
        files = self.input_files
        found = []
        for url in urls:
            file = files.get(url)
            if file is None:
                file = files[url] = InputFile(url)
            found.append(file)
        return tuple(found)

    def on_submit(self, ev: SubmitRun) -> None:
        if ev.run_id in self.runs:
            raise ValueError(f"run {ev.run_id} was submitted twice")
        run = self.runs[ev.run_id] = RunRecord.of(ev)
        if ev.cache is not None:
            self.caching.open(run, ev.cache)
        self.add(run, ev.tasks, ev.functions)

    def on_extend(self, ev: ExtendRun) -> None:
        run = self.runs.get(ev.run_id)
        if run is not None:  # else it failed or was cancelled meanwhile
            self.add(run, ev.tasks, ev.functions)
            for task in run.arrived() if ev.last and run.arriving else ():  # readers counted
                self.transition(task, "released")

    def add(
        self, run: RunRecord, tasks: Sequence[NewTask], functions: Mapping[bytes, bytes]
    ) -> None:
        """Records for ``tasks`` of ``run``, each after its inputs."""
        run.functions.update(functions)
        records = run.tasks
        added = []
        new_id = self.new_id
        for new in tasks:
            priority = run.id << RUN_PRIORITY_BITS | new.priority
            record = TaskRecord(
                new_id(), new.key, run, new.payload, new.functions, priority, new.prefix
            )
            if new.key in run.outputs:  # (rare fields: written where they differ)
                record.is_output = True
                if new.dependents == 0:
                    record.unread = True
            if new.dependents is not None:
                record.waiters = new.dependents
            if new.inputs:
                record.reads = reads = self.input_files_of(new.inputs)
                for file in reads:
                    file.readers[record] = None
            records[new.key] = record
            self.tasks[record.id] = record
            added.append((new, record))
        if run.settings is not None:
            self.mark(run, added)  # annotated runs only
        for new, record in added:
            if not new.dependencies:
                continue  # (``missing`` is 0 and ``deps`` the shared empty tuple)
            missing = 0
            record.deps = deps = tuple([records[dep_key] for dep_key in new.dependencies])
            for dep in deps:
                dep.add_dependent(record)
                if new.dependents is None:
                    dep.waiters += 1
                if dep.state != "memory":
                    missing += 1
            record.missing = missing
        if run.verify:
            self.sample(run, [record for _, record in added])
        if self.cache_runs:
            self.caching.added(run, added)  # hits, skipped inputs, results read from disk
        for _, record in added:
            if record.missing == 0 and record.state == "waiting":
                self.transition(record, "ready")
