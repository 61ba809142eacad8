"""A counter labelled by event type, with the label set bounded.

Event types are their producers' to choose: a series for each would let a producer
grow a service's metrics without bound. The first MAX_TYPE_LABELS types counted
have a series of their own for the life of the process; every later type counts
under OTHER_TYPES, which no type can be (parentheses are not in a type's alphabet).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter

MAX_TYPE_LABELS: Final = 50
OTHER_TYPES: Final = "(other)"


class CountByType:
    """A Prometheus counter with one label, `type`, of at most MAX_TYPE_LABELS values
    besides OTHER_TYPES."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.counter = Counter(
            name,
            f"{documentation} By type: each of the first {MAX_TYPE_LABELS} types this"
            f" process counted has a series of its own, any later type counts under"
            f" type={OTHER_TYPES!r}.",
            ["type"],
            registry=registry,
        )
        self._series: dict[str, Counter] = {}  # a type's series, once it has one

    def count(self, event_type: str, count: int = 1) -> None:
        """Count `count` events of `event_type`."""
        series = self._series.get(event_type)
        if series is None:
            series = self._series_of(event_type)
        series.inc(count)

    def _series_of(self, event_type: str) -> Counter:
        if len(self._series) >= MAX_TYPE_LABELS:
            return self.counter.labels(OTHER_TYPES)
        series = self._series[event_type] = self.counter.labels(event_type)
        return series
