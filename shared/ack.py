"""The ACK: the sink's proof that it committed an event, and how it is checked."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final

from shared.errors import InvalidAck


class Receipt(StrEnum):
    """What the sink did with an event it accepted."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"


ACK_FIELD: Final = "ack"


def make_ack(event_id: str, receipt: Receipt) -> dict[str, str]:
    """The JSON object the sink replies with after its commit."""
    return {ACK_FIELD: event_id, "status": receipt.value}


def verify_ack(body: bytes, event_id: str) -> dict[str, object]:
    """Return the parsed ACK if `body` acknowledges exactly `event_id`, else raise InvalidAck."""
    try:
        reply = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidAck(f"reply is not JSON: {exc}") from exc
    if not isinstance(reply, dict):
        raise InvalidAck("reply is not a JSON object")
    acked = reply.get(ACK_FIELD)
    if acked != event_id:
        raise InvalidAck(f"ACK names {acked!r}, expected {event_id!r}")
    if reply.get("status") not in {r.value for r in Receipt}:
        raise InvalidAck(f"ACK status {reply.get('status')!r} is not applied or duplicate")
    return reply
