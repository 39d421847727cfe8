"""Bytes on sockets and pipes: the message records and their framing and validation
(``protocol``), sending batches (``transport``), CurveZMQ keys and connection files
(``security``), pickling and the function table (``serialize``), shared-memory buffers
(``sharedbuf``), and the worker's exit statuses (``exits``).

The one vocabulary the manager and the worker share. May import: ``errors``, ``options``
(the run modes it carries), ``config``; nothing else of ours.
"""
