"""What must hold at every step of a simulation, and the record of what did not.

Checked after every step (``Checker.after_step``) and as they happen:

- **results**: each ``RunOutput`` is the reference value of an output of that run, given
  once; a run ends with ``RunDone`` only after every output, and only if no task of it
  raises; with ``RunFailed`` only for the error a task really raised (its type is the
  workload's ``TaskRaised``), for crashes when the seed injected more faults that crash
  tasks (preemptions, leaves) than the run's retries, or for ``ResourceExhausted`` when
  libraries were made to run out of memory;
- **honest workers**: every worker is honest (but the liar, ``Config.liar``: then the
  results are not checked, and the liar may be ejected, struck or quarantined), so none
  is ejected (``Eject``), none is
  quarantined (but as slow, when it is slower than the others), none has a false claim
  counted (``Claims``), none a strike (``Faults``) unless its libraries were made to run
  out of memory;
- **inputs**: no call reaches a library naming a live input that the library does not
  hold and no call before it makes, and no call runs without one (``worker_node``);
- **the state machines never raise**: no event handler raised (``RunAborted``,
  ``EventDropped``), and no worker's state raised on a record from its manager;
- **nothing is lost**: every run submitted ends (or is cancelled) before the horizon;
- **views agree once quiet**: after the last run ended and the network went quiet (no
  record but heartbeats in flight), the manager has no task, no worker holds or runs
  anything, every worker's state is empty (``WorkerState.leaks``), and the manager's
  workers are the live ones that believe they joined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from daskvine_py.errors import ResourceExhausted
from daskvine_py.scheduler.messages import RunDone, RunFailed, RunOutput
from daskvine_py.simulate import workloads as wl
from daskvine_py.wire.serialize import loads, type_name

if TYPE_CHECKING:
    from daskvine_py.simulate.manager_node import ManagerNode
    from daskvine_py.simulate.worker_node import WorkerNode

#: Violations recorded per seed before the simulation stops (the first ones matter).
MAX_VIOLATIONS = 20
#: The qualified name of the error a task really raises.
RAISED = type_name(wl.TaskRaised(""))


@dataclass
class Violation:
    seed: int
    step: int
    time: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return (
            f"seed {self.seed} step {self.step} (t={self.time:.3f}s): {self.invariant}: "
            f"{self.detail}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "step": self.step,
            "time": self.time,
            "invariant": self.invariant,
            "detail": self.detail,
        }


@dataclass
class RunRecord:
    """A run as the simulation submitted it, and what came of it."""

    run_id: int
    workload: wl.Workload
    expected: dict[wl.Key, int | wl.TaskRaised]
    submitted: float
    #: what the run's outputs came back as: the tasks' own values
    delivered: dict[wl.Key, Any] = field(default_factory=dict)
    ended: RunDone | RunFailed | None = None
    cancelled: bool = False


class _Settings(Protocol):
    @property
    def retries(self) -> int: ...


class Observed(Protocol):
    """What the checks read of a simulation (``simulation.Simulation``)."""

    seed: int
    steps: int
    time: float
    crash_faults: int
    oom_faults: int
    #: the worker that lies (``Config.liar``), if any
    liar: str | None

    @property
    def config(self) -> _Settings: ...

    @property
    def runs(self) -> dict[int, RunRecord]: ...

    @property
    def workers(self) -> dict[str, WorkerNode]: ...

    @property
    def manager(self) -> ManagerNode: ...

    @property
    def said(self) -> dict[str, str]: ...


class Checker:
    """The invariants of one simulation; see the module docstring."""

    def __init__(self, sim: Observed) -> None:
        self.sim = sim
        self.violations: list[Violation] = []
        self.fatal = False
        self._ejected = 0
        self._quarantined = 0
        self._claims: set[str] = set()
        self._struck: set[str] = set()

    def violation(self, invariant: str, detail: str) -> None:
        sim = self.sim
        self.violations.append(Violation(sim.seed, sim.steps, sim.time, invariant, detail))
        if len(self.violations) >= MAX_VIOLATIONS:
            self.fatal = True

    # -- as it happens ----------------------------------------------------------------

    def output(self, ev: RunOutput) -> None:
        record = self.sim.runs.get(ev.run_id)
        if record is None:
            return self.violation("results", f"an output of run {ev.run_id}, never submitted")
        if ev.key not in record.expected:
            return self.violation("results", f"run {ev.run_id}: {ev.key!r} is not an output")
        if ev.key in record.delivered:
            return self.violation("results", f"run {ev.run_id}: output {ev.key!r} given twice")
        value = loads(ev.value)
        record.delivered[ev.key] = value
        expected = record.expected[ev.key]
        if self.sim.liar is not None:
            return  # (its wrong values go undetected without verification: docs/faults.md)
        if isinstance(expected, wl.TaskRaised) or value != expected:
            self.violation(
                "results",
                f"run {ev.run_id} ({record.workload.name}): output "
                f"{ev.key!r} is {value!r}, Dask's is {expected!r}",
            )

    def ended(self, ev: RunDone | RunFailed) -> None:
        record = self.sim.runs.get(ev.run_id)
        if record is None:
            return self.violation("results", f"run {ev.run_id} ended, never submitted")
        if record.ended is not None:
            return self.violation("results", f"run {ev.run_id} ended twice")
        record.ended = ev
        if self.sim.liar is not None:
            return  # (a task on the liar "succeeds", one reading its None raises)
        raises = record.workload.raises
        if not isinstance(ev, RunFailed):
            missing = [k for k in record.expected if k not in record.delivered]
            if missing:
                self.violation("results", f"run {ev.run_id} done without outputs {missing[:5]}")
            if raises:
                self.violation("results", f"run {ev.run_id} done, though a task of it raises")
            return
        if isinstance(ev.error, ResourceExhausted):
            if not self.sim.oom_faults and not any(n.exhausted for n in self.sim.workers.values()):
                self.violation(
                    "results", f"run {ev.run_id} failed {ev.error!r}, no task ran out of memory"
                )
            return
        if ev.crashed:
            if self.sim.crash_faults <= self.sim.config.retries:
                self.violation(
                    "results",
                    f"run {ev.run_id} failed on crashes ({ev.message}; task "
                    f"{ev.key!r} on {ev.worker}) after {self.sim.crash_faults} preemptions "
                    f"and leaves, with {self.sim.config.retries} retries",
                )
            return
        if not raises or ev.type_name != RAISED:
            self.violation(
                "results",
                f"run {ev.run_id} failed with {ev.type_name or '?'}: "
                f"{ev.message} (task {ev.key!r} on {ev.worker}); no task of it "
                "raises that",
            )

    def lost(self, worker: bytes, reason: str) -> None:
        """The manager lost a worker; an ejection is checked after the step."""

    def gone(self, node: WorkerNode, how: str) -> None:
        """The simulation made ``node`` leave."""

    # -- after every step --------------------------------------------------------------

    def after_step(self, name: str) -> None:
        manager = self.sim.manager
        if len(manager.ejected) > self._ejected:
            for ident, reason in manager.ejected[self._ejected :]:
                node = self.sim.workers.get(ident.decode())
                if node is not None and node.alive and not node.faults.liar:
                    # (a worker gone silent is no liar)
                    self.violation("no honest worker is ejected", f"{node.name}: {reason}")
            self._ejected = len(manager.ejected)
        if len(manager.quarantined) > self._quarantined:
            for q in manager.quarantined[self._quarantined :]:
                node = self.sim.workers.get(q.name)
                slower = node is not None and node.faults.speed < 1.0
                if node is not None and node.faults.liar:
                    continue  # (what the defence is for)
                if q.reason is not None and not (slower and q.reason.startswith("slow")):
                    self.violation("no honest worker is quarantined", f"{q.name}: {q.reason}")
            self._quarantined = len(manager.quarantined)
        for worker, count in manager.false_claims().items():
            if worker not in self._claims:
                self._claims.add(worker)
                said = self.sim.said.get(worker, "")
                self.violation(
                    "no honest report is judged a false claim",
                    f"{worker}: {count} false claims counted ({said})",
                )
        for worker, strikes in manager.strikes().items():
            node = self.sim.workers.get(worker)
            if node is not None and node.faults.liar:
                continue
            if worker not in self._struck and (node is None or not node.exhausted):
                self._struck.add(worker)
                self.violation("no honest worker is struck", f"{worker}: {strikes} strikes")

    # -- at the end --------------------------------------------------------------------

    def at_end(self, settled: bool) -> None:
        sim = self.sim
        if self.fatal:
            return
        if not settled:
            for record in sim.runs.values():
                if record.ended is None and not record.cancelled:
                    self.violation(
                        "every run ends",
                        f"run {record.run_id} ({record.workload.name}, "
                        f"{len(record.workload.graph)} tasks, submitted at "
                        f"{record.submitted:.2f}s) has not ended at {sim.time:.1f}s",
                    )
            return
        manager = sim.manager
        if manager.state.tasks:
            self.violation(
                "views agree once quiet", f"the manager still has {len(manager.state.tasks)} tasks"
            )
        alive = {n.name for n in sim.workers.values() if n.alive}
        known = manager.known_workers()
        if not known <= alive:
            self.violation(
                "views agree once quiet",
                f"the manager counts workers that are gone: {sorted(known - alive)}",
            )
        joined = {n.name for n in sim.workers.values() if n.alive and n.state_registered()}
        if not joined <= known:
            self.violation(
                "views agree once quiet",
                f"workers that think they joined are "
                f"unknown to the manager: {sorted(joined - known)}",
            )
        for name, held in manager.held_by().items():
            if held:
                self.violation(
                    "views agree once quiet", f"the manager thinks {name} holds {sorted(held)[:5]}"
                )
        for node in sim.workers.values():
            if not node.alive:
                continue
            leaks = node.leaks()
            if leaks:
                self.violation("views agree once quiet", f"{node.name} still has {leaks}")
            held = node.holds()
            if held:
                self.violation(
                    "views agree once quiet",
                    f"{node.name} still holds results {sorted(held)[:5]} nobody needs",
                )
