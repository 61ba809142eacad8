"""The publisher: an outbox for events of any type, and their delivery to a sink.

from publisher import Outbox, publish_in
async with Outbox.open("orders.db") as outbox:
    await outbox.publish({"id": "p-1", "type": "payment.captured", "key": "c-9",
                          "data": {"amount_cents": 1999}})
"""

from publisher.dispatch import dispatch
from publisher.errors import (
    DeliveryError,
    NotAcknowledged,
    Rejected,
    TargetNotAllowed,
    UnknownEntry,
)
from publisher.http import HttpSender, send_http
from publisher.in_transaction import (
    NotInTransaction,
    accept_in,
    accept_in_async,
    publish_in,
    publish_in_async,
)
from publisher.intake import event_check
from publisher.store import Outbox
from shared import MAX_BATCH, Conflict, Event, InvalidEvent
from shared.schemas import SchemaError, Schemas

__all__ = [
    "MAX_BATCH",
    "Conflict",
    "DeliveryError",
    "Event",
    "HttpSender",
    "InvalidEvent",
    "NotAcknowledged",
    "NotInTransaction",
    "Outbox",
    "Rejected",
    "SchemaError",
    "Schemas",
    "TargetNotAllowed",
    "UnknownEntry",
    "accept_in",
    "accept_in_async",
    "dispatch",
    "event_check",
    "publish_in",
    "publish_in_async",
    "send_http",
]
