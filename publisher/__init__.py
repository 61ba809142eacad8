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
from publisher.store import Outbox
from shared import MAX_BATCH

__all__ = [
    "MAX_BATCH",
    "DeliveryError",
    "HttpSender",
    "NotAcknowledged",
    "Outbox",
    "Rejected",
    "TargetNotAllowed",
    "UnknownEntry",
    "dispatch",
    "send_http",
]
