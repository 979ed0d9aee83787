"""The daemon's Prometheus metrics, exposed through ``prometheus_client`` (with process metrics)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from reconciler.status.usage import Totals

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
        # The usage totals (reconciler.observe.usage.UsageRecorder.totals); None: not counted.
        self.usage: Callable[[], Totals] | None = None
        self.registry.register(_StateCollector(self))
        self.registry.register(_UsageCollector(self))

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


class _UsageCollector(Collector):
    """Counters of the usage ledger's merged totals (docs/design/usage.md), read at each scrape.

    Their label sets are bounded by the repository: users and models it does not know are
    summed under ``(other)`` before they get here."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        source = self.metrics.usage
        totals = source() if source is not None else Totals()
        requests = CounterMetricFamily(
            "argus_usage_requests", "Requests that reached a model, by user and model.", labels=["user", "model"]
        )
        for (user, model), n in sorted(totals.requests.items()):
            requests.add_metric([user, model], n)
        yield requests
        tokens = CounterMetricFamily(
            "argus_usage_tokens",
            "Tokens by user, model and kind (prompt, completion).",
            labels=["user", "model", "kind"],
        )
        for kind, table in (("prompt", totals.prompt_tokens), ("completion", totals.completion_tokens)):
            for (user, model), n in sorted(table.items()):
                tokens.add_metric([user, model, kind], n)
        yield tokens
        gpu = CounterMetricFamily(
            "argus_usage_gpu_seconds",
            "GPU-seconds of tasks and model replicas, by user, team and kind (task, model).",
            labels=["user", "team", "kind"],
        )
        for (user, team, kind), seconds in sorted(totals.gpu_seconds.items()):
            gpu.add_metric([user, team, kind], seconds)
        yield gpu
