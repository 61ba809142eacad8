"""The publisher's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.gc_collector import GCCollector

from plumbing.capped_labels import CountByType
from publisher.store import Snapshot

DELIVERY_OUTCOMES: Final = ("delivered", "transient", "permanent", "fenced")
INTAKE_RESULTS: Final = ("accepted", "duplicate", "conflict", "invalid", "too_large")


class PublisherMetrics:
    """Counters are kept in process; gauges are read from the outbox at each scrape."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        GCCollector(registry=r)  # python_gc_collections_total{generation}, and collected
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
            "Lanes (keys) whose head entry has failed and is not yet delivered.",
            registry=r,
        )
        self.attempts = Counter(
            "publisher_delivery_attempts", "Delivery attempts, by outcome.", ["outcome"], registry=r
        )
        self.intake = Counter(
            "publisher_intake",
            "Orders and events received by the intake API (a batch counts each), by result.",
            ["result"],
            registry=r,
        )
        self.owned = Gauge(
            "publisher_lines_owned",
            "Lines (the global line, or key lanes) whose lease this worker holds.",
            registry=r,
        )
        self.live_workers = Gauge(
            "publisher_relay_workers_live",
            "Relay workers (this one included) whose heartbeat this worker saw within"
            " the lease ttl at its start or last renewal: the count its fair share"
            " divides by.",
            registry=r,
        )
        self.takeovers = Counter(
            "publisher_lease_takeovers",
            "Leases this worker took over from another worker whose lease had expired.",
            registry=r,
        )
        self.fenced_writes = Counter(
            "publisher_fenced_writes",
            "Writes of this worker (marks, attempt records, quarantines) the outbox"
            " refused because the line's lease had moved to a newer epoch.",
            registry=r,
        )
        self.fenced_requests = Counter(
            "publisher_fenced_requests",
            "Requests of this worker the sink refused (409) for a stale lease epoch.",
            registry=r,
        )
        self.fenced_gaps = Counter(
            "publisher_fenced_gaps_crossed",
            "Leases this worker took again past the epoch a sink said it had seen, the"
            " outbox being behind the sink (restored from an older backup, say).",
            registry=r,
        )
        # Events by type (CountByType bounds the label set): those the intake
        # accepted, and those the relay delivered (verified ACKs).
        self.published = CountByType(
            "publisher_events_published", "Events the intake API recorded as new.", r
        )
        self.delivered_events = CountByType(
            "publisher_events_delivered", "Events delivered with a verified ACK.", r
        )
        self.failovers = Counter(
            "publisher_sink_failovers",
            "Requests sent to the next --sink URL because one could not be reached.",
            registry=r,
        )
        for outcome in DELIVERY_OUTCOMES:
            self.attempts.labels(outcome)
        for result in INTAKE_RESULTS:
            self.intake.labels(result)

    def delivery(self, outcome: str) -> None:
        self.attempts.labels(outcome).inc()

    def delivered(self, event_type: str) -> None:
        self.delivered_events.count(event_type)

    # A LeaseObserver (publisher.leases):

    def lines_owned(self, count: int) -> None:
        self.owned.set(count)

    def workers_live(self, count: int) -> None:
        self.live_workers.set(count)

    def takeover(self) -> None:
        self.takeovers.inc()

    def fenced_write(self) -> None:
        self.fenced_writes.inc()

    def fenced_request(self) -> None:
        self.fenced_requests.inc()

    def fenced_gap_crossed(self) -> None:
        self.fenced_gaps.inc()

    def failover(self, from_url: object, to_url: object) -> None:
        """HttpSender's on_failover."""
        self.failovers.inc()

    def observe(self, snapshot: Snapshot) -> None:
        self.pending.set(snapshot.pending)
        self.oldest_age.set(snapshot.oldest_pending_age_s)
        self.quarantined.set(snapshot.quarantined)
        self.head_blocked.set(1 if snapshot.head is not None and snapshot.head.blocked else 0)
        self.blocked_lanes.set(len(snapshot.blocked_lanes))
