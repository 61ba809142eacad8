"""Intake without I/O: how an event is checked (its limits and schemas), what a batch
body is (`POST /events/batch`, `POST /orders/batch`), and how each item's outcome is
answered.

A batch is a JSON object `{"events": [...]}` (or `{"orders": [...]}`) of 1 to
MAX_ACCEPT items (an object, not a bare list, so that the body can gain fields
later). Its items are recorded in one transaction by `Outbox.publish_many` (or
`accept_many`) and answered one result each, in the request's order.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Final, Protocol

from plumbing.http_errors import BadRequest, invalid_event
from publisher.store import MAX_ACCEPT, EventCheck, IntakeOutcome
from shared import Conflict, Event, InvalidEvent, checked_event
from shared.event import MAX_DATA_BYTES, MAX_DATA_BYTES_LIMIT

ORDER_MAX_BODY_BYTES: Final = 16 * 1024  # one order (POST /orders)
# The body of one batch of orders: MAX_ACCEPT orders of the longest kind (an ID of 128
# and a SKU of 64 characters, about 230 bytes as JSON) with room for whitespace.
MAX_BATCH_BODY_BYTES: Final = MAX_ACCEPT * 1024
# Room around an event's data in its body: the other fields, and some whitespace.
EVENT_ENVELOPE_BYTES: Final = 64 * 1024
# One batch of events (POST /events/batch): up to MAX_ACCEPT events, but not over this.
EVENTS_BATCH_BODY_BYTES: Final = 8 * 1024 * 1024
RESULTS: Final = ("accepted", "duplicate", "conflict", "invalid")


class SchemaCheck(Protocol):
    """What intake asks of a set of schemas (shared.schemas.Schemas)."""

    def check(self, event_type: str, data: object) -> None: ...


def event_check(
    max_data_bytes: int = MAX_DATA_BYTES,
    schemas: SchemaCheck | None = None,
    *,
    parsed: bool = False,
) -> EventCheck:
    """How a service checks each event at intake: the event's own rules with its
    data limit, then the schema of its type, if any (InvalidEvent naming the place).
    `parsed`: the events come from the strict parser (plumbing.bodies), as those of
    a request body or of a file do (shared.checked_event).

    The library takes it as the `check` of `publish_in`, `publish_in_async`,
    `Outbox.publish` and `Outbox.publish_many`, to hold events to the schemas that
    `outbox-publisher serve --schemas DIR` holds them to:
    `check = event_check(schemas=Schemas.load("schemas"))`, then
    `publish_in(conn, event, check)`. ValueError for a `max_data_bytes` that is not
    an integer from 1 to MAX_DATA_BYTES_LIMIT: an event over that no sink takes."""
    if (
        not isinstance(max_data_bytes, int)
        or isinstance(max_data_bytes, bool)
        or not 1 <= max_data_bytes <= MAX_DATA_BYTES_LIMIT
    ):
        raise ValueError(
            f"max_data_bytes must be an integer from 1 to {MAX_DATA_BYTES_LIMIT:,},"
            f" not {max_data_bytes!r}"
        )

    def check(obj: object) -> tuple[Event, str]:
        event, canonical = checked_event(obj, max_data_bytes=max_data_bytes, parsed=parsed)
        if schemas is not None:
            schemas.check(event["type"], event["data"])
        return event, canonical

    return check


def event_body_bytes(max_data_bytes: int) -> int:
    """The largest body of one event that intake reads, for a data limit."""
    return max_data_bytes + EVENT_ENVELOPE_BYTES


def batch_items(body: object, name: str = "orders") -> list[object]:
    """The `name` list of a batch body (`orders`, `events`): 1 to MAX_ACCEPT items
    (each still to be validated), else BadRequest 400 saying what a batch is."""
    if not isinstance(body, dict) or set(body) != {name}:
        raise BadRequest(
            400, "invalid", f'a batch is a JSON object {{"{name}": [...]}}', field=name
        )
    items = body[name]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ACCEPT:
        raise BadRequest(
            400, "invalid", f"{name} must be a list of 1 to {MAX_ACCEPT} {name}", field=name
        )
    return items


def batch_orders(body: object) -> list[object]:
    """The `orders` list of a batch body (batch_items)."""
    return batch_items(body, "orders")


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
