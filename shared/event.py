"""The event: what the publisher records and the sink applies.

Pure functions only: no I/O, so both sides and the tests share one definition.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from shared.errors import InvalidEvent

ID_MAX_CHARS: Final = 128
SKU_MAX_CHARS: Final = 64
QTY_MIN: Final = 1
QTY_MAX: Final = 1_000_000
FIELDS: Final = ("id", "sku", "qty")

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_SKU_RE: Final = re.compile(r"[A-Za-z0-9._:-]+")
PLAIN_TEXT: Final = re.compile(r"[A-Za-z0-9._:-]*")  # text JSON writes as it is


@dataclass(frozen=True)
class BigInteger:
    """A JSON integer too long to be any field's value (Python will not even convert
    one of over 4,300 digits): what the strict body parser puts in its place."""

    digits: int


class Event(TypedDict):
    """A validated event: exactly these three fields."""

    id: str
    sku: str
    qty: int


def validate_event(obj: object) -> Event:
    """Return a validated copy of `obj`, or raise InvalidEvent naming the field."""
    if not isinstance(obj, dict):
        raise InvalidEvent("event", f"must be a JSON object, not {_json_type(obj)}")
    missing = [name for name in FIELDS if name not in obj]
    if missing:
        raise InvalidEvent(missing[0], "is required")
    extra = sorted(str(key) for key in obj if key not in FIELDS)
    if extra:
        raise InvalidEvent(extra[0], "is not a field of an event")
    return Event(
        id=_text(obj["id"], "id", _ID_RE, ID_MAX_CHARS),
        sku=_text(obj["sku"], "sku", _SKU_RE, SKU_MAX_CHARS),
        qty=_quantity(obj["qty"]),
    )


def validate_event_id(value: object) -> str:
    """Return `value` if it is a well-formed event ID, else raise InvalidEvent."""
    return _text(value, "id", _ID_RE, ID_MAX_CHARS)


def validate_sku(value: object) -> str:
    """Return `value` if it is a well-formed SKU, else raise InvalidEvent."""
    return _text(value, "sku", _SKU_RE, SKU_MAX_CHARS)


def canonical_json(event: Event) -> str:
    """The one serialisation used for storage, comparison and digests: sorted keys, no
    spaces, ASCII only (what json.dumps gives with sort_keys, compact separators)."""
    event_id, sku, qty = event.get("id"), event.get("sku"), event.get("qty")
    if (
        len(event) == len(FIELDS)
        and type(qty) is int
        and isinstance(event_id, str)
        and isinstance(sku, str)
        and PLAIN_TEXT.fullmatch(event_id)
        and PLAIN_TEXT.fullmatch(sku)
    ):
        # Text of the event alphabet needs no escaping: the same string, several times
        # faster (it is written for every event on both sides).
        return f'{{"id":"{event_id}","qty":{qty},"sku":"{sku}"}}'
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _text(value: object, field: str, pattern: re.Pattern[str], max_chars: int) -> str:
    if not isinstance(value, str):
        raise InvalidEvent(field, f"must be a string, not {_json_type(value)}")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEvent(field, f"must be 1 to {max_chars} characters, got {len(value)}")
    if pattern.fullmatch(value) is None:
        rule = "A-Z a-z 0-9 . _ : -"
        if field == "id":
            rule += ", starting with a letter or digit"
        raise InvalidEvent(field, f"may only use {rule}")
    return value


def _quantity(value: object) -> int:
    # bool is a subclass of int in Python; JSON true is not a quantity.
    if isinstance(value, BigInteger):
        raise InvalidEvent(
            "qty", f"must be between {QTY_MIN} and {QTY_MAX:,}, got {_json_type(value)}"
        )
    if type(value) is not int:
        raise InvalidEvent("qty", f"must be an integer, not {_json_type(value)}")
    if not QTY_MIN <= value <= QTY_MAX:
        raise InvalidEvent("qty", f"must be between {QTY_MIN} and {QTY_MAX:,}, got {value}")
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, BigInteger):
        return f"an integer of {value.digits:,} digits"
    names = {int: "an integer", float: "a number", str: "a string", list: "an array"}
    names[dict] = "an object"
    return names.get(type(value), type(value).__name__)
