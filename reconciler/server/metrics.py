"""The daemon's Prometheus metrics, exposed through ``prometheus_client`` (with process metrics)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Everything ``/metrics`` shows, in a registry of its own (so that two daemons in one process,
    as in tests, never share counters). Thread-safe: the loop writes while the server scrapes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._duration = Histogram(
            "argus_reconcile_duration_seconds",
            "Duration of one reconcile tick.",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self._errors = Counter("argus_errors", "Errors by kind.", ["kind"], registry=self.registry)
        self._tick_exceptions = Counter(
            "argus_tick_exceptions",
            "Unexpected exceptions caught by the loop's last line of defence.",
            registry=self.registry,
        )
        self._http_rejected = Counter(
            "argus_http_rejected",
            "HTTP requests refused before reaching a handler, by reason (timeout, too_large, busy, ...).",
            ["reason"],
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], int] = {}
        self._last_applied = 0.0
        self.registry.register(_StateCollector(self))

    def tick(self, seconds: float) -> None:
        """Record one reconcile tick's duration."""
        self._duration.observe(seconds)

    def set_objects(self, by_kind_state: Mapping[tuple[str, str], int]) -> None:
        """Replace the object counts by ``(kind, state)`` (kinds/states absent now disappear)."""
        with self._lock:
            self._objects = dict(by_kind_state)

    def error(self, kind: str) -> None:
        self._errors.labels(kind=kind).inc()

    def tick_exception(self) -> None:
        """Count an unexpected exception in a tick."""
        self._tick_exceptions.inc()

    def http_rejected(self, reason: str) -> None:
        self._http_rejected.labels(reason=reason).inc()

    @property
    def last_applied_commit_time(self) -> float:
        return self._last_applied

    @last_applied_commit_time.setter
    def last_applied_commit_time(self, value: float) -> None:
        self._last_applied = float(value)

    def render(self) -> str:
        """The text exposition format."""
        return generate_latest(self.registry).decode()


class _StateCollector(Collector):
    """Gauges that are replaced as a whole each tick, read consistently under one lock."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.metrics._lock:
            objects = sorted(self.metrics._objects.items())
        family = GaugeMetricFamily("argus_objects", "Objects by kind and state.", labels=["kind", "state"])
        for (kind, state), n in objects:
            family.add_metric([kind, state], n)
        yield family
        yield GaugeMetricFamily(
            "argus_last_applied_commit_timestamp_seconds",
            "Commit time of the last applied revision.",
            value=self.metrics._last_applied,
        )
