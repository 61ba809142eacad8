"""The console's overview: the backlog figures, the lines and the delivery rate, read
from the outbox only, and a short-lived cache so that many open pages cost one read.

The rate is read from the marks themselves (sent_at of the entries marked sent in
each interval), not sampled by this process: with several workers every one of
them marks entries, and any console, on any worker, sees all of their marks; a
restart loses no history either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

from publisher.lines_view import lines_view
from publisher.store import Outbox

RATE_INTERVAL_S: Final = 10.0
RATE_INTERVALS: Final = 30  # the chart shows the last 5 minutes
# A consumer that refuses a type can block a lane for each of thousands of keys: the
# overview, sent to each open page every second, carries the first ones and the
# counts (`outbox-publisher status` lists them all).
SHOWN_LANES: Final = 20
SHOWN_LINES: Final = 50


async def read_overview(outbox: Outbox) -> dict[str, Any]:
    """The overview as plain JSON values: GET /console/api/overview and each SSE event."""
    snapshot = await outbox.snapshot()
    lines = await lines_view(outbox)
    rate = await outbox.sent_per_interval(RATE_INTERVAL_S, RATE_INTERVALS)
    held = [lease.to_dict() for lease in lines.leases if lease.owner is not None]
    figures = snapshot.to_dict()
    blocked = figures["blocked_lanes"]
    return {
        **figures,
        "blocked_lanes": blocked[:SHOWN_LANES],
        "blocked_lanes_count": len(blocked),
        "taken_at": snapshot.taken_at,
        "workers": lines.workers,
        "lines": held[:SHOWN_LINES],
        "lines_held": len(held),
        "lines_free": len(lines.leases) - len(held),
        "rate": {"interval_seconds": RATE_INTERVAL_S, "sent": rate},
    }


class OverviewCache:
    """One overview read shared by every caller within `max_age_s` of it; concurrent
    callers wait for the one read in progress instead of starting their own."""

    def __init__(
        self,
        outbox: Callable[[], Outbox],
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._outbox = outbox
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._value: dict[str, Any] | None = None
        self._read_at = -float("inf")

    async def get(self) -> dict[str, Any]:
        async with self._lock:
            if self._value is None or self._clock() - self._read_at >= self._max_age_s:
                self._value = await read_overview(self._outbox())
                self._read_at = self._clock()
            return self._value
