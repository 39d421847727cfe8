"""The live view of a running manager (docs/live.md): the web dashboard's server
(``dashboard``) and its pages (``pages``, drawn with the report's sections), the snapshot
in Prometheus's text format (``metrics``), and ``python -m daskvine_py status``'s view in a
terminal (``terminal``, asking over the manager's port through ``batch.status``).

It draws what it is handed: the snapshot the manager's I/O thread builds (``manager.live``)
arrives as plain data, through a callable the manager gives the dashboard or over the
wire. May import ``report``, ``batch``'s status client and the layers below; never
``manager`` or ``worker``.
"""
