"""The content-addressed result cache, the caller's side: cache keys of tasks (``keys``,
``walk``), the cache directory on disk (``directory``) and a cached run's bookkeeping in the
caller's process (``result_cache``).

May import: ``scheduler`` (the placement of cached results), ``plan``, ``wire``, the bottom
modules; never the manager's I/O or the worker.
"""
