"""The sans-I/O scheduler: ``state.SchedulerState`` (events in, instructions out), the
records it keeps (``records``), the messages it takes and gives (``messages``), the
ready-task structure (``matching``) and worker liveness (``liveness``). The state owns its
components, each with its own state and called through a few named methods, all built
around one ``context.Context`` (the records they share, the clock, each other by name):
constraints, saturation, locality, stealing, claims, failures, sizing, faults,
verification, caching (with ``cache_budget``; the records it shares with the caller's
side: ``cache_placement``), copies, relays, churn, submission and dispatch. No sockets, no
threads, no clocks (``now`` is a parameter), no dask.

May import: ``wire`` (the records it emits), ``plan`` (what a plan is), the bottom modules.
"""
