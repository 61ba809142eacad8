"""What the relay puts on the wire: CloudEvents in structured mode for one event and
batched mode for a batch, cut at the byte cap, and one event per request for a
consumer that takes no batches. Real aiohttp servers on loopback that record each
request as it arrived."""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from hypothesis import example, given
from hypothesis import strategies as st
from support import placed

from publisher import HttpSender, Outbox
from publisher.cli.dispatch import deliver_pending
from publisher.http import _rfc3339
from publisher.settings import RelaySettings
from publisher.store import Pending, State
from shared import PREDECESSOR_HEADER, Event, Receipt, canonical_json, make_ack, payload_digest
from shared.cloudevents import BATCHED, STRUCTURED
from shared.event import StoredEvent

if TYPE_CHECKING:
    from conftest import Serve

PAYMENT: Event = {
    "id": "p-1",
    "type": "payment.captured",
    "key": "c-9",
    "data": {"amount_cents": 1999, "note": "caf\u00e9 \U0001f600", "lines": [{"x": 1.5}]},
}
KEYLESS: Event = {"id": "p-2", "type": "audit.noted", "data": {"by": "alice"}}
ONCE = RelaySettings(batch=True, pipeline=1, worker=None)  # one read, no leases


@dataclass
class Consumer:
    """ACKs what it is sent; with `batches=False` it answers 404 to /events/batch,
    as a consumer that takes one event per request does."""

    batches: bool = True
    requests: list[tuple[str, str, str | None, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self._one)
        app.router.add_post("/events/batch", self._batch)
        return app

    def _record(self, request: web.Request, body: Any) -> None:
        self.requests.append(
            (request.path, request.content_type, request.headers.get(PREDECESSOR_HEADER), body)
        )

    async def _one(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        return web.json_response(make_ack(body["id"], Receipt.APPLIED, _digest(body)))

    async def _batch(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        if not self.batches:
            return web.json_response({"error": "no such route"}, status=404)
        acks = [make_ack(one["id"], Receipt.APPLIED, _digest(one)) for one in body]
        return web.json_response({"acks": acks, "rejected": None})


def _digest(envelope: dict[str, Any]) -> str:
    event: Event = {"id": envelope["id"], "type": envelope["type"], "data": envelope["data"]}
    if "partitionkey" in envelope:
        event["key"] = envelope["partitionkey"]
    return payload_digest(event)


async def _url(serve: Serve, consumer: Consumer) -> str:
    return f"{await serve(consumer.app())}/events"


async def test_one_event_goes_in_structured_mode(serve: Serve) -> None:
    consumer = Consumer()
    async with HttpSender(await _url(serve, consumer), source="urn:shop:payments") as sender:
        ack = await sender.deliver(PAYMENT)
    assert ack["sha256"] == payload_digest(PAYMENT)
    [(path, media, _, body)] = consumer.requests
    assert (path, media) == ("/events", STRUCTURED)
    assert body["specversion"] == "1.0"
    assert (body["id"], body["type"], body["source"]) == (
        "p-1",
        "payment.captured",
        "urn:shop:payments",
    )
    assert (body["partitionkey"], body["datacontenttype"]) == ("c-9", "application/json")
    assert body["data"] == PAYMENT["data"]
    assert body["time"].endswith("Z")


async def test_a_batch_goes_in_batched_mode_and_an_event_without_a_key_has_no_partitionkey(
    serve: Serve,
) -> None:
    consumer = Consumer()
    async with HttpSender(await _url(serve, consumer)) as sender:
        results = await sender.deliver_batch([PAYMENT, KEYLESS])
    assert [r["ack"] for r in results if isinstance(r, dict)] == ["p-1", "p-2"]
    [(path, media, _, body)] = consumer.requests
    assert (path, media) == ("/events/batch", BATCHED)
    assert [one["id"] for one in body] == ["p-1", "p-2"]
    assert "partitionkey" not in body[1]


async def test_a_batch_over_the_byte_cap_is_cut_in_order_each_part_naming_the_one_before(
    serve: Serve,
) -> None:
    consumer = Consumer()
    events = [placed(f"o-{n}") for n in range(6)]
    one_body = 260  # each structured body of these is a little under this
    async with HttpSender(await _url(serve, consumer), max_batch_body_bytes=2 * one_body) as sender:
        results = await sender.deliver_batch(events, after="o-before")
    assert [r["ack"] for r in results if isinstance(r, dict)] == [e["id"] for e in events]
    parts = [[one["id"] for one in body] for *_, body in consumer.requests]
    assert [i for part in parts for i in part] == [e["id"] for e in events]
    assert len(parts) > 1 and all(len(part) <= 2 for part in parts)
    afters = [after for _, _, after, _ in consumer.requests]
    assert afters == ["o-before"] + [part[-1] for part in parts[:-1]]


async def test_a_consumer_that_takes_no_batches_gets_one_event_per_request_from_then_on(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = Consumer(batches=False)
    caplog.set_level(logging.WARNING, logger="publisher.http")
    async with HttpSender(await _url(serve, consumer)) as sender:
        first = await sender.deliver_batch([PAYMENT, KEYLESS])
        second = await sender.deliver_batch([placed("o-1"), placed("o-2")])
    assert [r["ack"] for r in first + second if isinstance(r, dict)] == ["p-1", "p-2", "o-1", "o-2"]
    paths = [path for path, *_ in consumer.requests]
    assert paths == ["/events/batch"] + ["/events"] * 4  # one refused batch, then singles
    assert [after for _, _, after, _ in consumer.requests[1:3]] == [None, "p-1"]
    said = [r.getMessage() for r in caplog.records if "one event per request" in r.getMessage()]
    assert len(said) == 1 and "404" in said[0]


async def test_a_sink_that_stored_something_else_is_not_acknowledged(serve: Serve) -> None:
    async def wrong(request: web.Request) -> web.Response:
        body = await request.json()
        other = dict(body, data={**body["data"], "amount_cents": 1})
        return web.json_response(make_ack(body["id"], Receipt.APPLIED, _digest(other)))

    app = web.Application()
    app.router.add_post("/events", wrong)
    async with HttpSender(f"{await serve(app)}/events") as sender:
        with pytest.raises(Exception, match="digest"):
            await sender.deliver(PAYMENT)
    assert json.dumps(PAYMENT)  # the event itself is plain JSON


async def test_an_event_read_from_the_outbox_goes_out_as_its_stored_text(serve: Serve) -> None:
    # The relay's events carry the canonical text the outbox stored: the data on the
    # wire is cut from that text and the digest the ACK must name is of it, not of a
    # form made again from the parsed event (which here differs on purpose).
    stored = canonical_json(PAYMENT)
    altered: Event = {**PAYMENT, "data": {"amount_cents": 1}}
    consumer = Consumer()
    async with HttpSender(await _url(serve, consumer)) as sender:
        ack = await sender.deliver(StoredEvent(altered, stored))  # type: ignore[arg-type]
        batch = await sender.deliver_batch(
            [StoredEvent(altered, stored), StoredEvent(KEYLESS, canonical_json(KEYLESS))]  # type: ignore[list-item]
        )
    assert ack["sha256"] == payload_digest(PAYMENT)
    assert [r["sha256"] for r in batch if isinstance(r, dict)] == [
        payload_digest(PAYMENT),
        payload_digest(KEYLESS),
    ]
    (_, _, _, one), (_, _, _, many) = consumer.requests
    assert one["data"] == PAYMENT["data"] == many[0]["data"]
    assert many[0]["time"] == many[1]["time"]  # one request, one time


async def test_an_entry_read_with_its_data_unparsed_goes_out_as_a_parsed_one_would(
    serve: Serve,
) -> None:
    # The relay reads an entry's id, type and key from its stored text and hands the
    # sender the data's text as it is (publisher.store.Pending): on the wire it must
    # be the very request a fully parsed stored event makes.
    stored, recorded_at = canonical_json(PAYMENT), 1_700_000_000.25
    row = Pending.stored(1, stored, 0, PAYMENT["key"], recorded_at)
    consumer = Consumer()
    async with HttpSender(await _url(serve, consumer)) as sender:
        lazy = await sender.deliver(row.sent(copied=False))
        whole = await sender.deliver(StoredEvent(PAYMENT, stored, recorded_at))  # type: ignore[arg-type]
    assert lazy["sha256"] == whole["sha256"] == payload_digest(PAYMENT)
    (_, _, _, unparsed), (_, _, _, parsed) = consumer.requests
    assert unparsed == parsed


def test_a_copy_of_a_stored_event_is_a_plain_event() -> None:
    # A sender that may change what it is given gets copies: they must not keep the
    # stored text, which would then no longer be theirs.
    original = StoredEvent(PAYMENT, canonical_json(PAYMENT))
    copied = copy.deepcopy(original)
    assert type(copied) is dict and copied == PAYMENT
    copied["data"]["amount_cents"] = 5
    assert original["data"]["amount_cents"] == 1999


async def test_an_event_read_from_the_outbox_carries_the_time_it_was_recorded(
    serve: Serve,
) -> None:
    # Its CloudEvents `time` is when the outbox recorded it, on every send alike; an
    # event the caller's code hands the sender, with no such record, is sent "now".
    stored = canonical_json(PAYMENT)
    recorded = 1_700_000_000.123456  # 2023-11-14T22:13:20.123Z
    consumer = Consumer()
    async with HttpSender(await _url(serve, consumer)) as sender:
        await sender.deliver(StoredEvent(PAYMENT, stored, recorded))  # type: ignore[arg-type]
        await sender.deliver_batch([StoredEvent(PAYMENT, stored, recorded)])  # type: ignore[list-item]
        await sender.deliver(PAYMENT)
    (_, _, _, one), (_, _, _, [many]), (_, _, _, plain) = consumer.requests
    assert one["time"] == many["time"] == "2023-11-14T22:13:20.123Z"
    assert plain["time"] > "2026"


async def test_the_relay_sends_each_entry_with_its_recording_time(
    serve: Serve, tmp_path: Path
) -> None:
    consumer = Consumer()
    url = await _url(serve, consumer)
    async with Outbox.open(tmp_path / "source.db") as outbox, HttpSender(url) as sender:
        await outbox.publish(dict(PAYMENT))
        [entry] = await outbox.entries(State.PENDING)
        await asyncio.sleep(0.05)  # so that a send time would be told from it
        assert await deliver_pending(outbox, sender, ONCE) == ["p-1"]
    [(_, _, _, [sent])] = consumer.requests
    recorded = datetime.datetime.fromtimestamp(entry.queued_at, datetime.UTC)
    sent_at = datetime.datetime.fromisoformat(sent["time"].replace("Z", "+00:00"))
    assert abs((sent_at - recorded).total_seconds()) < 0.001


@given(seconds=st.floats(min_value=-2e9, max_value=4e9, allow_nan=False))
@example(seconds=1_700_000_000.9999996)  # microseconds round up into the next second
@example(seconds=-0.0000004)
@example(seconds=0.0)
def test_a_time_is_written_as_datetime_writes_it_to_the_millisecond(seconds: float) -> None:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    expected = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    assert _rfc3339(seconds) == expected
