"""The wire contract between publisher and sink: events, ACKs, protocol headers and
limits, errors. No I/O."""

from shared.ack import (
    Receipt,
    digest_of,
    make_ack,
    payload_digest,
    verify_ack,
)
from shared.errors import (
    Conflict,
    ContractError,
    InvalidAck,
    InvalidEvent,
    PredecessorMissing,
    StaleLease,
)
from shared.event import Event, canonical_json, validate_event, validate_event_id, validate_sku
from shared.protocol import (
    GLOBAL_LINE,
    LEASE_HEADER,
    MAX_BATCH,
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
    PREDECESSOR_CHECK_ENFORCED,
    PREDECESSOR_CHECK_HEADER,
    PREDECESSOR_HEADER,
    Lease,
    parse_lease,
)

__all__ = [
    "GLOBAL_LINE",
    "LEASE_HEADER",
    "MAX_BATCH",
    "MAX_BATCH_BODY_BYTES",
    "MAX_BODY_BYTES",
    "PREDECESSOR_CHECK_ENFORCED",
    "PREDECESSOR_CHECK_HEADER",
    "PREDECESSOR_HEADER",
    "Conflict",
    "ContractError",
    "Event",
    "InvalidAck",
    "InvalidEvent",
    "Lease",
    "PredecessorMissing",
    "Receipt",
    "StaleLease",
    "canonical_json",
    "digest_of",
    "make_ack",
    "parse_lease",
    "payload_digest",
    "validate_event",
    "validate_event_id",
    "validate_sku",
    "verify_ack",
]
