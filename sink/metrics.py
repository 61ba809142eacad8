"""The sink's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared import LEASE_HEADER, PREDECESSOR_HEADER

RESULTS: Final = ("applied", "duplicate", "conflict", "invalid")
# Event types are the senders' to choose: a label value for each would let them grow
# the series without bound. The first MAX_TYPE_LABELS types applied have their own;
# the rest share OTHER_TYPES, which no type can be (parentheses are not in a type).
MAX_TYPE_LABELS: Final = 50
OTHER_TYPES: Final = "(other)"


class SinkMetrics:
    """The sink's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.applied = Counter(
            "sink_events_applied",
            f"Events applied (duplicates not counted), by type: each of the first"
            f" {MAX_TYPE_LABELS} types this process applied has a series of its own, any"
            f" later type counts under type={OTHER_TYPES!r}.",
            ["type"],
            registry=self.registry,
        )
        self._applied: dict[str, Counter] = {}  # a type's series, once it has one
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
        series = self._applied.get(event_type)
        if series is None:
            series = self._series_of(event_type)
        series.inc(count)

    def _series_of(self, event_type: str) -> Counter:
        """The series of a type not counted before: its own while there is room, else
        OTHER_TYPES's (the first types seen keep theirs for the life of the process)."""
        if len(self._applied) >= MAX_TYPE_LABELS:
            return self.applied.labels(OTHER_TYPES)
        series = self._applied[event_type] = self.applied.labels(event_type)
        return series
