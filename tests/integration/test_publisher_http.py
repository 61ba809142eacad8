"""The publisher service (intake API, status, metrics) and the sink's read API, on loopback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from support import (
    as_event,
    entry_payload,
    eventually,
    get_json,
    padded,
    post_body,
    scrape,
    sent_events,
    value,
)

from publisher.app import ServiceSettings, create_app
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings, worker_id_for
from publisher.store import Outbox
from shared import Event, Receipt, canonical_json, make_ack, payload_digest
from shared.schemas import Schemas

if TYPE_CHECKING:
    from conftest import Query, Serve

EVENT: Event = {"id": "order-1", "sku": "snack", "qty": 7}
BODY_CAP = 16 * 1024

PUBLISHER_METRICS = (
    "publisher_outbox_pending_events",
    "publisher_outbox_oldest_pending_age_seconds",
    "publisher_outbox_quarantined_events",
    "publisher_outbox_head_blocked",
    "publisher_delivery_attempts_total",
    "publisher_intake_total",
)


StartPublisher = Callable[..., Awaitable[str]]


@pytest.fixture
def start_publisher(serve: Serve, db: Path) -> StartPublisher:
    async def start(
        sink_url: str,
        send_timeout_s: float = 2.0,
        service: dict[str, Any] | None = None,
        **relay: Any,
    ) -> str:
        relay.setdefault("poll_interval_s", 0.1)
        relay.setdefault("retry", RetryPolicy(base_s=0.05, cap_s=0.3))
        # The misbehaving sinks here speak POST /events only: one request per entry.
        relay.setdefault("batch", False)
        settings = ServiceSettings(
            db=str(db),
            sink=sink_url,
            send_timeout_s=send_timeout_s,
            relay=RelaySettings(**relay),
            **(service or {}),
        )
        return await serve(create_app(settings))

    return start


@pytest.fixture
async def publisher(start_publisher: StartPublisher, sink_base: str) -> str:
    return await start_publisher(f"{sink_base}/events")


def outbox_rows(db_rows: Query, db: Path) -> list[tuple[Any, ...]]:
    payload = entry_payload(db)
    return db_rows(db, f"SELECT seq, id, {payload}, sent FROM outbox_entries ORDER BY seq")


def order_rows(db_rows: Query, db: Path) -> list[tuple[Any, ...]]:
    return db_rows(db, "SELECT id, sku, qty FROM outbox_orders ORDER BY id")


# ---------------------------------------------------------------- intake


async def test_post_order_accepted_then_duplicate(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    assert await post_body(client, f"{publisher}/orders", EVENT) == (
        201,
        "application/json",
        {"id": "order-1", "result": "accepted"},
    )
    first = outbox_rows(db_rows, db)

    assert await post_body(client, f"{publisher}/orders", dict(reversed(EVENT.items()))) == (
        200,
        "application/json",
        {"id": "order-1", "result": "duplicate"},
    )

    assert order_rows(db_rows, db) == [("order-1", "snack", 7)]
    assert [r[:3] for r in outbox_rows(db_rows, db)] == [r[:3] for r in first]


async def test_conflicting_order_is_409_and_changes_nothing(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{publisher}/orders", EVENT)
    before = (order_rows(db_rows, db), [r[:3] for r in outbox_rows(db_rows, db)])

    status, kind, body = await post_body(client, f"{publisher}/orders", {**EVENT, "qty": 8})

    assert (status, kind) == (409, "application/json")
    assert body["id"] == "order-1"
    assert "error" in body
    assert (order_rows(db_rows, db), [r[:3] for r in outbox_rows(db_rows, db)]) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "order-1", "sku": "snack"}, "qty"),
        ({**EVENT, "qty": True}, "qty"),
        ({**EVENT, "qty": 1.5}, "qty"),
        ({**EVENT, "qty": 0}, "qty"),
        ({**EVENT, "id": "-bad"}, "id"),
        ({**EVENT, "sku": "has space"}, "sku"),
        ({**EVENT, "note": "extra"}, "note"),
        ([EVENT], "event"),
    ],
)
async def test_invalid_order_is_400_naming_the_field_and_changes_nothing(
    client: aiohttp.ClientSession,
    publisher: str,
    db: Path,
    db_rows: Query,
    body: object,
    field: str,
) -> None:
    status, kind, reply = await post_body(client, f"{publisher}/orders", body)

    assert (status, kind) == (400, "application/json")
    assert reply["field"] == field
    assert "error" in reply
    assert order_rows(db_rows, db) == []
    assert outbox_rows(db_rows, db) == []


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b"\xff\xfe", b'{"id": "a",}'])
async def test_malformed_body_is_400(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query, body: bytes
) -> None:
    status, kind, reply = await post_body(client, f"{publisher}/orders", body)
    assert (status, kind) == (400, "application/json")
    assert "JSON" in reply["error"]
    assert order_rows(db_rows, db) == []


async def test_oversized_body_is_413_and_changes_nothing(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    body = json.dumps({**EVENT, "sku": "x" * (BODY_CAP + 10)}).encode()
    status, kind, reply = await post_body(client, f"{publisher}/orders", body)
    assert (status, kind) == (413, "application/json")
    assert "error" in reply
    assert order_rows(db_rows, db) == []
    # The service still works afterwards.
    assert (await post_body(client, f"{publisher}/orders", EVENT))[0] == 201


async def test_healthz(client: aiohttp.ClientSession, publisher: str) -> None:
    assert await get_json(client, f"{publisher}/healthz") == (200, {"status": "ok"})


async def test_accepted_order_is_delivered_at_once_not_at_the_next_poll(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    sink_base: str,
    db: Path,
    sink_db: Path,
    db_rows: Query,
) -> None:
    publisher = await start_publisher(f"{sink_base}/events", poll_interval_s=5.0)
    await asyncio.sleep(0.2)  # the relay found nothing and sleeps for 5 s

    assert (await post_body(client, f"{publisher}/orders", EVENT))[0] == 201
    took = await eventually(lambda: db_rows(db, "SELECT sent FROM outbox_entries") == [(1,)], 3.0)

    assert took < 1.0
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory") == [(7,)]


async def test_a_duplicate_post_does_not_send_again(
    client: aiohttp.ClientSession, publisher: str, db: Path, sink_db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{publisher}/orders", EVENT)
    await eventually(lambda: db_rows(db, "SELECT sent FROM outbox_entries") == [(1,)])
    await post_body(client, f"{publisher}/orders", EVENT)
    await asyncio.sleep(0.3)
    assert db_rows(sink_db, "SELECT deliveries FROM inbox_events") == [(1,)]


# ---------------------------------------------------------------- bulk intake


def batch(*orders: object) -> dict[str, Any]:
    return {"orders": list(orders)}


async def test_a_batch_is_answered_per_order_in_order_and_only_its_good_orders_are_written(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    assert (await post_body(client, f"{publisher}/orders", EVENT))[0] == 201
    body = batch(
        {"id": "b1", "sku": "tea", "qty": 2},
        EVENT,  # as accepted before
        {**EVENT, "qty": 8},  # another payload
        {"id": "b2", "sku": "tea", "qty": 0},
        "not an order",
        {"id": "b3", "sku": "juice", "qty": 1},
    )
    status, kind, reply = await post_body(client, f"{publisher}/orders/batch", body)

    assert (status, kind) == (200, "application/json")
    assert reply == {
        "accepted": 2,
        "duplicate": 1,
        "conflict": 1,
        "invalid": 2,
        "results": [
            {"index": 0, "id": "b1", "result": "accepted"},
            {"index": 1, "id": "order-1", "result": "duplicate"},
            {
                "index": 2,
                "id": "order-1",
                "result": "conflict",
                "error": "conflict",
                "detail": "event 'order-1' was already recorded with a different payload",
            },
            {
                "index": 3,
                "id": "b2",
                "result": "invalid",
                "error": "invalid event",
                "field": "qty",
                "detail": reply["results"][3]["detail"],
            },
            {
                "index": 4,
                "id": None,
                "result": "invalid",
                "error": "invalid event",
                "field": "event",
                "detail": "must be a JSON object, not a string",
            },
            {"index": 5, "id": "b3", "result": "accepted"},
        ],
    }
    assert "1" in reply["results"][3]["detail"]  # says the range qty must be in
    assert order_rows(db_rows, db) == [
        ("b1", "tea", 2),
        ("b3", "juice", 1),
        ("order-1", "snack", 7),
    ]
    assert [r[1] for r in outbox_rows(db_rows, db)] == ["order-1", "b1", "b3"]


async def test_a_batch_is_delivered_and_counted_per_order(
    client: aiohttp.ClientSession, publisher: str, db: Path, sink_db: Path, db_rows: Query
) -> None:
    orders = [{"id": f"b{n}", "sku": "tea", "qty": 1} for n in range(500)]
    status, _, reply = await post_body(client, f"{publisher}/orders/batch", batch(*orders))
    assert (status, reply["accepted"]) == (200, 500)
    await eventually(
        lambda: db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 1") == [(500,)], 10.0
    )
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory") == [(500,)]
    status, _, reply = await post_body(client, f"{publisher}/orders/batch", batch(orders[0], {}))
    assert (reply["duplicate"], reply["invalid"]) == (1, 1)
    samples = await scrape(client, f"{publisher}/metrics")
    intake = "publisher_intake_total"
    assert value(samples, intake, result="accepted") == 500
    assert value(samples, intake, result="duplicate") == 1
    assert value(samples, intake, result="invalid") == 1


TOO_MANY = batch(*({"id": f"o{n}", "sku": "s", "qty": 1} for n in range(501)))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ([EVENT], 'a batch is a JSON object {"orders": [...]}'),
        (EVENT, 'a batch is a JSON object {"orders": [...]}'),
        ({**batch(EVENT), "more": 1}, 'a batch is a JSON object {"orders": [...]}'),
        (batch(), "orders must be a list of 1 to 500 orders"),
        ({"orders": EVENT}, "orders must be a list of 1 to 500 orders"),
        (TOO_MANY, "orders must be a list of 1 to 500 orders"),
        (b"not json", "body is not valid JSON"),
        (b'{"orders": [], "orders": []}', "duplicate key 'orders'"),
    ],
)
async def test_a_body_that_is_not_a_batch_is_400_and_writes_nothing(
    client: aiohttp.ClientSession,
    publisher: str,
    db: Path,
    db_rows: Query,
    body: object,
    said: str,
) -> None:
    status, kind, reply = await post_body(client, f"{publisher}/orders/batch", body)
    assert (status, kind) == (400, "application/json")
    assert said in reply["error"]
    assert order_rows(db_rows, db) == []


async def test_a_batch_over_the_body_cap_is_413_and_one_of_500_long_orders_is_not(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    longest = [
        {"id": f"{n:03d}" + "i" * 125, "sku": "s" * 64, "qty": 1_000_000} for n in range(500)
    ]
    pretty = json.dumps(batch(*longest), indent=2).encode()  # whitespace too
    assert len(pretty) < 500 * 1024
    status, _, reply = await post_body(client, f"{publisher}/orders/batch", pretty)
    assert (status, reply["accepted"]) == (200, 500)

    over = json.dumps(batch(EVENT)).encode() + b" " * (500 * 1024)
    status, kind, reply = await post_body(client, f"{publisher}/orders/batch", over)
    assert (status, kind) == (413, "application/json")
    assert "error" in reply
    assert len(order_rows(db_rows, db)) == 500


async def test_a_batch_that_is_not_plain_json_is_415(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    data = json.dumps(batch(EVENT)).encode()
    url = f"{publisher}/orders/batch"
    async with client.post(url, data=data, headers={"Content-Type": "text/plain"}) as r:
        assert (r.status, r.content_type) == (415, "application/json")
        assert "error" in await r.json()
    assert order_rows(db_rows, db) == []


async def test_a_batch_the_database_cannot_take_is_503_and_nothing_of_it_is_written(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    assert (await post_body(client, f"{publisher}/orders", EVENT))[0] == 201
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox_entries WHEN NEW.id = 'b2'"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
        body = batch(*({"id": f"b{n}", "sku": "tea", "qty": 1} for n in range(4)))
        status, kind, reply = await post_body(client, f"{publisher}/orders/batch", body)
        assert (status, kind) == (503, "application/json")
        assert reply == {"error": "storage unavailable, try again"}
        assert order_rows(db_rows, db) == [("order-1", "snack", 7)]  # b0, b1 undone too
    finally:
        conn.execute("DROP TRIGGER refuse")
        conn.close()
    status, _, reply = await post_body(client, f"{publisher}/orders/batch", body)
    assert (status, reply["accepted"]) == (200, 4)


# ---------------------------------------------------------------- events of any type

PAYMENT: Event = {
    "id": "pay-1",
    "type": "payment.captured",
    "key": "acct-9",
    "data": {"amount": 1250, "currency": "EUR", "lines": [{"sku": "tea", "n": 2}]},
}
TOKEN = "intake-token-of-the-tests-0001"


def event_rows(db_rows: Query, db: Path) -> list[tuple[Any, ...]]:
    payload = entry_payload(db)
    return db_rows(db, f"SELECT id, type, lane, {payload} FROM outbox_entries ORDER BY seq")


async def post_as(
    client: aiohttp.ClientSession, url: str, body: object, token: str | None
) -> tuple[int, Any]:
    """POST `body` as JSON with `token` (if any) as the bearer token; (status, JSON)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with client.post(url, data=json.dumps(body).encode(), headers=headers) as response:
        return response.status, await response.json()


async def test_post_event_accepted_then_duplicate_and_delivered_as_recorded(
    client: aiohttp.ClientSession,
    publisher: str,
    db: Path,
    sink_db: Path,
    db_rows: Query,
) -> None:
    assert await post_body(client, f"{publisher}/events", PAYMENT) == (
        201,
        "application/json",
        {"id": "pay-1", "result": "accepted"},
    )
    # The same event written otherwise (member order, 1250.0 for 1250) is the same event.
    again = {"data": {**PAYMENT["data"], "amount": 1250.0}, "key": "acct-9"}
    again |= {"type": "payment.captured", "id": "pay-1"}
    assert await post_body(client, f"{publisher}/events", again) == (
        200,
        "application/json",
        {"id": "pay-1", "result": "duplicate"},
    )

    assert event_rows(db_rows, db) == [
        ("pay-1", "payment.captured", "acct-9", canonical_json(PAYMENT))
    ]
    await eventually(lambda: db_rows(db, "SELECT sent FROM outbox_entries") == [(1,)])
    assert db_rows(sink_db, "SELECT id, type, payload, deliveries FROM inbox_events") == [
        ("pay-1", "payment.captured", canonical_json(PAYMENT), 1)
    ]


@pytest.mark.parametrize(
    "changed",
    [
        {**PAYMENT, "type": "payment.refunded"},
        {**PAYMENT, "key": "acct-10"},
        {key: value for key, value in PAYMENT.items() if key != "key"},
        {**PAYMENT, "data": {**PAYMENT["data"], "amount": 1251}},
    ],
    ids=["type", "key", "no-key", "data"],
)
async def test_an_event_changed_in_type_key_or_data_is_409_and_changes_nothing(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query, changed: object
) -> None:
    assert (await post_body(client, f"{publisher}/events", PAYMENT))[0] == 201
    before = event_rows(db_rows, db)

    status, kind, body = await post_body(client, f"{publisher}/events", changed)

    assert (status, kind) == (409, "application/json")
    assert (body["error"], body["id"]) == ("conflict", "pay-1")
    assert event_rows(db_rows, db) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**PAYMENT, "data": {"a": [2**53]}}, "/data/a/0"),
        ({**PAYMENT, "data": {"a": [-(2**53)]}}, "/data/a/0"),
        ({**PAYMENT, "data": {"x/y": {"m~n": 1.5, "deep": [True, 2**60]}}}, "/data/x~1y/deep/1"),
        ({**PAYMENT, "data": [1]}, "/data"),
        ({key: value for key, value in PAYMENT.items() if key != "type"}, "/type"),
        ({**PAYMENT, "type": "has space"}, "/type"),
        ({**PAYMENT, "key": ""}, "/key"),
        ({**PAYMENT, "id": "-bad"}, "/id"),
        ({**PAYMENT, "note": "extra"}, "/note"),
        ([PAYMENT], ""),
    ],
    ids=[
        "big",
        "big-negative",
        "escaped",
        "array",
        "no-type",
        "type",
        "key",
        "id",
        "extra",
        "list",
    ],
)
async def test_an_invalid_event_is_400_with_a_json_pointer_and_changes_nothing(
    client: aiohttp.ClientSession,
    publisher: str,
    db: Path,
    db_rows: Query,
    body: object,
    field: str,
) -> None:
    status, kind, reply = await post_body(client, f"{publisher}/events", body)

    assert (status, kind) == (400, "application/json")
    assert (reply["error"], reply["field"]) == ("invalid event", field)
    assert reply["detail"]
    assert event_rows(db_rows, db) == []


async def test_max_data_bytes_bounds_the_data_and_the_body_is_413_past_it_and_its_envelope(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    sink_base: str,
    db: Path,
    db_rows: Query,
) -> None:
    settings = {"max_data_bytes": 100}
    publisher = await start_publisher(f"{sink_base}/events", service=settings)
    url = f"{publisher}/events"
    cap = ServiceSettings(db=str(db), sink=f"{sink_base}/events", **settings).event_body_bytes

    def sized(event_id: str, data_bytes: int) -> dict[str, Any]:
        # '{"pad":"' + n x + '"}' is canonical data of n + 10 bytes
        return {"id": event_id, "type": "blob.put", "data": {"pad": "x" * (data_bytes - 10)}}

    assert (await post_body(client, url, sized("fits", 100)))[0] == 201
    status, _, reply = await post_body(client, url, sized("over", 101))
    assert (status, reply["field"]) == (400, "/data")
    assert "100" in reply["detail"]

    status, _, reply = await post_body(client, url, padded(sized("big-body", 50), cap + 1))
    assert status == 413
    assert "error" in reply
    # A body of exactly the cap is read (its whitespace does not count against the data).
    assert (await post_body(client, url, padded(sized("at-cap", 50), cap)))[0] == 201
    assert [row[0] for row in event_rows(db_rows, db)] == ["fits", "at-cap"]


async def test_an_events_batch_is_answered_per_event_and_only_its_good_events_are_written(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    assert (await post_body(client, f"{publisher}/events", PAYMENT))[0] == 201
    keyless: Event = {"id": "tick-1", "type": "clock.ticked", "data": {}}
    body = {
        "events": [
            keyless,
            PAYMENT,  # as recorded before
            {**PAYMENT, "key": "acct-10"},  # another key
            {**PAYMENT, "id": "pay-2", "data": {"a": [2**53]}},
            "not an event",
            {**PAYMENT, "id": "pay-3"},
        ]
    }
    status, kind, reply = await post_body(client, f"{publisher}/events/batch", body)

    assert (status, kind) == (200, "application/json")
    results = reply["results"]
    assert {name: reply[name] for name in ("accepted", "duplicate", "conflict", "invalid")} == {
        "accepted": 2,
        "duplicate": 1,
        "conflict": 1,
        "invalid": 2,
    }
    assert [(r["index"], r["id"], r["result"]) for r in results] == [
        (0, "tick-1", "accepted"),
        (1, "pay-1", "duplicate"),
        (2, "pay-1", "conflict"),
        (3, "pay-2", "invalid"),
        (4, None, "invalid"),
        (5, "pay-3", "accepted"),
    ]
    assert results[2]["error"] == "conflict"
    assert (results[3]["error"], results[3]["field"]) == ("invalid event", "/data/a/0")
    assert results[4]["field"] == ""
    assert [row[:3] for row in event_rows(db_rows, db)] == [
        ("pay-1", "payment.captured", "acct-9"),
        ("tick-1", "clock.ticked", "*"),
        ("pay-3", "payment.captured", "acct-9"),
    ]


@pytest.mark.parametrize("body", [{"orders": [PAYMENT]}, {"events": []}, [PAYMENT]])
async def test_a_body_that_is_not_an_events_batch_is_400_and_writes_nothing(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query, body: object
) -> None:
    status, _, reply = await post_body(client, f"{publisher}/events/batch", body)

    assert status == 400
    assert reply["field"] == "events"
    assert event_rows(db_rows, db) == []


@pytest.mark.parametrize("path", ["/events", "/events/batch"])
async def test_the_intake_token_guards_post_events(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    sink_base: str,
    db: Path,
    db_rows: Query,
    path: str,
) -> None:
    publisher = await start_publisher(f"{sink_base}/events", service={"intake_token": TOKEN})
    url = f"{publisher}{path}"
    body: object = PAYMENT if path == "/events" else {"events": [PAYMENT]}

    for token in (None, TOKEN[:-1], TOKEN.upper()):
        status, reply = await post_as(client, url, body, token)
        assert status == 401, token
        assert "error" in reply
    assert event_rows(db_rows, db) == []

    status, _ = await post_as(client, url, body, TOKEN)
    assert status == (201 if path == "/events" else 200)
    assert [row[0] for row in event_rows(db_rows, db)] == ["pay-1"]


async def test_with_schemas_an_event_its_schema_refuses_is_400_naming_the_place_and_the_rule(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    sink_base: str,
    tmp_path: Path,
    db: Path,
    db_rows: Query,
) -> None:
    folder = tmp_path / "schemas"
    folder.mkdir()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["amount"],
        "properties": {
            "amount": {"type": "integer", "minimum": 1},
            "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
        },
    }
    (folder / "payment.captured.json").write_text(json.dumps(schema))
    service = {"schemas": Schemas.load(folder)}
    publisher = await start_publisher(f"{sink_base}/events", service=service)
    url = f"{publisher}/events"

    refusals = [
        ({**PAYMENT, "data": {"amount": 0}}, "/data/amount", "minimum"),
        (
            {**PAYMENT, "data": {"amount": 5, "lines": [{"sku": "a"}, {}]}},
            "/data/lines/1",
            "required",
        ),
        ({**PAYMENT, "data": {"currency": "EUR"}}, "/data", "required"),
    ]
    for body, field, rule in refusals:
        status, _, reply = await post_body(client, url, body)
        assert (status, reply["field"]) == (400, field), reply
        assert reply["detail"].startswith("does not match the schema of 'payment.captured'")
        assert f"{rule}:" in reply["detail"], reply
    status, _, reply = await post_body(client, f"{publisher}/events/batch", {"events": [body]})
    assert (status, reply["results"][0]["field"]) == (200, "/data")
    assert event_rows(db_rows, db) == []

    assert (await post_body(client, url, PAYMENT))[0] == 201
    # A type without a schema is not checked (not strict).
    assert (await post_body(client, url, {"id": "t", "type": "clock.ticked", "data": {}}))[0] == 201
    assert [row[0] for row in event_rows(db_rows, db)] == ["pay-1", "t"]


# ---------------------------------------------------------------- status and metrics


async def test_status_and_metrics_after_traffic(
    client: aiohttp.ClientSession,
    publisher: str,
    sink_base: str,
    db: Path,
    db_rows: Query,
) -> None:
    orders = f"{publisher}/orders"
    assert (await post_body(client, orders, EVENT))[0] == 201
    assert (await post_body(client, orders, EVENT))[0] == 200
    assert (await post_body(client, orders, {**EVENT, "qty": 9}))[0] == 409
    assert (await post_body(client, orders, {"id": "x"}))[0] == 400
    assert (await post_body(client, orders, b"nope"))[0] == 400
    assert (await post_body(client, orders, b"x" * (BODY_CAP + 1)))[0] == 413
    assert (await post_body(client, orders, {"id": "order-2", "sku": "snack", "qty": 1}))[0] == 201
    await eventually(
        lambda: db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 1") == [(2,)]
    )

    samples = await scrape(client, f"{publisher}/metrics")

    names = {name for name, _ in samples}
    assert set(PUBLISHER_METRICS) <= names
    assert value(samples, "publisher_outbox_pending_events") == 0
    assert value(samples, "publisher_outbox_oldest_pending_age_seconds") == 0
    assert value(samples, "publisher_outbox_quarantined_events") == 0
    assert value(samples, "publisher_outbox_head_blocked") == 0
    attempts = "publisher_delivery_attempts_total"
    assert value(samples, attempts, outcome="delivered") == 2
    assert value(samples, attempts, outcome="transient") == 0
    assert value(samples, attempts, outcome="permanent") == 0
    intake = "publisher_intake_total"
    assert value(samples, intake, result="accepted") == 2
    assert value(samples, intake, result="duplicate") == 1
    assert value(samples, intake, result="conflict") == 1
    assert value(samples, intake, result="invalid") == 2
    assert value(samples, intake, result="too_large") == 1
    status, figures = await get_json(client, f"{publisher}/status")
    lines = figures.pop("lines")
    [worker] = figures.pop("relay_workers")  # its heartbeat row
    assert (status, figures) == (
        200,
        {
            "pending": 0,
            "oldest_pending_age_seconds": 0.0,
            "quarantined": 0,
            "head_blocked": False,
            "head": None,
            "blocked_lanes": [],
            "workers": [worker_id_for(str(db), None)],  # the relay holds the global line
        },
    )
    assert [(line["line"], line["owner"], line["epoch"]) for line in lines] == [
        ("*", worker_id_for(str(db), None), 1)
    ]
    assert (worker["worker"], worker["live"], worker["lines"]) == (
        worker_id_for(str(db), None),
        True,
        ["*"],
    )
    assert worker["started_at"] <= worker["seen_at"] and 0 <= worker["seen_seconds_ago"] < 30


async def test_metrics_count_events_published_and_delivered_by_type(
    client: aiohttp.ClientSession, publisher: str, db: Path, db_rows: Query
) -> None:
    payment = {"id": "pay-1", "type": "payment.captured", "key": "c-1", "data": {"n": 1}}
    refund = {"id": "ref-1", "type": "payment.refunded", "data": {}}
    assert (await post_body(client, f"{publisher}/events", payment))[0] == 201
    assert (await post_body(client, f"{publisher}/events", payment))[0] == 200  # not new
    batch = {"events": [refund, {**refund, "id": "ref-2"}, {"id": "bad"}]}
    assert (await post_body(client, f"{publisher}/events/batch", batch))[0] == 200
    assert (await post_body(client, f"{publisher}/orders", EVENT))[0] == 201
    await eventually(
        lambda: db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 1") == [(4,)]
    )

    samples = await scrape(client, f"{publisher}/metrics")
    for name in ("publisher_events_published_total", "publisher_events_delivered_total"):
        by_type = {dict(labels)["type"]: v for (n, labels), v in samples.items() if n == name}
        assert by_type == {"payment.captured": 1, "payment.refunded": 2, "order.placed": 1}


@pytest.fixture
async def rejecting_sink(serve: Serve) -> tuple[str, list[str]]:
    """A sink that rejects order-1 with 409 and ACKs everything else properly."""
    received: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        [event] = sent_events(json.loads(await request.read()))
        received.append(event["id"])
        if event["id"] == "order-1":
            return web.json_response({"error": "conflict"}, status=409)
        digest = payload_digest(event)
        return web.json_response(make_ack(event["id"], Receipt.APPLIED, digest))

    app = web.Application()
    app.router.add_post("/events", handle)
    return f"{await serve(app)}/events", received


async def test_blocked_head_shows_in_status_and_metrics_until_quarantined(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    rejecting_sink: tuple[str, list[str]],
    db: Path,
    db_rows: Query,
) -> None:
    url, received = rejecting_sink
    publisher = await start_publisher(url, retry=RetryPolicy(base_s=0.05, cap_s=0.3))
    before = time.time()
    await post_body(client, f"{publisher}/orders", EVENT)
    await post_body(client, f"{publisher}/orders", {"id": "order-2", "sku": "snack", "qty": 1})
    await eventually(lambda: received.count("order-1") >= 2)
    await asyncio.sleep(0.05)

    status, figures = await get_json(client, f"{publisher}/status")
    samples = await scrape(client, f"{publisher}/metrics")

    assert status == 200
    assert figures["pending"] == 2
    assert figures["head_blocked"] is True
    head = figures["head"]
    assert (head["id"], head["seq"]) == ("order-1", 1)
    assert head["attempts"] >= 2
    assert "409" in head["last_error"]
    assert before <= head["blocked_since"] <= time.time()
    assert figures["oldest_pending_age_seconds"] > 0
    assert value(samples, "publisher_outbox_pending_events") == 2
    assert value(samples, "publisher_outbox_head_blocked") == 1
    assert value(samples, "publisher_outbox_oldest_pending_age_seconds") > 0
    assert value(samples, "publisher_delivery_attempts_total", outcome="permanent") >= 2
    assert value(samples, "publisher_delivery_attempts_total", outcome="delivered") == 0
    assert "order-2" not in received

    async with Outbox.open(db) as operator:  # as `publisher quarantine` would
        await operator.quarantine("order-1", "sku retired", "alice")
    await eventually(lambda: "order-2" in received)
    await eventually(
        lambda: db_rows(db, "SELECT sent FROM outbox_entries WHERE id = 'order-2'") == [(1,)]
    )

    samples = await scrape(client, f"{publisher}/metrics")
    assert value(samples, "publisher_outbox_quarantined_events") == 1
    assert value(samples, "publisher_outbox_pending_events") == 0
    assert value(samples, "publisher_outbox_head_blocked") == 0
    assert value(samples, "publisher_delivery_attempts_total", outcome="delivered") == 1
    _, figures = await get_json(client, f"{publisher}/status")
    assert (figures["quarantined"], figures["head"], figures["head_blocked"]) == (1, None, False)


async def test_gauges_follow_rows_written_by_other_connections(
    client: aiohttp.ClientSession, start_publisher: StartPublisher, db: Path, serve: Serve
) -> None:
    # A sink that never answers in time keeps everything pending.
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/events", slow)
    url = f"{await serve(app, handler_cancellation=True)}/events"
    publisher = await start_publisher(url, send_timeout_s=0.5)
    async with Outbox.open(db) as other:
        for n in range(3):
            await other.accept({"id": f"cli-{n}", "sku": "snack", "qty": 1})

    samples = await scrape(client, f"{publisher}/metrics")

    assert value(samples, "publisher_outbox_pending_events") == 3


# ---------------------------------------------------------------- the sink's side


async def test_sink_metrics_count_every_result(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    events = f"{sink_base}/events"
    assert (await post_body(client, events, EVENT))[0] == 200
    assert (await post_body(client, events, EVENT))[0] == 200
    assert (await post_body(client, events, EVENT))[0] == 200
    assert (await post_body(client, events, {**EVENT, "qty": 8}))[0] == 409
    assert (await post_body(client, events, {"id": "order-2", "sku": "snack", "qty": 1}))[0] == 200
    assert (await post_body(client, events, b"{"))[0] == 400
    assert (await post_body(client, events, {"id": "x"}))[0] == 400

    samples = await scrape(client, f"{sink_base}/metrics")

    received = "sink_inbox_received_total"
    assert value(samples, received, result="applied") == 2
    assert value(samples, received, result="duplicate") == 2
    assert value(samples, received, result="conflict") == 1
    assert value(samples, received, result="invalid") == 2
    assert value(samples, "sink_inbox_events") == 2
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(2,)]


async def test_sink_metrics_start_at_zero(client: aiohttp.ClientSession, sink_base: str) -> None:
    samples = await scrape(client, f"{sink_base}/metrics")
    for result in ("applied", "duplicate", "conflict", "invalid"):
        assert value(samples, "sink_inbox_received_total", result=result) == 0
    assert value(samples, "sink_inbox_events") == 0


async def test_sink_event_record_counts_deliveries_and_carries_the_digest(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    before = time.time()
    await post_body(client, f"{sink_base}/events", EVENT)
    await post_body(client, f"{sink_base}/events", EVENT)

    status, record = await get_json(client, f"{sink_base}/events/order-1")

    assert status == 200
    assert record["id"] == "order-1"
    assert record["deliveries"] == 2
    assert record["sha256"] == payload_digest(as_event(EVENT))  # of the event it records
    # ISO 8601 in UTC, as every time is shown (the millisecond: before rounded down)
    received, last = (
        datetime.fromisoformat(record[name]).timestamp()
        for name in ("received_at", "last_delivery_at")
    )
    assert record["received_at"].endswith("Z") and record["last_delivery_at"].endswith("Z")
    assert int(before * 1000) / 1000 <= received <= last <= time.time()
    assert db_rows(sink_db, "SELECT deliveries FROM inbox_events WHERE id = 'order-1'") == [(2,)]


async def test_sink_event_record_unknown_is_404(
    client: aiohttp.ClientSession, sink_base: str
) -> None:
    status, body = await get_json(client, f"{sink_base}/events/never-sent")
    assert status == 404
    assert body["id"] == "never-sent"
    assert "error" in body


@pytest.mark.parametrize("bad", ["-starts-with-dash", "has%20space", "x" * 129, "semi;colon"])
async def test_sink_event_record_bad_id_is_400(
    client: aiohttp.ClientSession, sink_base: str, bad: str
) -> None:
    status, body = await get_json(client, f"{sink_base}/events/{bad}")
    assert status == 400
    assert body["field"] == "id"
