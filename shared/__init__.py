"""The wire contract between publisher and sink: events, ACKs, errors. No I/O."""

from shared.ack import (
    FENCE_HEADER,
    FENCING_ENFORCED,
    FENCING_HEADER,
    Receipt,
    digest_of,
    make_ack,
    payload_digest,
    verify_ack,
)
from shared.errors import Conflict, FenceNotMet, InvalidAck, InvalidEvent
from shared.event import Event, canonical_json, validate_event, validate_event_id, validate_sku

__all__ = [
    "FENCE_HEADER",
    "FENCING_ENFORCED",
    "FENCING_HEADER",
    "Conflict",
    "Event",
    "FenceNotMet",
    "InvalidAck",
    "InvalidEvent",
    "Receipt",
    "canonical_json",
    "digest_of",
    "make_ack",
    "payload_digest",
    "validate_event",
    "validate_event_id",
    "validate_sku",
    "verify_ack",
]
