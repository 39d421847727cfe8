"""The sans-I/O scheduler: ``state.SchedulerState`` (events in, instructions out) and its
parts: the records it keeps (``records``), the messages it takes and gives (``messages``),
the ready-task structure (``matching``), saturation, liveness, locality, stealing,
constraints, failures and cache placement. No sockets, no threads, no clocks (``now`` is a
parameter), no dask.

May import: ``wire`` (the records it emits), ``plan`` (what a plan is), the bottom modules.
"""
