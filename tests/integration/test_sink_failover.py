"""Several sink URLs, one sink cluster: HttpSender sends a request to the next URL only
when one cannot be reached (refused, reset before any reply, connect timeout), each
URL at most once per call, never on a reply. Real servers on loopback."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from stub_sink import Port, StubSink
from support import LOOPBACK
from test_sink_cloudevents import needs_cloudevents
from yarl import URL

from publisher import DeliveryError, HttpSender, NotAcknowledged, TargetNotAllowed
from shared import Event, Lease, order_event

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink, StartRaw

LEASE = Lease("0123456789abcdef", "snack", 4)


def numbered_event(n: int) -> Event:
    """The `n`th order as the `order.placed` event the relay sends: ID order-<n>."""
    return order_event({"id": f"order-{n}", "sku": "snack", "qty": 1})


FAST_FAIL_S = 2.0


@pytest.fixture
async def ports() -> AsyncIterator[list[Port]]:
    """Loopback ports held by the test (refused until served); closed after it."""
    held: list[Port] = []
    yield held
    for port in held:
        await port.close()


def refused(ports: list[Port]) -> str:
    ports.append(Port())
    return ports[-1].url


@pytest.fixture
def unanswered_url() -> Iterator[str]:
    """A loopback URL whose connects time out: a listener with a full accept queue
    that never accepts (the kernel drops further SYNs)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        filler.setblocking(False)
        filler.connect_ex((LOOPBACK, port))
        fillers.append(filler)
    try:
        yield f"http://{LOOPBACK}:{port}/events"
    finally:
        for sock in (*fillers, listener):
            sock.close()


async def stub(serve: Serve, status: int = 200) -> tuple[StubSink, str]:
    sink = StubSink(status)
    return sink, f"{await serve(sink.app())}/events"


# ---------------------------------------------------------------- failing over


@needs_cloudevents
@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_a_refused_first_url_sends_the_request_to_the_second(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query, ports: list[Port], batch: bool
) -> None:
    db = tmp_path / "sink.db"
    down, up = refused(ports), f"{await serve_sink(db)}/events"
    moves: list[tuple[URL, URL]] = []

    async with HttpSender([down, up], on_failover=lambda a, b: moves.append((a, b))) as sender:
        if batch:
            results = await sender.deliver_batch([numbered_event(1), numbered_event(2)])
            assert all(isinstance(r, dict) for r in results)
        else:
            await sender.deliver(numbered_event(1))

    assert db_rows(db, "SELECT count(*) FROM inbox_events") == [(2 if batch else 1,)]
    assert sender.url == URL(up)
    assert sender.failovers == 1
    assert moves == [(URL(down), URL(up))]


async def test_the_request_sent_on_is_the_same_request(serve: Serve, ports: list[Port]) -> None:
    sink, up = await stub(serve)

    async with HttpSender([refused(ports), up]) as sender:
        await sender.deliver_batch(
            [numbered_event(1), numbered_event(2)], after="order-0", lease=LEASE
        )
        await sender.deliver(numbered_event(3), lease=LEASE)

    assert sink.paths == ["/events/batch", "/events"]
    assert sink.leases == [LEASE.header(), LEASE.header()]
    assert sender.failovers == 1  # the second request went to the URL that answered


async def test_the_url_that_answered_last_is_tried_first_and_the_first_serves_again(
    serve: Serve, ports: list[Port]
) -> None:
    first, second = Port(), Port()
    ports += [first, second]
    back, other = StubSink(), StubSink()
    await second.serve(other.app())

    async with HttpSender([first.url, second.url]) as sender:
        await sender.deliver(numbered_event(1))  # first refused: to the second
        await first.serve(back.app())
        await sender.deliver(numbered_event(2))  # the second answered last: it is asked first
        await second.stop()
        await sender.deliver(numbered_event(3))  # the second is gone: the first, which is back

    assert (back.requests, other.requests) == (1, 2)
    assert sender.failovers == 2
    assert sender.url == URL(first.url)


async def test_a_connect_timeout_sends_the_request_to_the_next_url(
    serve: Serve, unanswered_url: str
) -> None:
    sink, up = await stub(serve)
    started = time.monotonic()

    async with HttpSender([unanswered_url, up], connect_timeout_s=0.3) as sender:
        await sender.deliver(numbered_event(1))

    assert 0.25 <= time.monotonic() - started < FAST_FAIL_S
    assert sink.requests == 1


async def test_a_connection_reset_before_any_reply_is_sent_to_the_next_url(
    serve: Serve, raw_server: StartRaw
) -> None:
    dropper = await raw_server("close-after-request")
    sink, up = await stub(serve)

    async with HttpSender([f"http://{LOOPBACK}:{dropper.port}/events", up]) as sender:
        await sender.deliver(numbered_event(1))

    assert (dropper.requests, sink.requests) == (1, 1)


@needs_cloudevents
async def test_lookup_tries_the_urls_the_same_way(
    serve_sink: ServeSink, tmp_path: Path, ports: list[Port]
) -> None:
    up = f"{await serve_sink(tmp_path / 'sink.db')}/events"
    async with HttpSender(up) as direct:
        await direct.deliver(numbered_event(1))

    async with HttpSender([refused(ports), up]) as sender:
        record = await sender.lookup("order-1")
        missing = await sender.lookup("order-2")

    assert record is not None and record["id"] == "order-1"
    assert missing is None
    assert sender.failovers == 1


@needs_cloudevents
async def test_a_request_fails_over_to_a_sink_of_the_same_inbox_after_a_drop_after_commit(
    serve_sink: ServeSink, pg_database: str, db_rows: Query
) -> None:
    """Two sinks on one PostgreSQL inbox: the first applies the event and drops the
    connection before its reply; the second has it already and ACKs it as a duplicate,
    so the event is applied once."""
    dropping = f"{await serve_sink(pg_database, drop_after_commit=1)}/events"
    other = f"{await serve_sink(pg_database)}/events"

    async with HttpSender([dropping, other]) as sender:
        ack = await sender.deliver(numbered_event(1))

    assert ack["status"] == "duplicate"
    assert db_rows(pg_database, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(pg_database, "SELECT qty FROM inbox_inventory") == [(1,)]


# ---------------------------------------------------------------- not failing over


@pytest.mark.parametrize("status", [503, 500, 409, 400])
async def test_a_reply_of_any_status_is_the_sinks_answer_and_is_not_sent_on(
    serve: Serve, status: int
) -> None:
    failing, first = await stub(serve, status)
    other, second = await stub(serve)

    async with HttpSender([first, second]) as sender:
        with pytest.raises(NotAcknowledged) as caught:
            await sender.deliver(numbered_event(1))

    assert caught.value.status == status
    assert (failing.requests, other.requests) == (1, 0)
    assert sender.failovers == 0
    assert sender.url == URL(first)


async def test_a_reply_that_does_not_come_in_time_is_not_sent_on(
    serve: Serve, raw_server: StartRaw
) -> None:
    silent = await raw_server("silent")
    other, second = await stub(serve)

    async with HttpSender(
        [f"http://{LOOPBACK}:{silent.port}/events", second], timeout_s=0.5
    ) as sender:
        with pytest.raises(DeliveryError) as caught:
            await sender.deliver(numbered_event(1))

    assert not isinstance(caught.value, NotAcknowledged)
    assert (silent.requests, other.requests) == (1, 0)


async def test_each_url_is_tried_at_most_once_per_call(raw_server: StartRaw) -> None:
    droppers = [await raw_server("close-after-request") for _ in range(3)]
    urls = [f"http://{LOOPBACK}:{d.port}/events" for d in droppers]

    async with HttpSender(urls) as sender:
        for calls in (1, 2):
            with pytest.raises(DeliveryError):
                await sender.deliver(numbered_event(calls))
            assert [d.requests for d in droppers] == [calls] * 3

    assert sender.failovers == 4


async def test_when_no_url_can_be_reached_the_error_names_each(
    raw_server: StartRaw, ports: list[Port]
) -> None:
    closing = await raw_server("close-on-accept")
    urls = [refused(ports), f"http://{LOOPBACK}:{closing.port}/events", refused(ports)]

    async with HttpSender(urls) as sender:
        with pytest.raises(DeliveryError) as caught:
            await sender.deliver(numbered_event(1))

    assert not isinstance(caught.value, NotAcknowledged)
    assert caught.value.retryable is True
    message = str(caught.value)
    assert message.startswith("order-1: no sink URL could be reached: ")
    assert all(url in message for url in urls), message
    assert closing.connections == 1


async def test_one_unreachable_url_reads_as_it_always_did(ports: list[Port]) -> None:
    async with HttpSender(refused(ports)) as sender:
        with pytest.raises(DeliveryError) as caught:
            await sender.deliver(numbered_event(1))

    assert str(caught.value).startswith("order-1: ClientConnectorError: ")
    assert sender.failovers == 0


# ---------------------------------------------------------------- targets and logs


@pytest.mark.parametrize("bad", ["http://example.com/events", "http://127.0.0.1:1/events/"])
async def test_a_url_that_is_not_allowed_refuses_the_sender_before_anything_is_sent(
    raw_server: StartRaw, bad: str
) -> None:
    server = await raw_server("close-on-accept")
    good = f"http://{LOOPBACK}:{server.port}/events"

    for urls in ([good, bad], [bad, good]):
        with pytest.raises(TargetNotAllowed):
            HttpSender(urls)
    with pytest.raises(TargetNotAllowed, match="no sink URL"):
        HttpSender([])

    assert server.connections == 0


def test_a_url_given_twice_counts_once() -> None:
    a, b = "http://127.0.0.1:8001/events", "http://[::1]:8002/events"

    assert HttpSender([a, b, a]).urls == (URL(a), URL(b))
    assert HttpSender(a).urls == (URL(a),)


async def test_a_failover_is_logged_once_per_interval(
    serve: Serve, ports: list[Port], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="publisher.http")
    _, up = await stub(serve)
    down = refused(ports)

    async with HttpSender([down, up]) as sender:
        for n in range(3):
            sender._preferred = 0  # as if the first had answered in between
            await sender.deliver(numbered_event(n))

    lines = [r.getMessage() for r in caplog.records if r.name == "publisher.http"]
    assert len(lines) == 1, lines
    assert down in lines[0] and up in lines[0] and "ClientConnectorError" in lines[0]
    assert sender.failovers == 3
