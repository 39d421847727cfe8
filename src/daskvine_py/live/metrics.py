"""The live snapshot (the manager's ``live.LiveView``) in Prometheus's text exposition format:
``Manager.metrics()``, what a ``/metrics`` endpoint serves (docs/live.md).

A collector of its own in a registry of its own (never ``prometheus_client``'s global
one, which would mix in this process's other metrics and hold one manager's figures
after it closed): each call turns one snapshot into text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "daskvine_py"

#: (name, snapshot total, help) of the gauges taken from ``totals``
_GAUGES = (
    ("workers", "workers", "Workers connected"),
    ("cores", "cores", "Cores of the workers connected"),
    ("stored_bytes", "stored_bytes", "Bytes of results the workers hold"),
    ("spilled_bytes", "spilled_bytes", "Bytes of results the workers hold on disk"),
)
#: (name, snapshot total, help) of the counters taken from ``totals`` (``_total`` added)
_COUNTERS = (
    ("tasks_done", "tasks_done", "Tasks finished since the manager started"),
    ("tasks_failed", "tasks_failed", "Tasks that raised or crashed since the manager started"),
    ("bytes_moved", "bytes_moved", "Bytes moved between workers and the manager"),
)


class SnapshotCollector(Collector):
    """One snapshot's metrics."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        totals = self.snapshot["totals"]
        for name, field, text in _GAUGES:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=totals[field])
        tasks = GaugeMetricFamily(
            f"{PREFIX}_tasks",
            "Tasks by state: waiting for inputs, ready at the manager, "
            "processing on a worker, running on a core",
            labels=["state"],
        )
        for state in ("waiting", "ready", "processing", "running"):
            tasks.add_metric([state], totals[state])
        yield tasks
        for name, field, text in _COUNTERS:
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=totals[field])
        yield GaugeMetricFamily(
            f"{PREFIX}_manager_cpu_seconds",
            "CPU seconds the manager's process has used",
            value=self.snapshot["manager"]["cpu_s"],
        )


def exposition(snapshot: dict[str, Any]) -> str:
    """``snapshot`` as Prometheus's text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry).decode()
