"""The event: what the publisher records and the sink applies, and its canonical form.

An event is `{"id", "type", "key", "data"}`: a business ID, a type such as
`payment.captured`, an optional ordering key (events of one key are delivered in
the order they were recorded), and a JSON object of any shape as I-JSON (RFC 7493).
Its canonical form, RFC 8785 (JSON Canonicalization Scheme) of those fields, is
what both sides store, compare and digest.

The seed's order intake takes orders `{id, sku, qty}`; each is recorded as the event
`{"type": "order.placed", "key": SKU, "data": {"sku": SKU, "qty": QTY}}`.

Pure functions only: no I/O, so both sides and the tests share one definition.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final, NotRequired, TypedDict

import orjson
import rfc8785

from shared.errors import InvalidEvent

ID_MAX_CHARS: Final = 128
TYPE_MAX_CHARS: Final = 128
KEY_MAX_CHARS: Final = 128
MAX_DATA_BYTES: Final = 64 * 1024  # the default cap of one event's canonical data
MAX_DATA_BYTES_LIMIT: Final = 1024 * 1024  # the most --max-data-bytes may allow
MAX_DEPTH: Final = 32  # `data` is depth 1; each object or array inside it adds one
MAX_SAFE_INTEGER: Final = 2**53 - 1  # I-JSON: integers a double holds exactly
EVENT_FIELDS: Final = ("id", "type", "key", "data")

ORDER_PLACED: Final = "order.placed"  # the type of the seed's orders
SKU_MAX_CHARS: Final = 64
QTY_MIN: Final = 1
QTY_MAX: Final = 1_000_000
FIELDS: Final = ("id", "sku", "qty")  # an order's fields

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_TYPE_RE: Final = re.compile(r"[A-Za-z0-9._-]+")
_KEY_RE: Final = re.compile(r"[A-Za-z0-9._:-]+")
_SKU_RE: Final = _KEY_RE
PLAIN_TEXT: Final = re.compile(r"[A-Za-z0-9._:-]*")  # text JSON writes as it is
_ID_RULE: Final = "A-Z a-z 0-9 . _ : -, starting with a letter or digit"
_RULES: Final = {"id": _ID_RULE, "type": "A-Z a-z 0-9 . _ -", "key": "A-Z a-z 0-9 . _ : -"}
_RULES["sku"] = _RULES["key"]


@dataclass(frozen=True)
class BigInteger:
    """A JSON integer too long to be any field's value (Python will not even convert
    one of over 4,300 digits): what the strict body parser puts in its place."""

    digits: int


@dataclass(frozen=True)
class NotFinite:
    """A JSON number no double holds (`1e400`), or a constant that is not JSON at all
    (`NaN`, `Infinity`, which Python's parser takes): what the strict body parser puts
    in its place, so that no field takes it and no serialiser writes it as null."""

    text: str


class Event(TypedDict):
    """A validated event. `key` is absent when the event has none (global order)."""

    id: str
    type: str
    key: NotRequired[str]
    data: dict[str, Any]


class Order(TypedDict):
    """A validated order of the seed's intake: exactly these three fields."""

    id: str
    sku: str
    qty: int


# ---------------------------------------------------------------------- events


def validate_event(obj: object, *, max_data_bytes: int = MAX_DATA_BYTES) -> Event:
    """Return a validated copy of `obj`, or raise InvalidEvent naming the place as a
    JSON pointer (`/data/customer/id`)."""
    event, canonical = checked_event(obj, max_data_bytes=max_data_bytes)
    event["data"] = json.loads(canonical)["data"]  # a copy: the caller's may change later
    return event


def checked_event(
    obj: object, *, max_data_bytes: int = MAX_DATA_BYTES, parsed: bool = False
) -> tuple[Event, str]:
    """`validate_event`, also returning the event's canonical form (computed once:
    the size rule is on the canonical data). The event's `data` is the caller's
    object, not a copy: what is stored is the canonical form returned. `parsed`: `obj`
    is what the strict parser (plumbing.bodies) or orjson returned, so its data holds
    JSON types and finite numbers only and may take canonical_data's fast path."""
    if not isinstance(obj, dict):
        raise InvalidEvent("", f"an event must be a JSON object, not {_json_type(obj)}")
    for name in ("id", "type", "data"):
        if name not in obj:
            raise InvalidEvent(f"/{name}", "is required")
    extra = sorted(str(name) for name in obj if name not in EVENT_FIELDS)
    if extra:
        raise InvalidEvent(
            "/" + pointer_token(extra[0]), "is not a field of an event (id, type, key, data)"
        )
    event = Event(
        id=_text(obj["id"], "id", _ID_RE, ID_MAX_CHARS, "/id"),
        type=_text(obj["type"], "type", _TYPE_RE, TYPE_MAX_CHARS, "/type"),
        data=obj["data"],
    )
    key = obj.get("key")
    if key is not None:
        event["key"] = _text(key, "key", _KEY_RE, KEY_MAX_CHARS, "/key")
    data = obj["data"]
    if not isinstance(data, dict):
        raise InvalidEvent("/data", f"must be a JSON object, not {_json_type(data)}")
    plain = _plain_bytes(data) if parsed else None
    if plain is not None:  # its size is at hand: no second encoding
        data_text, size = plain.decode(), len(plain)
    else:
        data_text = canonical_data(data, "/data")
        size = len(data_text.encode("utf-8", "surrogatepass"))
    if size > max_data_bytes:
        raise InvalidEvent(
            "/data", f"is {size:,} bytes encoded, over the {max_data_bytes:,} allowed"
        )
    return event, _assemble(event, data_text)


def canonical_json(event: Event) -> str:
    """The event's canonical form: RFC 8785 of {id, type, key, data} (key left out
    when the event has none). The one serialisation used for storage, comparison
    and digests. `event` is assumed valid (validate_event)."""
    return canonical_parts(event)[1]


def canonical_parts(event: Event) -> tuple[str, str]:
    """The canonical text of the event's data, and of the whole event."""
    data_text = canonical_data(event["data"], "/data")
    return data_text, _assemble(event, data_text)


def canonical_data(data: object, pointer: str, *, parsed: bool = False) -> str:
    """RFC 8785 text of a JSON value, or InvalidEvent naming the first place (under
    `pointer`) that is not I-JSON: a repeated key cannot occur in a dict, so the
    rules checked are types, integer range, finite numbers, depth and lone surrogates.

    Serialised by `json.dumps` with sorted keys when that is provably the RFC 8785
    text (no float that Python writes otherwise than ECMAScript once whole floats are
    ints, no key outside the Basic Multilingual Plane: then escaping, number text and
    key order agree), else by the `rfc8785` package. A value fresh from a parser
    (`parsed`: only dicts, lists, strings, ints, finite floats, booleans, None and the
    strict parser's markers) first tries `_plain_bytes`, which is C all the way.
    """
    if parsed:
        plain = _plain_bytes(data)
        if plain is not None:
            return plain.decode()
    try:
        need = _check(data, 1)
    except _NotIJson as bad:
        where = "".join(f"/{pointer_token(str(token))}" for token in reversed(bad.path))
        raise InvalidEvent(pointer + where, bad.problem) from None
    if need != _RFC8785:
        dumped = data if need == _DUMPS else _whole_floats_as_ints(data)
        text = json.dumps(dumped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    else:
        _find_surrogate(data, pointer)  # before rfc8785, which would only raise its own error
        text = rfc8785.dumps(data).decode()  # type: ignore[arg-type]
    try:
        text.encode()
    except UnicodeEncodeError:
        _find_surrogate(data, pointer)
        raise
    return text


# orjson's compact text with every digit as 0, "e" as "." and every byte that starts
# a character outside the Basic Multilingual Plane as 0xF0: a float ("1.5", "1e+16")
# then shows as "0.", such a character (whose keys RFC 8785 orders by UTF-16 code
# units, not code points) as 0xF0. Either sends a value down the checked path; so may
# a string that merely looks so ("v1.2"): that costs time, never a wrong text. (One
# translate and two searches: a regular expression took ten times as long.)
_SHAPES: Final = bytes.maketrans(b"123456789e\xf1\xf2\xf3\xf4", b"000000000.\xf0\xf0\xf0\xf0")
# Sorted keys, integers within +/-(2^53-1), and a TypeError (not a serialisation)
# for a dataclass (the strict parser's markers are), a datetime or a subclass.
_PLAIN_OPTIONS: Final = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_STRICT_INTEGER
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _plain_bytes(data: object) -> bytes | None:
    """The RFC 8785 text (UTF-8) of a parsed JSON value that holds no float and no
    key with a character outside the Basic Multilingual Plane, nests at most MAX_DEPTH
    deep and is I-JSON; None when any of that is not certain (canonical_data then
    checks it item by item).

    orjson writes such a value as RFC 8785 does: keys sorted by code point (UTF-16
    order, inside the Basic Multilingual Plane), strings escaped as the standard says
    (a property test compares the two character by character, and characters outside
    the plane are written as they are by both), integers as digits. It refuses an
    integer outside +/-(2^53-1) (OPT_STRICT_INTEGER), a lone surrogate and the strict
    parser's markers; a value with at most MAX_DEPTH objects and arrays in all cannot
    nest deeper. Only for parsed values: orjson also writes tuples, enums and UUIDs,
    which are not JSON, and a non-finite float as null.

    What only looks like a float or such a key is told apart by where the strings
    are, so a time such as "12:00:00.250Z", a version "1.2" or an emoji in a value
    keeps the fast path: once each escape of a backslash and of a quote is blanked
    out (escapes are two characters, read from the left), every quote left opens or
    closes a string."""
    try:
        text = orjson.dumps(data, option=_PLAIN_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is one
        return None
    shaped = text.translate(_SHAPES)
    if b"0." in shaped or b"\xf0" in shaped:
        quotes = text
        if b"\\" in text:  # positions kept: each escape becomes two other characters
            quotes = text.replace(b"\\\\", b"__").replace(b'\\"', b"__")
        if _number_with_fraction(quotes, shaped) or _wide_key(quotes, shaped):
            return None
    if text.count(b"{") + text.count(b"[") > MAX_DEPTH:
        return None
    return text


def _number_with_fraction(text: bytes, shaped: bytes) -> bool:
    """Whether a digit followed by a point or an exponent (a "0." in `shaped`) stands
    outside the strings of `text`, in which every quote opens or closes a string:
    then it is a float."""
    quotes, counted = 0, 0
    at = shaped.find(b"0.")
    while at >= 0:
        quotes += text.count(b'"', counted, at)
        if quotes % 2 == 0:
            return True
        counted = at
        at = shaped.find(b"0.", at + 2)
    return False


def _wide_key(text: bytes, shaped: bytes) -> bool:
    """Whether a character outside the Basic Multilingual Plane (0xF0 in `shaped`,
    always inside a string) is in a key of `text`, in which every quote opens or
    closes a string: a key's closing quote is followed by a colon. RFC 8785 orders
    keys by UTF-16 code units."""
    at = shaped.find(b"\xf0")
    while at >= 0:
        end = text.find(b'"', at)
        if text[end + 1 : end + 2] == b":":
            return True
        at = shaped.find(b"\xf0", end)
    return False


class _NotIJson(Exception):
    """Raised at the place that breaks a rule; each level adds its key or index on
    the way out (pointers are built only for an error)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.path: list[str | int] = []


# What serialising data to its RFC 8785 text takes (_check): json.dumps as it is,
# json.dumps once its whole floats are ints, or the rfc8785 package.
_DUMPS: Final = 0
_WHOLE_FLOATS: Final = 1
_RFC8785: Final = 2


def _check(value: object, depth: int) -> int:
    """How `value` (I-JSON, else _NotIJson) serialises to its RFC 8785 text: _DUMPS,
    _WHOLE_FLOATS or _RFC8785, the most any part of it needs."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return _DUMPS
    if kind is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:  # type: ignore[operator]
            raise _NotIJson(f"integer {value} is outside +/-(2^53-1) (I-JSON)")
        return _DUMPS
    if kind is float:
        size: float = abs(value)  # type: ignore[arg-type]
        if not math.isfinite(size):
            raise _NotIJson(f"{value} is not a JSON number")
        if size.is_integer():
            if MAX_SAFE_INTEGER < size < 1e21:
                # RFC 8785 writes it as an integer, which would then be out of range.
                raise _NotIJson(f"{value!r} is a whole number outside +/-(2^53-1) (I-JSON)")
            # Up to 2^53 its int is exact, and written as ECMAScript writes it ("7",
            # where Python's repr says "7.0"); past 1e21 both use exponents, unalike.
            return _WHOLE_FLOATS if size <= MAX_SAFE_INTEGER else _RFC8785
        # Python's repr and ECMAScript both write the shortest digits that read back,
        # the closest of them on a tie, in plain notation for a fraction of magnitude
        # 1e-4 to 1e16; outside that range (exponents) they differ.
        return _DUMPS if 1e-4 <= size < 1e16 else _RFC8785
    if depth > MAX_DEPTH:
        raise _NotIJson(f"is nested over {MAX_DEPTH} deep")
    need = _DUMPS
    if kind is dict or isinstance(value, dict):
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotIJson(f"has a key that is not a string: {key!r}"[:200])
            if not key.isascii() and max(key) > "\uffff":
                need = _RFC8785  # RFC 8785 orders keys by UTF-16 code units
            if type(item) is str:  # the usual leaf, without a call
                continue
            try:
                need = max(_check(item, depth + 1), need)
            except _NotIJson as bad:
                bad.path.append(key)
                raise
        return need
    if kind is list or isinstance(value, list):
        for index, item in enumerate(value):  # type: ignore[arg-type]
            if type(item) is str:
                continue
            try:
                need = max(_check(item, depth + 1), need)
            except _NotIJson as bad:
                bad.path.append(index)
                raise
        return need
    if isinstance(value, BigInteger):
        raise _NotIJson(f"an integer of {value.digits:,} digits is outside +/-(2^53-1)")
    if isinstance(value, NotFinite):
        raise _NotIJson(f"{value.text} is not a number a double holds (I-JSON)")
    raise _NotIJson(f"{_json_type(value)} is not a JSON value")


def _whole_floats_as_ints(value: Any) -> Any:
    """`value` with each whole float an int (each up to 2^53: _check said so)."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _whole_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_floats_as_ints(item) for item in value]
    return value


def _find_surrogate(value: object, pointer: str) -> None:
    """InvalidEvent naming the first string (or key) under `pointer` that holds a lone
    surrogate (not Unicode text; I-JSON forbids it)."""
    if isinstance(value, str):
        _no_surrogate(value, pointer)
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_surrogate(key, f"{pointer}/{pointer_token(key)}")
            _find_surrogate(item, f"{pointer}/{pointer_token(key)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _find_surrogate(item, f"{pointer}/{index}")


def _no_surrogate(text: str, pointer: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidEvent(pointer, "holds a lone surrogate, not Unicode text (I-JSON)") from exc


_DATA_PREFIX: Final = '{"data":'


def _assemble(event: Event, data_text: str) -> str:
    """The canonical event around its canonical data: id, type and key are of
    alphabets JSON writes as they are, and "data" < "id" < "key" < "type"."""
    key = event.get("key")
    keyed = "" if key is None else f',"key":"{key}"'
    return f'{_DATA_PREFIX}{data_text},"id":"{event["id"]}"{keyed},"type":"{event["type"]}"}}'


class StoredEvent(dict):  # type: ignore[type-arg]
    """An event read back from the outbox with the canonical text it is stored as
    (`canonical`), so that a sender need not canonicalise it again (`stored_data`),
    and when the outbox recorded it (`recorded_at`, None when not known).

    With `data_text` (the canonical text of its data, cut out of `canonical` by
    `envelope_of`), it holds only the event's id, type and key: its data was never
    parsed, and a sender writes `data_text` as it is. Read only: a copy that is
    changed must not keep `canonical` (copy.deepcopy and dict() give a plain dict
    of the same fields)."""

    __slots__ = ("canonical", "data_text", "recorded_at")

    def __init__(
        self,
        event: Event,
        canonical: str,
        recorded_at: float | None = None,
        data_text: str | None = None,
    ) -> None:
        super().__init__(event)
        self.canonical = canonical
        self.recorded_at = recorded_at  # seconds since the epoch it was recorded at
        self.data_text = data_text

    def __deepcopy__(self, memo: dict[int, object]) -> dict[str, Any]:
        return copy.deepcopy(dict(self), memo)


_ID_MEMBER: Final = ',"id":"'
_KEY_NAME: Final = 'key":"'
_TYPE_NAME: Final = 'type":"'


def envelope_of(canonical: str) -> tuple[dict[str, str], str] | None:
    """The id, type and key (if any) of an event from its canonical form, and the
    canonical text of its data, without parsing the data: the form is `{"data":DATA`
    followed by `,"id":"ID"`, `,"key":"KEY"` when it has one and `,"type":"TYPE"}`,
    whose values are of alphabets without a quote or a backslash, so the last
    `,"id":"` in the text is the event's own. None when `canonical` is not laid out
    so (it is then parsed whole)."""
    at = canonical.rfind(_ID_MEMBER)
    if at < len(_DATA_PREFIX) or not canonical.startswith(_DATA_OBJECT):
        return None
    data = canonical[len(_DATA_PREFIX) : at]
    tail = canonical[at + len(_ID_MEMBER) : -2]
    if not data.endswith("}") or not canonical.endswith('"}') or "\\" in tail:
        return None
    values = tail.split('","')
    # Each `","` between values and each name's `":"` holds the only quotes there are.
    if tail.count('"') != 4 * (len(values) - 1):
        return None
    if len(values) == 2:
        event_id, named_type = values
        head = {"id": event_id}
    elif len(values) == 3 and values[1].startswith(_KEY_NAME):
        event_id, named_key, named_type = values
        head = {"id": event_id, "key": named_key[len(_KEY_NAME) :]}
    else:
        return None
    if not named_type.startswith(_TYPE_NAME):
        return None
    head["type"] = named_type[len(_TYPE_NAME) :]
    return head, data


_DATA_OBJECT: Final = _DATA_PREFIX + "{"


def stored_data(event: Event, canonical: str) -> str | None:
    """The canonical text of the event's data, cut out of the event's canonical form
    (`canonical`) without a parse (envelope_of). None when `canonical` is not laid out
    so, or is the form of an event with another id, type or key."""
    cut = envelope_of(canonical)
    if cut is None:
        return None
    head, data = cut
    same = (head["id"], head["type"], head.get("key")) == (
        event["id"],
        event["type"],
        event.get("key"),
    )
    return data if same else None


def pointer_token(token: str) -> str:
    """A JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def data_preview(data: object, max_chars: int = 80) -> str:
    """A bounded view of an event's data for a person to read: JSON with every
    character outside printable ASCII escaped (no control character, no terminal
    escape reaches a screen or a log), cut at `max_chars` with "..." ."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= max_chars else text[: max(max_chars - 3, 0)] + "..."


# ---------------------------------------------------------------------- orders


def validate_order(obj: object) -> Order:
    """Return a validated copy of the order `obj`, or raise InvalidEvent naming the field."""
    if not isinstance(obj, dict):
        raise InvalidEvent("event", f"must be a JSON object, not {_json_type(obj)}")
    missing = [name for name in FIELDS if name not in obj]
    if missing:
        raise InvalidEvent(missing[0], "is required")
    extra = sorted(str(key) for key in obj if key not in FIELDS)
    if extra:
        raise InvalidEvent(extra[0], "is not a field of an order")
    return Order(
        id=_text(obj["id"], "id", _ID_RE, ID_MAX_CHARS),
        sku=_text(obj["sku"], "sku", _SKU_RE, SKU_MAX_CHARS),
        qty=_quantity(obj["qty"]),
    )


def order_event(order: Order) -> Event:
    """The event an order is recorded as."""
    data = {"sku": order["sku"], "qty": order["qty"]}
    return Event(id=order["id"], type=ORDER_PLACED, key=order["sku"], data=data)


def order_canonical(order: Order) -> str:
    """canonical_json(order_event(order)), written directly: every order is one."""
    sku = order["sku"]
    return (
        f'{{"data":{{"qty":{order["qty"]},"sku":"{sku}"}},"id":"{order["id"]}",'
        f'"key":"{sku}","type":"{ORDER_PLACED}"}}'
    )


def placed_order(event: Event) -> Order | None:
    """The order an `order.placed` event records, None for any other event (or one
    whose data is not an order's)."""
    if event["type"] != ORDER_PLACED:
        return None
    data = event["data"]
    if set(data) != {"sku", "qty"}:
        return None
    qty = data["qty"]
    if type(qty) is float and qty.is_integer():
        qty = int(qty)  # 7.0 and 7 are one canonical form, so one order
    try:
        return validate_order({"id": event["id"], "sku": data["sku"], "qty": qty})
    except InvalidEvent:
        return None


def previous_canonical(order: Order) -> str:
    """The canonical form of the previous release, whose events were orders: what
    the ACK digest of a request in that format is over."""
    return f'{{"id":"{order["id"]}","qty":{order["qty"]},"sku":"{order["sku"]}"}}'


# ---------------------------------------------------------------------- fields


def validate_event_id(value: object) -> str:
    """Return `value` if it is a well-formed event ID, else raise InvalidEvent."""
    return _text(value, "id", _ID_RE, ID_MAX_CHARS)


def validate_key(value: object) -> str:
    """Return `value` if it is a well-formed ordering key, else raise InvalidEvent."""
    return _text(value, "key", _KEY_RE, KEY_MAX_CHARS)


def validate_type(value: object) -> str:
    """Return `value` if it is a well-formed event type, else raise InvalidEvent."""
    return _text(value, "type", _TYPE_RE, TYPE_MAX_CHARS)


def validate_sku(value: object) -> str:
    """Return `value` if it is a well-formed SKU, else raise InvalidEvent."""
    return _text(value, "sku", _SKU_RE, SKU_MAX_CHARS)


def _text(
    value: object, field: str, pattern: re.Pattern[str], max_chars: int, at: str | None = None
) -> str:
    """`value` if it is text of `field`'s rules; else InvalidEvent naming `at` (a
    JSON pointer into an event), or the field itself (an order's, a path's)."""
    where = field if at is None else at
    if not isinstance(value, str):
        raise InvalidEvent(where, f"must be a string, not {_json_type(value)}")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEvent(where, f"must be 1 to {max_chars} characters, got {len(value)}")
    if pattern.fullmatch(value) is None:
        raise InvalidEvent(where, f"may only use {_RULES[field]}")
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
    if isinstance(value, NotFinite):
        return f"the number {value.text}"
    names = {int: "an integer", float: "a number", str: "a string", list: "an array"}
    names[dict] = "an object"
    return names.get(type(value), type(value).__name__)
