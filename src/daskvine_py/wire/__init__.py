"""Bytes on sockets and pipes: the message records (``records``), their validation
(``validation``), framing and the version (``protocol``, which also re-exports the names
of ``records``, ``validation`` and ``drops``: use it as ``p``), records as plain data for
what the receiver must not unpickle (``plain``, msgpack), warnings about dropped
messages (``drops``), sending batches (``transport``), CurveZMQ keys and connection files
(``security``), pickling and the function table (``serialize``), shared-memory buffers
(``sharedbuf``), and the worker's exit statuses (``exits``).

The one vocabulary the manager and the worker share. May import: ``errors``, ``options``
(the run modes it carries), ``config``; nothing else of ours.
"""
