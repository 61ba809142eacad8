"""The operator console's routes on a real aiohttp server on loopback: the security
rules (sign-in, its throttle, session cookie, CSRF, headers, the sink's record shown
to operators only), bad input (on both backends where a backend could differ), the
live stream, its bounds and its end at shutdown. Outcomes are read from the database
with a connection of the test's own. The browser side is
tests/e2e/test_console_browser.py."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from support import LOOPBACK, eventually

from publisher.app import ServiceSettings, create_app
from publisher.console import ConsoleSettings
from publisher.console.api import SINK_HIDDEN
from publisher.console.app import SECURITY_HEADERS, STREAMS
from publisher.console.overview import SHOWN_LANES, SHOWN_LINES
from publisher.console.stream import MAX_STREAMS, OPERATOR_STREAMS
from publisher.console.throttle import FREE_FAILURES
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from publisher.store import Outbox

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

TOKEN = "console-operator-token-0123"
API = "/console/api"
UNREACHABLE = "http://127.0.0.1:9/events"  # the relay fails every send: entries stay put
JSON = {"Content-Type": "application/json"}


def console_app(
    db: Path | str,
    token: str | None = TOKEN,
    *,
    sink: str = UNREACHABLE,
    sink_token: str | None = None,
    relay: RelaySettings | None = None,
    **console: Any,
) -> web.Application:
    settings = ServiceSettings(
        db=str(db),
        sink=sink,
        token=sink_token,
        relay=relay or RelaySettings(poll_interval_s=0.05),
        console=ConsoleSettings(token=token, **console),
    )
    return create_app(settings)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, db: Path) -> str:
    """The outbox on each backend in turn: the SQLite file, or the test's PostgreSQL schema."""
    return str(db) if request.param == "sqlite" else str(request.getfixturevalue("pg_database"))


@pytest.fixture
async def base(serve: Serve, db: Path) -> str:
    return await serve(console_app(db))


async def call(
    client: aiohttp.ClientSession,
    method: str,
    url: str,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    data = None if body is None else aiohttp.JsonPayload(body)
    all_headers = {**JSON, **(headers or {})} if method == "POST" else headers or {}
    async with client.request(method, url, data=data, headers=all_headers) as reply:
        return reply.status, await reply.json(content_type=None), reply


async def order(client: aiohttp.ClientSession, base: str, event_id: str, sku: str = "tea") -> None:
    status, _, _ = await call(
        client, "POST", f"{base}/orders", {"id": event_id, "sku": sku, "qty": 1}
    )
    assert status == 201


async def sign_in(
    client: aiohttp.ClientSession, base: str, operator: str = "alice"
) -> dict[str, str]:
    """The headers of a signed-in page: its session cookie and CSRF token."""
    status, body, reply = await call(
        client, "POST", f"{base}{API}/sign-in", {"token": TOKEN, "operator": operator}
    )
    assert status == 200, body
    cookie = reply.cookies["outbox_console"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/console"
    assert not cookie["secure"]  # plain HTTP unless the service is told otherwise
    assert body == {
        "actions_enabled": True,
        "signed_in": True,
        "operator": operator,
        "csrf_token": body["csrf_token"],
    }
    return {"Cookie": f"outbox_console={cookie.value}", "X-CSRF-Token": body["csrf_token"]}


def tables(query: Query, db: Path) -> Callable[[], tuple[Any, ...]]:
    """What an action would change: the outbox states and the quarantine records."""

    def read() -> tuple[Any, ...]:
        outbox = query(db, "SELECT id, sent, quarantined FROM outbox_entries ORDER BY seq")
        return outbox, query(db, "SELECT * FROM outbox_quarantines ORDER BY n")

    return read


# ---------------------------------------------------------------- security


async def test_every_console_answer_carries_the_security_headers(
    client: aiohttp.ClientSession, base: str
) -> None:
    paths = [
        ("GET", "/console"),
        ("GET", "/console/static/console.js"),
        ("GET", "/console/static/console.css"),
        ("GET", f"{API}/overview"),
        ("GET", f"{API}/session"),
        ("GET", f"{API}/events/unknown-1"),
        ("GET", "/console/static/missing.js"),
        ("POST", f"{API}/events/unknown-1/quarantine"),
    ]
    for method, path in paths:
        async with client.request(method, base + path, headers=JSON, data=b"{}") as reply:
            for name, value in SECURITY_HEADERS.items():
                assert reply.headers.get(name) == value, (path, name)
    assert "'unsafe-inline'" not in SECURITY_HEADERS["Content-Security-Policy"]
    async with client.get(f"{base}/status") as reply:  # the service's other routes: as before
        assert "Content-Security-Policy" not in reply.headers


async def test_the_page_and_its_assets_hold_no_inline_script_or_style(
    client: aiohttp.ClientSession, base: str
) -> None:
    async with client.get(f"{base}/console") as reply:
        assert reply.content_type == "text/html"
        page = await reply.text()
    assert "<script>" not in page and "style=" not in page and " on" not in page.split("<body")[1]
    async with client.get(f"{base}/console/static/console.js") as reply:
        assert reply.content_type == "text/javascript"
        script = await reply.text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


async def test_an_unsigned_post_is_refused_and_changes_nothing(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    before = tables(db_rows, db)()
    for action, body in (("quarantine", {"reason": "x"}), ("redrive", {})):
        status, reply, _ = await call(client, "POST", f"{base}{API}/events/o-1/{action}", body)
        assert status == 403 and "sign in" in reply["error"]
        # A CSRF token alone is no session.
        fake = {"X-CSRF-Token": "x" * 43, "Cookie": "outbox_console=forged"}
        status, reply, _ = await call(
            client, "POST", f"{base}{API}/events/o-1/{action}", body, fake
        )
        assert status == 403
    status, _, _ = await call(client, "POST", f"{base}{API}/sign-out", {})
    assert status == 403
    assert tables(db_rows, db)() == before


async def test_a_signed_post_without_its_csrf_token_is_refused_and_changes_nothing(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    signed = await sign_in(client, base)
    before = tables(db_rows, db)()
    other = await sign_in(client, base, "bob")
    for csrf in (None, "", "wrong", other["X-CSRF-Token"]):  # another session's token too
        headers = {"Cookie": signed["Cookie"]}
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf
        url = f"{base}{API}/events/o-1/quarantine"
        status, reply, _ = await call(client, "POST", url, {"reason": "x"}, headers)
        assert status == 403 and "X-CSRF-Token" in reply["error"], csrf
    assert tables(db_rows, db)() == before


async def test_signed_actions_are_the_stores_and_name_the_operator(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    signed = await sign_in(client, base, "alice")
    url = f"{base}{API}/events/o-1"
    status, reply, _ = await call(
        client, "POST", f"{url}/quarantine", {"reason": "bad sku"}, signed
    )
    assert (status, reply) == (200, {"id": "o-1", "result": "quarantined", "by": "alice"})
    assert db_rows(db, "SELECT quarantined FROM outbox_entries WHERE id = 'o-1'") == [(1,)]
    assert db_rows(db, "SELECT reason, quarantined_by FROM outbox_quarantines") == [
        ("bad sku", "alice")
    ]
    status, reply, _ = await call(client, "POST", f"{url}/quarantine", {"reason": "again"}, signed)
    assert status == 409  # not pending any more: the store's InvalidTransition
    status, reply, _ = await call(client, "POST", f"{url}/redrive", {}, signed)
    assert status == 200 and reply["record"]["released_by"] == "alice"
    assert db_rows(db, "SELECT quarantined FROM outbox_entries WHERE id = 'o-1'") == [(0,)]
    assert db_rows(db, "SELECT released_by, released_as FROM outbox_quarantines") == [
        ("alice", "redriven")
    ]


async def test_the_longest_reason_is_taken_however_its_json_is_written(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    # 500 characters outside the BMP: a client that writes JSON in ASCII (Python's
    # json.dumps, aiohttp's JsonPayload) sends each as two 6-byte escapes, 12 bytes.
    reason = "\U0001f600" * 500
    assert len(json.dumps({"reason": reason}).encode()) > 4096
    await order(client, base, "o-1")
    signed = await sign_in(client, base, "alice")
    url = f"{base}{API}/events/o-1/quarantine"
    status, reply, _ = await call(client, "POST", url, {"reason": reason}, signed)
    assert status == 200, reply
    assert db_rows(db, "SELECT reason FROM outbox_quarantines") == [(reason,)]


async def test_a_nameless_sign_in_acts_as_console_and_sign_out_ends_the_session(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    status, body, reply = await call(client, "POST", f"{base}{API}/sign-in", {"token": TOKEN})
    assert status == 200 and body["operator"] == "console"
    signed = {
        "Cookie": f"outbox_console={reply.cookies['outbox_console'].value}",
        "X-CSRF-Token": body["csrf_token"],
    }
    url = f"{base}{API}/events/o-1/quarantine"
    assert (await call(client, "POST", url, {"reason": "r"}, signed))[0] == 200
    assert db_rows(db, "SELECT quarantined_by FROM outbox_quarantines") == [("console",)]
    status, body, _ = await call(client, "GET", f"{base}{API}/session", headers=signed)
    assert body["signed_in"] is True
    assert (await call(client, "POST", f"{base}{API}/sign-out", {}, signed))[0] == 200
    status, body, _ = await call(client, "GET", f"{base}{API}/session", headers=signed)
    assert body["signed_in"] is False and body["csrf_token"] is None
    redrive = f"{base}{API}/events/o-1/redrive"
    assert (await call(client, "POST", redrive, {}, signed))[0] == 403


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"token": "wrong-token-0123456789"}, 403),
        ({"token": TOKEN[:-1]}, 403),
        ({}, 403),
        ({"token": 7}, 403),
        ([TOKEN], 400),
        ({"token": TOKEN, "operator": "<b>x</b>"}, 400),
        ({"token": TOKEN, "operator": "x" * 65}, 400),
    ],
)
async def test_a_bad_sign_in_is_refused_without_a_cookie(
    client: aiohttp.ClientSession, base: str, body: object, status: int
) -> None:
    got, reply, response = await call(client, "POST", f"{base}{API}/sign-in", body)
    assert got == status and reply["error"]
    assert "outbox_console" not in response.cookies


async def test_without_a_token_no_action_is_possible_and_the_session_says_so(
    serve: Serve, client: aiohttp.ClientSession, db: Path, db_rows: Query
) -> None:
    base = await serve(console_app(db, token=None))
    await order(client, base, "o-1")
    before = tables(db_rows, db)()
    status, body, _ = await call(client, "GET", f"{base}{API}/session")
    assert body == {
        "actions_enabled": False,
        "signed_in": False,
        "operator": None,
        "csrf_token": None,
    }
    status, body, _ = await call(client, "POST", f"{base}{API}/sign-in", {"token": TOKEN})
    assert status == 403 and "actions are off" in body["error"]
    url = f"{base}{API}/events/o-1/quarantine"
    status, body, _ = await call(client, "POST", url, {"reason": "x"})
    assert status == 403 and "actions are off" in body["error"]
    assert tables(db_rows, db)() == before


async def test_another_origin_is_refused_and_the_consoles_own_only_under_console(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    signed = await sign_in(client, base)
    before = tables(db_rows, db)()
    url = f"{base}{API}/events/o-1/quarantine"
    for origin in ("http://evil.example", "null", base.replace("127.0.0.1", "localhost")):
        headers = {**signed, "Origin": origin}
        status, body, _ = await call(client, "POST", url, {"reason": "x"}, headers)
        assert (status, body.get("origin")) == (403, origin)
    order_body = {"id": "o-2", "sku": "tea", "qty": 1}
    status, _, _ = await call(client, "POST", f"{base}/orders", order_body, {"Origin": base})
    assert status == 403  # the console's page may call the console, nothing else
    assert tables(db_rows, db)() == before
    status, _, _ = await call(client, "POST", url, {"reason": "x"}, {**signed, "Origin": base})
    assert status == 200


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "query",
    [
        "state=bogus",
        "limit=0",
        "limit=1001",
        "limit=abc",
        "limit=-1",
        "after=-1",
        "after=1.5",
        "sku=bad%20sku",
        "key=bad%20key",
        "key=%2A%2A",
        "key=" + "k" * 129,
        "type=bad%20type",
        "type=payment%2Fcaptured",
        "type=" + "t" * 129,
        "id=-bad",
    ],
)
async def test_bad_paging_or_search_is_400(
    client: aiohttp.ClientSession, base: str, query: str
) -> None:
    status, body, _ = await call(client, "GET", f"{base}{API}/entries?{query}")
    assert status == 400 and body["error"]


async def test_unknown_or_malformed_events_and_bad_reasons(
    client: aiohttp.ClientSession, base: str, db: Path, db_rows: Query
) -> None:
    await order(client, base, "o-1")
    signed = await sign_in(client, base)
    status, body, _ = await call(client, "GET", f"{base}{API}/events/nobody")
    assert status == 404 and body["id"] == "nobody"
    status, body, _ = await call(client, "GET", f"{base}{API}/events/-bad")
    assert status == 400
    before = tables(db_rows, db)()
    url = f"{base}{API}/events/nobody/quarantine"
    assert (await call(client, "POST", url, {"reason": "x"}, signed))[0] == 404
    assert (await call(client, "POST", f"{base}{API}/events/nobody/redrive", {}, signed))[0] == 404
    url = f"{base}{API}/events/o-1/quarantine"
    for body in ({}, {"reason": ""}, {"reason": "  "}, {"reason": 5}, {"reason": "x" * 501}, []):
        status, reply, _ = await call(client, "POST", url, body, signed)
        assert (status, reply.get("field")) == (400, "reason"), body
    async with client.post(url, data=b"{nope", headers={**JSON, **signed}) as reply:
        assert reply.status == 400
    assert tables(db_rows, db)() == before


# ---------------------------------------------------------------- reads


async def test_entries_page_on_and_search_by_id_and_sku(
    client: aiohttp.ClientSession, base: str
) -> None:
    for n in range(5):
        await order(client, base, f"o-{n}", sku="tea" if n % 2 else "snack")
    url = f"{base}{API}/entries?state=pending&limit=2"
    seen: list[str] = []
    after = ""
    for _ in range(5):
        status, page, _ = await call(client, "GET", url + after)
        assert status == 200
        seen += [e["id"] for e in page["entries"]]
        if page["next_after"] is None:
            break
        after = f"&after={page['next_after']}"
    assert seen == [f"o-{n}" for n in range(5)]
    _, page, _ = await call(client, "GET", f"{base}{API}/entries?sku=tea")
    assert [e["id"] for e in page["entries"]] == ["o-1", "o-3"]
    _, page, _ = await call(client, "GET", f"{base}{API}/entries?id=o-2&state=sent")
    assert [(e["id"], e["state"]) for e in page["entries"]] == [("o-2", "pending")]
    _, page, _ = await call(client, "GET", f"{base}{API}/entries?id=o-9")
    assert page == {"entries": [], "next_after": None}


EVENTS: list[dict[str, Any]] = [
    {"id": "pay-1", "type": "payment.captured", "key": "cust-1", "data": {"amount": 1250}},
    {"id": "tick-1", "type": "clock.tick", "data": {"n": 1}},
    {"id": "pay-2", "type": "payment.captured", "key": "cust-2", "data": {"amount": 99}},
    {"id": "note-1", "type": "note.added", "key": "cust-1", "data": {"text": "<b>\u0007"}},
]


async def test_entries_of_any_type_are_listed_and_searched_by_type_and_key(
    client: aiohttp.ClientSession, base: str
) -> None:
    for event in EVENTS:
        assert (await call(client, "POST", f"{base}/events", event))[0] == 201

    async def ids(query: str) -> list[str]:
        status, page, _ = await call(client, "GET", f"{base}{API}/entries?{query}")
        assert status == 200, page
        return [e["id"] for e in page["entries"]]

    _, page, _ = await call(client, "GET", f"{base}{API}/entries")
    assert [{k: e.get(k) for k in ("id", "type", "key", "data")} for e in page["entries"]] == [
        {**event, "key": event.get("key")} for event in EVENTS
    ]
    assert "key" not in page["entries"][1] and "sku" not in page["entries"][0]
    assert await ids("type=payment.captured") == ["pay-1", "pay-2"]
    assert await ids("key=cust-1") == ["pay-1", "note-1"]
    assert await ids("sku=cust-1") == ["pay-1", "note-1"]  # its name when all were orders
    assert await ids("type=note.added&key=cust-1") == ["note-1"]
    assert await ids("key=%2A") == ["tick-1"]  # the events without a key
    assert await ids("type=no.such.type") == []

    status, body, _ = await call(client, "GET", f"{base}{API}/events/note-1")
    assert status == 200
    assert body["entry"]["type"] == "note.added" and body["entry"]["key"] == "cust-1"
    assert body["entry"]["data"] == EVENTS[3]["data"]
    assert body["trace"]["stages"][0]["proof"] == "proven"
    assert body["trace"]["stages"][0]["evidence"].startswith("event note.added key cust-1 data")


async def test_the_event_view_is_the_trace_the_cli_builds(
    client: aiohttp.ClientSession, base: str, db: Path
) -> None:
    await order(client, base, "o-1")
    signed = await sign_in(client, base)  # the sink is asked for an operator only
    status, body, _ = await call(client, "GET", f"{base}{API}/events/o-1", headers=signed)
    assert status == 200
    assert [s["name"] for s in body["trace"]["stages"]] == [
        "accepted",
        "queued",
        "received",
        "acknowledged",
        "marked",
    ]
    assert body["trace"]["stages"][2]["proof"] == "unknown"  # the sink cannot be reached
    assert "could not be asked" in body["trace"]["stages"][2]["evidence"]
    assert body["entry"]["state"] == "pending"


async def test_the_overview_counts_and_the_head(client: aiohttp.ClientSession, base: str) -> None:
    await order(client, base, "o-1")
    await order(client, base, "o-2")

    async def blocked() -> dict[str, Any]:
        return (await call(client, "GET", f"{base}{API}/overview"))[1]

    overview: dict[str, Any] = {}

    async def head_failed() -> bool:
        overview.update(await blocked())
        return bool(overview["head"] and overview["head"]["attempts"] >= 1)

    for _ in range(200):
        if await head_failed():
            break
        await asyncio.sleep(0.02)
    assert overview["pending"] == 2 and overview["quarantined"] == 0
    assert overview["head"]["id"] == "o-1" and overview["head"]["last_error"]
    assert overview["rate"]["interval_seconds"] > 0 and len(overview["rate"]["sent"]) == 30


async def test_the_overview_carries_the_first_blocked_lanes_and_their_count(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    # A sink that refuses a type blocks a lane per key: the overview, sent to every
    # open page each second, stays bounded however many there are.
    relay = RelaySettings(
        poll_interval_s=0.05, ordering="key", retry=RetryPolicy(base_s=0.01, cap_s=0.05)
    )
    base = await serve(console_app(db, relay=relay))
    keys = SHOWN_LANES + 10
    for n in range(keys):
        event = {"id": f"e-{n}", "type": "thing.done", "key": f"k-{n}", "data": {}}
        assert (await call(client, "POST", f"{base}/events", event))[0] == 201
    overview: dict[str, Any] = {}

    async def read() -> None:
        overview.update((await call(client, "GET", f"{base}{API}/overview"))[1])

    async def all_blocked() -> bool:
        await read()
        return bool(overview["blocked_lanes_count"] == keys)

    for _ in range(400):
        if await all_blocked():
            break
        await asyncio.sleep(0.05)
    assert overview["blocked_lanes_count"] == keys
    assert len(overview["blocked_lanes"]) == SHOWN_LANES
    assert [lane["lane"] for lane in overview["blocked_lanes"]] == [
        f"k-{n}" for n in range(SHOWN_LANES)
    ]
    assert len(overview["lines"]) <= SHOWN_LINES
    assert overview["lines_held"] >= len(overview["lines"])


async def test_the_overview_carries_the_first_lines_held_and_their_count(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    # Workers of other processes hold more lines than the overview carries.
    held = SHOWN_LINES + 5
    async with Outbox.open(str(db)) as outbox:
        for n in range(held):
            assert await outbox.take_lease(f"k-{n}", "other-worker", 60.0) is not None
    base = await serve(console_app(db))
    status, overview, _ = await call(client, "GET", f"{base}{API}/overview")
    assert status == 200, overview
    assert len(overview["lines"]) == SHOWN_LINES
    assert overview["lines_held"] >= held
    assert "other-worker" in overview["workers"]


# ---------------------------------------------------------------- the live stream


async def read_event(reply: aiohttp.ClientResponse) -> tuple[str, str]:
    """The next server-sent event: (name, data)."""
    name = data = ""
    async for raw in reply.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif not line and name:
            return name, data
    raise AssertionError("the stream ended")


async def start_runner(app: web.Application) -> tuple[web.AppRunner, str]:
    # aiohttp's own shutdown timeout (60 s): a stream left open would hold the stop.
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def test_the_stream_pushes_the_overview_and_shutdown_ends_it_at_once(
    client: aiohttp.ClientSession, db: Path
) -> None:
    app = console_app(db, stream_interval_s=0.1)
    runner, base = await start_runner(app)
    try:
        await order(client, base, "o-1")
        async with client.get(f"{base}{API}/stream") as reply:
            assert reply.content_type == "text/event-stream"
            assert reply.headers["X-Frame-Options"] == "DENY"
            name, data = await read_event(reply)
            assert name == "overview" and '"pending": 1' in data
            await order(client, base, "o-2")
            for _ in range(50):
                name, data = await read_event(reply)
                if '"pending": 2' in data:
                    break
            else:
                raise AssertionError("the stream never showed the second order")
            started = time.monotonic()
            await asyncio.wait_for(runner.cleanup(), 10)
            assert time.monotonic() - started < 3.0
            assert await reply.content.read() in (b"", b"\n")  # ended by the server
    finally:
        await runner.cleanup()


async def test_a_stream_ends_when_its_client_goes_and_their_number_is_bounded(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    app = console_app(db, stream_interval_s=0.05)
    base = await serve(app)
    streams = app[STREAMS]
    async with client.get(f"{base}{API}/stream") as reply:
        await read_event(reply)
        assert streams.open == 1
    await eventually(lambda: streams.open == 0, 5.0)
    streams.open = MAX_STREAMS  # as if that many pages were open
    status, body, _ = await call(client, "GET", f"{base}{API}/stream")
    assert status == 503 and "live views" in body["error"]


async def test_without_the_console_its_routes_are_not_served(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    settings = ServiceSettings(db=str(db), sink=UNREACHABLE, console=None)
    base = await serve(create_app(settings))
    for path in ("/console", f"{API}/overview", "/console/static/console.js"):
        async with client.get(base + path) as reply:
            assert reply.status == 404, path


# ---------------------------------------------------------------- issue 32: hardening


@pytest.mark.parametrize(
    "reason",
    [
        "lone \ud800 surrogate",  # no UTF-8 encoder writes it: was a 500 on both backends
        "nul \x00 inside",  # PostgreSQL refuses it in text: was a 503 that never succeeds
        "forged\r\n2026-01-01 00:00:00 INFO line",
        "escape \x1b[31m red",
    ],
)
async def test_a_reason_no_record_may_carry_is_400_on_both_backends(
    serve: Serve, client: aiohttp.ClientSession, location: str, db_rows: Query, reason: str
) -> None:
    base = await serve(console_app(location))
    await order(client, base, "o-1")
    signed = await sign_in(client, base)
    before = tables(db_rows, location)()
    url = f"{base}{API}/events/o-1/quarantine"
    status, body, _ = await call(client, "POST", url, {"reason": reason}, signed)
    assert (status, body["field"]) == (400, "reason"), body
    assert "control character or lone surrogate" in body["error"]
    assert tables(db_rows, location)() == before
    status, body, _ = await call(client, "POST", url, {"reason": "a reason"}, signed)
    assert status == 200  # the same entry, a reason a record may carry


async def test_wrong_tokens_slow_their_client_down_and_no_other(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    base = await serve(console_app(db, sign_in_wait_s=1.0))
    url = f"{base}{API}/sign-in"
    for _ in range(FREE_FAILURES + 1):  # the free ones, and one that starts a wait
        status, body, _ = await call(client, "POST", url, {"token": "guess-0123456789"})
        assert status == 403 and body["error"] == "wrong operator token"
    started = time.monotonic()
    # While it waits, nothing it sends is looked at: the right token neither.
    status, body, reply = await call(client, "POST", url, {"token": TOKEN})
    assert status == 429 and body == {
        "error": "too many wrong tokens from this address: try again in 1 s"
    }
    assert reply.headers["Retry-After"] == "1" and "outbox_console" not in reply.cookies
    # Another client (another loopback address) is not slowed down.
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=other, cookie_jar=aiohttp.DummyCookieJar()) as two:
        assert (await call(two, "POST", url, {"token": TOKEN}))[0] == 200
    await asyncio.sleep(max(0.0, 1.05 - (time.monotonic() - started)))
    await sign_in(client, base)  # the wait is over; a success forgets the failures
    for _ in range(FREE_FAILURES):
        assert (await call(client, "POST", url, {"token": "guess-0123456789"}))[0] == 403


async def test_a_client_past_its_free_failures_gets_one_guess_per_wait(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    """About 1,750 guesses a second before; now, over one second of trying as fast as
    it can, a client past its free failures has one guess looked at."""
    base = await serve(console_app(db, sign_in_wait_s=0.5))
    url = f"{base}{API}/sign-in"
    for _ in range(FREE_FAILURES):
        await call(client, "POST", url, {"token": "guess-0123456789"})
    looked_at = throttled = 0
    ends_at = time.monotonic() + 1.0
    for _ in range(2000):
        if time.monotonic() >= ends_at:
            break
        status, _, _ = await call(client, "POST", url, {"token": "guess-0123456789"})
        looked_at += status == 403
        throttled += status == 429
    # The first guess (then a 0.5 s wait), the next after it (then 1 s): at most two.
    assert 1 <= looked_at <= 2 and throttled >= 10, (looked_at, throttled)


async def test_the_cookie_is_secure_when_the_console_is_served_over_tls(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    base = await serve(console_app(db, cookie_secure=True))
    status, body, reply = await call(client, "POST", f"{base}{API}/sign-in", {"token": TOKEN})
    assert status == 200
    cookie = reply.cookies["outbox_console"]
    assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"
    signed = {"Cookie": f"outbox_console={cookie.value}", "X-CSRF-Token": body["csrf_token"]}
    status, _, reply = await call(client, "POST", f"{base}{API}/sign-out", {}, signed)
    assert status == 200 and reply.cookies["outbox_console"]["secure"]


SINK_TOKEN = "sink-token-0123456789abcdef"


async def test_the_sinks_record_is_shown_to_a_signed_in_operator_only(
    serve: Serve,
    serve_sink: ServeSink,
    client: aiohttp.ClientSession,
    db: Path,
    sink_db: Path,
    db_rows: Query,
) -> None:
    sink = await serve_sink(sink_db, token=SINK_TOKEN)
    base = await serve(console_app(db, sink=f"{sink}/events", sink_token=SINK_TOKEN))
    await order(client, base, "o-1")
    await eventually(
        lambda: db_rows(db, "SELECT sent FROM outbox_entries WHERE id = 'o-1'") == [(1,)]
    )
    status, body, _ = await call(client, "GET", f"{base}{API}/events/o-1")
    assert status == 200
    received = body["trace"]["stages"][2]
    assert received == {"name": "received", "proof": "unknown", "evidence": SINK_HIDDEN}
    assert "deliveries" not in json.dumps(body)  # nothing of the sink's record
    signed = await sign_in(client, base)
    status, body, _ = await call(client, "GET", f"{base}{API}/events/o-1", headers=signed)
    received = body["trace"]["stages"][2]
    assert received["proof"] == "proven" and "in the sink's inbox since" in received["evidence"]


@pytest.fixture
async def odd_sink(serve: Serve) -> AsyncIterator[Callable[[object], str]]:
    """A sink that refuses every delivery (503) and answers GET /events/{id} with an
    inbox record whose received_at is whatever the test set: returns its URL."""
    received_at: list[object] = [None]

    async def lookup(request: web.Request) -> web.Response:
        record = {"id": request.match_info["id"], "received_at": received_at[0]}
        record |= {"deliveries": 1, "sha256": "0" * 64}
        return web.Response(text=json.dumps(record), content_type="application/json")

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": "not now"}, status=503)

    app = web.Application()
    app.router.add_get("/events/{id}", lookup)
    app.router.add_post("/events", refuse)
    url = f"{await serve(app)}/events"

    def with_received_at(value: object) -> str:
        received_at[0] = value
        return url

    yield with_received_at


@pytest.mark.parametrize("received_at", ["yesterday", 1e20, -1e20, math.nan, [1]])
async def test_a_sink_record_with_an_odd_time_is_shown_not_a_500(
    serve: Serve,
    client: aiohttp.ClientSession,
    db: Path,
    odd_sink: Callable[[object], str],
    received_at: object,
) -> None:
    base = await serve(console_app(db, sink=odd_sink(received_at)))
    await order(client, base, "o-1")
    signed = await sign_in(client, base)
    status, body, _ = await call(client, "GET", f"{base}{API}/events/o-1", headers=signed)
    assert status == 200, body
    received = body["trace"]["stages"][2]
    assert received["name"] == "received" and received["proof"] != "proven"


async def test_an_entry_waiting_its_turn_waits_and_a_failing_or_quarantined_one_does_not(
    serve: Serve, client: aiohttp.ClientSession, db: Path, db_rows: Query
) -> None:
    # One entry per request in one line: o-2 is never sent while o-1, ahead, fails.
    base = await serve(console_app(db, relay=RelaySettings(poll_interval_s=0.05, batch=False)))
    await order(client, base, "o-1")
    await order(client, base, "o-2")
    await eventually(
        lambda: db_rows(db, "SELECT attempts FROM outbox_entries WHERE id = 'o-1'")[0][0] > 0
    )

    async def event(event_id: str) -> Any:
        status, body, _ = await call(client, "GET", f"{base}{API}/events/{event_id}")
        assert status == 200, body
        return body

    waiting = await event("o-2")
    assert waiting["entry"]["attempts"] == 0
    # The sink cannot be reached: received is unknown, which is no wait.
    assert waiting["trace"]["stages"][2]["proof"] == "unknown"
    assert waiting["waiting_stages"] == ["acknowledged", "marked"]
    assert (await event("o-1"))["waiting_stages"] == []  # its sends fail: not merely waiting
    signed = await sign_in(client, base)
    url = f"{base}{API}/events/o-2/quarantine"
    assert (await call(client, "POST", url, {"reason": "stop"}, signed))[0] == 200
    quarantined = await event("o-2")
    assert quarantined["entry"]["state"] == "quarantined"
    assert quarantined["waiting_stages"] == []


async def read_first_event(client: aiohttp.ClientSession, url: str, **kw: Any) -> Any:
    reply = await client.get(url, **kw)
    if reply.status == 200:
        await read_event(reply)
    return reply


async def test_some_live_views_are_kept_for_signed_in_operators(
    serve: Serve, client: aiohttp.ClientSession, db: Path
) -> None:
    app = console_app(db, stream_interval_s=0.2)
    base = await serve(app)
    url = f"{base}{API}/stream"
    anonymous = MAX_STREAMS - OPERATOR_STREAMS
    opened = [await read_first_event(client, url) for _ in range(anonymous)]
    try:
        assert [reply.status for reply in opened] == [200] * anonymous
        status, body, _ = await call(client, "GET", url)
        assert status == 503 and "sign in" in body["error"]
        signed = await sign_in(client, base)
        operators = [await read_first_event(client, url, headers=signed) for _ in range(2)]
        opened += operators
        assert [reply.status for reply in operators] == [200, 200]
        assert app[STREAMS].open == anonymous + 2
    finally:
        for reply in opened:
            reply.close()
    await eventually(lambda: app[STREAMS].open == 0, 5.0)
