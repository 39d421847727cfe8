"""The report's names where code written before ``report/`` imports them (as
``examples/report.py`` once did); they live in ``daskvine_py.report.page``:
``from daskvine_py.report import write_report``."""

from daskvine_py.report.page import render, write_report

__all__ = ["render", "write_report"]
