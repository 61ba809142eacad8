"""The bearer token between publisher and sink, and the publisher's allowed hosts.

The sink is the real create_app served on 127.0.0.1; the state is read back from
its file with independent connections.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from support import placed

from publisher.errors import DeliveryError, NotAcknowledged, Rejected, TargetNotAllowed
from publisher.http import HttpSender
from publisher.targets import check_target

if TYPE_CHECKING:
    from conftest import Query, ServeSink

TOKEN = "correct-horse-battery-staple-42"
WRONG = "correct-horse-battery-staple-43"
EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
PLACED = placed("order-1", "snack", 7)  # EVENT as the sender sends it
UNAUTHORIZED = re.compile(r"^sink_unauthorized_requests_total\s+(\S+)$", re.MULTILINE)


@pytest.fixture
async def base(serve_sink: ServeSink, sink_db: Path) -> str:
    return await serve_sink(sink_db, token=TOKEN)


def auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


async def post_event(
    client: aiohttp.ClientSession, base: str, headers: dict[str, str], body: object = EVENT
) -> tuple[int, Mapping[str, str], bytes]:
    async with client.post(f"{base}/events", json=body, headers=headers) as response:
        return response.status, response.headers, await response.read()


async def get(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with client.get(url, headers=headers or {}) as response:
        return response.status, await response.text()


async def unauthorized_count(client: aiohttp.ClientSession, base: str) -> float:
    status, text = await get(client, f"{base}/metrics")
    assert status == 200
    match = UNAUTHORIZED.search(text)
    assert match is not None, text
    return float(match[1])


def nothing_applied(db_rows: Query, sink_db: Path) -> None:
    assert db_rows(sink_db, "SELECT * FROM inbox_events") == []
    assert db_rows(sink_db, "SELECT * FROM inbox_inventory") == []


# ---------------------------------------------------------------- the sink


@pytest.mark.parametrize(
    "headers",
    [
        {},
        auth(WRONG),
        auth(""),
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"X-Token": TOKEN},
    ],
    ids=["missing", "wrong", "empty", "no-scheme", "basic", "prefix", "other-header"],
)
async def test_post_without_the_right_token_is_401_and_changes_nothing(
    base: str,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    headers: dict[str, str],
) -> None:
    status, reply_headers, body = await post_event(client, base, headers)

    assert status == 401
    assert reply_headers["WWW-Authenticate"] == "Bearer"
    assert reply_headers["Content-Type"].startswith("application/json")
    parsed = json.loads(body)
    assert isinstance(parsed, dict) and parsed.get("error"), parsed
    assert TOKEN not in body.decode()
    nothing_applied(db_rows, sink_db)
    assert await unauthorized_count(client, base) == 1


async def test_missing_wrong_right(
    base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    assert (await post_event(client, base, {}))[0] == 401
    assert (await post_event(client, base, auth(WRONG)))[0] == 401
    nothing_applied(db_rows, sink_db)
    assert await unauthorized_count(client, base) == 2

    status, _, body = await post_event(client, base, auth(TOKEN))

    assert status == 200, body
    assert json.loads(body)["ack"] == "order-1"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]
    assert await unauthorized_count(client, base) == 2


async def test_the_scheme_is_case_insensitive(base: str, client: aiohttp.ClientSession) -> None:
    status, _, body = await post_event(client, base, {"Authorization": f"bearer {TOKEN}"})
    assert status == 200, body


async def test_a_wrong_token_is_refused_before_the_body_is_judged(
    base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    """An invalid or oversized body without a token is 401, not 400 or 413."""
    assert (await post_event(client, base, {}, {"id": "bad id!"}))[0] == 401
    big = {"id": "big", "sku": "snack", "qty": 1, "pad": "x" * 40_000}
    assert (await post_event(client, base, auth(WRONG), big))[0] == 401
    nothing_applied(db_rows, sink_db)
    assert await unauthorized_count(client, base) == 2


async def test_a_duplicate_with_the_token_is_still_a_duplicate(
    base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    assert (await post_event(client, base, auth(TOKEN)))[0] == 200
    assert (await post_event(client, base, {}))[0] == 401
    status, _, body = await post_event(client, base, auth(TOKEN))
    assert status == 200
    assert json.loads(body)["status"] == "duplicate"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


async def test_batch_needs_the_token(
    base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    url = f"{base}/events/batch"
    async with client.post(url, json={"events": [EVENT]}) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
    nothing_applied(db_rows, sink_db)
    async with client.post(url, json={"events": [EVENT]}, headers=auth(TOKEN)) as response:
        assert response.status == 200
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


async def test_healthz_and_metrics_are_open(base: str, client: aiohttp.ClientSession) -> None:
    status, text = await get(client, f"{base}/healthz")
    assert status == 200
    assert json.loads(text) == {"status": "ok"}
    status, text = await get(client, f"{base}/metrics")
    assert status == 200
    assert "sink_inbox_received_total" in text
    assert await unauthorized_count(client, base) == 0


async def test_reads_need_the_token(
    base: str, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    assert (await post_event(client, base, auth(TOKEN)))[0] == 200
    for path in ("/events/order-1", "/inventory/snack"):
        for headers in ({}, auth(WRONG)):
            status, text = await get(client, f"{base}{path}", headers)
            assert status == 401, (path, headers)
            assert "order-1" not in text and '"qty"' not in text, text
    assert await unauthorized_count(client, base) == 4

    status, text = await get(client, f"{base}/events/order-1", auth(TOKEN))
    assert status == 200
    assert json.loads(text)["deliveries"] == 1
    status, text = await get(client, f"{base}/inventory/snack", auth(TOKEN))
    assert status == 200
    assert json.loads(text) == {"sku": "snack", "qty": 7}


async def test_without_a_token_setting_the_sink_is_open(
    serve_sink: ServeSink, tmp_path: Path, client: aiohttp.ClientSession
) -> None:
    open_base = await serve_sink(tmp_path / "open.db")
    assert (await post_event(client, open_base, {}))[0] == 200


# ---------------------------------------------------------------- the publisher's sender


async def test_sender_with_the_token_delivers(base: str, sink_db: Path, db_rows: Query) -> None:
    async with HttpSender(f"{base}/events", token=TOKEN) as sender:
        ack = await sender.deliver(PLACED)
        record = await sender.lookup("order-1")

    assert ack["ack"] == "order-1"
    assert record is not None and record["deliveries"] == 1
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


async def test_sender_batch_with_the_token_delivers(
    base: str, sink_db: Path, db_rows: Query
) -> None:
    events = [PLACED, placed("order-2", "juice", 2)]
    async with HttpSender(f"{base}/events", token=TOKEN) as sender:
        results = await sender.deliver_batch(events)

    assert [r["ack"] for r in results if isinstance(r, dict)] == ["order-1", "order-2"]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("juice", 2),
        ("snack", 7),
    ]


@pytest.mark.parametrize("token", [None, WRONG], ids=["no-token", "wrong-token"])
async def test_sender_without_the_right_token_is_not_acknowledged(
    base: str,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    token: str | None,
) -> None:
    async with HttpSender(f"{base}/events", token=token) as sender:
        with pytest.raises(NotAcknowledged) as raised:
            await sender.deliver(PLACED)

    error = raised.value
    assert not isinstance(error, Rejected)
    assert error.status == 401
    assert error.retryable is True
    assert "401" in str(error)
    nothing_applied(db_rows, sink_db)
    assert await unauthorized_count(client, base) == 1


async def test_sender_lookup_without_the_token_is_an_error(base: str) -> None:
    async with HttpSender(f"{base}/events") as sender:
        with pytest.raises(NotAcknowledged) as raised:
            await sender.lookup("order-1")
    assert raised.value.status == 401


# ---------------------------------------------------------------- allowed hosts (no traffic)

REMOTE = "http://sink.invalid:1/events"


def test_a_non_loopback_sink_is_refused_by_default() -> None:
    with pytest.raises(TargetNotAllowed) as raised:
        HttpSender(REMOTE)
    assert raised.value.retryable is False
    assert isinstance(raised.value, DeliveryError)


def test_a_non_loopback_sink_is_refused_even_with_a_token() -> None:
    with pytest.raises(TargetNotAllowed):
        HttpSender(REMOTE, token=TOKEN)


@pytest.mark.parametrize("allowed", [["sink.invalid"], ["SINK.INVALID"], ["other", "sink.invalid"]])
def test_an_allowed_host_can_be_constructed(allowed: list[str]) -> None:
    sender = HttpSender(REMOTE, allowed_hosts=allowed, token=TOKEN)
    assert sender.url.host == "sink.invalid"
    assert sender.url.port == 1


def test_an_allowed_host_may_use_https() -> None:
    target = check_target("https://sink.invalid/events", ["sink.invalid"])
    assert target.scheme == "https"


@pytest.mark.parametrize(
    "url",
    [
        "http://other.invalid:1/events",
        "http://sink.invalid.evil.invalid/events",
        "http://evil.invalid/events?next=sink.invalid",
        "http://sink.invalid@evil.invalid/events",
        "http://10.0.0.1/events",
        "http://0.0.0.0:8080/events",
    ],
)
def test_an_allowed_host_does_not_open_other_hosts(url: str) -> None:
    with pytest.raises(TargetNotAllowed):
        check_target(url, ["sink.invalid"])
    with pytest.raises(TargetNotAllowed):
        HttpSender(url, allowed_hosts=["sink.invalid"])


@pytest.mark.parametrize(
    "url",
    [
        "http://sink.invalid:1/events/",
        "http://sink.invalid:1/events?x=1",
        "ftp://sink.invalid/events",
        "http://user:pw@sink.invalid/events",
    ],
)
def test_an_allowed_host_still_needs_a_proper_url(url: str) -> None:
    with pytest.raises(TargetNotAllowed):
        check_target(url, ["sink.invalid"])


def test_loopback_stays_allowed_next_to_an_allowed_host() -> None:
    assert check_target("http://127.0.0.1:9/events", ["sink.invalid"]).host == "127.0.0.1"
