"""Outbox-Lease over HTTP: the header a leased request carries, and the sink's 409
"fenced" reply turned into FencedBySink. Real aiohttp servers on loopback: a recording
one, and the real sink (which checks the epochs)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiohttp import web
from stub_sink import StubSink
from support import as_event, numbered_event

from publisher import HttpSender, NotAcknowledged, Rejected, dispatch
from publisher.driver import Driver
from publisher.errors import FencedBySink, LeaseLost
from publisher.settings import RelaySettings
from publisher.store import Mark, Pending
from shared import GLOBAL_LINE, Event, Lease, make_ack, payload_digest
from shared.ack import Receipt

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

SOURCE = "0123456789abcdef"
LANE = Lease(SOURCE, "snack", 7)


def numbered(n: int, sku: str = "snack", qty: int = 1) -> Event:
    """The `n`th order as the order.placed event the relay sends (ID order-<n>)."""
    return as_event(numbered_event(n, sku, qty))


@pytest.fixture
async def recorder(serve: Serve) -> tuple[StubSink, str]:
    """A sink stand-in that keeps each request's Outbox-Lease, and its /events URL."""
    stub = StubSink()
    return stub, f"{await serve(stub.app())}/events"


def replying_409(body: Mapping[str, object]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(body, status=409)

    app = web.Application()
    app.router.add_post("/events", handler)
    app.router.add_post("/events/batch", handler)
    return app


FENCED_BODY = {
    "error": "lease epoch 7 of line 'snack' is stale: epoch 9 has been seen",
    "fenced": {"source": SOURCE, "line": "snack", "epoch": 7, "seen": 9},
}


# ---------------------------------------------------------------- the header


async def test_a_leased_request_carries_the_lease_as_sent(recorder: tuple[StubSink, str]) -> None:
    seen, url = recorder
    global_lease = Lease(SOURCE, GLOBAL_LINE, 2**63 - 1)

    async with HttpSender(url) as sender:
        await sender.deliver(numbered(1), lease=LANE)
        await sender.deliver_batch([numbered(2), numbered(3)], lease=global_lease)
        await sender.deliver(numbered(4), after="order-3", lease=LANE)

    assert seen.paths == ["/events", "/events/batch", "/events"]
    assert seen.leases == [
        f"{SOURCE} snack 7",
        f"{SOURCE} * 9223372036854775807",
        f"{SOURCE} snack 7",
    ]


async def test_a_request_without_a_lease_carries_no_lease_header(
    recorder: tuple[StubSink, str],
) -> None:
    seen, url = recorder

    async with HttpSender(url) as sender:
        await sender.deliver(numbered(1))
        await sender.deliver_batch([numbered(2)], after="order-1")
        await sender.deliver(numbered(3), after=None, lease=None)

    assert seen.leases == [None, None, None]


class Entries:
    """A line's store in memory: the given entries pending, the marks kept in order."""

    def __init__(self, *events: Event) -> None:
        self.rows = [Pending(seq, e, 0, e.get("key")) for seq, e in enumerate(events, start=1)]
        self.marks: list[Mark] = []

    async def read(self, limit: int, skip: Collection[str]) -> list[Pending]:
        done = {*skip, *(mark.event_id for mark in self.marks)}
        return [row for row in self.rows if row.event["id"] not in done][:limit]

    async def mark(self, marks: list[Mark], lease: Lease | None) -> None:
        self.marks.extend(marks)


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_the_driver_hands_the_lease_to_the_sender(
    recorder: tuple[StubSink, str], batch: bool
) -> None:
    seen, url = recorder
    entries = Entries(numbered(1), numbered(2))
    settings = RelaySettings(limit=2, batch=batch, pipeline=1, worker=None)

    async with HttpSender(url) as sender:
        assert await Driver(entries, sender, settings).run(LANE) == 2

    assert [mark.event_id for mark in entries.marks] == ["order-1", "order-2"]
    assert seen.leases == [LANE.header()] * (1 if batch else 2)
    assert seen.paths == ["/events/batch"] if batch else ["/events", "/events"]


async def test_a_plain_send_callback_that_takes_no_lease_still_works_without_one() -> None:
    calls: list[tuple[Event, ...]] = []
    marked: list[str] = []

    class Store:
        async def pending(self, limit: int = 16) -> list[Event]:
            return [numbered(1)][: 0 if marked else 1]

        async def mark_sent(self, event_id: str) -> None:
            marked.append(event_id)

    async def plain(sent: Event) -> bool:
        calls.append((sent,))
        return True

    assert await dispatch(Store(), plain) == ["order-1"]

    assert marked == ["order-1"]
    assert calls == [(numbered(1),)]


# ---------------------------------------------------------------- the real sink's fence


async def test_the_real_sink_refuses_a_stale_epoch_as_fenced_by_sink(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    db = tmp_path / "sink.db"
    url = f"{await serve_sink(db)}/events"

    async with HttpSender(url) as sender:
        await sender.deliver(numbered(1), lease=Lease(SOURCE, "snack", 3))
        with pytest.raises(FencedBySink) as single:
            await sender.deliver(numbered(2), lease=Lease(SOURCE, "snack", 2))
        with pytest.raises(FencedBySink) as batch:
            await sender.deliver_batch([numbered(3), numbered(4)], lease=Lease(SOURCE, "snack", 1))
        # The line's current epoch and other lines are not fenced.
        await sender.deliver(numbered(5), lease=Lease(SOURCE, "snack", 3))
        await sender.deliver(numbered(6, "tea"), lease=Lease(SOURCE, "tea", 1))

    assert (single.value.line, single.value.epoch, single.value.status) == ("snack", 2, 409)
    assert (batch.value.line, batch.value.epoch) == ("snack", 1)
    assert isinstance(batch.value, LeaseLost) and isinstance(batch.value, NotAcknowledged)
    assert not isinstance(batch.value, Rejected)
    assert "epoch 3 has been seen" in str(single.value)
    assert "order-3" in str(batch.value)
    ids = db_rows(db, "SELECT id FROM inbox_events ORDER BY id")
    assert ids == [("order-1",), ("order-5",), ("order-6",)]


async def test_a_conflict_under_a_good_lease_is_still_rejected(
    serve_sink: ServeSink, tmp_path: Path
) -> None:
    url = f"{await serve_sink(tmp_path / 'sink.db')}/events"

    async with HttpSender(url) as sender:
        await sender.deliver(numbered(1, qty=1), lease=LANE)
        with pytest.raises(Rejected) as caught:
            await sender.deliver(numbered(1, qty=2), lease=LANE)

    assert not isinstance(caught.value, LeaseLost)
    assert (caught.value.status, caught.value.retryable) == (409, False)


# ---------------------------------------------------------------- 409 replies judged


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_a_fenced_409_raises_fenced_by_sink_for_the_whole_request(
    serve: Serve, batch: bool
) -> None:
    url = f"{await serve(replying_409(FENCED_BODY))}/events"

    async with HttpSender(url) as sender:
        with pytest.raises(FencedBySink) as caught:
            if batch:
                await sender.deliver_batch([numbered(1), numbered(2)], lease=LANE)
            else:
                await sender.deliver(numbered(1), lease=LANE)

    assert (caught.value.line, caught.value.epoch) == ("snack", 7)
    assert "epoch 9 has been seen" in str(caught.value)


@pytest.mark.parametrize(
    "body",
    [
        {"error": "conflict", "id": "order-1"},
        {"error": "x", "fenced": "yes"},
        {"error": "x", "fenced": None},
    ],
    ids=["conflict", "fenced-not-an-object", "fenced-null"],
)
async def test_a_409_without_a_fenced_object_is_rejected(
    serve: Serve, body: Mapping[str, object]
) -> None:
    url = f"{await serve(replying_409(body))}/events"

    async with HttpSender(url) as sender:
        with pytest.raises(Rejected) as caught:
            await sender.deliver(numbered(1), lease=LANE)

    assert not isinstance(caught.value, LeaseLost)


async def test_a_fenced_409_to_a_request_without_a_lease_is_not_acknowledged(
    serve: Serve,
) -> None:
    """The sink names a lease the request did not carry: that answers nothing sent,
    so the event is neither refused for good nor a lost lease."""
    url = f"{await serve(replying_409(FENCED_BODY))}/events"

    async with HttpSender(url) as sender:
        with pytest.raises(NotAcknowledged) as caught:
            await sender.deliver(numbered(1))

    assert not isinstance(caught.value, Rejected | LeaseLost)
    assert caught.value.retryable is True


async def test_a_batch_item_refused_as_fenced_is_fenced_by_sink(serve: Serve) -> None:
    """Not what the sink does (a stale lease refuses the whole request), but a reply
    that says so of one item must not count as the event refused."""
    first = numbered(1)
    reply = {
        "acks": [make_ack("order-1", Receipt.APPLIED, payload_digest(first))],
        "rejected": {"index": 1, "status": 409, **FENCED_BODY},
    }

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=json.dumps(reply).encode(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/events/batch", handler)
    url = f"{await serve(app)}/events"

    async with HttpSender(url) as sender:
        results: Sequence[object] = await sender.deliver_batch([first, numbered(2)], lease=LANE)

    assert isinstance(results[0], dict)
    assert isinstance(results[1], FencedBySink)
    assert (results[1].line, results[1].epoch) == ("snack", 7)
