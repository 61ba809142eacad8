"""Bulk intake (`POST /orders/batch`) without I/O: what a batch body is, and how each
order's outcome is answered.

A batch is a JSON object `{"orders": [...]}` of 1 to MAX_ACCEPT orders (an object,
not a bare list, so that the body can gain fields later, as the sink's
`{"events": [...]}` did). Its orders are recorded in one transaction by
`Outbox.accept_many` and answered one result each, in the request's order.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Final

from plumbing.http_errors import BadRequest, invalid_event
from publisher.store import MAX_ACCEPT, IntakeOutcome
from shared import MAX_BODY_BYTES, Conflict, InvalidEvent

# The body of one batch: MAX_ACCEPT orders of the longest kind (an ID of 128 and a SKU
# of 64 characters, about 230 bytes as JSON) with room for whitespace.
MAX_BATCH_BODY_BYTES: Final = max(MAX_BODY_BYTES, MAX_ACCEPT * 1024)
RESULTS: Final = ("accepted", "duplicate", "conflict", "invalid")


def batch_orders(body: object) -> list[object]:
    """The `orders` list of a batch body: 1 to MAX_ACCEPT items (each still to be
    validated), else BadRequest 400 saying what a batch is."""
    if not isinstance(body, dict) or set(body) != {"orders"}:
        raise BadRequest(
            400, "invalid", 'a batch is a JSON object {"orders": [...]}', field="orders"
        )
    orders = body["orders"]
    if not isinstance(orders, list) or not 1 <= len(orders) <= MAX_ACCEPT:
        raise BadRequest(
            400, "invalid", f"orders must be a list of 1 to {MAX_ACCEPT} orders", field="orders"
        )
    return orders


def order_result(index: int, item: object, outcome: IntakeOutcome) -> dict[str, Any]:
    """One order's answer: its index and ID, and its result; a conflict or an invalid
    order also says what was wrong, as the single route's error body would."""
    event_id = item.get("id") if isinstance(item, dict) else None
    answer: dict[str, Any] = {"index": index, "id": event_id if isinstance(event_id, str) else None}
    if isinstance(outcome, InvalidEvent):
        return {**answer, "result": "invalid", **invalid_event(outcome).body}
    if isinstance(outcome, Conflict):
        return {**answer, "result": "conflict", "error": "conflict", "detail": str(outcome)}
    return {**answer, "result": outcome}


def batch_reply(items: Sequence[object], outcomes: Sequence[IntakeOutcome]) -> dict[str, Any]:
    """The reply to a batch: how many orders had each result, and each order's."""
    results = [
        order_result(n, item, outcome)
        for n, (item, outcome) in enumerate(zip(items, outcomes, strict=True))
    ]
    counts = collections.Counter(result["result"] for result in results)
    return {**{name: counts[name] for name in RESULTS}, "results": results}
