"""The ACK: the sink's proof that it committed an event, and how it is checked."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from shared.errors import InvalidAck
from shared.event import PLAIN_TEXT, Event, canonical_json


class Receipt(StrEnum):
    """What the sink did with an event it accepted."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"


# A tuple, not a set: a JSON array or object as a status must not need hashing.
RECEIPTS: Final = tuple(r.value for r in Receipt)
ACK_FIELD: Final = "ack"
DIGEST_FIELD: Final = "sha256"
ACK_FIELDS: Final = (ACK_FIELD, "status", DIGEST_FIELD)  # in the order the sink writes them


def payload_digest(event: Event) -> str:
    """SHA-256 of the canonical payload: what both sides compare to prove the content."""
    return digest_of(canonical_json(event))


def digest_of(canonical: str) -> str:
    """SHA-256 (hex) of an already canonical payload."""
    return hashlib.sha256(canonical.encode()).hexdigest()


def make_ack(event_id: str, receipt: Receipt, digest: str | None = None) -> dict[str, str]:
    """The JSON object the sink replies with after its commit."""
    ack = {ACK_FIELD: event_id, "status": receipt.value}
    if digest is not None:
        ack[DIGEST_FIELD] = digest
    return ack


def ack_json(ack: Mapping[str, object]) -> str:
    """The ACK as JSON text, as `json.dumps(ack)` writes it (the publisher stores it
    with each mark). A usual ACK, three fields of plain text, is written directly."""
    if tuple(ack) == ACK_FIELDS and all(
        type(value) is str and PLAIN_TEXT.fullmatch(value) for value in ack.values()
    ):
        return '{{"ack": "{}", "status": "{}", "sha256": "{}"}}'.format(*ack.values())
    return json.dumps(ack)


def verify_ack(body: bytes, event_id: str, digest: str | None = None) -> dict[str, object]:
    """Return the parsed ACK if `body` acknowledges exactly `event_id`, else raise InvalidAck.

    When the ACK carries a payload digest and `digest` is given, they must match: a
    sink that stored something other than what was sent is caught here.
    """
    return check_ack(parse_reply(body), event_id, digest)


def parse_reply(body: bytes) -> object:
    """The JSON value of a reply body, or InvalidAck."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidAck(f"reply is not JSON: {exc!r}"[:200]) from exc


# How much of a value a sink put in its ACK an error quotes: the error is stored with
# the entry and shown by status, list, trace and the console.
QUOTED_CHARS: Final = 100


def check_ack(reply: object, event_id: str, digest: str | None = None) -> dict[str, object]:
    """Return `reply` if it is an ACK for exactly `event_id` (and `digest`), else InvalidAck
    (quoting at most QUOTED_CHARS of what the sink wrote)."""
    if not isinstance(reply, dict):
        raise InvalidAck("ACK is not a JSON object")
    acked = reply.get(ACK_FIELD)
    if acked != event_id:
        raise InvalidAck(f"ACK names {_quoted(acked)}, expected {event_id!r}")
    if reply.get("status") not in RECEIPTS:
        raise InvalidAck(f"ACK status {_quoted(reply.get('status'))} is not applied or duplicate")
    stored = reply.get(DIGEST_FIELD)
    if stored is not None and digest is not None and stored != digest:
        raise InvalidAck(f"ACK digest {_quoted(stored)} does not match the payload sent ({digest})")
    return reply


def _quoted(value: object) -> str:
    """repr of a value from a reply, cut to QUOTED_CHARS with `...` when longer."""
    text = repr(value)
    return text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "..."
