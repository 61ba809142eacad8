"""How a sink's reply is judged: check_reply. Pure, no network traffic."""

from __future__ import annotations

import json

import pytest
from support import placed

from publisher.errors import DeliveryError, NotAcknowledged, Rejected
from publisher.http import check_reply
from shared import Receipt, make_ack, payload_digest
from shared.event import Event

EVENT: Event = placed("order-1", "snack", 7)
DIGEST = payload_digest(EVENT)
GOOD = json.dumps(make_ack("order-1", Receipt.APPLIED, DIGEST)).encode()
REDIRECTS = [300, 301, 302, 303, 307, 308]


def failure(status: int, reply: bytes = GOOD, digest: str | None = DIGEST) -> NotAcknowledged:
    with pytest.raises(NotAcknowledged) as excinfo:
        check_reply(status, reply, "order-1", digest)
    return excinfo.value


def test_error_hierarchy() -> None:
    assert issubclass(NotAcknowledged, DeliveryError)
    assert issubclass(Rejected, NotAcknowledged)


# ---------------------------------------------------------------- verified


def test_200_with_matching_ack_returns_the_ack() -> None:
    assert check_reply(200, GOOD, "order-1", DIGEST) == {
        "ack": "order-1",
        "status": "applied",
        "sha256": DIGEST,
    }


def test_200_with_duplicate_ack_is_verified() -> None:
    reply = json.dumps(make_ack("order-1", Receipt.DUPLICATE)).encode()
    assert check_reply(200, reply, "order-1")["status"] == "duplicate"


# ---------------------------------------------------------------- 200 but not an ACK


def test_200_with_ack_for_another_id_is_not_acknowledged() -> None:
    reply = json.dumps(make_ack("order-2", Receipt.APPLIED)).encode()
    error = failure(200, reply)
    assert not isinstance(error, Rejected)
    assert error.status == 200
    assert error.retryable is True


def test_200_with_a_different_digest_is_not_acknowledged() -> None:
    other = payload_digest(placed("order-1", "snack", 8))
    reply = json.dumps(make_ack("order-1", Receipt.APPLIED, other)).encode()
    assert not isinstance(failure(200, reply), Rejected)


@pytest.mark.parametrize("reply", [b"", b"OK", b"[]", b'{"status": "applied"}', b"\xff"])
def test_200_without_a_valid_ack_is_not_acknowledged(reply: bytes) -> None:
    assert failure(200, reply).status == 200


@pytest.mark.parametrize("status_value", [[], {}, ["applied"]])
def test_200_with_a_container_status_is_not_acknowledged(status_value: object) -> None:
    reply = json.dumps({"ack": "order-1", "status": status_value}).encode()
    assert failure(200, reply).status == 200


# ---------------------------------------------------------------- redirects


@pytest.mark.parametrize("status", REDIRECTS)
def test_redirect_is_not_acknowledged_and_not_rejected(status: int) -> None:
    error = failure(status)
    assert type(error) is NotAcknowledged
    assert error.status == status
    assert error.retryable is True


@pytest.mark.parametrize("status", REDIRECTS)
def test_redirect_is_a_failure_even_with_an_ack_shaped_body(status: int) -> None:
    failure(status, GOOD)


# ---------------------------------------------------------------- refused by the sink


@pytest.mark.parametrize("status", [400, 409, 413, 422])
def test_permanent_refusal_is_rejected_and_not_retryable(status: int) -> None:
    with pytest.raises(Rejected) as excinfo:
        check_reply(status, b'{"error": "no"}', "order-1", DIGEST)
    assert excinfo.value.retryable is False
    assert excinfo.value.status == status


def test_422_for_an_event_no_handler_takes_is_rejected_and_quotes_the_reason() -> None:
    reply = b'{"error": "no handler", "detail": "order-1 (parcel.lost): no handler for it"}'
    with pytest.raises(Rejected) as excinfo:
        check_reply(422, reply, "order-1", DIGEST)
    assert excinfo.value.retryable is False
    assert "no handler" in str(excinfo.value)


def test_503_from_a_failing_handler_stays_retryable() -> None:
    error = failure(503, b'{"error": "handler failed, try again"}')
    assert not isinstance(error, Rejected)
    assert error.retryable is True


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_error_is_not_acknowledged_and_retryable(status: int) -> None:
    error = failure(status, b'{"error": "storage unavailable, try again"}')
    assert not isinstance(error, Rejected)
    assert error.retryable is True
    assert error.status == status


@pytest.mark.parametrize("status", [201, 202, 204, 404, 405, 429])
def test_other_statuses_are_not_acknowledged_even_with_a_good_ack(status: int) -> None:
    error = failure(status, GOOD)
    assert not isinstance(error, Rejected)
    assert error.retryable is True


def test_error_message_names_the_event_and_quotes_the_reply() -> None:
    error = failure(503, b'{"error": "storage unavailable"}')
    assert "order-1" in str(error)
    assert "storage unavailable" in str(error)


def test_error_excerpt_is_bounded_and_survives_bad_utf8() -> None:
    error = failure(500, b"\xff" + b"x" * 10_000)
    assert len(str(error)) < 1_000
