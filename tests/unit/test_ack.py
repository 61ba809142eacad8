"""The ACK: make_ack, verify_ack and the payload digest (over the event's canonical
form). Pure functions, no I/O."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from shared import (
    InvalidAck,
    Receipt,
    checked_event,
    digest_of,
    make_ack,
    order_canonical,
    order_event,
    payload_digest,
    validate_event,
    validate_order,
    verify_ack,
)
from shared.ack import ack_json
from shared.event import Event, previous_canonical

EVENT: Event = {
    "id": "evt-1",
    "type": "payment.captured",
    "key": "customer-7",
    "data": {"amount": {"value": 1250, "currency": "EUR"}, "note": "caf\u00e9 \U0001d11e"},
}
DIGEST = payload_digest(EVENT)


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def refused(reply: bytes, event_id: str = "evt-1", digest: str | None = None) -> InvalidAck:
    with pytest.raises(InvalidAck) as excinfo:
        verify_ack(reply, event_id, digest)
    return excinfo.value


# ---------------------------------------------------------------- make_ack


def test_make_ack_names_the_id_and_the_receipt() -> None:
    assert make_ack("evt-1", Receipt.APPLIED) == {"ack": "evt-1", "status": "applied"}
    assert make_ack("evt-1", Receipt.DUPLICATE) == {"ack": "evt-1", "status": "duplicate"}


def test_make_ack_carries_the_digest_when_given() -> None:
    assert make_ack("evt-1", Receipt.APPLIED, DIGEST) == {
        "ack": "evt-1",
        "status": "applied",
        "sha256": DIGEST,
    }


def test_payload_digest_is_sha256_hex() -> None:
    assert len(DIGEST) == 64
    assert set(DIGEST) <= set("0123456789abcdef")


# ---------------------------------------------------------------- payload digest


def rfc8785_digest(event: dict[str, Any]) -> str:
    """What the digest means: SHA-256 of the UTF-8 of RFC 8785 of {id, type, key?, data}."""
    return hashlib.sha256(rfc8785.dumps(event)).hexdigest()


def test_payload_digest_is_over_the_canonical_generic_form() -> None:
    assert DIGEST == rfc8785_digest(dict(EVENT))
    assert DIGEST == digest_of(checked_event(dict(EVENT))[1])
    assert DIGEST == hashlib.sha256(checked_event(dict(EVENT))[1].encode("utf-8")).hexdigest()


def test_payload_digest_of_an_event_without_key() -> None:
    keyless: Event = {"id": "evt-1", "type": "t", "data": {}}
    expected = hashlib.sha256(b'{"data":{},"id":"evt-1","type":"t"}').hexdigest()
    assert payload_digest(keyless) == expected
    assert payload_digest(validate_event({**keyless, "key": None})) == expected


def test_payload_digest_is_independent_of_key_order() -> None:
    reordered: dict[str, Any] = {
        "data": {"note": EVENT["data"]["note"], "amount": {"currency": "EUR", "value": 1250}},
        "key": "customer-7",
        "type": "payment.captured",
        "id": "evt-1",
    }
    assert payload_digest(validate_event(reordered)) == DIGEST


@pytest.mark.parametrize(
    "change",
    [
        {"id": "evt-2"},
        {"type": "payment.refunded"},
        {"key": "customer-8"},
        {"key": None},
        {"data": {}},
        {"data": {"amount": {"value": 1250.5, "currency": "EUR"}, "note": "x"}},
    ],
)
def test_payload_digest_changes_with_any_field(change: dict[str, Any]) -> None:
    assert payload_digest(validate_event({**EVENT, **change})) != DIGEST


@given(
    order_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True),
    sku=st.from_regex(r"[A-Za-z0-9._:-]{1,64}", fullmatch=True),
    qty=st.integers(min_value=1, max_value=1_000_000),
)
def test_an_orders_digest_is_over_its_order_placed_event(order_id: str, sku: str, qty: int) -> None:
    order = validate_order({"id": order_id, "sku": sku, "qty": qty})
    digest = payload_digest(order_event(order))
    assert digest == digest_of(order_canonical(order))
    assert digest == rfc8785_digest(dict(order_event(order)))
    # The previous release digested the order itself: a different text, a different digest.
    assert digest_of(previous_canonical(order)) != digest


# ---------------------------------------------------------------- accepted


@pytest.mark.parametrize("receipt", list(Receipt))
def test_good_ack_is_returned(receipt: Receipt) -> None:
    ack = make_ack("evt-1", receipt)
    assert verify_ack(body(ack), "evt-1") == ack


def test_good_ack_with_matching_digest_is_returned() -> None:
    ack = make_ack("evt-1", Receipt.APPLIED, DIGEST)
    assert verify_ack(body(ack), "evt-1", DIGEST) == ack


# ---------------------------------------------------------------- refused


def test_ack_for_another_id_is_refused() -> None:
    refused(body(make_ack("evt-2", Receipt.APPLIED)))


def test_ack_for_a_prefix_of_the_id_is_refused() -> None:
    refused(body(make_ack("evt", Receipt.APPLIED)))


def test_ack_id_differing_only_in_case_is_refused() -> None:
    refused(body(make_ack("EVT-1", Receipt.APPLIED)))


def test_missing_ack_field_is_refused() -> None:
    refused(body({"status": "applied"}))


def test_null_ack_is_refused() -> None:
    refused(body({"ack": None, "status": "applied"}))


def test_ack_id_of_another_type_is_refused() -> None:
    refused(body({"ack": 1, "status": "applied"}), event_id="1")


def test_ack_id_as_a_list_is_refused() -> None:
    refused(body({"ack": ["evt-1"], "status": "applied"}))


@pytest.mark.parametrize(
    "reply",
    [
        {"ack": "\u202e" * 600 + "B" * 300, "status": "applied"},
        {"ack": "evt-1", "status": "x" * 5000},
        {"ack": "evt-1", "status": "applied", "sha256": "f" * 5000},
    ],
    ids=["ack", "status", "sha256"],
)
def test_what_a_refusal_quotes_of_the_reply_is_bounded(reply: dict[str, str]) -> None:
    """The error is stored with the entry and shown to people: a sink's long value
    is cut, not copied whole."""
    error = str(refused(body(reply), digest="0" * 64))
    assert len(error) < 300, error
    assert "..." in error


@pytest.mark.parametrize(
    "reply", [b"", b"ok", b"{", b"\xff\xfe\x00", b"<html>200 OK</html>", b"{'ack': 'evt-1'}"]
)
def test_reply_that_is_not_json_is_refused(reply: bytes) -> None:
    refused(reply)


@pytest.mark.parametrize(
    "reply",
    [
        [{"ack": "evt-1", "status": "applied"}],
        "evt-1",
        None,
        True,
        1,
    ],
)
def test_json_that_is_not_an_object_is_refused(reply: object) -> None:
    refused(body(reply))


@pytest.mark.parametrize("status", ["ok", "APPLIED", "", "rejected", None, 1, True])
def test_bad_status_value_is_refused(status: object) -> None:
    refused(body({"ack": "evt-1", "status": status}))


@pytest.mark.parametrize("status", [[], ["applied"], {}, {"applied": 1}])
def test_status_of_a_container_type_is_refused_as_invalid_ack(status: object) -> None:
    refused(body({"ack": "evt-1", "status": status}))


def test_missing_status_is_refused() -> None:
    refused(body({"ack": "evt-1"}))


def test_ack_whose_digest_differs_from_the_payload_sent_is_refused() -> None:
    other = payload_digest({**EVENT, "data": {**EVENT["data"], "note": "other"}})
    error = refused(body(make_ack("evt-1", Receipt.APPLIED, other)), digest=DIGEST)
    assert "does not match the payload sent" in str(error)


def test_ack_without_digest_is_accepted_when_a_digest_is_expected() -> None:
    ack = make_ack("evt-1", Receipt.DUPLICATE)
    assert verify_ack(body(ack), "evt-1", DIGEST) == ack


def test_ack_with_digest_is_accepted_when_none_is_expected() -> None:
    ack = make_ack("evt-1", Receipt.APPLIED, DIGEST)
    assert verify_ack(body(ack), "evt-1") == ack


def test_deeply_nested_reply_is_refused_as_invalid_ack() -> None:
    refused(b"[" * 2000 + b"]" * 2000)


# ---------------------------------------------------------------- ack_json


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    event_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True),
    receipt=st.sampled_from(Receipt),
)
def test_ack_json_of_a_usual_ack_is_what_json_dumps_writes(event_id: str, receipt: Receipt) -> None:
    ack = make_ack(event_id, receipt, DIGEST)
    assert ack_json(ack) == json.dumps(ack)
    assert json.loads(ack_json(ack)) == ack


@given(
    ack=st.fixed_dictionaries({"ack": JSON_VALUES, "status": JSON_VALUES, "sha256": JSON_VALUES})
    | st.dictionaries(st.sampled_from(["ack", "status", "sha256", "extra"]), JSON_VALUES)
    | st.dictionaries(st.text(), JSON_VALUES, max_size=4)
)
def test_ack_json_of_any_object_is_what_json_dumps_writes(ack: dict[str, object]) -> None:
    assert ack_json(ack) == json.dumps(ack)


@pytest.mark.parametrize(
    "ack",
    [
        {"ack": 'say "hi"', "status": "applied", "sha256": DIGEST},
        {"ack": "back\\slash", "status": "applied", "sha256": DIGEST},
        {"ack": "caf\u00e9", "status": "applied", "sha256": DIGEST},
        {"ack": "tab\there", "status": "applied", "sha256": DIGEST},
        {"status": "applied", "ack": "evt-1", "sha256": DIGEST},  # another order
        {"ack": "evt-1", "status": "applied", "sha256": 7},
        {"ack": "evt-1", "status": "applied"},
    ],
)
def test_ack_json_escapes_and_orders_like_json_dumps(ack: dict[str, object]) -> None:
    assert ack_json(ack) == json.dumps(ack)
