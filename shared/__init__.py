"""The wire contract between publisher and sink: events, ACKs, errors. No I/O."""

from shared.ack import Receipt, make_ack, verify_ack
from shared.errors import Conflict, InvalidAck, InvalidEvent
from shared.event import Event, canonical_json, validate_event, validate_event_id, validate_sku

__all__ = [
    "Conflict",
    "Event",
    "InvalidAck",
    "InvalidEvent",
    "Receipt",
    "canonical_json",
    "make_ack",
    "validate_event",
    "validate_event_id",
    "validate_sku",
    "verify_ack",
]
