"""A deterministic simulation of the real state machines (docs/simulation.md).

The real ``SchedulerState`` (scheduler/) and N real ``WorkerState``s (worker/) on a
seeded network and clock, with simulated libraries that compute the tasks for real:
``python -m daskvine_py.simulate --seeds N``. It may import the scheduler, the worker's
state and its library's ``run``, the plan and the wire; never a socket, a thread, a
process or a clock. Nothing imports it but its ``__main__`` and the tests.

- ``simulation``: one seed: the event heap, the network, faults, runs;
- ``manager_node``: the only contact with ``SchedulerState`` (what the manager's loop
  does around it);
- ``worker_node``: the only contact with ``WorkerState`` (what the worker's shell does
  around it), and the simulated libraries;
- ``invariants``: what must hold at every step;
- ``workloads``: the graphs, their simulated costs and their reference results.

May import: ``scheduler`` (its state and records), ``worker`` (its state, store, pipe
records, peer serving and library ``run``), ``plan`` (to read a graph), ``wire``, the
bottom modules. Never ``manager``, a socket, a thread or a clock.
"""
