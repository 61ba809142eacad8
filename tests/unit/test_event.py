"""The event contract: validate_event and checked_event (I-JSON, places named as JSON
pointers), the canonical form (RFC 8785), data_preview, and the seed's orders
(validate_order and the `order.placed` event). Pure functions, no I/O."""

from __future__ import annotations

import copy
import json
import math
import string
from decimal import Decimal
from enum import IntEnum
from typing import Any

import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared import (
    ORDER_PLACED,
    InvalidEvent,
    canonical_json,
    checked_event,
    order_canonical,
    order_event,
    payload_digest,
    validate_event,
    validate_key,
    validate_order,
    validate_type,
)
from shared.event import (
    EVENT_FIELDS,
    FIELDS,
    ID_MAX_CHARS,
    KEY_MAX_CHARS,
    MAX_DATA_BYTES,
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    QTY_MAX,
    QTY_MIN,
    SKU_MAX_CHARS,
    TYPE_MAX_CHARS,
    BigInteger,
    canonical_parts,
    data_preview,
    envelope_of,
    placed_order,
    previous_canonical,
    stored_data,
)

ALPHABET = string.ascii_letters + string.digits + "._:-"  # of an ID, a key, a SKU
TYPE_ALPHABET = string.ascii_letters + string.digits + "._-"
ALNUM = string.ascii_letters + string.digits

VALID: dict[str, Any] = {"id": "evt-1", "type": "payment.captured", "data": {"amount": 5}}
KEYED: dict[str, Any] = {**VALID, "key": "customer-7"}
VALID_ORDER: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}

valid_ids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(ALNUM),
    st.text(alphabet=ALPHABET, max_size=ID_MAX_CHARS - 1),
)
valid_types = st.text(alphabet=TYPE_ALPHABET, min_size=1, max_size=TYPE_MAX_CHARS)
valid_keys = st.text(alphabet=ALPHABET, min_size=1, max_size=KEY_MAX_CHARS)
valid_skus = st.text(alphabet=ALPHABET, min_size=1, max_size=SKU_MAX_CHARS)
valid_qtys = st.integers(min_value=QTY_MIN, max_value=QTY_MAX)
outside_alphabet = st.characters(exclude_characters=ALPHABET)

# Unicode text (never a lone surrogate), drawn often from the characters RFC 8785 is
# particular about: astral ones (UTF-16 key order), controls and quotes (escaping).
characters = st.one_of(
    st.characters(codec="utf-8"),
    st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF, codec="utf-8"),
    st.characters(max_codepoint=0x1F),
    st.sampled_from('"\\/\x7f\u2028\u2029\ue000\uffff\u00e9'),
)
texts = st.text(characters, max_size=8)
safe_integers = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
# Whole floats of 2^53 up to 1e21 are left out: their canonical text is an integer
# outside the safe range (see test_a_large_whole_float_survives_its_canonical_form).
finite_floats = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda number: not 2**53 <= abs(number) < 1e21
)
json_scalars = st.none() | st.booleans() | safe_integers | finite_floats | texts
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
json_data = st.dictionaries(texts, json_values, max_size=5)


def event(**changes: Any) -> dict[str, Any]:
    """The valid event with some fields replaced."""
    return {**VALID, **changes}


def with_data(data: object, **changes: Any) -> dict[str, Any]:
    return event(data=data, **changes)


def rejected(obj: object, **limits: int) -> InvalidEvent:
    """The InvalidEvent that validate_event raises for `obj`."""
    with pytest.raises(InvalidEvent) as excinfo:
        validate_event(obj, **limits)
    return excinfo.value


def reference(obj: dict[str, Any]) -> str:
    """What the canonical form means: RFC 8785 of the event, a key of None left out."""
    fields = {name: value for name, value in obj.items() if value is not None}
    return rfc8785.dumps(fields).decode()


def nested(depth: int, container: str = "object") -> dict[str, Any]:
    """Data `depth` deep (the data object itself is depth 1)."""
    inner: Any = {} if container == "object" else []
    for _ in range(depth - 2):
        inner = {"a": inner} if container == "object" else [inner]
    return {"a": inner}


def reordered(value: Any) -> Any:
    """`value` with every object's members in reverse order."""
    if isinstance(value, dict):
        return {key: reordered(item) for key, item in reversed(value.items())}
    if isinstance(value, list):
        return [reordered(item) for item in value]
    return value


# ---------------------------------------------------------------- accepted


def test_invalid_event_is_a_value_error() -> None:
    assert issubclass(InvalidEvent, ValueError)


def test_valid_event_is_returned_equal() -> None:
    assert validate_event(dict(VALID)) == VALID
    assert validate_event(dict(KEYED)) == KEYED


def test_a_key_of_null_is_no_key() -> None:
    result = validate_event(event(key=None))
    assert result == VALID
    assert "key" not in result


def test_validation_does_not_change_its_argument() -> None:
    original = {"data": {"b": 1, "a": [2]}, "key": "k", "type": "t", "id": "e"}
    kept = copy.deepcopy(original)
    validate_event(original)
    assert original == kept
    assert list(original) == list(kept)
    assert list(original["data"]) == ["b", "a"]


def test_valid_event_is_returned_as_a_copy() -> None:
    original = with_data({"customer": {"id": "c-1"}, "lines": [1, 2]})
    result = validate_event(original)
    assert result is not original
    assert result["data"] is not original["data"]
    original["data"]["customer"]["id"] = "changed"
    original["data"]["lines"].append(3)
    original["id"] = "changed"
    assert result == with_data({"customer": {"id": "c-1"}, "lines": [1, 2]})
    result["data"]["new"] = 1
    assert "new" not in original["data"]


def test_checked_event_returns_the_callers_data_with_the_canonical_form() -> None:
    # Documented: no copy (what is stored is the canonical text returned with it).
    original = with_data({"b": 1, "a": 2})
    checked, canonical = checked_event(original)
    assert checked["data"] is original["data"]
    assert canonical == '{"data":{"a":2,"b":1},"id":"evt-1","type":"payment.captured"}'


def test_validate_event_data_is_the_canonical_data_read_back() -> None:
    # One JSON number, one spelling: 1.0 and 1 are the same number in RFC 8785.
    result = validate_event(with_data({"whole": 1.0, "half": 0.5, "zero": -0.0}))
    assert result["data"] == {"whole": 1, "half": 0.5, "zero": 0}
    assert type(result["data"]["whole"]) is int


@given(event_id=valid_ids, event_type=valid_types, key=st.none() | valid_keys)
def test_any_valid_id_type_and_key_round_trip(
    event_id: str, event_type: str, key: str | None
) -> None:
    obj = {"id": event_id, "type": event_type, "key": key, "data": {}}
    expected = {name: value for name, value in obj.items() if value is not None}
    assert validate_event(obj) == expected


# ---------------------------------------------------------------- not an object


@pytest.mark.parametrize("obj", [[], [VALID], "evt-1", "", None, 7, 7.0, True, ("id",)])
def test_not_an_object_is_rejected_at_the_root(obj: object) -> None:
    error = rejected(obj)
    assert error.field == ""
    assert "must be a JSON object" in error.problem


# ---------------------------------------------------------------- fields


@pytest.mark.parametrize("name", ["id", "type", "data"])
def test_missing_required_field_is_named_by_its_pointer(name: str) -> None:
    obj = dict(KEYED)
    del obj[name]
    error = rejected(obj)
    assert error.field == f"/{name}"
    assert error.problem == "is required"
    assert str(error) == f"/{name}: is required"


def test_key_is_optional() -> None:
    assert "key" not in validate_event(dict(VALID))


def test_empty_object_names_the_first_missing_field() -> None:
    assert rejected({}).field == "/id"
    assert rejected({"id": "e"}).field == "/type"


@pytest.mark.parametrize(
    ("extra", "pointer"),
    [
        ("note", "/note"),
        ("ID", "/ID"),
        ("key ", "/key "),
        ("", "/"),
        ("sku", "/sku"),
        ("specversion", "/specversion"),
        ("a/b", "/a~1b"),
        ("a~b", "/a~0b"),
        ("~1", "/~01"),
        (5, "/5"),
    ],
)
def test_unknown_field_is_named_by_its_escaped_pointer(extra: object, pointer: str) -> None:
    error = rejected({**KEYED, extra: "x"})
    assert error.field == pointer
    assert "is not a field of an event" in error.problem


@given(
    extras=st.dictionaries(
        keys=st.text(alphabet="adz/~", max_size=4).filter(lambda k: k not in EVENT_FIELDS),
        values=st.one_of(st.none(), st.integers(), st.text(max_size=5)),
        min_size=1,
        max_size=4,
    )
)
def test_of_several_unknown_fields_the_first_in_sorted_order_is_named(
    extras: dict[str, Any],
) -> None:
    first = min(extras).replace("~", "~0").replace("/", "~1")
    assert rejected({**VALID, **extras}).field == "/" + first


@pytest.mark.parametrize("data", [[], [{"a": 1}], "x", "", 1, 1.5, True, None])
def test_data_must_be_an_object(data: object) -> None:
    error = rejected(with_data(data))
    assert error.field == "/data"
    assert "must be a JSON object" in error.problem


def test_empty_data_is_accepted() -> None:
    assert validate_event(with_data({}))["data"] == {}


def test_the_first_invalid_field_in_order_is_named() -> None:
    assert rejected({"id": "", "type": "", "key": "", "data": []}).field == "/id"
    assert rejected({"id": "e", "type": "", "key": "", "data": []}).field == "/type"
    assert rejected({"id": "e", "type": "t", "key": "", "data": []}).field == "/key"
    assert rejected({"id": "e", "type": "t", "key": "k", "data": []}).field == "/data"


# ---------------------------------------------------------------- id, type, key


@pytest.mark.parametrize("value", [1, 1.5, True, ["a"], {"a": 1}, b"abc"])
@pytest.mark.parametrize("name", ["id", "type", "key"])
def test_text_field_of_wrong_type_is_rejected(name: str, value: object) -> None:
    error = rejected({**KEYED, name: value})
    assert error.field == f"/{name}"
    assert "must be a string" in error.problem


@pytest.mark.parametrize("name", ["id", "type"])
def test_null_id_or_type_is_rejected(name: str) -> None:
    assert rejected(event(**{name: None})).field == f"/{name}"


@pytest.mark.parametrize("name", ["id", "type", "key"])
def test_text_fields_of_128_chars_are_accepted(name: str) -> None:
    value = "a" * 128
    assert validate_event({**KEYED, name: value})[name] == value  # type: ignore[literal-required]


@pytest.mark.parametrize("name", ["id", "type", "key"])
@pytest.mark.parametrize("length", [0, 129, 1000])
def test_text_fields_outside_1_to_128_chars_are_rejected(name: str, length: int) -> None:
    error = rejected({**KEYED, name: "a" * length})
    assert error.field == f"/{name}"
    assert error.problem == f"must be 1 to 128 characters, got {length}"


@pytest.mark.parametrize("event_id", ["a", "Z", "0", "a.b_c:d-e", "9-._:"])
def test_id_with_every_allowed_character_class_is_accepted(event_id: str) -> None:
    assert validate_event(event(id=event_id))["id"] == event_id


@pytest.mark.parametrize("event_id", ["-a", ".a", "_a", ":a", "-", "."])
def test_id_must_start_with_a_letter_or_digit(event_id: str) -> None:
    error = rejected(event(id=event_id))
    assert error.field == "/id"
    assert "starting with a letter or digit" in error.problem


@pytest.mark.parametrize("key", ["-", ".x", "_x", ":x", "a.b_c:d-e", "0"])
def test_key_may_start_with_any_character_of_the_alphabet(key: str) -> None:
    assert validate_event(event(key=key))["key"] == key


@pytest.mark.parametrize("event_type", ["-", ".x", "_x", "a.b_c-d", "0", "order.placed"])
def test_type_may_start_with_any_character_of_its_alphabet(event_type: str) -> None:
    assert validate_event(event(type=event_type))["type"] == event_type


@pytest.mark.parametrize("event_type", ["a:b", ":", "urn:x"])
def test_type_may_not_hold_a_colon(event_type: str) -> None:
    error = rejected(event(type=event_type))
    assert error.field == "/type"
    assert error.problem == "may only use A-Z a-z 0-9 . _ -"


@pytest.mark.parametrize(
    "value",
    ["a b", "a/b", "caf\u00e9", "abc\n", "\nabc", "a\tb", "a\x00b", "a#b", "a+b", "\u0663", " "],
)
@pytest.mark.parametrize("name", ["id", "type", "key"])
def test_bad_characters_are_rejected(name: str, value: str) -> None:
    assert rejected({**KEYED, name: value}).field == f"/{name}"


@given(prefix=valid_ids, bad=outside_alphabet, suffix=st.text(alphabet=ALPHABET, max_size=5))
def test_id_with_any_character_outside_the_alphabet_is_rejected(
    prefix: str, bad: str, suffix: str
) -> None:
    event_id = (prefix + bad + suffix)[-ID_MAX_CHARS:]
    assert bad in event_id
    assert rejected(event(id=event_id)).field == "/id"


@given(prefix=valid_keys, bad=outside_alphabet)
def test_key_with_any_character_outside_the_alphabet_is_rejected(prefix: str, bad: str) -> None:
    key = (prefix + bad)[-KEY_MAX_CHARS:]
    assert rejected(event(key=key)).field == "/key"


@given(prefix=valid_types, bad=st.characters(exclude_characters=TYPE_ALPHABET))
def test_type_with_any_character_outside_its_alphabet_is_rejected(prefix: str, bad: str) -> None:
    event_type = (prefix + bad)[-TYPE_MAX_CHARS:]
    assert rejected(event(type=event_type)).field == "/type"


def test_key_and_type_validators_name_the_field_not_a_pointer() -> None:
    assert validate_key("-k:1") == "-k:1"
    assert validate_type("a.b-c") == "a.b-c"
    with pytest.raises(InvalidEvent) as key_error:
        validate_key("k" * 129)
    with pytest.raises(InvalidEvent) as type_error:
        validate_type("a:b")
    assert (key_error.value.field, type_error.value.field) == ("key", "type")


# ---------------------------------------------------------------- I-JSON


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0, -1])
def test_integers_within_the_safe_range_are_accepted(value: int) -> None:
    assert validate_event(with_data({"n": value}))["data"] == {"n": value}


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"n": MAX_SAFE_INTEGER + 1}, "/data/n"),
        ({"n": -MAX_SAFE_INTEGER - 1}, "/data/n"),
        ({"n": 10**30}, "/data/n"),
        ({"a": [0, 1, 2, 2**53]}, "/data/a/3"),
        ({"a": [[], [0, {"b": -(2**60)}]]}, "/data/a/1/1/b"),
        ({"customer": {"id": 2**53}}, "/data/customer/id"),
    ],
)
def test_integer_outside_the_safe_range_is_named_by_its_place(
    data: dict[str, Any], pointer: str
) -> None:
    error = rejected(with_data(data))
    assert error.field == pointer
    assert "outside +/-(2^53-1)" in error.problem


def test_an_integer_too_long_to_convert_is_named_by_its_place() -> None:
    error = rejected(with_data({"a": [BigInteger(5000)]}))
    assert error.field == "/data/a/0"
    assert "5,000 digits" in error.problem


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_number_that_is_not_finite_is_rejected(value: float) -> None:
    error = rejected(with_data({"x": {"y": [1.5, value]}}))
    assert error.field == "/data/x/y/1"
    assert "is not a JSON number" in error.problem


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"a": "\ud800"}, "/data/a"),
        ({"a": "ok\udfffok"}, "/data/a"),
        ({"a": ["x", "\udc00"]}, "/data/a/1"),
        ({"\udc00": 1}, "/data/\udc00"),
        ({"x": {"k\ud83d": "v"}}, "/data/x/k\ud83d"),
    ],
)
def test_a_lone_surrogate_in_a_value_or_a_key_is_named(data: dict[str, Any], pointer: str) -> None:
    error = rejected(with_data(data))
    assert error.field == pointer
    assert "lone surrogate" in error.problem


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({"a": 1.5, "b": "\ud800"}, "/data/b"),
        ({"a": 1.5, "\ud800": 1}, "/data/\ud800"),
        ({"\U0001d11e": "\ud800"}, "/data/\U0001d11e"),
    ],
)
def test_a_lone_surrogate_beside_a_float_or_an_astral_key_is_named(
    data: dict[str, Any], pointer: str
) -> None:
    assert rejected(with_data(data)).field == pointer


def test_paired_surrogates_written_as_astral_characters_are_text() -> None:
    data = {"clef": "\U0001d11e", "\U0001f600": "smile"}
    assert validate_event(with_data(data))["data"] == data


@pytest.mark.parametrize(
    ("data", "pointer"),
    [
        ({1: "x"}, "/data"),
        ({"a": {None: "x"}}, "/data/a"),
        ({"a": [{(1, 2): "x"}]}, "/data/a/0"),
        ({"a": {True: "x"}}, "/data/a"),
    ],
)
def test_a_key_that_is_not_a_string_is_named_by_its_object(
    data: dict[Any, Any], pointer: str
) -> None:
    error = rejected(with_data(data))
    assert error.field == pointer
    assert "has a key that is not a string" in error.problem


class Level(IntEnum):
    HIGH = 1


class Text(str):
    pass


NOT_JSON: list[object] = [
    {1, 2},
    frozenset(),
    b"x",
    bytearray(b"x"),
    (1, 2),
    (),
    Decimal(1),
    object(),
    1j,
    Level.HIGH,
    Text("x"),
]


@pytest.mark.parametrize("value", NOT_JSON)
def test_a_python_value_that_is_not_json_is_named_by_its_place(value: object) -> None:
    # A tuple is refused like a set: data is what JSON parsing gives, exactly.
    error = rejected(with_data({"a": [value]}))
    assert error.field == "/data/a/0"
    assert error.problem.endswith("is not a JSON value")


def test_dict_and_list_subclasses_are_objects_and_arrays() -> None:
    class Obj(dict[str, Any]):
        pass

    class Arr(list[Any]):
        pass

    result = validate_event(with_data(Obj(a=Arr([1, Obj(b=2)]))))
    assert result["data"] == {"a": [1, {"b": 2}]}


def depth(value: object) -> int:
    """How many objects and arrays deep `value` is."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@pytest.mark.parametrize("container", ["object", "array"])
def test_data_exactly_32_deep_is_accepted(container: str) -> None:
    data = nested(MAX_DEPTH, container)
    assert depth(data) == MAX_DEPTH == 32
    assert validate_event(with_data(data))["data"] == data


def test_scalars_inside_the_32nd_level_are_accepted_a_container_is_not() -> None:
    data = nested(MAX_DEPTH)
    last = data
    for _ in range(MAX_DEPTH - 1):
        last = last["a"]
    last.update(n=1, s="x", t=True, z=None)
    assert validate_event(with_data(data))["data"] == data
    last["s"] = []
    assert rejected(with_data(data)).field == "/data" + "/a" * (MAX_DEPTH - 1) + "/s"


@pytest.mark.parametrize(
    ("container", "step"),
    [("object", "/a"), ("array", "/0")],
)
def test_data_33_deep_is_rejected_at_the_33rd_level(container: str, step: str) -> None:
    error = rejected(with_data(nested(MAX_DEPTH + 1, container)))
    assert error.field == "/data/a" + step * (MAX_DEPTH - 1)
    assert error.problem == "is nested over 32 deep"


def test_data_nested_far_too_deep_is_rejected_without_recursion_error() -> None:
    assert rejected(with_data(nested(100_000))).problem == "is nested over 32 deep"


# ---------------------------------------------------------------- data size


def sized(total_bytes: int, filler: str = "x") -> dict[str, str]:
    """Data whose canonical UTF-8 encoding is `total_bytes` long: {"a":"..."}."""
    unit = len(json.dumps(filler, ensure_ascii=False).encode()) - 2
    count, rest = divmod(total_bytes - len('{"a":""}'), unit)
    assert rest == 0
    return {"a": filler * count}


def test_data_of_exactly_the_default_cap_is_accepted() -> None:
    assert MAX_DATA_BYTES == 64 * 1024
    validate_event(with_data(sized(MAX_DATA_BYTES)))


def test_data_over_the_default_cap_is_rejected() -> None:
    error = rejected(with_data(sized(MAX_DATA_BYTES + 1)))
    assert error.field == "/data"
    assert error.problem == "is 65,537 bytes encoded, over the 65,536 allowed"


@pytest.mark.parametrize("limit", [16, 100, 1000, 200_000])
def test_an_explicit_cap_is_exact(limit: int) -> None:
    validate_event(with_data(sized(limit)), max_data_bytes=limit)
    assert rejected(with_data(sized(limit + 1)), max_data_bytes=limit).field == "/data"


def test_a_cap_above_the_default_takes_what_the_default_refuses() -> None:
    data = sized(100_000)
    assert rejected(with_data(data)).field == "/data"
    assert validate_event(with_data(data), max_data_bytes=100_000)["data"] == data


@pytest.mark.parametrize(
    ("filler", "unit"),
    [
        ("\u00e9", 2),  # UTF-8 bytes, not characters
        ("\U0001d11e", 4),
        ("\x00", 6),  # written \u0000
        ("\n", 2),  # written \n
        ('"', 2),
    ],
)
def test_the_size_is_of_the_canonical_utf8_encoding(filler: str, unit: int) -> None:
    data = {"a": filler * 10}
    size = len('{"a":""}') + 10 * unit
    validate_event(with_data(data), max_data_bytes=size)
    error = rejected(with_data(data), max_data_bytes=size - 1)
    assert error.problem == f"is {size} bytes encoded, over the {size - 1} allowed"


@pytest.mark.parametrize(
    ("number", "python_text", "canonical_text"),
    [(1e-7, "1e-07", "1e-7"), (100.0, "100.0", "100"), (1e21, "1e+21", "1e+21")],
)
def test_the_size_is_of_the_canonical_spelling_of_numbers(
    number: float, python_text: str, canonical_text: str
) -> None:
    assert json.dumps(number) == python_text
    size = len(f'{{"a":{canonical_text}}}')
    validate_event(with_data({"a": number}), max_data_bytes=size)
    assert rejected(with_data({"a": number}), max_data_bytes=size - 1).field == "/data"


def test_the_size_counts_only_the_data() -> None:
    limit = len('{"a":""}')
    validate_event({**KEYED, "id": "i" * 128, "data": {"a": ""}}, max_data_bytes=limit)


# ---------------------------------------------------------------- canonical form


@given(
    event_id=valid_ids,
    event_type=valid_types,
    key=st.none() | valid_keys,
    data=json_data,
)
@example(event_id="e", event_type="t", key=None, data={"\ue000": 1, "\U0001d11e": 2})
@example(event_id="e", event_type="t", key="k", data={"a": {"\uffff": [], "\U00010000": 0}})
@example(event_id="e", event_type="t", key=None, data={"n": [1.0, -0.0, 1e21, 5e-324, 0.1]})
@example(event_id="e", event_type="t", key=None, data={"n": [0.0001, 0.00009999999999999999]})
@example(event_id="e", event_type="t", key=None, data={"n": [99999999999999.9, 4503599627370495.5]})
@example(event_id="e", event_type="t", key=None, data={"n": [-2.5, 0.1 + 0.2, 1.5e15, 9.99e-5]})
@example(event_id="e", event_type="t", key=None, data={"n": [1.0, -0.0, 2.0**53 - 1]})
@example(event_id="e", event_type="t", key=None, data={"s": '\x00\x08\x1f\x7f\u2028"\\/'})
def test_the_canonical_form_is_rfc8785_of_the_event(
    event_id: str, event_type: str, key: str | None, data: dict[str, Any]
) -> None:
    obj = {"id": event_id, "type": event_type, "key": key, "data": data}
    expected = reference(obj)
    assert checked_event(obj)[1] == expected
    assert canonical_json(validate_event(obj)) == expected


@settings(max_examples=2000)
@given(
    magnitude=st.floats(min_value=1e-4, max_value=1e16, exclude_max=True).filter(
        lambda x: not x.is_integer() or x <= 2**53 - 1  # larger whole floats are refused
    )
    | st.integers(min_value=0, max_value=2**53 - 1).map(float),  # whole floats as ints
    negative=st.booleans(),
)
def test_a_float_on_the_json_dumps_path_is_written_as_rfc8785_writes_it(
    magnitude: float, negative: bool
) -> None:
    # Fractions of magnitude 1e-4 to 1e16 skip the rfc8785 package: Python's repr is
    # then the ECMAScript text; whole floats up to 2^53 skip it too, written as ints
    # (7.0 -> "7", as ECMAScript writes it; -0.0 -> "0").
    number = -magnitude if negative else magnitude
    obj = {"id": "e", "type": "t", "data": {"n": number, "l": [number, {"m": number}]}}
    assert checked_event(obj)[1] == reference(obj)


@given(data=json_data, key=st.none() | valid_keys, order=st.permutations(["id", "type", "data"]))
def test_the_canonical_form_is_independent_of_key_order(
    data: dict[str, Any], key: str | None, order: list[str]
) -> None:
    fields = {"id": "e-1", "type": "t", "data": data}
    if key is not None:
        order = [*order, "key"]
        fields["key"] = key
    forward = {name: fields[name] for name in order}
    backward = {name: reordered(fields[name]) for name in reversed(order)}
    assert checked_event(forward)[1] == checked_event(backward)[1]
    assert payload_digest(validate_event(forward)) == payload_digest(validate_event(backward))


def test_the_canonical_form_is_compact_and_sorted() -> None:
    obj = {"type": "t.x", "key": "k", "id": "e", "data": {"b": [1, {"d": None, "c": True}]}}
    assert checked_event(obj)[1] == (
        '{"data":{"b":[1,{"c":true,"d":null}]},"id":"e","key":"k","type":"t.x"}'
    )


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ({"s": "caf\u00e9"}, '{"s":"caf\u00e9"}'),  # UTF-8, not \u escapes
        ({"s": "\U0001d11e"}, '{"s":"\U0001d11e"}'),
        ({"s": "\x1f\x00"}, '{"s":"\\u001f\\u0000"}'),
        ({"s": "\b\f\n\r\t"}, '{"s":"\\b\\f\\n\\r\\t"}'),
        ({"s": '"\\/'}, '{"s":"\\"\\\\/"}'),
        ({"s": "\x7f\u2028"}, '{"s":"\x7f\u2028"}'),
        ({"n": 1.0}, '{"n":1}'),
        ({"n": 1e21}, '{"n":1e+21}'),
        ({"n": 1e-7}, '{"n":1e-7}'),
        ({"n": -0.0}, '{"n":0}'),
        ({"\ue000": 1, "\U0001d11e": 2}, '{"\U0001d11e":2,"\ue000":1}'),  # UTF-16 order
    ],
)
def test_canonical_data_follows_rfc8785(data: dict[str, Any], text: str) -> None:
    assert checked_event(with_data(data))[1] == (
        f'{{"data":{text},"id":"evt-1","type":"payment.captured"}}'
    )


def test_the_canonical_form_differs_when_any_field_differs() -> None:
    forms = {
        checked_event(obj)[1]
        for obj in [
            VALID,
            KEYED,
            event(id="evt-2"),
            event(type="payment.refunded"),
            event(key="customer-8"),
            with_data({"amount": 6}),
            with_data({"amount": "5"}),
        ]
    }
    assert len(forms) == 7


@given(data=json_data)
def test_the_canonical_form_read_back_is_valid_and_the_same(data: dict[str, Any]) -> None:
    # The sink validates what the publisher sends: the canonical text, parsed; and
    # what validate_event returns is stored and digested again.
    canonical = checked_event(with_data(data))[1]
    assert checked_event(json.loads(canonical))[1] == canonical
    assert canonical_json(validate_event(with_data(data))) == canonical


@pytest.mark.parametrize("value", [2.0**53, 1e20, -1e20])
def test_a_whole_float_outside_the_safe_range_is_refused_at_its_place(value: float) -> None:
    # RFC 8785 writes such a float as an integer, which read back would be out of
    # range: the publisher would accept an event that no sink takes.
    with pytest.raises(InvalidEvent) as raised:
        checked_event(with_data({"a": [value]}))
    assert raised.value.field == "/data/a/0"


@pytest.mark.parametrize("value", [2.0**53 - 1, 1e21, 1.5e300, 0.5])
def test_a_float_whose_canonical_form_reads_back_the_same_is_taken(value: float) -> None:
    canonical = checked_event(with_data({"a": value}))[1]
    assert checked_event(json.loads(canonical))[1] == canonical


# ---------------------------------------------------------------- data_preview


def test_data_preview_is_compact_sorted_json() -> None:
    assert data_preview({"b": [1, None], "a": True}) == '{"a":true,"b":[1,null]}'


@pytest.mark.parametrize(
    ("data", "preview"),
    [
        ({"a": "\x1b[31mred"}, '{"a":"\\u001b[31mred"}'),
        ({"a": "caf\u00e9"}, '{"a":"caf\\u00e9"}'),
        ({"a": "\U0001d11e"}, '{"a":"\\ud834\\udd1e"}'),
        ({"a": "\u202e"}, '{"a":"\\u202e"}'),
        ({"\n": "\x7f"}, '{"\\n":"\\u007f"}'),
    ],
)
def test_data_preview_escapes_everything_outside_printable_ascii(
    data: dict[str, str], preview: str
) -> None:
    assert data_preview(data) == preview


@given(data=json_data, max_chars=st.integers(min_value=3, max_value=200))
def test_data_preview_is_printable_ascii_and_bounded(data: dict[str, Any], max_chars: int) -> None:
    preview = data_preview(data, max_chars)
    assert len(preview) <= max_chars
    assert all(" " <= char <= "~" for char in preview)
    full = data_preview(data, 10**9)
    if len(full) <= max_chars:
        assert preview == full
    else:
        assert preview == full[: max_chars - 3] + "..."


def test_data_preview_defaults_to_80_characters() -> None:
    preview = data_preview({"a": "x" * 500})
    assert len(preview) == 80
    assert preview.endswith("...")


# ---------------------------------------------------------------- orders


def order(**changes: Any) -> dict[str, Any]:
    """The valid order with some fields replaced."""
    return {**VALID_ORDER, **changes}


def rejected_order(obj: object) -> InvalidEvent:
    """The InvalidEvent that validate_order raises for `obj`."""
    with pytest.raises(InvalidEvent) as excinfo:
        validate_order(obj)
    return excinfo.value


def test_valid_order_is_returned_equal() -> None:
    assert validate_order(dict(VALID_ORDER)) == VALID_ORDER


def test_valid_order_is_returned_as_a_copy() -> None:
    original = dict(VALID_ORDER)
    result = validate_order(original)
    assert result is not original
    result["qty"] = 99
    result["id"] = "changed"
    assert original == VALID_ORDER


def test_order_validation_does_not_change_its_argument() -> None:
    original = {"qty": 7, "sku": "snack", "id": "order-1"}
    validate_order(original)
    assert original == {"qty": 7, "sku": "snack", "id": "order-1"}
    assert list(original) == ["qty", "sku", "id"]


@pytest.mark.parametrize("qty", [1, 2, 999_999, 1_000_000])
def test_qty_inside_bounds_is_accepted(qty: int) -> None:
    assert validate_order(order(qty=qty))["qty"] == qty


def test_order_id_of_128_chars_is_accepted() -> None:
    order_id = "a" * 128
    assert validate_order(order(id=order_id))["id"] == order_id


def test_sku_of_64_chars_is_accepted() -> None:
    sku = "s" * 64
    assert validate_order(order(sku=sku))["sku"] == sku


@pytest.mark.parametrize("order_id", ["a", "Z", "0", "a.b_c:d-e", "9-._:"])
def test_order_id_with_every_allowed_character_class_is_accepted(order_id: str) -> None:
    assert validate_order(order(id=order_id))["id"] == order_id


@pytest.mark.parametrize("sku", ["-", ".x", "_x", ":x", "a.b_c:d-e", "0"])
def test_sku_may_start_with_any_character_of_the_alphabet(sku: str) -> None:
    assert validate_order(order(sku=sku))["sku"] == sku


@given(order_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_any_valid_order_round_trips(order_id: str, sku: str, qty: int) -> None:
    obj = {"id": order_id, "sku": sku, "qty": qty}
    result = validate_order(obj)
    assert result == obj
    assert result is not obj


@pytest.mark.parametrize("obj", [[], [VALID_ORDER], "order-1", "", None, 7, 7.0, True, ("id",)])
def test_order_that_is_not_an_object_is_rejected(obj: object) -> None:
    assert rejected_order(obj).field == "event"


@pytest.mark.parametrize("name", FIELDS)
def test_missing_order_field_is_rejected_naming_it(name: str) -> None:
    obj = dict(VALID_ORDER)
    del obj[name]
    error = rejected_order(obj)
    assert error.field == name
    assert str(error).startswith(f"{name}:")


def test_empty_order_names_the_first_missing_field() -> None:
    assert rejected_order({}).field == "id"


@pytest.mark.parametrize("extra", ["note", "ID", "qty ", "", "sent", "type", "data", "key"])
def test_extra_order_field_is_rejected_naming_it(extra: str) -> None:
    error = rejected_order(order(**{extra: "x"}))
    assert error.field == extra
    assert error.problem == "is not a field of an order"


@given(
    extras=st.dictionaries(
        keys=st.one_of(st.text(max_size=10), st.integers()).filter(lambda k: k not in FIELDS),
        values=st.one_of(st.none(), st.integers(), st.text(max_size=5)),
        min_size=1,
        max_size=4,
    )
)
def test_any_extra_order_key_is_rejected(extras: dict[Any, Any]) -> None:
    error = rejected_order({**VALID_ORDER, **extras})
    assert error.field == min(str(key) for key in extras)


@pytest.mark.parametrize("value", [1, 1.5, None, True, ["a"], {"a": 1}, b"abc"])
@pytest.mark.parametrize("name", ["id", "sku"])
def test_order_text_field_of_wrong_type_is_rejected(name: str, value: object) -> None:
    assert rejected_order(order(**{name: value})).field == name


@pytest.mark.parametrize("qty", [7.0, 1.0, True, False, "7", None, [7], {"n": 7}])
def test_qty_that_is_not_a_plain_integer_is_rejected(qty: object) -> None:
    assert rejected_order(order(qty=qty)).field == "qty"


@pytest.mark.parametrize("qty", [0, -1, 1_000_001, 10**30, BigInteger(5000)])
def test_qty_outside_bounds_is_rejected(qty: object) -> None:
    error = rejected_order(order(qty=qty))
    assert error.field == "qty"
    assert error.problem.startswith("must be between 1 and 1,000,000")


@given(qty=st.one_of(st.integers(max_value=QTY_MIN - 1), st.integers(min_value=QTY_MAX + 1)))
def test_any_qty_outside_bounds_is_rejected(qty: int) -> None:
    assert rejected_order(order(qty=qty)).field == "qty"


@given(qty=st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_qty_is_rejected(qty: float) -> None:
    assert rejected_order(order(qty=qty)).field == "qty"


def test_order_id_of_129_chars_is_rejected() -> None:
    assert rejected_order(order(id="a" * 129)).field == "id"


def test_sku_of_65_chars_is_rejected() -> None:
    # An ordering key may be 128 characters; a SKU stays at 64.
    assert rejected_order(order(sku="s" * 65)).field == "sku"


@pytest.mark.parametrize("name", ["id", "sku"])
def test_empty_order_string_is_rejected(name: str) -> None:
    assert rejected_order(order(**{name: ""})).field == name


@pytest.mark.parametrize(
    "value",
    ["a b", "a/b", "caf\u00e9", "abc\n", "\nabc", "a\tb", "a\x00b", "a#b", "a+b", "\u0663", " "],
)
@pytest.mark.parametrize("name", ["id", "sku"])
def test_bad_order_characters_are_rejected(name: str, value: str) -> None:
    assert rejected_order(order(**{name: value})).field == name


@pytest.mark.parametrize("order_id", ["-a", ".a", "_a", ":a", "-", "."])
def test_order_id_must_start_with_a_letter_or_digit(order_id: str) -> None:
    assert rejected_order(order(id=order_id)).field == "id"


@given(prefix=valid_ids, bad=outside_alphabet, suffix=st.text(alphabet=ALPHABET, max_size=5))
def test_order_id_with_any_character_outside_the_alphabet_is_rejected(
    prefix: str, bad: str, suffix: str
) -> None:
    order_id = (prefix + bad + suffix)[-ID_MAX_CHARS:]
    assert bad in order_id
    assert rejected_order(order(id=order_id)).field == "id"


@given(prefix=valid_skus, bad=outside_alphabet)
def test_sku_with_any_character_outside_the_alphabet_is_rejected(prefix: str, bad: str) -> None:
    sku = (prefix + bad)[-SKU_MAX_CHARS:]
    assert bad in sku
    assert rejected_order(order(sku=sku)).field == "sku"


def test_the_first_invalid_order_field_in_order_is_named() -> None:
    assert rejected_order({"id": "", "sku": "", "qty": 0}).field == "id"
    assert rejected_order({"id": "ok", "sku": "", "qty": 0}).field == "sku"


# ---------------------------------------------------------------- the order.placed event


def test_an_order_is_recorded_as_an_order_placed_event_keyed_by_its_sku() -> None:
    valid = validate_order(dict(VALID_ORDER))
    assert order_event(valid) == {
        "id": "order-1",
        "type": "order.placed",
        "key": "snack",
        "data": {"sku": "snack", "qty": 7},
    }
    assert ORDER_PLACED == "order.placed"


def test_the_canonical_form_of_an_order_event() -> None:
    valid = validate_order({"sku": "s", "qty": 7, "id": "a"})
    assert order_canonical(valid) == (
        '{"data":{"qty":7,"sku":"s"},"id":"a","key":"s","type":"order.placed"}'
    )


@given(order_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_order_canonical_is_the_canonical_form_of_the_order_event(
    order_id: str, sku: str, qty: int
) -> None:
    valid = validate_order({"id": order_id, "sku": sku, "qty": qty})
    placed = order_event(valid)
    assert validate_event(placed) == placed
    assert order_canonical(valid) == canonical_json(placed)
    assert order_canonical(valid) == rfc8785.dumps(placed).decode()
    assert order_canonical(valid) == checked_event(placed)[1]


@given(order_id=valid_ids, sku=valid_skus, qty=valid_qtys, data=st.data())
def test_order_canonical_and_digest_are_stable_under_any_key_order(
    order_id: str, sku: str, qty: int, data: st.DataObject
) -> None:
    items = [("id", order_id), ("sku", sku), ("qty", qty)]
    shuffled = data.draw(st.permutations(items))
    first = validate_order(dict(items))
    second = validate_order(dict(shuffled))
    assert order_canonical(first) == order_canonical(second)
    assert payload_digest(order_event(first)) == payload_digest(order_event(second))


def previous_reference(obj: object) -> str:
    """What the previous release's canonical JSON meant: json.dumps, sorted keys,
    compact, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def test_previous_canonical_is_the_previous_releases_text() -> None:
    valid = validate_order({"sku": "s", "qty": 7, "id": "a"})
    assert previous_canonical(valid) == '{"id":"a","qty":7,"sku":"s"}'


@given(order_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_previous_canonical_of_any_valid_order_is_the_previous_reference(
    order_id: str, sku: str, qty: int
) -> None:
    valid = validate_order({"qty": qty, "id": order_id, "sku": sku})
    assert previous_canonical(valid) == previous_reference(valid)
    assert previous_canonical(valid) != order_canonical(valid)


@given(order_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_placed_order_reads_back_the_order_of_its_event(order_id: str, sku: str, qty: int) -> None:
    valid = validate_order({"id": order_id, "sku": sku, "qty": qty})
    assert placed_order(order_event(valid)) == valid
    assert placed_order(validate_event(order_event(valid))) == valid
    assert placed_order(checked_event(order_event(valid))[0]) == valid


@pytest.mark.parametrize("event_type", ["order.placed.v2", "Order.placed", "order.cancelled"])
def test_placed_order_is_none_for_another_type(event_type: str) -> None:
    placed = order_event(validate_order(dict(VALID_ORDER)))
    assert placed_order({**placed, "type": event_type}) is None  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"sku": "snack"},
        {"qty": 7},
        {"sku": "snack", "qty": 7, "note": "x"},
        {"sku": "snack", "qty": 7, "id": "order-1"},
        {"sku": "snack", "quantity": 7},
        {"sku": "snack", "qty": 0},
        {"sku": "snack", "qty": QTY_MAX + 1},
        {"sku": "snack", "qty": True},
        {"sku": "snack", "qty": "7"},
        {"sku": "snack", "qty": 7.5},
        {"sku": "s" * 65, "qty": 7},
        {"sku": "caf\u00e9", "qty": 7},
        {"sku": 7, "qty": 7},
        {"sku": {"id": "snack"}, "qty": 7},
    ],
)
def test_placed_order_is_none_for_data_that_is_not_an_order(data: dict[str, Any]) -> None:
    obj = {"id": "order-1", "type": ORDER_PLACED, "key": "snack", "data": data}
    checked, _ = checked_event(obj)
    assert placed_order(checked) is None
    assert placed_order(validate_event(obj)) is None


def test_placed_order_depends_only_on_the_canonical_form() -> None:
    spelled = {"id": "order-1", "type": ORDER_PLACED, "key": "snack"}
    as_float, canonical = checked_event({**spelled, "data": {"sku": "snack", "qty": 7.0}})
    as_int, same = checked_event({**spelled, "data": {"sku": "snack", "qty": 7}})
    assert canonical == same
    assert placed_order(as_float) == placed_order(as_int)


@given(event_id=valid_ids, event_type=valid_types, key=st.none() | valid_keys, data=json_data)
def test_stored_data_is_the_data_cut_from_the_canonical_form(
    event_id: str, event_type: str, key: str | None, data: dict[str, Any]
) -> None:
    obj = {"id": event_id, "type": event_type, "key": key, "data": data}
    checked, canonical = checked_event(obj)
    assert stored_data(checked, canonical) == canonical_parts(checked)[0]


@given(event_id=valid_ids, event_type=valid_types, key=st.none() | valid_keys, data=json_data)
def test_envelope_of_reads_id_type_and_key_and_cuts_out_the_data(
    event_id: str, event_type: str, key: str | None, data: dict[str, Any]
) -> None:
    obj = {"id": event_id, "type": event_type, "key": key, "data": data}
    checked, canonical = checked_event(obj)
    head = {name: value for name, value in checked.items() if name != "data"}
    assert envelope_of(canonical) == (head, canonical_parts(checked)[0])


def test_envelope_of_finds_the_events_own_id_after_data_that_names_ids() -> None:
    data = {"id": "inner", "order": {"id": "deeper"}, "note": ',"id":"fake","type":"x"}'}
    checked, canonical = checked_event({**KEYED, "data": data})
    assert envelope_of(canonical) == (
        {"id": KEYED["id"], "key": KEYED["key"], "type": KEYED["type"]},
        canonical_parts(checked)[0],
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"data": {},"id":"e-1","type":"t"}',  # not canonical: a space
        '{"data":{},"type":"t","id":"e-1"}',  # another key order
        '{"data":{},"id":"e-1","type":"t","extra":"x"}',  # a field of no event
        '{"data":{},"id":"e-1"}',  # no type
        '{"data":[],"id":"e-1","type":"t"}',  # data not an object
        '{"data":{},"id":"e-1","type":7}',  # a type that is not text
        '{"data":{},"id":"e-1","type":"t"',  # cut short
        '{"id":"e-1","type":"t","data":{}}',  # data not first
        '{"data":{"id":"e-1","type":"t"}}',  # the ID only inside the data
        '{"data":{},"id":"e\\"1","type":"t"}',  # a value with an escaped quote
        '{"data":{},"id":"e-1","type":"t\\u0041"}',  # a value with an escape
        '{"data":{},"id":"e-1","kind":"k","type":"t"}',  # a member of no event
        '{"data":{},"id":"e-1","key":"k","type":"t","key":"k"}',  # a member twice
    ],
)
def test_envelope_of_is_none_for_text_not_laid_out_as_a_canonical_event(text: str) -> None:
    assert envelope_of(text) is None


def test_stored_data_is_none_for_text_not_laid_out_as_that_event() -> None:
    keyed = validate_event(KEYED)
    canonical = canonical_json(keyed)
    assert stored_data(keyed, canonical.replace('{"data":', '{"data": ', 1)) is None
    assert stored_data({**keyed, "id": "other"}, canonical) is None
    assert stored_data({**keyed, "key": "k-2"}, canonical) is None
    assert stored_data(validate_event(VALID), canonical) is None  # no key: another layout
