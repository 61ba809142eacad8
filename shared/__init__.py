"""The wire contract between publisher and sink: events, ACKs, protocol headers and
limits, errors. No I/O."""

from shared.ack import (
    Receipt,
    digest_of,
    make_ack,
    payload_digest,
    verify_ack,
)
from shared.errors import Conflict, ContractError, FenceNotMet, InvalidAck, InvalidEvent
from shared.event import Event, canonical_json, validate_event, validate_event_id, validate_sku
from shared.protocol import (
    FENCE_HEADER,
    FENCING_ENFORCED,
    FENCING_HEADER,
    MAX_BATCH,
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
)

__all__ = [
    "FENCE_HEADER",
    "FENCING_ENFORCED",
    "FENCING_HEADER",
    "MAX_BATCH",
    "MAX_BATCH_BODY_BYTES",
    "MAX_BODY_BYTES",
    "Conflict",
    "ContractError",
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
