"""The public ``Manager`` (``manager``), its I/O thread (``loop``, ``watching``) and what
users see of runs as they go: Dask's callbacks and the progress bar; the live snapshot its
I/O thread builds (``live``) and the views it hands it to (``views``); how workers reach
it (``connection``) and starting local workers (``launch``). The report and the live
view's pages are drawn below it (``report``, ``live``).

May import everything below it (``live``, ``report``, ``batch``, ``cache``, ``scheduler``,
``plan``, ``wire``); never ``worker``: local workers are processes, started by their
command line.
"""
