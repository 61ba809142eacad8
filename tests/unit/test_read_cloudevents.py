"""read_cloudevents and ack_body, without a socket or a database: a CloudEvents
request read as the sink reads it (sink.wire), each refusal carrying the sink's own
answer, and the ACK of an event given what receive_in said of it. The forms of an
event are those of tests/unit/test_sink_wire.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_sink_wire import NO_HEADERS, PAYMENT, PLACED, binary, refusal, structured

from plumbing.http_errors import BadRequest
from shared import Event, InvalidEvent, canonical_json, digest_of
from shared.cloudevents import BATCHED, JSON, STRUCTURED
from sink import InvalidRequest, ack_body, read_cloudevents
from sink.wire import media_of, read_event, read_item

UNICODE: Event = {"id": "u-1", "type": "note.added", "data": {"text": "Zoë ✓", "n": 1.5}}


def body(value: object) -> bytes:
    return json.dumps(value).encode()


def refused(content_type: str | None, headers: Any, raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        read_cloudevents(content_type, headers, raw)
    return caught.value


# ---------------------------------------------------------------- each mode


@pytest.mark.parametrize("one", [PLACED, PAYMENT, UNICODE], ids=["order-placed", "payment", "uni"])
def test_a_structured_event_is_the_event_the_sink_reads(one: Event) -> None:
    envelope = structured(one)
    events = read_cloudevents(STRUCTURED, NO_HEADERS, body(envelope))
    assert events == [read_event(STRUCTURED, NO_HEADERS, envelope).incoming.event] == [one]


@pytest.mark.parametrize("one", [PLACED, PAYMENT, UNICODE], ids=["order-placed", "payment", "uni"])
def test_a_binary_event_is_the_event_the_sink_reads_whatever_the_headers_case(one: Event) -> None:
    headers = binary(one)
    expected = read_event(JSON, headers, one["data"]).incoming.event
    assert read_cloudevents(JSON, headers, body(one["data"])) == [expected] == [one]
    # A plain dict, as another framework may hand its headers over.
    shouting = {name.upper(): value for name, value in headers.items()}
    assert read_cloudevents("Application/JSON; charset=utf-8", shouting, body(one["data"])) == [one]


def test_a_batch_is_its_events_in_order_as_the_sink_reads_them() -> None:
    items = [structured(PAYMENT), structured(PLACED), structured(UNICODE)]
    events = read_cloudevents(BATCHED, NO_HEADERS, body(items))
    assert events == [read_item(BATCHED, item, n).incoming.event for n, item in enumerate(items)]
    assert events == [PAYMENT, PLACED, UNICODE]


def test_structured_mode_wins_over_ce_headers_as_at_the_sink() -> None:
    assert read_cloudevents(STRUCTURED, binary(PLACED), body(structured(PAYMENT))) == [PAYMENT]


def test_delivery_attributes_and_extensions_make_no_difference() -> None:
    again = structured(PAYMENT, source="urn:other", time="2027-01-01T00:00:00Z", traceparent="x")
    assert read_cloudevents(STRUCTURED, NO_HEADERS, body(again)) == [PAYMENT]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/xml"])
def test_a_media_type_not_read_is_415_with_the_sinks_answer(content_type: str | None) -> None:
    error = refused(content_type, NO_HEADERS, body(structured(PAYMENT)))

    with pytest.raises(BadRequest) as sink:
        media_of(content_type, (STRUCTURED, BATCHED, JSON))
    assert (error.status, error.body) == (415, sink.value.body)
    assert error.field == "Content-Type"
    assert repr(content_type) in error.problem


def test_application_json_without_ce_headers_is_no_cloudevent() -> None:
    """The sink reads such a body as a plain event; a CloudEvents reader does not."""
    error = refused(JSON, NO_HEADERS, body(PAYMENT))
    assert (error.status, error.field) == (400, "ce-specversion")
    assert error.body["error"] == "invalid event" and error.body["field"] == "ce-specversion"
    assert "binary mode" in error.problem


@pytest.mark.parametrize(
    ("envelope", "pointer"),
    [
        ({**structured(PAYMENT), "partitionkey": "a b"}, "/partitionkey"),
        ({**structured(PAYMENT), "specversion": "0.3"}, "/specversion"),
        ({**structured(PAYMENT), "data_base64": "AA=="}, "/data_base64"),
        ({k: v for k, v in structured(PAYMENT).items() if k != "source"}, "/source"),
        ({**structured(PAYMENT), "data": {"a": [1, {"b": 2**53}]}}, "/data/a/1/b"),
        ("not an object", ""),
    ],
    ids=["key", "specversion", "base64", "no-source", "big-int", "string"],
)
def test_a_structured_event_refused_is_the_sinks_400_naming_its_place(
    envelope: object, pointer: str
) -> None:
    error = refused(STRUCTURED, NO_HEADERS, body(envelope))

    assert isinstance(error, InvalidEvent)  # one except clause takes every refusal
    assert (error.status, error.field) == (400, pointer)
    assert error.body == refusal(read_event, STRUCTURED, NO_HEADERS, envelope)
    assert error.problem == error.body["detail"]


@pytest.mark.parametrize(
    ("header", "value"),
    [("ce-id", "-x"), ("ce-type", "a b"), ("ce-specversion", "0.3"), ("ce-source", None)],
)
def test_a_binary_event_refused_for_a_header_names_the_header(
    header: str, value: str | None
) -> None:
    headers = binary(PAYMENT)
    if value is None:
        del headers[header]
    else:
        headers[header] = value

    error = refused(JSON, headers, body(PAYMENT["data"]))

    assert (error.status, error.field) == (400, header)
    assert error.body == refusal(read_event, JSON, headers, PAYMENT["data"])


def test_a_header_given_twice_in_two_letter_cases_is_refused() -> None:
    headers = {**binary(PAYMENT), "CE-ID": "p-2"}

    error = refused(JSON, headers, body(PAYMENT["data"]))

    assert (error.status, error.field, error.problem) == (400, "ce-id", "is given twice")


def test_a_batch_with_an_invalid_item_is_refused_whole_pointing_under_its_index() -> None:
    bad = structured({**PAYMENT, "id": "p-2", "data": {"x": [0, 2**60]}})
    error = refused(BATCHED, NO_HEADERS, body([structured(PAYMENT), bad]))

    assert (error.status, error.field) == (400, "/1/data/x/1")
    assert error.body == refusal(read_item, BATCHED, bad, 1)


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'{"events": []}', body([structured(PAYMENT)] * 17)],
    ids=["empty", "object", "17"],
)
def test_a_body_that_is_no_batch_is_400(raw: bytes) -> None:
    error = refused(BATCHED, NO_HEADERS, raw)
    assert (error.status, error.field) == (400, "")
    assert error.body["error"].startswith("a CloudEvents batch is a JSON array")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{", "body is not valid JSON"),
        (b'{"specversion": "1.0", "id": "a", "id": "b"}', "duplicate key 'id'"),
        (b"\xff\xfe{", "body is not valid JSON"),
    ],
    ids=["truncated", "repeated-key", "not-utf"],
)
def test_a_body_that_is_not_strict_json_is_400(raw: bytes, problem: str) -> None:
    error = refused(STRUCTURED, NO_HEADERS, raw)
    assert (error.status, error.field) == (400, "")
    assert problem in error.problem and problem in error.body["error"]


# ---------------------------------------------------------------- ack_body


@pytest.mark.parametrize("one", [PLACED, PAYMENT, UNICODE], ids=["order-placed", "payment", "uni"])
def test_ack_body_names_the_event_its_status_and_the_digest_of_its_canonical_form(
    one: Event,
) -> None:
    digest = digest_of(canonical_json(one))
    assert ack_body(one, "new") == {"ack": one["id"], "status": "applied", "sha256": digest}
    assert ack_body(one, "duplicate") == {
        "ack": one["id"],
        "status": "duplicate",
        "sha256": digest,
    }
    assert list(ack_body(one, "new")) == ["ack", "status", "sha256"]  # the sink's order


def test_ack_body_takes_only_what_receive_in_returns_and_valid_events() -> None:
    with pytest.raises(ValueError, match="'new' or 'duplicate'"):
        ack_body(PAYMENT, "applied")  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent):
        ack_body({"id": "x", "type": "t"}, "new")
