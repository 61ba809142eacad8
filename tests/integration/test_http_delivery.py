"""HttpSender and send_http against the real sink and against servers that misbehave."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import pytest
from aiohttp import web
from support import padded, placed

from publisher import DeliveryError, HttpSender, NotAcknowledged, Rejected, TargetNotAllowed
from publisher.http import LOOKUP_REPLY_BYTES, MAX_REPLY_BYTES, send_http
from shared import Event, payload_digest
from sink.app import create_app

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink, StartRaw

EVENT: Event = placed("order-1", "snack", 7)
ACK: dict[str, str] = {"ack": "order-1", "status": "applied"}
FAST_FAIL_S = 2.0
PROXIES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ServeHandler = Callable[[Handler], Awaitable[str]]


@pytest.fixture
def serve_events(serve: Serve) -> ServeHandler:
    """A loopback server whose POST /events is `handler`; returns the /events URL."""

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/events", handler)
        base = await serve(app, handler_cancellation=True)
        return f"{base}/events"

    return start


def replying(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, status=status, headers=headers)

    return handler


def as_event(fields: Mapping[str, object]) -> Event:
    """A fresh copy, typed as an Event even when it breaks the rules on purpose."""
    return cast(Event, dict(fields))


async def deliver(url: str, event: Mapping[str, object] = EVENT, **options: Any) -> bool:
    async with HttpSender(url, **options) as send:
        return await send(as_event(event))


# ---------------------------------------------------------------- verified ACKs


async def test_verified_ack_from_the_real_sink_is_true(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"

    async with HttpSender(url) as send:
        assert await send(as_event(EVENT)) is True
        again = await send.deliver(as_event(EVENT))
        assert await send(placed("order-2", "snack", 5)) is True

    assert (again["ack"], again["status"]) == ("order-1", "duplicate")
    assert again["sha256"] == payload_digest(EVENT)
    assert db_rows(tmp_path / "sink.db", "SELECT qty FROM inbox_inventory") == [(12,)]


async def test_send_http_returns_true_for_a_verified_ack(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"

    assert await send_http(url, as_event(EVENT)) is True
    assert db_rows(tmp_path / "sink.db", "SELECT id, deliveries FROM inbox_events") == [
        ("order-1", 1)
    ]


async def test_ack_without_digest_from_another_server_is_accepted(
    serve_events: ServeHandler,
) -> None:
    url = await serve_events(replying(json.dumps(ACK).encode()))
    assert await deliver(url) is True


# ---------------------------------------------------------------- replies that are not ACKs


@pytest.mark.parametrize(
    "body",
    [
        {"ack": "order-2", "status": "applied"},
        {"ack": "ORDER-1", "status": "applied"},
        {"status": "applied"},
        {"ack": "order-1"},
        {"ack": "order-1", "status": "conflict"},
        {"ack": "order-1", "status": "applied", "sha256": "0" * 64},
        ["order-1", "applied"],
        "order-1",
    ],
    ids=[
        "wrong-id",
        "wrong-case-id",
        "no-id",
        "no-status",
        "bad-status",
        "wrong-digest",
        "array",
        "string",
    ],
)
async def test_reply_that_is_not_an_ack_for_this_id_is_not_acknowledged(
    serve_events: ServeHandler, body: object
) -> None:
    url = await serve_events(replying(json.dumps(body).encode()))

    with pytest.raises(NotAcknowledged) as caught:
        await deliver(url)

    assert caught.value.status == 200
    assert caught.value.retryable is True
    assert not isinstance(caught.value, Rejected)


@pytest.mark.parametrize(
    "body", [b"ok", b"", b"\xff\xfe", b"<html>ok</html>"], ids=["text", "empty", "bytes", "html"]
)
async def test_non_json_200_is_not_acknowledged(serve_events: ServeHandler, body: bytes) -> None:
    url = await serve_events(replying(body))

    with pytest.raises(NotAcknowledged):
        await deliver(url)


async def test_deeply_nested_json_200_is_not_acknowledged(serve_events: ServeHandler) -> None:
    url = await serve_events(replying(b"[" * 4000))

    with pytest.raises(NotAcknowledged):
        await deliver(url)


async def test_valid_ack_with_another_success_status_is_not_acknowledged(
    serve_events: ServeHandler,
) -> None:
    url = await serve_events(replying(json.dumps(ACK).encode(), status=201))

    with pytest.raises(NotAcknowledged) as caught:
        await deliver(url)
    assert caught.value.status == 201


async def test_compressed_reply_is_not_inflated(serve_events: ServeHandler) -> None:
    bomb = gzip.compress(json.dumps(ACK).encode() + b" " * 2_000_000)
    assert len(bomb) < MAX_REPLY_BYTES
    url = await serve_events(replying(bomb, headers={"Content-Encoding": "gzip"}))

    with pytest.raises(NotAcknowledged):
        await deliver(url)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_error_is_not_acknowledged_and_retryable(
    serve_events: ServeHandler, status: int
) -> None:
    url = await serve_events(replying(json.dumps(ACK).encode(), status=status))

    with pytest.raises(NotAcknowledged) as caught:
        await deliver(url)

    assert caught.value.status == status
    assert caught.value.retryable is True
    assert not isinstance(caught.value, Rejected)


# ---------------------------------------------------------------- redirects


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_redirect_is_not_acknowledged_and_never_followed(serve: Serve, code: int) -> None:
    landed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        location = str(request.url.with_path("/landing"))
        return web.Response(status=code, headers={"Location": location})

    async def landing(request: web.Request) -> web.Response:
        landed.append(request.method)
        return web.json_response(ACK)

    app = web.Application()
    app.router.add_post("/events", redirect)
    app.router.add_route("*", "/landing", landing)
    base = await serve(app)

    with pytest.raises(NotAcknowledged) as caught:
        await deliver(f"{base}/events")

    assert caught.value.status == code
    assert landed == []


# ---------------------------------------------------------------- reply size cap


async def test_reply_with_content_length_over_the_cap_is_not_acknowledged(
    serve_events: ServeHandler,
) -> None:
    url = await serve_events(replying(padded(ACK, MAX_REPLY_BYTES + 1)))

    with pytest.raises(NotAcknowledged, match="cap"):
        await deliver(url)


async def test_reply_of_exactly_the_cap_is_accepted(serve_events: ServeHandler) -> None:
    url = await serve_events(replying(padded(ACK, MAX_REPLY_BYTES)))
    assert await deliver(url) is True


async def test_configured_reply_cap_is_applied(serve_events: ServeHandler) -> None:
    url = await serve_events(replying(padded(ACK, 100)))

    assert await deliver(url, max_reply_bytes=100) is True
    with pytest.raises(NotAcknowledged, match="cap"):
        await deliver(url, max_reply_bytes=99)


def chunked(parts: list[bytes]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in parts:
            await response.write(part)
        await response.write_eof()
        return response

    return handler


def split(body: bytes, size: int = 1000) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


async def test_chunked_reply_over_the_cap_is_not_acknowledged(
    serve_events: ServeHandler,
) -> None:
    url = await serve_events(chunked(split(padded(ACK, MAX_REPLY_BYTES + 1))))

    with pytest.raises(NotAcknowledged, match="cap"):
        await deliver(url)


async def test_chunked_reply_of_exactly_the_cap_is_accepted(serve_events: ServeHandler) -> None:
    url = await serve_events(chunked(split(padded(ACK, MAX_REPLY_BYTES))))
    assert await deliver(url) is True


async def test_endless_chunked_reply_fails_fast(serve_events: ServeHandler) -> None:
    written: list[int] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        await response.write(json.dumps(ACK).encode())
        with contextlib.suppress(ConnectionError):
            for _ in range(100_000):
                if loop.time() > deadline:
                    break
                await response.write(b" " * 1024)
                written.append(1024)
                await asyncio.sleep(0.001)
        return response

    url = await serve_events(endless)
    started = time.monotonic()

    with pytest.raises(NotAcknowledged, match="cap"):
        await deliver(url)

    assert time.monotonic() - started < FAST_FAIL_S
    assert written, "the server did not get to stream"


# ---------------------------------------------------------------- rejections by the real sink


async def test_invalid_event_rejected_by_the_sink_is_not_retryable(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"

    with pytest.raises(Rejected) as caught:
        await deliver(url, {**EVENT, "type": "order placed"})

    assert (caught.value.status, caught.value.retryable) == (400, False)
    assert db_rows(tmp_path / "sink.db", "SELECT * FROM inbox_events") == []


async def test_conflict_rejected_by_the_sink_is_not_retryable(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"
    assert await deliver(url) is True

    with pytest.raises(Rejected) as caught:
        await deliver(url, placed("order-1", "snack", 8))

    assert (caught.value.status, caught.value.retryable) == (409, False)
    assert db_rows(tmp_path / "sink.db", "SELECT qty FROM inbox_inventory") == [(7,)]


async def test_oversized_event_rejected_by_the_sink_is_not_retryable(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db', max_body_bytes=30)}/events"

    with pytest.raises(Rejected) as caught:
        await deliver(url)

    assert (caught.value.status, caught.value.retryable) == (413, False)
    assert db_rows(tmp_path / "sink.db", "SELECT * FROM inbox_events") == []


# ---------------------------------------------------------------- no reply at all


@pytest.mark.parametrize("mode", ["close-on-accept", "close-after-request"])
async def test_connection_closed_without_reply_is_a_delivery_error(
    raw_server: StartRaw, mode: Any
) -> None:
    server = await raw_server(mode)

    with pytest.raises(DeliveryError) as caught:
        await deliver(f"http://127.0.0.1:{server.port}/events")

    assert not isinstance(caught.value, NotAcknowledged)
    assert caught.value.retryable is True
    assert server.connections >= 1


async def test_sink_that_commits_then_drops_the_connection_is_a_delivery_error(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    db = tmp_path / "sink.db"
    url = f"{await serve_sink(db, drop_after_commit=1)}/events"

    with pytest.raises(DeliveryError) as caught:
        await deliver(url)
    assert not isinstance(caught.value, NotAcknowledged)
    assert db_rows(db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]

    assert await deliver(url) is True
    assert db_rows(db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(db, "SELECT qty FROM inbox_inventory") == [(7,)]


async def test_server_that_never_answers_fails_within_the_timeout(
    raw_server: StartRaw,
) -> None:
    server = await raw_server("silent")
    started = time.monotonic()

    with pytest.raises(DeliveryError) as caught:
        await deliver(f"http://127.0.0.1:{server.port}/events", timeout_s=0.5)

    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < FAST_FAIL_S
    assert not isinstance(caught.value, NotAcknowledged)
    assert server.requests == 1


async def test_reply_that_trickles_forever_fails_within_the_timeout(
    serve_events: ServeHandler,
) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(200):
                await response.write(b" ")
                await asyncio.sleep(0.05)
        return response

    url = await serve_events(trickle)
    started = time.monotonic()

    with pytest.raises(DeliveryError):
        await deliver(url, timeout_s=0.5)

    assert time.monotonic() - started < FAST_FAIL_S


# ---------------------------------------------------------------- proxies and targets


async def test_proxy_variables_are_ignored(
    serve_sink: ServeSink,
    raw_server: StartRaw,
    tmp_path: Path,
    db_rows: Query,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = await raw_server("close-on-accept")
    for name in (
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"

    assert await deliver(url) is True
    assert await send_http(url, placed("order-2", "snack", 1)) is True
    assert proxy.connections == 0
    assert db_rows(tmp_path / "sink.db", "SELECT count(*) FROM inbox_events") == [(2,)]

    # The same environment does steer a client that trusts it to the proxy.
    async with aiohttp.ClientSession(trust_env=True) as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url, json=EVENT):
                pass
    assert proxy.connections == 1


REFUSED = [
    "http://example.com/events",
    "https://127.0.0.1/events",
    "http://127.0.0.1:1/",
    "https://127.0.0.1:{port}/events",
    "http://127.0.0.1:{port}",
    "http://127.0.0.1:{port}/events/",
    "http://127.0.0.1:{port}/outbox/events/",
    "http://127.0.0.1:{port}/events?x=1",
    "http://user:secret@127.0.0.1:{port}/events",
    "ftp://127.0.0.1:{port}/events",
    "127.0.0.1:{port}/events",
    "/events",
]


@pytest.mark.parametrize("template", REFUSED)
async def test_refused_target_raises_before_any_connection(
    raw_server: StartRaw, template: str
) -> None:
    server = await raw_server("close-on-accept")
    url = template.format(port=server.port)

    with pytest.raises(TargetNotAllowed) as made:
        HttpSender(url)
    with pytest.raises(TargetNotAllowed):
        await send_http(url, as_event(EVENT))

    assert made.value.retryable is False
    assert server.connections == 0


async def test_allowed_target_on_the_counting_server_does_connect(raw_server: StartRaw) -> None:
    server = await raw_server("close-on-accept")

    with pytest.raises(DeliveryError):
        await deliver(f"http://127.0.0.1:{server.port}/events")

    assert server.connections == 1


# ---------------------------------------------------------------- the inbox record


# Near the largest: a body over 2**20 bytes would have aiohttp warn about its size.
@pytest.mark.parametrize("text", ["x" * 60_000, "\u00e9" * 500_000])
async def test_the_inbox_record_of_a_large_event_is_read_whole(
    serve: Serve, tmp_path: Path, text: str
) -> None:
    """GET /events/{id} holds the event: its reply is read past an ACK's cap, up to
    the record of the largest event a sink takes written as ASCII JSON (each byte of
    an "e" with an accent three bytes of escape)."""
    url = f"{await serve(create_app(tmp_path / 'sink.db'))}/events"
    event = Event(id="big-1", type="t.large", data={"text": text})

    async with HttpSender(url) as send:
        await send.deliver(event)
        record = await send.lookup("big-1")

    assert record is not None
    assert record["event"] == {"id": "big-1", "type": "t.large", "data": {"text": text}}
    assert len(json.dumps(record)) > MAX_REPLY_BYTES
    assert len(json.dumps(record)) < LOOKUP_REPLY_BYTES


async def test_only_a_404_naming_the_event_says_the_inbox_has_no_record(
    serve: Serve, tmp_path: Path
) -> None:
    """A sink's 404 names the event; a consumer of one's own without the route answers
    a 404 that proves nothing, and `trace` must not read it as "no row"."""
    sink = f"{await serve(create_app(tmp_path / 'sink.db'))}/events"
    own = f"{await serve(web.Application())}/hooks/events"  # takes events, serves no GET

    async with HttpSender(sink) as send:
        assert await send.lookup("never-sent") is None
    async with HttpSender(own) as send:
        with pytest.raises(NotAcknowledged, match="404 without naming the event"):
            await send.lookup("never-sent")


async def test_a_record_without_its_digest_proves_nothing(serve: Serve) -> None:
    """A consumer of one's own that serves GET .../events/ID with a body of its own
    (no `sha256`) says nothing about what it holds: `trace` must not read it as
    another payload in the inbox."""

    async def record(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["id"], "deliveries": 1})

    app = web.Application()
    app.router.add_get("/hooks/events/{id}", record)
    own = f"{await serve(app)}/hooks/events"

    async with HttpSender(own) as send:
        with pytest.raises(NotAcknowledged, match="no sha256"):
            await send.lookup("p-1")


async def test_an_event_alone_over_the_consumers_cap_ends_the_verified_prefix(
    serve: Serve, tmp_path: Path, db_rows: Query
) -> None:
    """Cut down to one event still over the cap: that event is refused (413, for good)
    and the ones before it, applied, keep their ACKs: the line stops at it, not at
    its head."""
    app = web.Application(client_max_size=200_000)
    app.add_subapp("/outbox/", create_app(tmp_path / "sink.db"))
    url = f"{await serve(app)}/outbox/events"
    events = [Event(id=f"e-{n}", type="t.x", data={"text": "x" * 30_000}) for n in range(5)]
    events += [Event(id="big", type="t.x", data={"text": "x" * 210_000}), events[0] | {"id": "e-5"}]

    async with HttpSender(url) as send:
        results = await send.deliver_batch(events)

    assert [r["ack"] for r in results[:5] if isinstance(r, dict)] == [f"e-{n}" for n in range(5)]
    assert len(results) == 6 and isinstance(results[5], Rejected)
    assert "big" in str(results[5]) and "413" in str(results[5])
    ids = db_rows(tmp_path / "sink.db", "SELECT id FROM inbox_events ORDER BY id")
    assert ids == [(f"e-{n}",) for n in range(5)]


async def test_a_batch_over_the_consumers_own_cap_is_sent_again_in_smaller_ones(
    serve: Serve, tmp_path: Path, db_rows: Query, caplog: pytest.LogCaptureFixture
) -> None:
    """The inbox mounted in an app of one's own takes that app's body cap (aiohttp's
    1 MiB by default), under a sink's 2 MiB: a batch refused with 413 was read by none
    of it, and goes again in batches half as large, until they pass."""
    app = web.Application()  # client_max_size left at aiohttp's default
    app.add_subapp("/outbox/", create_app(tmp_path / "sink.db"))
    url = f"{await serve(app)}/outbox/events"
    events = [
        Event(id=f"big-{n:02}", type="t.large", data={"text": "x" * 100_000}) for n in range(16)
    ]

    async with HttpSender(url) as send:
        results = await send.deliver_batch(events)
        cap = send.max_batch_body_bytes

    assert [r["ack"] for r in results if isinstance(r, dict)] == [e["id"] for e in events]
    assert cap < 2**20
    ids = db_rows(tmp_path / "sink.db", "SELECT id FROM inbox_events ORDER BY id")
    assert ids == [(e["id"],) for e in events]
    said = [r.getMessage() for r in caplog.records if "answered 413" in r.getMessage()]
    assert len(said) == 1, said
    # The refusal names the cap that refused it, the app's, not the inbox's own.
    too_big = b'{"events": [' + b'"x", ' * 300_000 + b'"x"]}'  # 1.5 MB
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"{url}/batch", data=io.BytesIO(too_big), headers={"Content-Type": "application/json"}
        ) as reply,
    ):
        assert reply.status == 413
        assert (await reply.json())["error"] == (
            f"body is over {2**20} bytes, this application's cap"
        )


# ---------------------------------------------------------------- a sink under a prefix


async def test_a_sink_mounted_under_a_prefix_of_another_app_gets_events_and_batches(
    serve: Serve, tmp_path: Path, db_rows: Query
) -> None:
    # A user's own aiohttp app with the sink's inbox mounted at /outbox/.
    seen: list[tuple[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append((request.method, request.path))
        return await handler(request)

    app = web.Application(middlewares=[record])
    app.router.add_get("/", replying(b"the user's own page"))
    app.add_subapp("/outbox/", create_app(tmp_path / "sink.db"))
    url = f"{await serve(app)}/outbox/events"
    batch = [placed("order-2", "snack", 2), placed("order-3", "snack", 3)]

    async with HttpSender(url) as send:
        single = await send.deliver(as_event(EVENT))
        acks = await send.deliver_batch(batch, after="order-1")
        inbox_record = await send.lookup("order-3")
        batches_refused = send.one_per_request

    assert seen == [
        ("POST", "/outbox/events"),
        ("POST", "/outbox/events/batch"),
        ("GET", "/outbox/events/order-3"),
    ]
    assert single["ack"] == "order-1"
    assert [a["ack"] for a in acks if isinstance(a, dict)] == ["order-2", "order-3"]
    # Taken as one batch: a refusal would have sent its events again one by one.
    assert batches_refused is False
    assert inbox_record is not None and inbox_record["id"] == "order-3"
    ids = db_rows(tmp_path / "sink.db", "SELECT id FROM inbox_events ORDER BY id")
    assert ids == [("order-1",), ("order-2",), ("order-3",)]
