"""The ACK: make_ack and verify_ack. Pure functions, no I/O."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import InvalidAck, Receipt, make_ack, payload_digest, verify_ack
from shared.ack import ack_json
from shared.event import Event

EVENT: Event = {"id": "order-1", "sku": "snack", "qty": 7}
DIGEST = payload_digest(EVENT)


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def refused(reply: bytes, event_id: str = "order-1", digest: str | None = None) -> InvalidAck:
    with pytest.raises(InvalidAck) as excinfo:
        verify_ack(reply, event_id, digest)
    return excinfo.value


# ---------------------------------------------------------------- make_ack


def test_make_ack_names_the_id_and_the_receipt() -> None:
    assert make_ack("order-1", Receipt.APPLIED) == {"ack": "order-1", "status": "applied"}
    assert make_ack("order-1", Receipt.DUPLICATE) == {"ack": "order-1", "status": "duplicate"}


def test_make_ack_carries_the_digest_when_given() -> None:
    assert make_ack("order-1", Receipt.APPLIED, DIGEST) == {
        "ack": "order-1",
        "status": "applied",
        "sha256": DIGEST,
    }


def test_payload_digest_is_sha256_hex() -> None:
    assert len(DIGEST) == 64
    assert set(DIGEST) <= set("0123456789abcdef")


# ---------------------------------------------------------------- accepted


@pytest.mark.parametrize("receipt", list(Receipt))
def test_good_ack_is_returned(receipt: Receipt) -> None:
    ack = make_ack("order-1", receipt)
    assert verify_ack(body(ack), "order-1") == ack


def test_good_ack_with_matching_digest_is_returned() -> None:
    ack = make_ack("order-1", Receipt.APPLIED, DIGEST)
    assert verify_ack(body(ack), "order-1", DIGEST) == ack


# ---------------------------------------------------------------- refused


def test_ack_for_another_id_is_refused() -> None:
    refused(body(make_ack("order-2", Receipt.APPLIED)))


def test_ack_for_a_prefix_of_the_id_is_refused() -> None:
    refused(body(make_ack("order", Receipt.APPLIED)))


def test_ack_id_differing_only_in_case_is_refused() -> None:
    refused(body(make_ack("ORDER-1", Receipt.APPLIED)))


def test_missing_ack_field_is_refused() -> None:
    refused(body({"status": "applied"}))


def test_null_ack_is_refused() -> None:
    refused(body({"ack": None, "status": "applied"}))


def test_ack_id_of_another_type_is_refused() -> None:
    refused(body({"ack": 1, "status": "applied"}), event_id="1")


def test_ack_id_as_a_list_is_refused() -> None:
    refused(body({"ack": ["order-1"], "status": "applied"}))


@pytest.mark.parametrize(
    "reply", [b"", b"ok", b"{", b"\xff\xfe\x00", b"<html>200 OK</html>", b"{'ack': 'order-1'}"]
)
def test_reply_that_is_not_json_is_refused(reply: bytes) -> None:
    refused(reply)


@pytest.mark.parametrize(
    "reply",
    [
        [{"ack": "order-1", "status": "applied"}],
        "order-1",
        None,
        True,
        1,
    ],
)
def test_json_that_is_not_an_object_is_refused(reply: object) -> None:
    refused(body(reply))


@pytest.mark.parametrize("status", ["ok", "APPLIED", "", "rejected", None, 1, True])
def test_bad_status_value_is_refused(status: object) -> None:
    refused(body({"ack": "order-1", "status": status}))


@pytest.mark.parametrize("status", [[], ["applied"], {}, {"applied": 1}])
def test_status_of_a_container_type_is_refused_as_invalid_ack(status: object) -> None:
    refused(body({"ack": "order-1", "status": status}))


def test_missing_status_is_refused() -> None:
    refused(body({"ack": "order-1"}))


def test_ack_whose_digest_differs_from_the_payload_sent_is_refused() -> None:
    other = payload_digest({"id": "order-1", "sku": "snack", "qty": 8})
    refused(body(make_ack("order-1", Receipt.APPLIED, other)), digest=DIGEST)


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
        {"status": "applied", "ack": "order-1", "sha256": DIGEST},  # another order
        {"ack": "order-1", "status": "applied", "sha256": 7},
        {"ack": "order-1", "status": "applied"},
    ],
)
def test_ack_json_escapes_and_orders_like_json_dumps(ack: dict[str, object]) -> None:
    assert ack_json(ack) == json.dumps(ack)
