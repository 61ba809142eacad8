"""The publisher: order intake with an outbox, and delivery to the sink."""

from publisher.dispatch import dispatch
from publisher.errors import (
    DeliveryError,
    NotAcknowledged,
    Rejected,
    TargetNotAllowed,
    UnknownEntry,
)
from publisher.http import HttpSender, send_http
from publisher.in_transaction import NotInTransaction, accept_in, accept_in_async
from publisher.store import Outbox
from shared import MAX_BATCH

__all__ = [
    "MAX_BATCH",
    "DeliveryError",
    "HttpSender",
    "NotAcknowledged",
    "NotInTransaction",
    "Outbox",
    "Rejected",
    "TargetNotAllowed",
    "UnknownEntry",
    "accept_in",
    "accept_in_async",
    "dispatch",
    "send_http",
]
