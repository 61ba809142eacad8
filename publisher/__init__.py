"""The publisher: order intake with an outbox, and delivery to the sink."""

from publisher.errors import (
    DeliveryError,
    NotAcknowledged,
    Rejected,
    TargetNotAllowed,
    UnknownEntry,
)
from publisher.http import HttpSender, send_http
from publisher.outbox import MAX_BATCH, Outbox
from publisher.relay import OutboxStore, dispatch

__all__ = [
    "MAX_BATCH",
    "DeliveryError",
    "HttpSender",
    "NotAcknowledged",
    "Outbox",
    "OutboxStore",
    "Rejected",
    "TargetNotAllowed",
    "UnknownEntry",
    "dispatch",
    "send_http",
]
