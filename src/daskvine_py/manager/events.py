"""The event log's names where code written before ``report/`` imports them (as
``examples/report.py`` once did); they live in ``daskvine_py.report.events``:
``from daskvine_py.report import read_events, write_events``."""

from daskvine_py.report.events import EventLog, read_events, write_events

__all__ = ["EventLog", "read_events", "write_events"]
