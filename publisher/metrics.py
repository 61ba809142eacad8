"""The publisher's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from publisher.store import Snapshot

DELIVERY_OUTCOMES: Final = ("delivered", "transient", "permanent")
INTAKE_RESULTS: Final = ("accepted", "duplicate", "conflict", "invalid", "too_large")


class PublisherMetrics:
    """Counters are kept in process; gauges are read from the outbox at each scrape."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.pending = Gauge(
            "publisher_outbox_pending_events", "Entries waiting to be delivered.", registry=r
        )
        self.oldest_age = Gauge(
            "publisher_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending entry (0 when none).",
            registry=r,
        )
        self.quarantined = Gauge(
            "publisher_outbox_quarantined_events", "Entries held in quarantine.", registry=r
        )
        self.head_blocked = Gauge(
            "publisher_outbox_head_blocked",
            "1 while the oldest pending entry has failed and not yet been delivered.",
            registry=r,
        )
        self.blocked_lanes = Gauge(
            "publisher_outbox_blocked_lanes",
            "Lanes (SKUs) whose head entry has failed and is not yet delivered.",
            registry=r,
        )
        self.attempts = Counter(
            "publisher_delivery_attempts", "Delivery attempts, by outcome.", ["outcome"], registry=r
        )
        self.intake = Counter(
            "publisher_intake",
            "Orders received by the intake API, by result.",
            ["result"],
            registry=r,
        )
        for outcome in DELIVERY_OUTCOMES:
            self.attempts.labels(outcome)
        for result in INTAKE_RESULTS:
            self.intake.labels(result)

    def delivery(self, outcome: str) -> None:
        self.attempts.labels(outcome).inc()

    def observe(self, snapshot: Snapshot) -> None:
        self.pending.set(snapshot.pending)
        self.oldest_age.set(snapshot.oldest_pending_age_s)
        self.quarantined.set(snapshot.quarantined)
        self.head_blocked.set(1 if snapshot.head is not None and snapshot.head.blocked else 0)
        self.blocked_lanes.set(len(snapshot.blocked_lanes))
