"""Request bodies read strictly: JSON with no repeated key and no huge integer, within
a size cap and a time limit, and the event a body carries, validated.

Each refusal is a BadRequest that says what was wrong: 400, 408 or 413.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Iterable
from typing import Final, NamedTuple

import orjson
from aiohttp import web

from plumbing.collector import collector_paused
from plumbing.http_errors import BadRequest, invalid_event
from plumbing.http_limits import BODY_TIMEOUT_S, LIMITS, HttpLimits
from shared.errors import InvalidEvent
from shared.event import BigInteger, Event, NotFinite, pointer_token, validate_event

# No field of a body is an integer this long; anything longer is kept as a marker
# instead of converted (Python refuses over 4,300 digits with a plain ValueError).
MAX_INT_DIGITS: Final = 100


class DuplicateKey(ValueError):
    """A JSON object names the same key twice: which value was meant is unknowable.
    `pointer` is the JSON pointer of the repeated member in the whole text, when
    loads_strict could place it."""

    def __init__(self, key: str, pointer: str | None = None) -> None:
        where = "" if pointer is None else f" at {pointer}"
        super().__init__(f"duplicate key {key!r} in a JSON object{where}")
        self.key = key
        self.pointer = pointer


class NotUtf8(ValueError):
    """JSON text in another encoding than UTF-8, which RFC 8259 requires between
    systems and I-JSON (RFC 7493) requires always."""

    def __init__(self, encoding: str) -> None:
        super().__init__(f"JSON text must be UTF-8 (RFC 8259, I-JSON), not {encoding.upper()}")


def _parse_int(text: str) -> int | BigInteger:
    return int(text) if len(text) <= MAX_INT_DIGITS else BigInteger(len(text.lstrip("-")))


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise DuplicateKey(_first_repeated(pairs) or "")
    return obj


def _first_repeated(pairs: list[tuple[str, object]]) -> str | None:
    """The first key of an object's members that an earlier member named already."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return None


def _parse_float(text: str) -> float | NotFinite:
    number = float(text)
    return number if math.isfinite(number) else NotFinite(text)


# A decoder that reads numbers as the checked parser does: NaN, Infinity and
# -Infinity, which Python's parser takes, become markers as well.
_numbers_checked: Final = functools.partial(
    json.JSONDecoder, parse_int=_parse_int, parse_float=_parse_float, parse_constant=NotFinite
)
_DECODER: Final = _numbers_checked(object_pairs_hook=_unique_keys)
# What sends a body to the checked parser: an escaped character between U+0030 and
# U+003F (one is the colon, which the count below must see as it is), or a run of 19
# digits (an integer that orjson would read as a float, past 64 bits), found as 19
# zeros once every digit is one (a regular expression took ten times as long as the
# parse).
_ESCAPED_NEAR_COLON: Final = b"\\u003"
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER: Final = b"0" * 19


def loads_strict(body: bytes) -> object:
    """`json.loads`, but a repeated key is DuplicateKey, an integer of more than
    MAX_INT_DIGITS digits becomes a BigInteger marker and a number no double holds
    (or NaN, Infinity) a NotFinite marker, neither of which any field accepts.

    Most bodies are read by orjson, in C, and proved free of repeated keys by counting
    colons: in a body with no escaped colon, each colon is a member's or one inside a
    string; orjson writes the parsed value back with one colon per member and the
    strings' own, so the counts differ exactly when a repeated key dropped a member.
    A body orjson refuses, or that the count cannot judge, takes the checked parser,
    which names what is wrong (or takes what orjson does not: NaN, a byte order
    mark).

    orjson reads an integer past 64 bits as a float, which the checked parser would
    not. Every float of that size (1.8e19 and up) is written back with an exponent
    and its sign, `e+19`: only when that text holds a plus sign (which it seldom
    does) is the body searched for a run of 19 digits, and one sends it to the
    checked parser. So does a value nested deeper than orjson writes back (255
    levels; it reads 1,024).

    Text in UTF-16 or UTF-32 is NotUtf8. A repeated key is placed by a second,
    forgiving parse (only then): DuplicateKey carries its JSON pointer."""
    if _ESCAPED_NEAR_COLON not in body:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            try:
                text = orjson.dumps(value)
            except orjson.JSONEncodeError:  # nested too deep to write: the checked parser
                pass
            else:
                if text.count(b":") == body.count(b":") and (
                    b"+" not in text or _LONG_NUMBER not in body.translate(_DIGITS_AS_ZERO)
                ):
                    return value
    decoded = _decoded(body)
    try:
        return _DECODER.decode(decoded)
    except DuplicateKey as exc:
        raise DuplicateKey(exc.key, _repeated_at(decoded)) from None


def _decoded(body: bytes) -> str:
    """The text of a UTF-8 body (a byte order mark left out), lone surrogates kept
    (the event's checks name their place); NotUtf8 for UTF-16 and UTF-32."""
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise NotUtf8(encoding)
    return body.decode(encoding, "surrogatepass")


class _Members(NamedTuple):
    """An object as the forgiving parse keeps it: every member, in order, and the
    first key it names twice (None: none)."""

    pairs: list[tuple[str, object]]
    repeated: str | None


def _note_repeats(pairs: list[tuple[str, object]]) -> _Members:
    return _Members(pairs, _first_repeated(pairs))


_PLACING: Final = _numbers_checked(object_pairs_hook=_note_repeats)


def _repeated_at(text: str) -> str | None:
    """The JSON pointer of the repeated member the checked parser refuses first (in
    the first object to end that repeats a key), or None when the text cannot be read
    whole."""
    try:
        return _first_repeat(_PLACING.decode(text), "")
    except (ValueError, RecursionError):
        return None


def _first_repeat(value: object, at: str) -> str | None:
    """Objects in the order they end: what one holds before the object itself."""
    if isinstance(value, _Members):
        members: Iterable[tuple[object, object]] = value.pairs
    elif isinstance(value, list):
        members = enumerate(value)
    else:
        return None
    for name, item in members:
        found = _first_repeat(item, f"{at}/{pointer_token(str(name))}")
        if found is not None:
            return found
    if isinstance(value, _Members) and value.repeated is not None:
        return f"{at}/{pointer_token(value.repeated)}"
    return None


async def read_json(request: web.Request, max_body_bytes: int) -> object:
    """The parsed JSON body, or BadRequest: 413 over `max_body_bytes`, 400 if not JSON
    (or a key repeated in an object), 408 if the body does not arrive in time."""
    body = await _read_body(request)
    if body is None and request.client_max_size < max_body_bytes:
        # The cap of an app of one's own that the inbox is mounted in fired first.
        cap = request.client_max_size
        raise BadRequest(413, "too_large", f"body is over {cap} bytes, this application's cap")
    if body is None or len(body) > max_body_bytes:
        raise BadRequest(413, "too_large", f"body is over {max_body_bytes} bytes")
    return parse_json(body)


def parse_json(text: bytes, what: str = "body") -> object:
    """`text` parsed as strict JSON (loads_strict), or BadRequest 400 saying why not,
    naming the text `what` (the body; a line of a file)."""
    try:
        with collector_paused():
            return loads_strict(text)
    except DuplicateKey as exc:
        placed = {} if exc.pointer is None else {"pointer": exc.pointer}
        raise BadRequest(400, "invalid", str(exc), field=exc.key, **placed) from exc
    except (UnicodeDecodeError, json.JSONDecodeError, NotUtf8) as exc:
        raise BadRequest(400, "invalid", f"{what} is not valid JSON", detail=str(exc)) from exc
    except RecursionError as exc:
        raise BadRequest(
            400, "invalid", f"{what} is not valid JSON", detail="nested too deeply"
        ) from exc


async def _read_body(request: web.Request) -> bytes | None:
    """The body, None if it is over the app's cap; BadRequest 408 if it is too slow."""
    timeout_s = BODY_TIMEOUT_S
    try:
        if request.content.is_eof():  # all here already (the usual case): no timer
            return await request.read()
        timeout_s = request.app.get(LIMITS, HttpLimits()).body_timeout_s
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None
    except TimeoutError as exc:
        raise BadRequest(408, "timeout", f"the body did not arrive within {timeout_s:g} s") from exc


def checked_event(parsed: object) -> Event:
    """The validated event, or BadRequest 400 naming the field."""
    try:
        return validate_event(parsed)
    except InvalidEvent as exc:
        raise invalid_event(exc) from exc
