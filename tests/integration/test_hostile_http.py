"""Requests a hostile or confused client sends, against both services on loopback.

Each answer is a 4xx with a JSON body that says what was wrong, and each refused
request changes nothing: the database files are read back with connections of
this test. Malformed HTTP goes over raw sockets.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from support import LOOPBACK, raw_get

from plumbing.host_guard import HttpGuard
from plumbing.http_errors import json_errors
from plumbing.http_limits import HttpLimits
from plumbing.serving import handler_options, start_site
from plumbing.storage import StorageError
from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import Query, Serve

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
HUGE = "1" + "0" * 5000  # over Python's 4,300-digit limit for int()
JSON = {"Content-Type": "application/json"}
TOKEN = "intake-token-0123456789"

Snapshot = dict[str, list[tuple[Any, ...]]]


# ---------------------------------------------------------------- fixtures


ServeHardened = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve_hardened() -> AsyncIterator[ServeHardened]:
    """Serve an app as serve_app does (JSON parser errors, connection cap)."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, limits: HttpLimits | None = None) -> str:
        limits = limits or HttpLimits()
        options = handler_options(limits, access_log=False)
        runner = web.AppRunner(app, shutdown_timeout=1.0, **options)
        await runner.setup()
        runners.append(runner)
        await start_site(runner, LOOPBACK, 0, limits, options)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def sink(serve_hardened: ServeHardened, sink_db: Path) -> str:
    return await serve_hardened(create_sink(sink_db))


StartPublisher = Callable[..., Awaitable[str]]


@pytest.fixture
def start_publisher(serve_hardened: ServeHardened, db: Path, sink: str) -> StartPublisher:
    async def start(**settings: Any) -> str:
        relay = RelaySettings(poll_interval_s=0.1, retry=RetryPolicy(base_s=0.05, cap_s=0.3))
        app = create_publisher(
            ServiceSettings(db=str(db), sink=f"{sink}/events", relay=relay, **settings)
        )
        return await serve_hardened(app)

    return start


@pytest.fixture
async def publisher(start_publisher: StartPublisher) -> str:
    return await start_publisher()


def state(db_rows: Query, sink_db: Path, source_db: Path) -> Snapshot:
    """Every row either service keeps, read with fresh connections."""
    found: Snapshot = {}
    for db, tables in (
        (sink_db, ("inbox_events", "inbox_inventory")),
        (source_db, ("outbox_orders", "outbox_entries")),
    ):
        if db.exists():
            for table in tables:
                found[f"{db.name}:{table}"] = db_rows(db, f"SELECT * FROM {table}")
    return found


Unchanged = Callable[[], None]


@pytest.fixture
def unchanged(db_rows: Query, sink_db: Path, db: Path) -> Callable[[], Unchanged]:
    """`check = unchanged()` before, `check()` after: both files hold the same rows."""

    def take() -> Unchanged:
        before = state(db_rows, sink_db, db)

        def check() -> None:
            assert state(db_rows, sink_db, db) == before

        return check

    return take


async def post_bytes(
    client: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    """POST `body` as it is; (status, the JSON reply, which it must be, its headers)."""
    async with client.post(url, data=body, headers=JSON if headers is None else headers) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json(), r.headers


def no_unexpected_errors(caplog: pytest.LogCaptureFixture) -> None:
    assert not any("unexpected error" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"


def huge_event() -> bytes:
    return f'{{"id": "order-1", "sku": "snack", "qty": {HUGE}}}'.encode()


# ---------------------------------------------------------------- item 1: huge integers


async def test_an_integer_over_the_digit_limit_is_400_naming_the_field(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = unchanged()
    for url in (f"{sink}/events", f"{publisher}/orders"):
        status, body, _ = await post_bytes(client, url, huge_event())
        assert status == 400, body
        assert body["field"] == "qty"
        assert "5,001 digits" in body["detail"]

    status, body, _ = await post_bytes(
        client, f"{sink}/events/batch", b'{"events": [%s]}' % huge_event()
    )
    assert status == 200
    assert body["acks"] == []
    assert body["rejected"]["status"] == 400
    assert body["rejected"]["field"] == "qty"

    envelope = f'{{"events": {HUGE}}}'.encode()
    status, body, _ = await post_bytes(client, f"{sink}/events/batch", envelope)
    assert status == 400
    assert "events" in body["error"]
    check()
    no_unexpected_errors(caplog)


# ---------------------------------------------------------------- item 6: duplicate keys

DUPLICATES = {
    "id": b'{"id": "a", "id": "b", "sku": "snack", "qty": 1}',
    "qty": b'{"id": "a", "sku": "snack", "qty": 1, "qty": 2}',
}


@pytest.mark.parametrize("key", sorted(DUPLICATES))
async def test_a_repeated_key_is_400_on_both_services(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    key: str,
) -> None:
    check = unchanged()
    for url in (f"{sink}/events", f"{publisher}/orders"):
        status, body, _ = await post_bytes(client, url, DUPLICATES[key])
        assert status == 400, body
        assert body["field"] == key
        assert body["pointer"] == f"/{key}"
        assert "duplicate key" in body["error"]
    check()


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": [{"id": "a", "sku": "s", "qty": 1}], "events": []}',
        b'{"events": [{"id": "a", "sku": "s", "qty": 1}, {"id": "b", "id": "c", "sku": "s", '
        b'"qty": 1}]}',
    ],
    ids=["envelope", "second-item"],
)
async def test_a_repeated_key_in_a_batch_is_400_and_applies_nothing(
    client: aiohttp.ClientSession, sink: str, unchanged: Callable[[], Unchanged], body: bytes
) -> None:
    check = unchanged()
    status, reply, _ = await post_bytes(client, f"{sink}/events/batch", body)
    assert status == 400, reply
    assert "duplicate key" in reply["error"]
    check()


def nested(depth: int) -> bytes:
    """An event whose data holds arrays `depth` deep: past 255, orjson reads it (up to
    1,024) but cannot write it back."""
    return b'{"id": "deep-1", "type": "t.x", "data": {"a": %s%s}}' % (b"[" * depth, b"]" * depth)


@pytest.mark.parametrize("depth", [300, 1000])
async def test_nesting_orjson_cannot_write_back_is_400_on_both_services(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    caplog: pytest.LogCaptureFixture,
    depth: int,
) -> None:
    check = unchanged()
    deep = nested(depth)
    bodies = {
        f"{sink}/events": deep,
        f"{sink}/events/batch": b'{"events": [%s]}' % deep,
        f"{publisher}/events": deep,
        f"{publisher}/events/batch": b'{"events": [%s]}' % deep,
        f"{publisher}/orders": b'{"id": "o-1", "sku": "s", "qty": 1, "z": %s%s}'
        % (b"[" * depth, b"]" * depth),
    }
    for url, body in bodies.items():
        status, reply, _ = await post_bytes(client, url, body)
        if url == f"{sink}/events/batch" and status == 200:  # applied up to the bad item
            status = reply["rejected"]["status"]
        elif url == f"{publisher}/events/batch" and status == 200:  # answered per event
            status = 400 if reply["results"][0]["result"] == "invalid" else 200
        assert status == 400, (url, reply)
    check()
    no_unexpected_errors(caplog)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
async def test_json_in_utf16_or_utf32_is_400_on_both_services(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    encoding: str,
) -> None:
    check = unchanged()
    event = '{"id": "u-1", "type": "t.x", "data": {}}'
    for url in (f"{sink}/events", f"{publisher}/events", f"{publisher}/orders"):
        status, reply, _ = await post_bytes(client, url, event.encode(encoding))
        assert status == 400, (url, reply)
        assert "must be UTF-8" in reply["detail"]
    check()


async def test_ce_headers_without_a_spec_version_are_400_at_the_sink(
    client: aiohttp.ClientSession, sink: str, unchanged: Callable[[], Unchanged]
) -> None:
    """Binary mode is told by ce-specversion; other ce-* headers without it are not
    read as a plain event that ignores them."""
    check = unchanged()
    headers = {**JSON, "ce-id": "bin-1", "ce-type": "t.x", "ce-source": "urn:x"}
    event = b'{"id": "bin-1", "type": "t.x", "data": {}}'
    for body in (b'{"a": 1}', event):
        status, reply, _ = await post_bytes(client, f"{sink}/events", body, headers)
        assert status == 400, reply
        assert reply["field"] == "ce-specversion"
    check()


# ---------------------------------------------------------------- item 2: Content-Encoding

PLAIN = json.dumps(EVENT).encode()
ENCODED = {
    "gzip-plain": ("gzip", PLAIN),
    "gzip-real": ("gzip", gzip.compress(PLAIN)),
    "deflate-plain": ("deflate", PLAIN),
    "deflate-real": ("deflate", zlib.compress(PLAIN)),
    "br": ("br", PLAIN),
    "unknown": ("x-unheard-of", PLAIN),
}


@pytest.mark.parametrize("case", sorted(ENCODED))
async def test_a_content_encoding_is_415_with_json_on_both_services(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    encoding, body = ENCODED[case]
    check = unchanged()
    for url in (f"{sink}/events", f"{publisher}/orders"):
        async with client.post(
            url, data=body, headers={**JSON, "Content-Encoding": encoding}
        ) as response:
            assert response.content_type == "application/json"
            reply = await response.json()
            assert response.status in (400, 415), reply
            assert "Content-Encoding" in reply["error"]
    check()
    no_unexpected_errors(caplog)


async def test_identity_encoding_is_plain(client: aiohttp.ClientSession, sink: str) -> None:
    headers = {**JSON, "Content-Encoding": "identity"}
    status, body, _ = await post_bytes(client, f"{sink}/events", PLAIN, headers)
    assert (status, body["ack"]) == (200, "order-1")


# ---------------------------------------------------------------- item 3: Authorization bytes


async def test_an_authorization_header_that_is_not_utf8_is_401_and_counted(
    serve_hardened: ServeHardened,
    sink_db: Path,
    unchanged: Callable[[], Unchanged],
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = yarl.URL(await serve_hardened(create_sink(sink_db, token=TOKEN)))
    check = unchanged()
    request = (
        f"POST /events HTTP/1.1\r\nHost: {base.host}:{base.port}\r\n".encode()
        + b"Authorization: Bearer \xff\xfe\xc3(-not-utf8\r\n"
        + b"Content-Type: application/json\r\nConnection: close\r\n"
        + b"Content-Length: %d\r\n\r\n%s" % (len(PLAIN), PLAIN)
    )
    status, headers, body = await raw(base, request)
    assert status == 401, body
    assert headers["content-type"].startswith("application/json")
    assert headers["www-authenticate"] == "Bearer"
    assert "bearer token" in json.loads(body)["error"]
    metrics = await raw(base, raw_get(f"{base.host}:{base.port}", "/metrics"))
    assert b"sink_unauthorized_requests_total 1.0" in metrics[2]
    check()
    no_unexpected_errors(caplog)


# ---------------------------------------------------------------- item 13: its own predecessor


async def test_outbox_after_naming_its_own_event_is_400_at_once(
    client: aiohttp.ClientSession, sink: str, unchanged: Callable[[], Unchanged]
) -> None:
    check = unchanged()
    cases = [
        (f"{sink}/events", EVENT, "order-1"),
        (f"{sink}/events/batch", {"events": [EVENT]}, "order-1"),
        (f"{sink}/events/batch", {"events": [EVENT, {**EVENT, "id": "order-2"}]}, "order-2"),
        # Even an item that is itself invalid can never be there before its request.
        (f"{sink}/events/batch", {"events": [EVENT, {"id": "order-3"}]}, "order-3"),
    ]
    for url, body, after in cases:
        started = time.monotonic()
        headers = {**JSON, "Outbox-After": after}
        status, reply, _ = await post_bytes(client, url, json.dumps(body).encode(), headers)
        assert time.monotonic() - started < 1.0, "waited for the predecessor"
        assert status == 400, reply
        assert reply["after"] == after
        assert reply["field"] == "Outbox-After"
    check()


# ---------------------------------------------------------------- item 9: the browser boundary


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_post_that_is_not_declared_json_is_415_on_both_services(
    client: aiohttp.ClientSession,
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    content_type: str | None,
) -> None:
    check = unchanged()
    headers = {} if content_type is None else {"Content-Type": content_type}
    batch = json.dumps({"events": [EVENT]}).encode()
    for url, body in (
        (f"{sink}/events", PLAIN),
        (f"{sink}/events/batch", batch),
        (f"{publisher}/orders", PLAIN),
    ):
        async with client.post(
            url, data=body, headers=headers, skip_auto_headers=["Content-Type"]
        ) as r:
            assert r.status == 415
            assert "application/json" in (await r.json())["error"]
    check()


async def test_json_with_a_charset_parameter_is_accepted(
    client: aiohttp.ClientSession, publisher: str
) -> None:
    headers = {"Content-Type": "application/json; charset=utf-8"}
    status, body, _ = await post_bytes(client, f"{publisher}/orders", PLAIN, headers)
    assert (status, body["result"]) == (201, "accepted")


@pytest.mark.parametrize("path", ["/orders", "/status", "/healthz"])
async def test_a_foreign_host_header_is_421_dns_rebinding(
    publisher: str, sink: str, unchanged: Callable[[], Unchanged], path: str
) -> None:
    check = unchanged()
    for base, route in ((yarl.URL(publisher), path), (yarl.URL(sink), "/events")):
        # Names are compared, not ports (a port mapping): tests/integration/test_host_guard.py.
        for host in (f"evil.example:{base.port}", "evil.example", "127.0.0.1.evil.example"):
            status, headers, body = await raw(base, request_to(route, host, PLAIN))
            assert status == 421, body
            assert headers["content-type"].startswith("application/json")
            assert json.loads(body)["host"] == host
    check()


async def test_loopback_names_and_configured_names_are_allowed_hosts(
    serve_hardened: ServeHardened, sink_db: Path, db_rows: Query
) -> None:
    guard = HttpGuard.of(host_names=["Sink.Internal"])
    base = yarl.URL(await serve_hardened(create_sink(sink_db, guard=guard)))
    hosts = [f"127.0.0.1:{base.port}", f"localhost:{base.port}", f"LOCALHOST:{base.port}"]
    hosts += ["sink.internal", f"sink.internal:{base.port}"]
    for n, host in enumerate(hosts):
        event = json.dumps({**EVENT, "id": f"order-{n}"}).encode()
        status, _, body = await raw(base, request_to("/events", host, event))
        assert status == 200, (host, body)
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(len(hosts),)]


async def test_an_origin_is_403_unless_allowed(
    serve_hardened: ServeHardened,
    client: aiohttp.ClientSession,
    publisher: str,
    db: Path,
    sink: str,
    unchanged: Callable[[], Unchanged],
    db_rows: Query,
) -> None:
    check = unchanged()
    for url in (f"{publisher}/orders", f"{sink}/events"):
        for origin in ("http://evil.example", "null", publisher):
            status, body, _ = await post_bytes(client, url, PLAIN, {**JSON, "Origin": origin})
            assert status == 403, body
            assert body["origin"] == origin
    async with client.get(f"{publisher}/status", headers={"Origin": "http://evil.example"}) as r:
        assert r.status == 403
    check()

    allowed = "https://ops.example"
    guard = HttpGuard.of(origins=[allowed])
    other = await serve_hardened(create_sink(db.with_name("other-sink.db"), guard=guard))
    status, body, _ = await post_bytes(
        client, f"{other}/events", PLAIN, {**JSON, "Origin": allowed}
    )
    assert (status, body["ack"]) == (200, "order-1")


async def test_the_intake_token_guards_post_orders(
    client: aiohttp.ClientSession,
    start_publisher: StartPublisher,
    unchanged: Callable[[], Unchanged],
    db_rows: Query,
    db: Path,
) -> None:
    publisher = await start_publisher(intake_token=TOKEN)
    check = unchanged()
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": TOKEN},
    ):
        status, body, reply_headers = await post_bytes(
            client, f"{publisher}/orders", PLAIN, {**JSON, **headers}
        )
        assert status == 401, body
        assert reply_headers["WWW-Authenticate"] == "Bearer"
    check()
    auth = {**JSON, "Authorization": f"Bearer {TOKEN}"}
    status, body, _ = await post_bytes(client, f"{publisher}/orders", PLAIN, auth)
    assert (status, body["result"]) == (201, "accepted")
    assert db_rows(db, "SELECT id FROM outbox_orders") == [("order-1",)]
    async with client.get(f"{publisher}/status") as response:  # reads stay open
        assert response.status == 200


# ---------------------------------------------------------------- item 5: parser errors


def request_to(path: str, host: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def raw(
    base: yarl.URL, request: bytes, timeout_s: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as it is; the reply's status, headers (lower-case) and body."""
    assert base.host is not None and base.port is not None
    reader, writer = await asyncio.open_connection(base.host, base.port)
    try:
        writer.write(request)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(1 << 20), timeout_s)
        while True:  # until the server closes (every request here says close)
            more = await asyncio.wait_for(reader.read(1 << 20), timeout_s)
            if not more:
                break
            reply += more
    finally:
        writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def malformed(base: yarl.URL) -> dict[str, bytes]:
    host = f"Host: {base.host}:{base.port}\r\n".encode()
    return {
        "two-content-lengths": b"POST /events HTTP/1.1\r\n"
        + host
        + b"Content-Type: application/json\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "negative-content-length": b"POST /events HTTP/1.1\r\n"
        + host
        + b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n",
        "long-url": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n",
        "long-header": b"GET /healthz HTTP/1.1\r\n"
        + host
        + b"X-Long: "
        + b"a" * 9000
        + b"\r\n\r\n",
        "many-headers": b"GET /healthz HTTP/1.1\r\n"
        + host
        + b"".join(b"X-%d: 1\r\n" % n for n in range(200))
        + b"\r\n",
        "nul-in-header": b"GET /healthz HTTP/1.1\r\n" + host + b"X-Nul: a\x00b\r\n\r\n",
        "unknown-method": b"FROB /healthz HTTP/1.1\r\n" + host + b"\r\n",
        "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n",
        "bad-chunk": b"POST /events HTTP/1.1\r\n"
        + host
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"zz\r\nab\r\n0\r\n\r\n",
    }


CASES = [
    "two-content-lengths",
    "negative-content-length",
    "long-url",
    "long-header",
    "many-headers",
    "nul-in-header",
    "unknown-method",
    "garbage",
    "bad-chunk",
]


@pytest.mark.parametrize("case", CASES)
async def test_what_the_parser_refuses_is_answered_in_json(
    sink: str,
    publisher: str,
    unchanged: Callable[[], Unchanged],
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    check = unchanged()
    for base in (yarl.URL(sink), yarl.URL(publisher)):
        request = malformed(base)[case]
        status, headers, body = await raw(base, request)
        assert 400 <= status < 500, body
        assert headers["content-type"].startswith("application/json"), (headers, body)
        reply = json.loads(body)
        assert set(reply) <= {"error", "detail"}, reply
        assert isinstance(reply["error"], str)
        assert b"aaaa" not in body and b"X-Nul" not in body and b"FROB" not in body
    check()
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"


async def test_a_405_carries_allow(sink: str, publisher: str) -> None:
    for base, path, allowed in (
        (yarl.URL(sink), "/events", "POST"),
        (yarl.URL(publisher), "/orders", "POST"),
        (yarl.URL(publisher), "/status", "GET"),
    ):
        request = (
            f"DELETE {path} HTTP/1.1\r\nHost: {base.host}:{base.port}\r\nConnection: close\r\n\r\n"
        )
        status, headers, body = await raw(base, request.encode())
        assert status == 405, body
        assert headers["content-type"].startswith("application/json")
        assert allowed in headers["allow"]
        assert "error" in json.loads(body)


@pytest.mark.parametrize("content_type", [None, "text/plain"])
async def test_a_post_to_a_route_without_post_is_405_or_404_whatever_its_body(
    client: aiohttp.ClientSession, sink: str, publisher: str, content_type: str | None
) -> None:
    # The body rules are for routes that take a body: the router's answer comes first.
    headers = {} if content_type is None else {"Content-Type": content_type}
    for url, status in (
        (f"{sink}/metrics", 405),
        (f"{publisher}/status", 405),
        (f"{sink}/nowhere", 404),
    ):
        async with client.post(url, data=b"x", headers=headers) as reply:
            assert reply.status == status, await reply.text()
            assert reply.content_type == "application/json"
            if status == 405:
                assert "GET" in reply.headers["Allow"]


# ---------------------------------------------------------------- item 11: storage log lines


async def test_a_failing_database_is_logged_once_per_interval(
    serve: Serve, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: web.Request) -> web.Response:
        raise StorageError("disk I/O error")

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/broken", broken)
    base = await serve(app)
    caplog.set_level(logging.INFO)
    for _ in range(50):
        async with client.get(f"{base}/broken") as response:
            assert response.status == 503
            assert "storage" in (await response.json())["error"]
    lines = [r for r in caplog.records if "storage failed" in r.getMessage()]
    assert len(lines) == 1
