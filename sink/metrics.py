"""The sink's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.gc_collector import GCCollector

from plumbing.capped_labels import CountByType
from shared import LEASE_HEADER, PREDECESSOR_HEADER

# rejected: no handler for its type, or its handler rejected it (422); failed: its
# handler failed (503).
RESULTS: Final = ("applied", "duplicate", "conflict", "invalid", "rejected", "failed")


class SinkMetrics:
    """The sink's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        GCCollector(registry=self.registry)  # python_gc_collections_total{generation}, ...
        self.received = Counter(
            "sink_inbox_received",
            "Events received, by result.",
            ["result"],
            registry=self.registry,
        )
        # Every series exists from the start, at 0; each request counts through these.
        self._received = {result: self.received.labels(result) for result in RESULTS}
        self.unauthorized = Counter(
            "sink_unauthorized_requests",
            "Requests refused for a missing or wrong bearer token.",
            registry=self.registry,
        )
        self.events = Gauge("sink_inbox_events", "Events in the inbox.", registry=self.registry)
        self.ready = Gauge(
            "sink_ready",
            "1 while the inbox database takes a write (as GET /readyz says), else 0.",
            registry=self.registry,
        )
        self.fenced = Counter(
            "sink_fenced_requests",
            f"Requests refused by fencing (409), nothing applied: the lease epoch in"
            f" {LEASE_HEADER} was below one seen for its source and line.",
            registry=self.registry,
        )
        # Applied, duplicates not counted; the label set is bounded (CountByType).
        self.applied = CountByType("sink_events_applied", "Events applied.", self.registry)
        self.predecessor_missing = Counter(
            "sink_predecessor_missing_requests",
            f"Requests refused by the predecessor check (412), nothing applied: the event"
            f" named in {PREDECESSOR_HEADER} was not in the inbox.",
            registry=self.registry,
        )

    def count_received(self, result: str, count: int = 1) -> None:
        """Count `count` events received with `result` (one of RESULTS)."""
        self._received[result].inc(count)

    def count_applied(self, event_type: str, count: int = 1) -> None:
        """Count `count` events of `event_type` applied."""
        self.applied.count(event_type, count)
