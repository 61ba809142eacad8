"""The C paths of strict JSON against their meaning: plumbing.bodies.loads_strict reads
what json.loads reads and refuses every repeated key in any layout; and the canonical
data of a parsed value (shared.event, `parsed=True`) is the same text, and the same
refusal, as the checked path's and the `rfc8785` package's."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import example, given
from hypothesis import strategies as st

from plumbing.bodies import DuplicateKey, NotUtf8, loads_strict
from shared import InvalidEvent, validate_event, validate_order
from shared.event import MAX_SAFE_INTEGER, BigInteger, NotFinite, _plain_bytes, canonical_data

# Text of every kind: ASCII with the characters JSON escapes and the colon the fast
# path counts, Latin and CJK, characters outside the Basic Multilingual Plane.
characters = st.characters(codec="utf-8") | st.sampled_from(':"\\/\n\t\x00\x7f\u2028')
texts = st.text(characters, max_size=8)
# Integers beyond 64 bits too: orjson reads those as floats, the strict parser not.
integers = st.integers(min_value=-(10**30), max_value=10**30) | st.sampled_from(
    [2**53 - 1, 2**53, -(2**53), 2**63, -(2**63) - 1, 2**64, -(2**64), 9_300_000_000_000_000_000]
)
floats = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | integers | floats | texts
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=25,
)
# How a client may lay a body out: compact, the standard library's default, indented,
# with or without escaping every character outside ASCII.
layouts = st.fixed_dictionaries(
    {
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")]),
        "indent": st.sampled_from([None, 2]),
        "ensure_ascii": st.booleans(),
    }
)


def written(value: object, layout: dict[str, Any]) -> bytes:
    return json.dumps(value, **layout).encode()


def same(a: object, b: object) -> bool:
    """Equal, with the same types all the way down (1 is not 1.0) and the same order."""
    return repr(a) == repr(b)


@given(value=values, layout=layouts)
@example(value={"a:b": "c:d", "e": [":", {"f": 1}]}, layout={"separators": (",", ":")})
@example(value=[2**64, -(2**63) - 1, 12345678901234567890], layout={})
def test_loads_strict_reads_what_json_loads_reads(value: object, layout: dict[str, Any]) -> None:
    body = written(value, layout)
    assert same(loads_strict(body), json.loads(body))


@st.composite
def repeated_keys(draw: st.DrawFn) -> tuple[bytes, str]:
    """A body that names one key twice in one object, somewhere inside other JSON."""
    key: str = draw(texts)
    separators: tuple[str, str] = draw(st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")]))
    ascii_only: bool = draw(st.booleans())
    first, second, rest = draw(values), draw(values), draw(st.dictionaries(texts, values))
    rest.pop(key, None)
    members = draw(st.permutations([(key, first), *rest.items(), (key, second)]))
    separator, colon = separators
    inner = (
        "{"
        + separator.join(
            json.dumps(name, ensure_ascii=ascii_only)
            + colon
            + json.dumps(item, ensure_ascii=ascii_only, separators=separators)
            for name, item in members
        )
        + "}"
    )
    wrapper = draw(st.sampled_from(["{}", '{"a": {}}', '[1, {}, "x:y"]', '{"b": [[{}]]}']))
    return wrapper.replace("{}", inner, 1).encode(), key


@given(case=repeated_keys())
@example(case=(b'{"a": 1, "a": "::"}', "a"))
@example(case=(b'{"a": "::", "a": 1}', "a"))
@example(case=(b'{"a:": 1, "x": "", "a:": 2}', "a:"))
def test_loads_strict_refuses_a_repeated_key_in_any_layout(case: tuple[bytes, str]) -> None:
    body, key = case
    with pytest.raises(DuplicateKey) as caught:
        loads_strict(body)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"\\u003a": 1, ":": 2}', ":"),  # one key, written two ways
        (b'{"a": 1, "\\u0061": 2}', "a"),
        (b'{"x": "\\u003a", "x": 1}', "x"),
        (b'\xef\xbb\xbf{"a": 1, "a": 2}', "a"),  # a byte order mark: not orjson's
        (b'{"a": NaN, "a": 2}', "a"),
    ],
)
def test_a_key_repeated_where_only_the_checked_parser_reads(body: bytes, key: str) -> None:
    with pytest.raises(DuplicateKey) as caught:
        loads_strict(body)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("body", "key", "pointer"),
    [
        (b'{"a": 1, "a": 2}', "a", "/a"),
        (b'{"data": {"x": {"y": [{"z": 1, "z": 1}]}}}', "z", "/data/x/y/0/z"),
        (b'{"events": [{}, {}, {"data": {"a/~": 1, "a/~": 2}}]}', "a/~", "/events/2/data/a~1~0"),
        # The first object to end with a repeat, as the checked parser refuses it;
        # a member repeated later keeps what it held first.
        (b'{"a": {"b": 1, "b": 2}, "a": 3}', "b", "/a/b"),
        (b'{"a": 3, "a": {"b": 1, "b": 2}}', "b", "/a/b"),
        (b'{"x": [{"a": 1}], "x": 2}', "x", "/x"),
        (b'{"\\u003a": 1, ":": 2}', ":", "/:"),
    ],
)
def test_a_repeated_key_is_placed_by_a_json_pointer(body: bytes, key: str, pointer: str) -> None:
    with pytest.raises(DuplicateKey) as caught:
        loads_strict(body)
    assert (caught.value.key, caught.value.pointer) == (key, pointer)
    assert str(caught.value).endswith(f" at {pointer}")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"])
def test_json_that_is_not_utf8_is_refused(encoding: str) -> None:
    """RFC 8259 and I-JSON: UTF-8 only (a byte order mark before it is let pass)."""
    with pytest.raises(NotUtf8, match="must be UTF-8"):
        loads_strict('{"a": 1}'.encode(encoding))
    assert loads_strict(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("depth", [255, 256, 300, 900])
@pytest.mark.parametrize("member", [False, True])
def test_nesting_orjson_reads_but_cannot_write_takes_the_checked_parser(
    depth: int, member: bool
) -> None:
    """orjson reads 1,024 levels and writes 255: between, the colon count cannot be
    taken, and the checked parser reads the body instead. It is told by an integer
    past 64 bits, which orjson would read as a float."""
    big = 2**70
    inner = b'{"n": %d}' % big if member else b"%d" % big
    value = loads_strict(b"[" * depth + inner + b"]" * depth)
    for _ in range(depth):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == ({"n": big} if member else big)
    assert type(value["n"] if member else value) is int  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "marker"),
    [
        (b'{"x": NaN}', NotFinite("NaN")),
        (b'{"x": -Infinity}', NotFinite("-Infinity")),
        (b'{"x": 1e400}', NotFinite("1e400")),
        (b'{"x": ' + b"9" * 101 + b"}", BigInteger(101)),
    ],
)
def test_what_no_double_holds_is_a_marker_no_field_takes(body: bytes, marker: object) -> None:
    parsed = loads_strict(body)
    assert parsed == {"x": marker}

    event = {"id": "e-1", "type": "t", "data": parsed}
    with pytest.raises(InvalidEvent) as caught:
        validate_event(event)
    assert caught.value.field == "/data/x"
    with pytest.raises(InvalidEvent, match="qty"):
        validate_order({"id": "o-1", "sku": "s", "qty": parsed["x"]})


# ------------------------------------------------------------- canonical data


def outcome(data: object, *, parsed: bool) -> tuple[str, str]:
    """("text", the canonical data) or ("refused", where and why)."""
    try:
        return "text", canonical_data(data, "/data", parsed=parsed)
    except InvalidEvent as exc:
        return "refused", f"{exc.field}: {exc.problem}"


# Lone surrogates too, which only the checked parser lets through (from \\ud800).
any_texts = st.text(st.characters(codec=None) | characters, max_size=8)
any_values = st.recursive(
    st.none() | st.booleans() | integers | floats | any_texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_texts, inner, max_size=4),
    max_leaves=25,
)


@given(data=st.dictionaries(any_texts, any_values, max_size=5))
@example(data={"a": 2**53 - 1, "b": -(2**53 - 1), "c": "1.5e3", "d": [[[]]]})
@example(data={"a": 2**53})
@example(data={"\U0001f600": 1, "\uffff": 2})
@example(data={"a": 7.0, "b": 0.1})
def test_a_parsed_value_has_one_canonical_text_on_either_path(data: dict[str, Any]) -> None:
    body = json.dumps(data, ensure_ascii=True).encode()  # lone surrogates as escapes
    parsed = loads_strict(body)

    fast = outcome(parsed, parsed=True)

    assert fast == outcome(parsed, parsed=False)
    if fast[0] == "text":
        assert fast[1] == rfc8785.dumps(parsed).decode()  # type: ignore[arg-type]


def test_data_nested_past_the_limit_is_refused_on_either_path() -> None:
    for depth in (32, 33, 40):
        data: Any = 1
        for _ in range(depth):
            data = {"a": data}
        parsed = loads_strict(json.dumps(data).encode())
        assert outcome(parsed, parsed=True) == outcome(parsed, parsed=False)
    assert outcome(parsed, parsed=True)[0] == "refused"


def test_orjson_escapes_every_character_of_the_plane_as_rfc8785_does() -> None:
    # What _plain_bytes stands on: one string, one key, with all 63,488 of them.
    plane = "".join(chr(code) for code in range(0x10000) if not 0xD800 <= code <= 0xDFFF)
    data = {"key " + plane: plane, "astral": "\U0001f600\U0010ffff"}
    assert orjson.dumps(data, option=orjson.OPT_SORT_KEYS) == rfc8785.dumps(data)
    assert outcome(data, parsed=True) == ("text", rfc8785.dumps(data).decode())


def test_an_ordinary_event_takes_the_fast_path() -> None:
    data = loads_strict(
        b'{"payment_id": "p-123", "amount_cents": 1999, "currency": "EUR",'
        b' "customer": {"id": "c-9", "tags": ["vip", null, true]}}'
    )
    assert _plain_bytes(data) == rfc8785.dumps(data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        {"at": "2026-12-06T04:00:00.250Z", "version": "1.2.3", "ip": "10.0.0.1"},
        {"price": "19.99", "rate": "1e-7", "note": "up 12.5 % on 2025"},
        {"message": "thanks \U0001f600", "tags": ["\U0001f680", "café"]},  # in values
        {"nested": {"when": "04:00:00.5", "items": [{"v": "0.9"}, 3]}, "n": 10},
        {"line": "a\nb", "at": "04:00:00.250Z"},  # escapes before and among the look-alikes
        {"quote": 'said "1.5" \\ then "2.5"', "path": "c:\\", "v": "1.2"},
    ],
)
def test_strings_that_look_like_floats_or_hold_emoji_keep_the_fast_path(data: object) -> None:
    parsed = loads_strict(json.dumps(data).encode())
    assert _plain_bytes(parsed) == rfc8785.dumps(parsed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        {"price": 12.5},  # a float: written as ECMAScript writes it, by the checked path
        {"at": "04:00:00.250Z", "price": 12.5},  # a float beside a time that looks like one
        {"when": "1.5", "size": 1e300},  # an exponent's float
        {"big": MAX_SAFE_INTEGER + 1},
        {"\U0001f600": 1},
        {"values": "\U0001f600", "keys": {"a\U0001f600": 1}},  # outside the plane in a key
        {"quote": 'said "1.5"', "price": 1.5},  # a float after an escaped quote
        {"path": "c:\\", "price": 1.5},  # a float after a string that ends in a backslash
        {"x": NotFinite("NaN")},
        {"x": BigInteger(200)},
    ],
)
def test_what_the_fast_path_cannot_vouch_for_goes_down_the_checked_one(data: object) -> None:
    assert _plain_bytes(data) is None
