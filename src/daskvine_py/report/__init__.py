"""The run report and what builds it: a run's record (``runinfo``: ``manager.last_run``),
its event log (``events``), the records gathered (``summary``) and drawn (``drawing``) into
one self-contained HTML page (``page``, with the categories and memory sections in
``resources``).

    >>> from daskvine_py.report import read_events, write_report
    >>> write_report(read_events("run.jsonl"), "run.html")  # doctest: +SKIP

Pure functions of records: no sockets, no threads; the manager's I/O thread appends to an
``EventLog`` and its caller writes the files. May import ``scheduler`` records (its
categories) and the modules below; never ``manager``, ``live`` or ``worker``.
"""

from daskvine_py.report.events import read_events, write_events
from daskvine_py.report.page import write_report

__all__ = ["read_events", "write_events", "write_report"]
