"""Software reaching the workers: the caller's environment and code, shipped and cached.

A run may name the software its tasks need (``environment=``): the caller's own
environment packed into an archive, an archive the user built, or a requirements (lock)
file each node builds with ``uv``. Modules of the caller's that no environment holds (the
working directory's, editable installs) travel beside it as a content-addressed code
archive. Workers fetch both once per node, from the manager's host or from peers that
hold them, keep them in a cache shared by the workers of the node, and start their
libraries with that environment's interpreter.

- ``spec``: what travels in a ``RunConfig`` (pure records, and the checks a node makes);
- ``pack``: the caller's side: environments packed or read, keyed by content;
- ``code``: the caller's side: the user's modules, archived by content;
- ``node_cache``: the worker's side: the per-node cache, locked, unpacked atomically, LRU;
- ``fanout``: the manager's policy of who sends an archive to whom (pure);
- ``transfer``: archives served and fetched, from the manager's host or peers (fan-out).

Nothing here imports dask: the worker process runs from a small install.

May import: ``wire`` (the records, the keys and CurveZMQ), the standard library; never
dask, numpy, the manager, the scheduler or the worker: both sides use it.
"""
