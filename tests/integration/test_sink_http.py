"""The sink's HTTP API, served by create_app on loopback, checked on disk.

Most requests here are in the two forms `Content-Type: application/json` takes: an
order of the previous release `{id, sku, qty}` (answered with that release's
digest) and a plain event `{id, type, key, data}`; binary mode too. CloudEvents in
structured and batched mode are in test_sink_cloudevents.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import yarl
from multidict import CIMultiDict
from support import padded, post_body, scrape, snapshot

from plumbing.capped_labels import MAX_TYPE_LABELS, OTHER_TYPES
from shared import (
    MAX_BODY_BYTES,
    Event,
    Order,
    Receipt,
    canonical_json,
    digest_of,
    make_ack,
    order_event,
)
from shared.event import previous_canonical

if TYPE_CHECKING:
    from conftest import Query, ServeSink

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}  # the previous release's
DEFAULT_CAP = MAX_BODY_BYTES
PAYMENT: Event = {
    "id": "p-123",
    "type": "payment.captured",
    "key": "c-9",
    "data": {"amount": 12.5, "customer": {"id": "c-9", "name": "Zoë 😀"}, "lines": [1, 2.0]},
}


def previous_ack(order: Order, receipt: Receipt = Receipt.APPLIED) -> dict[str, str]:
    """The ACK of an order of the previous release, as that release's publisher checks it."""
    return make_ack(order["id"], receipt, digest_of(previous_canonical(order)))


def event_ack(one: Event, receipt: Receipt = Receipt.APPLIED) -> dict[str, str]:
    """The ACK of an event: the digest of its canonical form."""
    return make_ack(one["id"], receipt, digest_of(canonical_json(one)))


async def post_large(client: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str, Any]:
    """support.post_body for a body over 1 MiB (aiohttp wants it as a stream)."""
    headers = {"Content-Type": "application/json"}
    async with client.post(url, data=io.BytesIO(body), headers=headers) as response:
        return response.status, response.content_type, await response.json()


def binary_headers(one: Event) -> dict[str, str]:
    """`one`'s headers in binary mode (its data is the body)."""
    headers = {"ce-specversion": "1.0", "ce-id": one["id"], "ce-source": "urn:t"}
    headers.update({"ce-type": one["type"], "Content-Type": "application/json"})
    if "key" in one:
        headers["ce-partitionkey"] = one["key"]
    return headers


async def test_post_applies_then_duplicate_and_inventory_counts_once(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    status, _, first = await post_body(client, f"{sink_base}/events", EVENT)
    assert (status, first) == (200, previous_ack(EVENT))

    status, _, second = await post_body(client, f"{sink_base}/events", EVENT)
    assert (status, second) == (200, previous_ack(EVENT, Receipt.DUPLICATE))

    async with client.get(f"{sink_base}/inventory/snack") as response:
        assert response.status == 200
        assert await response.json() == {"sku": "snack", "qty": 7}
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]


async def test_get_event_reports_the_inbox_record(
    client: aiohttp.ClientSession, sink_base: str
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    await post_body(client, f"{sink_base}/events", {**EVENT, "id": "order-2"})
    await post_body(client, f"{sink_base}/events", EVENT)

    records = {}
    for event_id in ("order-1", "order-2"):
        async with client.get(f"{sink_base}/events/{event_id}") as response:
            assert response.status == 200
            records[event_id] = await response.json()
    first, second = records["order-1"], records["order-2"]
    assert (first["id"], first["deliveries"], second["deliveries"]) == ("order-1", 2, 1)
    # Applied first, so first in the order of application; the redelivery kept it.
    assert 1 <= first["applied_seq"] < second["applied_seq"]
    assert set(first) == {
        "id",
        "sha256",
        "received_at",
        "deliveries",
        "last_delivery_at",
        "applied_seq",
        "event",
    }
    # An order of the previous release is stored as the order.placed event it records.
    placed = order_event(EVENT)  # type: ignore[arg-type]
    assert first["event"] == placed
    assert first["sha256"] == digest_of(canonical_json(placed))

    async with client.get(f"{sink_base}/events/never-sent") as response:
        assert response.status == 404
        assert "error" in await response.json()


async def test_ack_is_already_committed_when_the_reply_arrives(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    async with client.post(f"{sink_base}/events", json=EVENT) as response:
        assert response.status == 200
        # Read before anything else runs on this loop, including the rest of the body.
        seen = db_rows(sink_db, "SELECT id FROM inbox_events")
        stock = db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'")
        ack = await response.json()
    assert seen == [("order-1",)]
    assert stock == [(7,)]
    assert ack["ack"] == "order-1"


async def test_reply_waits_for_the_commit(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{sink_base}/events", {"id": "warm-up", "sku": "other", "qty": 1})
    lock = sqlite3.connect(sink_db, timeout=5, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    sending = asyncio.create_task(post_body(client, f"{sink_base}/events", EVENT))
    try:
        done, _ = await asyncio.wait({sending}, timeout=0.5)
        assert not done, "the sink replied while it could not commit"
        assert db_rows(sink_db, "SELECT id FROM inbox_events WHERE id = 'order-1'") == []
        lock.execute("ROLLBACK")
        status, _, ack = await asyncio.wait_for(sending, 10)
    finally:
        lock.close()
        sending.cancel()
    assert (status, ack["ack"]) == (200, "order-1")
    assert db_rows(sink_db, "SELECT id FROM inbox_events WHERE id = 'order-1'") == [("order-1",)]


@pytest.mark.parametrize("changed", [{"qty": 8}, {"sku": "drink"}], ids=["qty", "sku"])
async def test_conflict_is_409_json_and_changes_nothing(
    client: aiohttp.ClientSession,
    sink_base: str,
    sink_db: Path,
    db_rows: Query,
    changed: dict[str, Any],
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    before = snapshot(sink_db)

    status, content_type, body = await post_body(
        client, f"{sink_base}/events", {**EVENT, **changed}
    )

    assert (status, content_type) == (409, "application/json")
    assert body["error"]
    assert snapshot(sink_db) == before


@pytest.mark.parametrize(
    "body",
    [b"{", b"not json", b"", b'{"id": "x", "sku": "snack", "qty": 7', b"\xff\xfe\x00"],
    ids=["open-brace", "text", "empty", "truncated", "not-utf8"],
)
async def test_malformed_json_is_400_json_and_changes_nothing(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query, body: bytes
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    before = snapshot(sink_db)

    status, content_type, reply = await post_body(client, f"{sink_base}/events", body)

    assert (status, content_type) == (400, "application/json")
    assert "JSON" in reply["error"]
    assert snapshot(sink_db) == before


async def test_deeply_nested_json_is_400_not_a_server_error(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    before = snapshot(sink_db)

    status, content_type, reply = await post_body(client, f"{sink_base}/events", b"[" * 5000)

    assert (status, content_type) == (400, "application/json")
    assert reply["error"]
    assert snapshot(sink_db) == before


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({**EVENT, "extra": 1}, "extra"),
        ({**EVENT, "qty": True}, "qty"),
        ({**EVENT, "qty": 7.0}, "qty"),
        ({**EVENT, "qty": 0}, "qty"),
        ({**EVENT, "qty": 1_000_001}, "qty"),
        ({"id": "order-2", "qty": 7}, "sku"),
        ({"sku": "snack", "qty": 7}, "id"),
        ({**EVENT, "id": "-x"}, "id"),
        ({**EVENT, "id": "x" * 129}, "id"),
        ({**EVENT, "sku": "s" * 65}, "sku"),
        ([EVENT], ""),
        (None, ""),
        ({**PAYMENT, "data": {"x": [{"y": 2**53}]}}, "/data/x/0/y"),
        ({**PAYMENT, "key": ""}, "/key"),
        ({**PAYMENT, "extra": 1}, "/extra"),
        ({"id": "e", "data": {}}, "/type"),
    ],
    ids=[
        "extra-field",
        "bool-qty",
        "float-qty",
        "zero-qty",
        "huge-qty",
        "missing-sku",
        "missing-id",
        "bad-id",
        "long-id",
        "long-sku",
        "array",
        "null",
        "event-big-int",
        "event-empty-key",
        "event-extra-field",
        "event-no-type",
    ],
)
async def test_schema_error_is_400_naming_the_field_and_changes_nothing(
    client: aiohttp.ClientSession,
    sink_base: str,
    sink_db: Path,
    db_rows: Query,
    event: object,
    field: str,
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    before = snapshot(sink_db)

    status, content_type, reply = await post_body(client, f"{sink_base}/events", event)

    assert (status, content_type) == (400, "application/json")
    assert reply["field"] == field
    # The place in the body: an order's field names a member of the body's root.
    assert reply["pointer"] == (field if field.startswith("/") or not field else f"/{field}")
    assert reply["error"]
    assert snapshot(sink_db) == before


async def test_body_over_the_default_cap_is_413_and_changes_nothing(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{sink_base}/events", EVENT)
    before = snapshot(sink_db)

    status, content_type, reply = await post_large(
        client, f"{sink_base}/events", padded({**EVENT, "id": "big"}, DEFAULT_CAP + 1)
    )

    assert (status, content_type) == (413, "application/json")
    assert reply["error"]
    assert snapshot(sink_db) == before


async def test_body_of_exactly_the_default_cap_is_accepted(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    status, _, reply = await post_large(client, f"{sink_base}/events", padded(EVENT, DEFAULT_CAP))

    assert (status, reply["status"]) == (200, "applied")
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory") == [(7,)]


async def test_configured_cap_applies_at_its_boundary(
    client: aiohttp.ClientSession, serve_sink: ServeSink, sink_db: Path, db_rows: Query
) -> None:
    base = await serve_sink(sink_db, max_body_bytes=200)

    status, content_type, _ = await post_body(
        client, f"{base}/events", padded({**EVENT, "id": "big"}, 201)
    )
    assert (status, content_type) == (413, "application/json")
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []

    status, _, reply = await post_body(client, f"{base}/events", padded(EVENT, 200))
    assert (status, reply["ack"]) == (200, "order-1")


async def test_chunked_body_over_the_cap_is_413_and_changes_nothing(
    client: aiohttp.ClientSession, serve_sink: ServeSink, sink_db: Path, db_rows: Query
) -> None:
    base = await serve_sink(sink_db, max_body_bytes=200)
    body = padded(EVENT, 4000)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 100):
            yield body[start : start + 100]

    headers = {"Content-Type": "application/json"}
    async with client.post(f"{base}/events", data=chunks(), headers=headers) as response:
        assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert response.status == 413
        assert "error" in await response.json()
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []
    assert db_rows(sink_db, "SELECT * FROM inbox_inventory") == []


async def test_storage_failure_is_503_json_and_changes_nothing(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    await post_body(client, f"{sink_base}/events", {"id": "first", "sku": "other", "qty": 1})
    conn = sqlite3.connect(sink_db, timeout=5, isolation_level=None)
    try:
        conn.execute(
            "CREATE TRIGGER fail BEFORE INSERT ON inbox_inventory"
            " BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
    finally:
        conn.close()
    before = snapshot(sink_db)

    status, content_type, reply = await post_body(client, f"{sink_base}/events", EVENT)

    assert (status, content_type) == (503, "application/json")
    assert reply["error"]
    assert snapshot(sink_db) == before


async def test_healthz_is_200(client: aiohttp.ClientSession, sink_base: str) -> None:
    async with client.get(f"{sink_base}/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}


async def test_unknown_route_is_404_json(client: aiohttp.ClientSession, sink_base: str) -> None:
    async with client.get(f"{sink_base}/nowhere") as response:
        assert (response.status, response.content_type) == (404, "application/json")
        assert (await response.json())["error"]


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/events"), ("PUT", "/events"), ("DELETE", "/inventory/snack")]
)
async def test_wrong_method_is_405_json(
    client: aiohttp.ClientSession,
    sink_base: str,
    sink_db: Path,
    db_rows: Query,
    method: str,
    path: str,
) -> None:
    async with client.request(method, f"{sink_base}{path}", json=EVENT) as response:
        assert (response.status, response.content_type) == (405, "application/json")
        assert (await response.json())["error"]
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []


@pytest.mark.parametrize("sku", ["bad!sku", "s" * 65], ids=["bad-char", "too-long"])
async def test_bad_sku_in_inventory_path_is_400(
    client: aiohttp.ClientSession, sink_base: str, sku: str
) -> None:
    async with client.get(f"{sink_base}/inventory/{sku}") as response:
        assert (response.status, response.content_type) == (400, "application/json")
        assert (await response.json())["field"] == "sku"


async def test_inventory_of_an_unknown_sku_is_zero(
    client: aiohttp.ClientSession, sink_base: str
) -> None:
    async with client.get(f"{sink_base}/inventory/never-seen") as response:
        assert response.status == 200
        assert await response.json() == {"sku": "never-seen", "qty": 0}


async def test_drop_after_commit_closes_without_reply_but_keeps_the_commit(
    client: aiohttp.ClientSession, serve_sink: ServeSink, sink_db: Path, db_rows: Query
) -> None:
    base = await serve_sink(sink_db, drop_after_commit=1)

    with pytest.raises(aiohttp.ClientError):
        await post_body(client, f"{base}/events", EVENT)

    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]

    status, _, ack = await post_body(client, f"{base}/events", EVENT)
    assert (status, ack["ack"], ack["status"]) == (200, "order-1", "duplicate")
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]


async def test_a_client_that_goes_away_mid_body_is_no_unexpected_error(
    sink_base: str,
    client: aiohttp.ClientSession,
    db_rows: Query,
    sink_db: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A publisher killed while sending: the headers promise a body that never comes.
    caplog.set_level(logging.INFO)
    url = yarl.URL(sink_base)
    _reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(
        f"POST /events HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        b'Content-Length: 500\r\n\r\n{"id": "half'
    )
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.transport.abort()
    for _ in range(50):  # the sink notices on its next loop turns
        await asyncio.sleep(0.02)
        if any("closed the connection" in r.getMessage() for r in caplog.records):
            break
    assert any("closed the connection" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    assert not any("unexpected error" in r.getMessage() for r in caplog.records)
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(0,)]
    status, _, _ = await post_body(
        client, f"{sink_base}/events", {"id": "next", "sku": "s", "qty": 1}
    )
    assert status == 200


# ---------------------------------------------------------- plain JSON events, binary mode


async def test_a_plain_event_is_applied_once_recorded_as_sent_and_shown_by_get(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    status, _, first = await post_body(client, f"{sink_base}/events", PAYMENT)
    assert (status, first) == (200, event_ack(PAYMENT))
    reordered = {**PAYMENT, "data": dict(reversed(list(PAYMENT["data"].items())))}
    status, _, again = await post_body(client, f"{sink_base}/events", reordered)
    assert (status, again) == (200, event_ack(PAYMENT, Receipt.DUPLICATE))

    assert db_rows(sink_db, "SELECT id, type, payload, deliveries FROM inbox_events") == [
        ("p-123", "payment.captured", canonical_json(PAYMENT), 2)
    ]
    assert db_rows(sink_db, "SELECT * FROM inbox_inventory") == []  # not an order: no effect
    async with client.get(f"{sink_base}/events/p-123") as response:
        record = await response.json()
    assert (record["event"], record["sha256"]) == (PAYMENT, first["sha256"])

    changed = {**PAYMENT, "data": {**PAYMENT["data"], "amount": 12.51}}
    status, _, reply = await post_body(client, f"{sink_base}/events", changed)
    assert (status, reply["error"], reply["id"]) == (409, "conflict", "p-123")


async def test_an_event_in_binary_mode_is_the_same_event_as_in_plain_json(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    data = json.dumps(PAYMENT["data"])
    async with client.post(
        f"{sink_base}/events", data=data, headers=binary_headers(PAYMENT)
    ) as response:
        assert (response.status, await response.json()) == (200, event_ack(PAYMENT))
    status, _, again = await post_body(client, f"{sink_base}/events", PAYMENT)
    assert (status, again) == (200, event_ack(PAYMENT, Receipt.DUPLICATE))

    keyless: Event = {"id": "k-0", "type": "tick", "data": {}}
    async with client.post(
        f"{sink_base}/events", data=b"{}", headers=binary_headers(keyless)
    ) as response:
        assert (response.status, await response.json()) == (200, event_ack(keyless))
    assert db_rows(sink_db, "SELECT id, payload FROM inbox_events ORDER BY applied_seq") == [
        ("p-123", canonical_json(PAYMENT)),
        ("k-0", '{"data":{},"id":"k-0","type":"tick"}'),
    ]


async def test_a_binary_event_refused_names_its_header_or_the_place_in_its_data(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    url = f"{sink_base}/events"
    headers = {**binary_headers(PAYMENT), "ce-id": "-bad"}
    async with client.post(url, data=b"{}", headers=headers) as response:
        reply = await response.json()
        assert (response.status, reply["field"], "pointer" in reply) == (400, "ce-id", False)
    body = b'{"lines": [1, 9007199254740992]}'
    async with client.post(url, data=body, headers=binary_headers(PAYMENT)) as response:
        reply = await response.json()
        assert (response.status, reply["field"], reply["pointer"]) == (
            400,
            "/data/lines/1",
            "/lines/1",
        )
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []


async def test_a_binary_event_with_a_header_given_twice_is_refused_and_nothing_applied(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    headers = CIMultiDict(binary_headers(PAYMENT))
    headers.add("ce-id", "p-other")
    async with client.post(f"{sink_base}/events", data=b"{}", headers=headers) as response:
        reply = await response.json()
    assert (response.status, reply["field"], reply["detail"]) == (400, "ce-id", "is given twice")
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []


async def test_an_order_of_the_previous_release_and_its_order_placed_event_are_one_event(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    first: Order = {"id": "o-1", "sku": "snack", "qty": 2}
    second: Order = {"id": "o-2", "sku": "snack", "qty": 3}
    url, batch_url = f"{sink_base}/events", f"{sink_base}/events/batch"

    # The previous release's order first, its event later (a publisher upgraded
    # after the sink resends it), and the other way round; one effect each.
    assert (await post_body(client, url, first))[2] == previous_ack(first)
    reply = (await post_body(client, url, order_event(first)))[2]
    assert reply == event_ack(order_event(first), Receipt.DUPLICATE)
    assert (await post_body(client, url, order_event(second)))[2] == event_ack(order_event(second))
    reply = (await post_body(client, batch_url, {"events": [second, first]}))[2]
    assert reply == {
        "acks": [
            previous_ack(second, Receipt.DUPLICATE),
            previous_ack(first, Receipt.DUPLICATE),
        ],
        "rejected": None,
    }

    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("o-1", 3),
        ("o-2", 2),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 5)]
    changed = {**first, "qty": 9}
    status, _, reply = await post_body(client, url, changed)
    assert (status, reply["id"]) == (409, "o-1")


async def test_a_batch_in_plain_json_may_mix_orders_and_events_each_acked_in_its_terms(
    client: aiohttp.ClientSession, sink_base: str, sink_db: Path, db_rows: Query
) -> None:
    order: Order = {"id": "o-1", "sku": "snack", "qty": 2}
    bad = {**PAYMENT, "id": "p-9", "data": {"n": [0, 2**60]}}
    body = {"events": [order, PAYMENT, bad, {"id": "o-3", "sku": "snack", "qty": 1}]}

    status, _, reply = await post_body(client, f"{sink_base}/events/batch", body)

    assert status == 200
    assert reply["acks"] == [previous_ack(order), event_ack(PAYMENT)]
    rejected = reply["rejected"]
    assert (rejected["index"], rejected["status"], rejected["error"]) == (2, 400, "invalid event")
    assert (rejected["field"], rejected["pointer"]) == ("/data/n/1", "/events/2/data/n/1")
    assert db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY applied_seq") == [
        ("o-1",),
        ("p-123",),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 2)]


async def test_applied_events_are_counted_by_type_the_first_50_types_each_apart(
    client: aiohttp.ClientSession, sink_base: str
) -> None:
    assert MAX_TYPE_LABELS == 50
    types = [f"type.{n}" for n in range(MAX_TYPE_LABELS + 3)]
    events = [{"id": f"e-{n}", "type": t, "data": {}} for n, t in enumerate(types)]
    events.append({"id": "e-again", "type": "type.0", "data": {}})
    for start in range(0, len(events), 16):
        body = {"events": events[start : start + 16]}
        status, _, reply = await post_body(client, f"{sink_base}/events/batch", body)
        assert (status, reply["rejected"]) == (200, None)
    await post_body(client, f"{sink_base}/events", EVENT)
    await post_body(client, f"{sink_base}/events", EVENT)  # a duplicate: not applied again

    samples = await scrape(client, f"{sink_base}/metrics")
    applied = {
        dict(labels)["type"]: count
        for (name, labels), count in samples.items()
        if name == "sink_events_applied_total"
    }
    # order.placed came after 50 others: it counts under OTHER_TYPES with the last 3.
    assert applied == {
        **{t: 1.0 for t in types[:MAX_TYPE_LABELS]},
        "type.0": 2.0,
        OTHER_TYPES: 4.0,
    }
