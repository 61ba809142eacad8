"""What the sink reads from a request, without a socket: each form an event comes in
(sink.wire), the event and canonical form it becomes, the digest its ACK carries, and
where a refusal says the problem is."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from plumbing.bodies import loads_strict
from plumbing.http_errors import BadRequest
from shared import Event, Order, Receipt, canonical_json, digest_of, order_canonical, order_event
from shared.cloudevents import BATCHED, JSON, STRUCTURED
from shared.event import MAX_DATA_BYTES_LIMIT, previous_canonical
from sink.store import Incoming, Received
from sink.wire import (
    BATCH_MEDIA,
    EVENT_MEDIA,
    Taken,
    batch_items,
    event_ids,
    media_of,
    read_event,
    read_item,
)

ORDER: Order = {"id": "o-1", "sku": "snack", "qty": 7}
PLACED: Event = order_event(ORDER)
PAYMENT: Event = {
    "id": "p-123",
    "type": "payment.captured",
    "key": "c-9",
    "data": {"amount": 12.5, "customer": {"id": "c-9", "name": "Zoë"}},
}
NO_HEADERS: CIMultiDict[str] = CIMultiDict()


def structured(one: Event, **extra: Any) -> dict[str, Any]:
    """`one` as a structured-mode CloudEvent."""
    envelope = {"specversion": "1.0", "id": one["id"], "source": "urn:test", "type": one["type"]}
    if "key" in one:
        envelope["partitionkey"] = one["key"]
    return {**envelope, "time": "2026-01-01T00:00:00.000Z", "data": one["data"], **extra}


def binary(one: Event) -> CIMultiDict[str]:
    """The headers of `one` in binary mode (its data is the body)."""
    headers = CIMultiDict(
        {"ce-specversion": "1.0", "ce-id": one["id"], "ce-source": "urn:t", "ce-type": one["type"]}
    )
    if "key" in one:
        headers["ce-partitionkey"] = one["key"]
    return headers


def refusal(call: Any, *args: Any) -> dict[str, Any]:
    """The body of the BadRequest 400 `call(*args)` raises."""
    with pytest.raises(BadRequest) as refused:
        call(*args)
    assert refused.value.status == 400
    return refused.value.body


# ---------------------------------------------------------------- the forms of one event


@pytest.mark.parametrize("one", [PLACED, PAYMENT], ids=["order-placed", "payment"])
@pytest.mark.parametrize("form", ["structured", "binary", "plain"])
def test_every_form_of_an_event_is_the_same_event_in_the_same_canonical_form(
    one: Event, form: str
) -> None:
    if form == "structured":
        taken = read_event(STRUCTURED, NO_HEADERS, structured(one))
    elif form == "binary":
        taken = read_event(JSON, binary(one), one["data"])
    else:
        taken = read_event(JSON, NO_HEADERS, dict(one))

    assert taken.incoming.event == one
    assert taken.incoming.canonical == canonical_json(one)
    assert taken.previous is None
    done = Received(Receipt.APPLIED, taken.incoming.canonical)
    assert taken.ack_digest(done) == digest_of(canonical_json(one))
    assert taken.incoming.order == (ORDER if one is PLACED else None)


def test_an_order_of_the_previous_release_is_its_order_placed_event_acked_in_its_terms() -> None:
    taken = read_event(JSON, NO_HEADERS, {"qty": 7, "id": "o-1", "sku": "snack"})

    assert taken.incoming == Incoming(PLACED, order_canonical(ORDER), ORDER)
    assert taken.incoming.canonical == canonical_json(PLACED)  # the same event as a CloudEvent
    assert taken.previous == previous_canonical(ORDER) == '{"id":"o-1","qty":7,"sku":"snack"}'
    # Whatever the inbox holds for it (the same canonical form), the ACK is in the
    # previous release's terms: what its publisher checks.
    for receipt in Receipt:
        done = Received(receipt, order_canonical(ORDER))
        assert taken.ack_digest(done) == digest_of('{"id":"o-1","qty":7,"sku":"snack"}')


def test_a_structured_event_ignores_delivery_attributes_and_extensions() -> None:
    first = read_event(STRUCTURED, NO_HEADERS, structured(PAYMENT))
    again = read_event(
        STRUCTURED,
        NO_HEADERS,
        structured(PAYMENT, source="urn:other", time="2027-01-01T00:00:00Z", traceparent="00-x"),
    )
    assert again.incoming == first.incoming


def test_structured_mode_wins_over_ce_headers() -> None:
    taken = read_event(STRUCTURED, binary(PLACED), structured(PAYMENT))
    assert taken.incoming.event == PAYMENT


def test_data_up_to_the_largest_any_publisher_allows_is_taken() -> None:
    room = MAX_DATA_BYTES_LIMIT - len('{"s":""}')
    big: Event = {"id": "big", "type": "blob.stored", "data": {"s": "x" * room}}
    assert read_event(JSON, NO_HEADERS, big).incoming.event["id"] == "big"

    over: Event = {"id": "big", "type": "blob.stored", "data": {"s": "x" * (room + 1)}}
    body = refusal(read_event, JSON, NO_HEADERS, over)
    assert (body["field"], body["pointer"]) == ("/data", "/data")


# ---------------------------------------------------------------- refusals and pointers


@pytest.mark.parametrize(
    ("body", "field", "pointer"),
    [
        ({**PAYMENT, "data": {"a": [1, {"b": 2**53}]}}, "/data/a/1/b", "/data/a/1/b"),
        ({**PAYMENT, "data": {"a/b": {"c~d": "\ud800"}}}, "/data/a~1b/c~0d", "/data/a~1b/c~0d"),
        ({**PAYMENT, "type": "a b"}, "/type", "/type"),
        ({**PAYMENT, "sku": "s"}, "/sku", "/sku"),
        ({"id": "x", "data": {}}, "/type", "/type"),
        ([PAYMENT], "", ""),
        ({**ORDER, "qty": 7.0}, "qty", "/qty"),
        ({"id": "o-1", "qty": 7}, "sku", "/sku"),
        ({**ORDER, "note": "x"}, "note", "/note"),
    ],
    ids=[
        "big-int",
        "lone-surrogate",
        "bad-type",
        "extra-field",
        "no-type",
        "array",
        "order-float-qty",
        "order-no-sku",
        "order-extra",
    ],
)
def test_a_plain_body_refused_names_the_field_and_the_pointer(
    body: object, field: str, pointer: str
) -> None:
    reply = refusal(read_event, JSON, NO_HEADERS, body)

    assert reply["error"] == "invalid event"
    assert (reply["field"], reply["pointer"]) == (field, pointer)
    assert reply["detail"]


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        ({**structured(PAYMENT), "partitionkey": "a b"}, "/partitionkey"),
        ({**structured(PAYMENT), "specversion": "0.3"}, "/specversion"),
        # What the strict parser reads for a number no double holds.
        ({**structured(PAYMENT), "data": loads_strict(b'{"x": 1e400}')}, "/data/x"),
        ({**structured(PAYMENT), "data_base64": "AA=="}, "/data_base64"),
        ({**structured(PAYMENT), "datacontenttype": "text/plain"}, "/datacontenttype"),
        ({k: v for k, v in structured(PAYMENT).items() if k != "source"}, "/source"),
        ("not an object", ""),
    ],
    ids=["key", "specversion", "data", "base64", "content-type", "no-source", "string"],
)
def test_a_structured_event_refused_names_its_attribute(envelope: object, field: str) -> None:
    reply = refusal(read_event, STRUCTURED, NO_HEADERS, envelope)
    assert (reply["field"], reply["pointer"]) == (field, field)


@pytest.mark.parametrize(
    ("header", "value", "field"),
    [
        ("ce-id", "-x", "ce-id"),
        ("ce-type", "a b", "ce-type"),
        ("ce-partitionkey", "a b", "ce-partitionkey"),
        ("ce-specversion", "0.3", "ce-specversion"),
        ("ce-source", None, "ce-source"),
    ],
)
def test_a_binary_event_refused_for_a_header_names_the_header_and_no_pointer(
    header: str, value: str | None, field: str
) -> None:
    headers = binary(PAYMENT)
    if value is None:
        del headers[header]
    else:
        headers[header] = value

    reply = refusal(read_event, JSON, headers, PAYMENT["data"])

    assert reply["field"] == field and "pointer" not in reply


def test_a_binary_event_refused_for_its_data_points_into_the_body() -> None:
    reply = refusal(read_event, JSON, binary(PAYMENT), loads_strict(b'{"a": [{"b": NaN}]}'))
    assert (reply["field"], reply["pointer"]) == ("/data/a/0/b", "/a/0/b")
    reply = refusal(read_event, JSON, binary(PAYMENT), [1, 2])
    assert (reply["field"], reply["pointer"]) == ("/data", "")


def test_the_id_of_a_request_is_read_from_where_its_form_keeps_it() -> None:
    assert event_ids(JSON, binary(PAYMENT), {"id": "not-this"}) == ["p-123"]
    assert event_ids(STRUCTURED, binary(PAYMENT), structured(PLACED)) == ["o-1"]
    assert event_ids(JSON, NO_HEADERS, ORDER) == ["o-1"]
    assert event_ids(JSON, NO_HEADERS, [ORDER]) == []


# ---------------------------------------------------------------- batches


def test_a_batch_item_refused_points_under_its_place_in_the_body() -> None:
    bad = {**PAYMENT, "data": {"x": [0, 2**60]}}
    reply = refusal(read_item, BATCHED, structured(bad), 3)
    assert (reply["field"], reply["pointer"]) == ("/data/x/1", "/3/data/x/1")
    reply = refusal(read_item, JSON, bad, 3)
    assert (reply["field"], reply["pointer"]) == ("/data/x/1", "/events/3/data/x/1")
    reply = refusal(read_item, JSON, {**ORDER, "qty": 0}, 2)
    assert (reply["field"], reply["pointer"]) == ("qty", "/events/2/qty")


def test_the_items_of_a_batch_are_read_in_the_form_of_its_media_type() -> None:
    items = batch_items(BATCHED, [structured(PAYMENT), structured(PLACED)])
    assert [read_item(BATCHED, item, n).incoming.event for n, item in enumerate(items)] == [
        PAYMENT,
        PLACED,
    ]
    items = batch_items(JSON, {"events": [ORDER, PAYMENT]})
    taken = [read_item(JSON, item, n) for n, item in enumerate(items)]
    assert [one.incoming.event for one in taken] == [PLACED, PAYMENT]
    assert [one.previous for one in taken] == [previous_canonical(ORDER), None]


@pytest.mark.parametrize(
    ("media", "body"),
    [
        (BATCHED, {"events": [structured(PAYMENT)]}),
        (BATCHED, []),
        (BATCHED, [structured(PAYMENT)] * 17),
        (JSON, [PAYMENT]),
        (JSON, {"events": []}),
        (JSON, {"events": [PAYMENT], "more": 1}),
    ],
    ids=["object-as-batched", "empty", "17", "array-as-json", "no-events", "extra-member"],
)
def test_a_body_that_is_no_batch_of_its_media_type_is_400(media: str, body: object) -> None:
    assert refusal(batch_items, media, body)["error"].startswith(("a ", "events must"))


# ---------------------------------------------------------------- media types


@pytest.mark.parametrize(
    ("content_type", "taken", "media"),
    [
        ("application/json", EVENT_MEDIA, JSON),
        ("Application/JSON; charset=utf-8", EVENT_MEDIA, JSON),
        ("application/cloudevents+json", EVENT_MEDIA, STRUCTURED),
        ("application/cloudevents-batch+json", BATCH_MEDIA, BATCHED),
        ("application/json", BATCH_MEDIA, JSON),
    ],
)
def test_a_media_type_a_route_takes_is_read_without_its_parameters(
    content_type: str, taken: tuple[str, ...], media: str
) -> None:
    assert media_of(content_type, taken) == media


@pytest.mark.parametrize(
    ("content_type", "taken"),
    [
        ("application/cloudevents-batch+json", EVENT_MEDIA),
        ("application/cloudevents+json", BATCH_MEDIA),
        ("text/plain", EVENT_MEDIA),
        (None, BATCH_MEDIA),
    ],
)
def test_any_other_media_type_is_415_naming_those_taken(
    content_type: str | None, taken: tuple[str, ...]
) -> None:
    with pytest.raises(BadRequest) as refused:
        media_of(content_type, taken)

    assert refused.value.status == 415
    assert refused.value.body["accepted"] == list(taken)
    assert refused.value.body["content_type"] == content_type
    assert all(media in refused.value.body["error"] for media in taken)


def test_taken_names_its_event() -> None:
    assert Taken(Incoming.of_order(ORDER)).event_id == "o-1"
