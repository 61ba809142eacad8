"""The event contract: validate_event and canonical_json. Pure functions, no I/O."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import InvalidEvent, canonical_json, payload_digest, validate_event
from shared.event import FIELDS, ID_MAX_CHARS, QTY_MAX, QTY_MIN, SKU_MAX_CHARS

ALPHABET = string.ascii_letters + string.digits + "._:-"
ALNUM = string.ascii_letters + string.digits

VALID: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}

valid_ids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(ALNUM),
    st.text(alphabet=ALPHABET, max_size=ID_MAX_CHARS - 1),
)
valid_skus = st.text(alphabet=ALPHABET, min_size=1, max_size=SKU_MAX_CHARS)
valid_qtys = st.integers(min_value=QTY_MIN, max_value=QTY_MAX)
outside_alphabet = st.characters(exclude_characters=ALPHABET)


def event(**changes: Any) -> dict[str, Any]:
    """The valid event with some fields replaced."""
    return {**VALID, **changes}


def rejected(obj: object) -> InvalidEvent:
    """The InvalidEvent that validate_event raises for `obj`."""
    with pytest.raises(InvalidEvent) as excinfo:
        validate_event(obj)
    return excinfo.value


# ---------------------------------------------------------------- accepted


def test_valid_event_is_returned_equal() -> None:
    assert validate_event(dict(VALID)) == VALID


def test_valid_event_is_returned_as_a_copy() -> None:
    original = dict(VALID)
    result = validate_event(original)
    assert result is not original
    result["qty"] = 99  # type: ignore[typeddict-item]
    result["id"] = "changed"
    assert original == VALID


def test_validation_does_not_change_its_argument() -> None:
    original = {"qty": 7, "sku": "snack", "id": "order-1"}
    validate_event(original)
    assert original == {"qty": 7, "sku": "snack", "id": "order-1"}
    assert list(original) == ["qty", "sku", "id"]


def test_invalid_event_is_a_value_error() -> None:
    assert issubclass(InvalidEvent, ValueError)


@pytest.mark.parametrize("qty", [1, 2, 999_999, 1_000_000])
def test_qty_inside_bounds_is_accepted(qty: int) -> None:
    assert validate_event(event(qty=qty))["qty"] == qty


def test_id_of_128_chars_is_accepted() -> None:
    event_id = "a" * 128
    assert validate_event(event(id=event_id))["id"] == event_id


def test_sku_of_64_chars_is_accepted() -> None:
    sku = "s" * 64
    assert validate_event(event(sku=sku))["sku"] == sku


@pytest.mark.parametrize("event_id", ["a", "Z", "0", "a.b_c:d-e", "9-._:"])
def test_id_with_every_allowed_character_class_is_accepted(event_id: str) -> None:
    assert validate_event(event(id=event_id))["id"] == event_id


@pytest.mark.parametrize("sku", ["-", ".x", "_x", ":x", "a.b_c:d-e", "0"])
def test_sku_may_start_with_any_character_of_the_alphabet(sku: str) -> None:
    assert validate_event(event(sku=sku))["sku"] == sku


@given(event_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_any_valid_event_round_trips(event_id: str, sku: str, qty: int) -> None:
    obj = {"id": event_id, "sku": sku, "qty": qty}
    result = validate_event(obj)
    assert result == obj
    assert result is not obj


# ---------------------------------------------------------------- not an object


@pytest.mark.parametrize("obj", [[], [VALID], "order-1", "", None, 7, 7.0, True, ("id",)])
def test_not_an_object_is_rejected(obj: object) -> None:
    assert rejected(obj).field == "event"


# ---------------------------------------------------------------- fields


@pytest.mark.parametrize("name", FIELDS)
def test_missing_field_is_rejected_naming_it(name: str) -> None:
    obj = dict(VALID)
    del obj[name]
    error = rejected(obj)
    assert error.field == name
    assert str(error).startswith(f"{name}:")


def test_empty_object_names_the_first_missing_field() -> None:
    assert rejected({}).field == "id"


@pytest.mark.parametrize("extra", ["note", "ID", "qty ", "", "sent"])
def test_extra_field_is_rejected_naming_it(extra: str) -> None:
    error = rejected(event(**{extra: "x"}))
    assert error.field == extra


@given(
    extras=st.dictionaries(
        keys=st.one_of(st.text(max_size=10), st.integers()).filter(lambda k: k not in FIELDS),
        values=st.one_of(st.none(), st.integers(), st.text(max_size=5)),
        min_size=1,
        max_size=4,
    )
)
def test_any_extra_key_is_rejected(extras: dict[Any, Any]) -> None:
    error = rejected({**VALID, **extras})
    assert error.field == min(str(key) for key in extras)


# ---------------------------------------------------------------- types


@pytest.mark.parametrize("value", [1, 1.5, None, True, ["a"], {"a": 1}, b"abc"])
@pytest.mark.parametrize("name", ["id", "sku"])
def test_text_field_of_wrong_type_is_rejected(name: str, value: object) -> None:
    assert rejected(event(**{name: value})).field == name


@pytest.mark.parametrize("qty", [7.0, 1.0, True, False, "7", None, [7], {"n": 7}])
def test_qty_that_is_not_a_plain_integer_is_rejected(qty: object) -> None:
    error = rejected(event(qty=qty))
    assert error.field == "qty"


@pytest.mark.parametrize("qty", [0, -1, 1_000_001, 10**30])
def test_qty_outside_bounds_is_rejected(qty: int) -> None:
    assert rejected(event(qty=qty)).field == "qty"


@given(qty=st.one_of(st.integers(max_value=QTY_MIN - 1), st.integers(min_value=QTY_MAX + 1)))
def test_any_qty_outside_bounds_is_rejected(qty: int) -> None:
    assert rejected(event(qty=qty)).field == "qty"


@given(qty=st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_qty_is_rejected(qty: float) -> None:
    assert rejected(event(qty=qty)).field == "qty"


# ---------------------------------------------------------------- lengths and characters


def test_id_of_129_chars_is_rejected() -> None:
    assert rejected(event(id="a" * 129)).field == "id"


def test_sku_of_65_chars_is_rejected() -> None:
    assert rejected(event(sku="s" * 65)).field == "sku"


@pytest.mark.parametrize("name", ["id", "sku"])
def test_empty_string_is_rejected(name: str) -> None:
    assert rejected(event(**{name: ""})).field == name


@pytest.mark.parametrize(
    "value",
    ["a b", "a/b", "caf\u00e9", "abc\n", "\nabc", "a\tb", "a\x00b", "a#b", "a+b", "\u0663", " "],
)
@pytest.mark.parametrize("name", ["id", "sku"])
def test_bad_characters_are_rejected(name: str, value: str) -> None:
    assert rejected(event(**{name: value})).field == name


@pytest.mark.parametrize("event_id", ["-a", ".a", "_a", ":a", "-", "."])
def test_id_must_start_with_a_letter_or_digit(event_id: str) -> None:
    assert rejected(event(id=event_id)).field == "id"


@given(prefix=valid_ids, bad=outside_alphabet, suffix=st.text(alphabet=ALPHABET, max_size=5))
def test_id_with_any_character_outside_the_alphabet_is_rejected(
    prefix: str, bad: str, suffix: str
) -> None:
    event_id = (prefix + bad + suffix)[-ID_MAX_CHARS:]
    assert bad in event_id
    assert rejected(event(id=event_id)).field == "id"


@given(prefix=valid_skus, bad=outside_alphabet)
def test_sku_with_any_character_outside_the_alphabet_is_rejected(prefix: str, bad: str) -> None:
    sku = (prefix + bad)[-SKU_MAX_CHARS:]
    assert bad in sku
    assert rejected(event(sku=sku)).field == "sku"


def test_the_first_invalid_field_in_order_is_named() -> None:
    assert rejected({"id": "", "sku": "", "qty": 0}).field == "id"
    assert rejected({"id": "ok", "sku": "", "qty": 0}).field == "sku"


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_is_key_order_independent() -> None:
    forward = validate_event({"id": "a", "sku": "s", "qty": 7})
    backward = validate_event({"qty": 7, "sku": "s", "id": "a"})
    assert canonical_json(forward) == canonical_json(backward)


def test_canonical_json_is_compact_and_sorted() -> None:
    assert canonical_json(validate_event({"sku": "s", "qty": 7, "id": "a"})) == (
        '{"id":"a","qty":7,"sku":"s"}'
    )


def test_canonical_json_differs_when_the_payload_differs() -> None:
    base = validate_event(dict(VALID))
    assert canonical_json(base) != canonical_json(validate_event(event(qty=8)))
    assert canonical_json(base) != canonical_json(validate_event(event(sku="snacks")))


@given(event_id=valid_ids, sku=valid_skus, qty=valid_qtys, data=st.data())
def test_canonical_json_and_digest_are_stable_under_any_key_order(
    event_id: str, sku: str, qty: int, data: st.DataObject
) -> None:
    items = [("id", event_id), ("sku", sku), ("qty", qty)]
    shuffled = data.draw(st.permutations(items))
    first = validate_event(dict(items))
    second = validate_event(dict(shuffled))
    assert canonical_json(first) == canonical_json(second)
    assert canonical_json(first) == canonical_json(first)
    assert payload_digest(first) == payload_digest(second)


def reference_json(obj: object) -> str:
    """What canonical JSON means: json.dumps, sorted keys, compact, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)


@given(event_id=valid_ids, sku=valid_skus, qty=valid_qtys)
def test_canonical_json_of_any_valid_event_is_the_reference_serialisation(
    event_id: str, sku: str, qty: int
) -> None:
    valid = validate_event({"id": event_id, "sku": sku, "qty": qty})
    assert canonical_json(valid) == reference_json(valid)


@given(
    obj=st.fixed_dictionaries({"id": json_scalars, "sku": json_scalars, "qty": json_scalars})
    | st.dictionaries(st.sampled_from(["id", "sku", "qty", "x"]), json_scalars)
)
def test_canonical_json_of_anything_else_is_still_the_reference_serialisation(
    obj: dict[str, Any],
) -> None:
    # Text that needs escaping (quotes, backslashes, non-ASCII), a boolean or missing
    # quantity, other keys: the fast path must not take any of them.
    assert canonical_json(obj) == reference_json(obj)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "obj",
    [
        {"id": 'a"b', "sku": "s", "qty": 1},
        {"id": "a\\b", "sku": "s", "qty": 1},
        {"id": "é", "sku": "s", "qty": 1},
        {"id": "a", "sku": "s\n", "qty": 1},
        {"id": "a", "sku": "ü", "qty": 1},
        {"id": "a", "sku": "s", "qty": True},
        {"id": "a", "sku": "s", "qty": 1.5},
        {"id": 7, "sku": "s", "qty": 1},
        {"id": "a", "sku": "s", "x": 1},
    ],
)
def test_canonical_json_escapes_what_needs_escaping(obj: dict[str, Any]) -> None:
    assert canonical_json(obj) == reference_json(obj)  # type: ignore[arg-type]
