"""How a batch reply is judged, position by position: check_batch_reply. Pure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support import ack, placed

from publisher.errors import DeliveryError, NotAcknowledged, Rejected
from publisher.http import check_batch_reply, check_reply
from shared import Receipt, make_ack, payload_digest
from shared.event import Event

EVENTS: list[Event] = [placed(f"order-{n}", "snack", n) for n in range(1, 6)]


def body(acks: list[Any], rejected: object = None) -> bytes:
    return json.dumps({"acks": acks, "rejected": rejected}).encode()


def verified_prefix(results: list[Any], k: int) -> None:
    """results[:k] are the ACK dicts of EVENTS[:k]."""
    assert results[:k] == [ack(event) for event in EVENTS[:k]]
    assert all(isinstance(r, dict) for r in results[:k])


# ---------------------------------------------------------------- all verified


def test_every_ack_verified_returns_every_ack_in_order() -> None:
    results = check_batch_reply(200, body([ack(e) for e in EVENTS]), EVENTS)
    assert results == [ack(e) for e in EVENTS]


def test_duplicate_acks_and_acks_without_digest_are_verified() -> None:
    acks = [ack(EVENTS[0], Receipt.DUPLICATE), make_ack(EVENTS[1]["id"], Receipt.APPLIED)]
    results = check_batch_reply(200, body(acks), EVENTS[:2])
    assert results == acks


def test_a_single_event_batch() -> None:
    assert check_batch_reply(200, body([ack(EVENTS[0])]), EVENTS[:1]) == [ack(EVENTS[0])]


# ---------------------------------------------------------------- the prefix ends at a bad ACK


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_wrong_id_at_position_k_ends_the_prefix_there(k: int) -> None:
    acks = [ack(e) for e in EVENTS]
    acks[k] = make_ack("someone-else", Receipt.APPLIED)
    results = check_batch_reply(200, body(acks), EVENTS)

    assert len(results) == k + 1, "nothing may follow the first failure"
    verified_prefix(results, k)
    failure = results[k]
    assert type(failure) is NotAcknowledged
    assert failure.retryable is True
    assert EVENTS[k]["id"] in str(failure)


@pytest.mark.parametrize("k", [0, 2])
def test_acks_in_swapped_order_fail_at_the_first_swap(k: int) -> None:
    acks = [ack(e) for e in EVENTS]
    acks[k], acks[k + 1] = acks[k + 1], acks[k]
    results = check_batch_reply(200, body(acks), EVENTS)
    assert len(results) == k + 1
    verified_prefix(results, k)
    assert type(results[k]) is NotAcknowledged


@pytest.mark.parametrize("k", [0, 3])
def test_digest_mismatch_at_position_k_ends_the_prefix_there(k: int) -> None:
    acks = [ack(e) for e in EVENTS]
    stored_other = placed(EVENTS[k]["id"], "snack", EVENTS[k]["data"]["qty"] + 1)
    acks[k] = make_ack(EVENTS[k]["id"], Receipt.APPLIED, payload_digest(stored_other))
    results = check_batch_reply(200, body(acks), EVENTS)

    assert len(results) == k + 1
    verified_prefix(results, k)
    assert type(results[k]) is NotAcknowledged
    assert "digest" in str(results[k])


@pytest.mark.parametrize("bad", [None, "order-3", ["order-3"], {"status": "applied"}])
def test_an_ack_that_is_not_an_ack_object_ends_the_prefix(bad: object) -> None:
    acks: list[Any] = [ack(e) for e in EVENTS]
    acks[2] = bad
    results = check_batch_reply(200, body(acks), EVENTS)
    assert len(results) == 3
    verified_prefix(results, 2)
    assert type(results[2]) is NotAcknowledged


def test_an_ack_with_an_unknown_status_ends_the_prefix() -> None:
    acks: list[Any] = [ack(e) for e in EVENTS]
    acks[1] = {**acks[1], "status": "queued"}
    results = check_batch_reply(200, body(acks), EVENTS)
    assert len(results) == 2
    assert type(results[1]) is NotAcknowledged


# ---------------------------------------------------------------- the sink rejected item k


@pytest.mark.parametrize("status", [409, 400, 413, 422])
@pytest.mark.parametrize("k", [0, 2, 4])
def test_rejected_at_index_k_is_rejected_and_not_retryable(status: int, k: int) -> None:
    rejected = {"index": k, "status": status, "error": "conflict", "id": EVENTS[k]["id"]}
    results = check_batch_reply(200, body([ack(e) for e in EVENTS[:k]], rejected), EVENTS)

    assert len(results) == k + 1
    verified_prefix(results, k)
    failure = results[k]
    assert isinstance(failure, Rejected)
    assert failure.retryable is False
    assert failure.status == status
    assert EVENTS[k]["id"] in str(failure)


def test_an_item_a_handler_refused_is_rejected_but_one_it_failed_on_is_retried() -> None:
    acks = [ack(e) for e in EVENTS[:2]]
    refused = {"index": 2, "status": 422, "error": "refused", "id": EVENTS[2]["id"]}
    failed = {"index": 2, "status": 503, "error": "handler failed", "id": EVENTS[2]["id"]}

    permanent = check_batch_reply(200, body(acks, refused), EVENTS)[2]
    transient = check_batch_reply(200, body(acks, failed), EVENTS)[2]

    assert isinstance(permanent, Rejected)
    assert (permanent.status, permanent.retryable) == (422, False)
    assert type(transient) is NotAcknowledged
    assert transient.retryable is True
    # What the sink said is kept for the entry's last error, as for a single event.
    assert (transient.status, "503" in str(transient)) == (503, True)
    assert "handler failed" in str(transient)


@pytest.mark.parametrize(
    "rejected",
    [
        None,
        {"index": 3, "status": 409, "error": "conflict"},  # names another item
        {"index": 1, "status": 409, "error": "conflict"},  # names an acknowledged item
        {"index": "2", "status": 409, "error": "conflict"},
        {"index": 2, "status": 503, "error": "busy"},  # not a refusal of the event
        {"index": 2, "status": "409", "error": "conflict"},
        {"index": 2, "error": "conflict"},
        {"status": 409, "error": "conflict"},
        "conflict",
        [2, 409],
    ],
)
def test_missing_ack_without_a_matching_rejection_is_not_acknowledged(rejected: object) -> None:
    results = check_batch_reply(200, body([ack(e) for e in EVENTS[:2]], rejected), EVENTS)
    assert len(results) == 3
    verified_prefix(results, 2)
    assert type(results[2]) is NotAcknowledged
    assert results[2].retryable is True


@pytest.mark.parametrize("index", [True, 2.0], ids=["bool", "float"])
def test_a_rejection_index_that_is_not_an_integer_does_not_match(index: object) -> None:
    # The sink writes an integer; `true` or `2.0` is not the position of an item.
    position = 1 if index is True else 2
    rejected = {"index": index, "status": 409, "error": "conflict"}
    acks = [ack(e) for e in EVENTS[:position]]
    results = check_batch_reply(200, body(acks, rejected), EVENTS)
    assert len(results) == position + 1
    assert type(results[position]) is NotAcknowledged


def test_a_rejection_alongside_a_full_set_of_acks_is_ignored() -> None:
    rejected = {"index": 5, "status": 409, "error": "conflict"}
    results = check_batch_reply(200, body([ack(e) for e in EVENTS], rejected), EVENTS)
    assert results == [ack(e) for e in EVENTS]


def test_an_empty_acks_list_fails_at_the_first_event() -> None:
    results = check_batch_reply(200, body([]), EVENTS)
    assert len(results) == 1
    assert type(results[0]) is NotAcknowledged
    assert EVENTS[0]["id"] in str(results[0])


# ---------------------------------------------------------------- the whole reply is bad


def test_more_acks_than_events_raises() -> None:
    acks = [ack(e) for e in EVENTS] + [ack(EVENTS[0])]
    with pytest.raises(NotAcknowledged):
        check_batch_reply(200, body(acks), EVENTS)


def test_more_acks_than_events_raises_even_when_the_extra_is_not_an_ack() -> None:
    with pytest.raises(NotAcknowledged):
        check_batch_reply(200, body([ack(EVENTS[0]), "extra"]), EVENTS[:1])


@pytest.mark.parametrize(
    "reply",
    [
        b"",
        b"OK",
        b"\xff\xfe",
        b"[" * 100_000,
        b"[]",
        b'"acks"',
        b"null",
        b"42",
        b"{}",
        b'{"acks": null, "rejected": null}',
        b'{"acks": {"0": {}}, "rejected": null}',
        b'{"acks": "order-1", "rejected": null}',
        b'{"rejected": {"index": 0, "status": 409}}',
    ],
)
def test_a_reply_that_is_not_an_object_with_an_acks_list_raises(reply: bytes) -> None:
    with pytest.raises(NotAcknowledged) as excinfo:
        check_batch_reply(200, reply, EVENTS)
    assert not isinstance(excinfo.value, Rejected)
    assert excinfo.value.retryable is True


def test_a_single_event_ack_body_is_not_a_batch_reply() -> None:
    reply = json.dumps(ack(EVENTS[0])).encode()
    with pytest.raises(NotAcknowledged):
        check_batch_reply(200, reply, EVENTS[:1])


# ---------------------------------------------------------------- statuses other than 200

GOOD_BATCH = body([ack(e) for e in EVENTS])


def raised(call: Any) -> DeliveryError:
    with pytest.raises(DeliveryError) as excinfo:
        call()
    return excinfo.value


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_raises_like_check_reply(status: int) -> None:
    error = raised(lambda: check_batch_reply(status, GOOD_BATCH, EVENTS))
    single = raised(lambda: check_reply(status, GOOD_BATCH, EVENTS[0]["id"]))
    assert type(error) is type(single) is NotAcknowledged
    assert error.status == status
    assert error.retryable is True


@pytest.mark.parametrize("status", [500, 502, 503, 504, 201, 404, 429])
def test_other_failures_raise_not_acknowledged_like_check_reply(status: int) -> None:
    reply = b'{"error": "storage unavailable, try again"}'
    error = raised(lambda: check_batch_reply(status, reply, EVENTS))
    single = raised(lambda: check_reply(status, reply, EVENTS[0]["id"]))
    assert type(error) is type(single) is NotAcknowledged
    assert (error.status, error.retryable) == (status, True)
    assert str(error) == str(single)


@pytest.mark.parametrize("status", [201, 202, 500])
def test_a_good_batch_body_with_another_status_is_still_a_failure(status: int) -> None:
    with pytest.raises(NotAcknowledged):
        check_batch_reply(status, GOOD_BATCH, EVENTS)


@pytest.mark.parametrize("status", [400, 413])
def test_a_refused_envelope_raises_rejected_for_the_batch(status: int) -> None:
    reply = b'{"error": "events must be a list of 1 to 16 events"}'
    error = raised(lambda: check_batch_reply(status, reply, EVENTS))
    assert isinstance(error, Rejected)
    assert (error.status, error.retryable) == (status, False)
    assert EVENTS[0]["id"] in str(error)
