"""The relay's delivery log and outcome counts: one line per request taken.

The lines keep the logger name `publisher.relay`, which operators filter on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from publisher.errors import LeaseLost
from publisher.retry import is_permanent
from publisher.store import Pending

RELAY_LOG = logging.getLogger("publisher.relay")


class Observer(Protocol):
    """Receives one call per delivery outcome (metrics). An observer that also has
    `delivered(event_type)` is told the type of each event delivered."""

    def delivery(self, outcome: str) -> None: ...


def outcome_of(error: BaseException | None) -> str:
    """delivered, transient, permanent, or fenced (refused for a stale lease: not a
    failure of the entry's, another worker delivers it)."""
    if error is None:
        return "delivered"
    if isinstance(error, LeaseLost):
        return "fenced"
    return "permanent" if is_permanent(error) else "transient"


class DeliveryLog:
    """A Reporter for the driver: logs each request taken and counts its outcomes.

    A request of one event gets one line like any attempt; a batch gets one line
    for its verified prefix (a line per entry would cost the relay more than the
    request), with its IDs and the first entry's seq and attempt, and one line for
    the entry that failed, if any.
    """

    def __init__(self, observer: Observer | None, batches: bool) -> None:
        self._observer = observer
        self._batches = batches
        self._by_type: Callable[[str], object] | None = getattr(observer, "delivered", None)

    def __call__(
        self,
        delivered: list[Pending],
        failed: Pending | None,
        error: BaseException | None,
        started: float,
    ) -> None:
        if delivered and (self._batches or len(delivered) > 1):
            self._delivered(delivered, started)
        elif delivered:
            self.attempt(delivered[0], started)
        if failed is not None:
            self.attempt(failed, started, error)

    def _delivered(self, rows: list[Pending], started: float) -> None:
        first, last = rows[0], rows[-1]
        fields = {
            **_fields(first, "delivered", started),
            "count": len(rows),
            "last_seq": last.seq,
            "event_ids": [row.id for row in rows],
        }
        RELAY_LOG.info("delivery", extra=fields)
        if self._observer is not None:
            for row in rows:
                self._observer.delivery("delivered")
                if self._by_type is not None:
                    self._by_type(row.type)

    def attempt(self, row: Pending, started: float, error: BaseException | None = None) -> None:
        """One line for one entry's attempt: delivered, or failed with `error`."""
        outcome = outcome_of(error)
        fields = _fields(row, outcome, started)
        if error is not None:
            fields["error"] = str(error)
        RELAY_LOG.log(logging.INFO if error is None else logging.WARNING, "delivery", extra=fields)
        if self._observer is not None:
            self._observer.delivery(outcome)
            if error is None and self._by_type is not None:
                self._by_type(row.type)


def _fields(row: Pending, outcome: str, started: float) -> dict[str, Any]:
    return {
        "event_id": row.id,
        "seq": row.seq,
        "attempt": row.attempts + 1,
        "outcome": outcome,
        "latency_ms": round((time.perf_counter() - started) * 1000, 2),
    }
