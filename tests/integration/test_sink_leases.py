"""Outbox-Lease over HTTP: the sink reads the header on both write routes, refuses a
malformed one (400) and a stale one (409 with the fenced lease), applies nothing of
either, counts and logs the stale ones.

The real sink (create_app) on loopback, over each backend in turn (a SQLite file in
tmp_path, a fresh PostgreSQL database), read back through connections of the test's
own. The transaction rules themselves are the inbox behaviour suite's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support import post_events, scrape, value

from shared import GLOBAL_LINE, LEASE_HEADER, Event, Lease, order_event
from sink import create_app

Serve = Callable[..., Awaitable[str]]
Query = Callable[..., list[tuple[Any, ...]]]
SOURCE = "a1b2c3d4e5f60718"
Route = str  # "event" or "batch"
ROUTES = pytest.mark.parametrize("route", ["event", "batch"])


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "sink.db")
    else:
        yield request.getfixturevalue("pg_database")


@pytest.fixture
async def sink(serve: Serve, location: str) -> AsyncIterator[str]:
    yield await serve(create_app(location))


def event(event_id: str, sku: str) -> Event:
    """An order as the `order.placed` event a publisher sends (here as plain JSON)."""
    return order_event({"id": event_id, "sku": sku, "qty": 1})


def lease(epoch: int, line: str = GLOBAL_LINE) -> dict[str, str]:
    return {LEASE_HEADER: Lease(SOURCE, line, epoch).header()}


@pytest.fixture
def rows(db_rows: Query, location: str) -> Callable[[str], list[tuple[Any, ...]]]:
    """Rows of the sink's database, read through a connection of the test's own."""
    return lambda sql: db_rows(location, sql)


REFUSED_BY = {
    "lease": "sink_fenced_requests_total",  # fencing: a stale lease epoch, 409
    "predecessor": "sink_predecessor_missing_requests_total",  # the predecessor check, 412
}


async def metric(client: aiohttp.ClientSession, base: str, refused_by: str) -> float:
    return value(await scrape(client, f"{base}/metrics"), REFUSED_BY[refused_by])


Rows = Callable[[str], list[tuple[Any, ...]]]


@ROUTES
@pytest.mark.parametrize(
    "value",
    ["", "a b", f"{SOURCE} * 0", f"{SOURCE} * x", f"{SOURCE} t/ea 3", "bad/source * 1"],
)
async def test_a_malformed_lease_is_400_naming_the_header_and_applies_nothing(
    client: aiohttp.ClientSession, sink: str, rows: Rows, route: Route, value: str
) -> None:
    status, body = await post_events(
        client, sink, route, [event("e1", "tea")], {LEASE_HEADER: value}
    )

    assert status == 400, body
    assert body["field"] == LEASE_HEADER
    assert LEASE_HEADER in body["error"] and body["detail"]
    assert rows("SELECT id, deliveries FROM inbox_events ORDER BY id") == []
    async with client.get(f"{sink}/events/e1") as response:
        assert response.status == 404


@ROUTES
async def test_a_stale_lease_is_409_with_the_fenced_lease_and_applies_nothing(
    client: aiohttp.ClientSession, sink: str, rows: Rows, route: Route
) -> None:
    assert (await post_events(client, sink, route, [event("e1", "tea")], lease(5)))[0] == 200
    before = (
        rows("SELECT id, deliveries FROM inbox_events ORDER BY id"),
        rows("SELECT sku, qty FROM inbox_inventory"),
    )

    status, body = await post_events(
        client,
        sink,
        route,
        [event("e2", "tea"), event("e1", "tea")][: 1 if route == "event" else 2],
        lease(4),
    )

    assert status == 409
    assert set(body) == {"error", "fenced"}
    assert body["fenced"] == {"source": SOURCE, "line": GLOBAL_LINE, "epoch": 4, "seen": 5}
    assert "stale" in body["error"] and "nothing was applied" in body["error"]
    assert (
        rows("SELECT id, deliveries FROM inbox_events ORDER BY id"),
        rows("SELECT sku, qty FROM inbox_inventory"),
    ) == before
    assert await metric(client, sink, "lease") == 1
    assert await metric(client, sink, "predecessor") == 0


@ROUTES
async def test_a_stale_duplicate_gets_no_ack(
    client: aiohttp.ClientSession, sink: str, rows: Rows, route: Route
) -> None:
    assert (await post_events(client, sink, route, [event("e1", "tea")], lease(1, "tea")))[0] == 200
    assert (await post_events(client, sink, route, [event("e2", "tea")], lease(2, "tea")))[0] == 200

    status, body = await post_events(client, sink, route, [event("e1", "tea")], lease(1, "tea"))

    assert status == 409, body
    assert body["fenced"]["seen"] == 2
    assert rows("SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("e1", 1),
        ("e2", 1),
    ]  # the delivery not counted


async def test_a_request_without_a_lease_is_applied_and_get_is_unchanged(
    client: aiohttp.ClientSession, sink: str, location: str
) -> None:
    assert (await post_events(client, sink, "event", [event("e1", "tea")], lease(9)))[0] == 200
    status, body = await post_events(
        client, sink, "batch", [event("e2", "tea"), event("e3", "tea")], {}
    )

    assert status == 200 and body["rejected"] is None
    async with client.get(f"{sink}/events/e2") as response:
        record = await response.json()
    assert set(record) == {
        "id",
        "sha256",
        "received_at",
        "deliveries",
        "last_delivery_at",
        "applied_seq",
        "event",
    }
    assert await metric(client, sink, "lease") == 0


@ROUTES
async def test_the_line_of_a_lease_may_be_any_key_up_to_128_characters(
    client: aiohttp.ClientSession, sink: str, rows: Rows, route: Route
) -> None:
    key = "k" * 128
    keyed: Event = {"id": "e1", "type": "thing.done", "key": key, "data": {}}
    status, body = await post_events(client, sink, route, [keyed], lease(1, key))
    assert status == 200, body
    assert rows("SELECT line, epoch FROM inbox_lease_fences") == [(key, 1)]

    too_long = {LEASE_HEADER: f"{SOURCE} {key}k 1"}
    status, body = await post_events(client, sink, route, [{**keyed, "id": "e2"}], too_long)
    assert (status, body["field"]) == (400, LEASE_HEADER)
    assert rows("SELECT id FROM inbox_events") == [("e1",)]


async def test_stale_requests_are_logged_once_per_line_with_a_count(
    client: aiohttp.ClientSession, sink: str, caplog: pytest.LogCaptureFixture
) -> None:
    await post_events(client, sink, "event", [event("e1", "tea")], lease(3))
    await post_events(client, sink, "event", [event("s1", "soap")], lease(3, "soap"))
    with caplog.at_level(logging.WARNING, logger="sink.app"):
        for n in range(5):
            assert (await post_events(client, sink, "event", [event(f"x{n}", "tea")], lease(2)))[
                0
            ] == 409
        assert (await post_events(client, sink, "event", [event("y", "tea")], lease(1, "soap")))[
            0
        ] == 409

    lines = [r for r in caplog.records if r.name == "sink.app" and "stale" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in lines]  # one per line, not per request
    assert "epoch 2 of line '*'" in lines[0].getMessage()
    assert await metric(client, sink, "lease") == 6
