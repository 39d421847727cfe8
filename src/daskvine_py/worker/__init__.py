"""``python -m daskvine_py.worker``: one process per node. The I/O shell (``shell``), its
sans-I/O state (``state``, with ``records`` and its components: ``fetching``,
``live_tasks`` with ``live_results``, ``dispatch``, ``activity``), the library processes
that run tasks (``library``; ``pipe``, the records and codec of the pipe to each;
``threads``, their thread pools; ``task_process`` for ``task_mode="tasks"``), the store of
results (``store``), peers (``peers``), the host's processes (``host``) and the software
runs ship (``software_host``: prepared off the loop, libraries started with it).

May import: ``software`` (the node's cache, archives fetched and served), ``wire``, ``plan``
(the fused-task records a library runs), the bottom modules;
never ``manager``, ``scheduler`` or ``batch``: the worker and the manager share only the wire.
"""
