"""The public ``Manager`` (``manager``), its I/O thread (``loop``, ``watching``) and what
users see of runs: Dask's callbacks, the progress bar, the event log, the report and the
run's record (``runinfo``); how workers reach it (``connection``) and starting local
workers (``launch``).

May import everything below it (``batch``, ``cache``, ``scheduler``, ``plan``, ``wire``);
never ``worker``: local workers are processes, started by their command line.
"""
