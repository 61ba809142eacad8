"""The predecessor check (Outbox-After): the sink applies nothing of a request unless
the event it names as its predecessor is in the inbox.

The real sink (create_app) on loopback over a SQLite file in tmp_path, read back
through independent sqlite3 connections; the inbox itself for the transaction rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from support import eventually, inbox_ids, post_events, settle, snapshot

from shared import (
    PREDECESSOR_HEADER,
    Event,
    PredecessorMissing,
    Receipt,
    make_ack,
    order_event,
    payload_digest,
)
from sink import Inbox, create_app
from sink.app import INBOX, PREDECESSORS
from sink.backends.sqlite import SqliteInbox
from sink.predecessor import PREDECESSOR_WAIT_S, PredecessorWaits
from sink.store import BatchReceipt, Incoming

T = TypeVar("T")
Query = Callable[..., list[tuple[Any, ...]]]
Serve = Callable[..., Awaitable[str]]

LOOPBACK = "127.0.0.1"
QUICK_WAIT_S = 0.2  # the predecessor wait of a sink whose 412s are checked, not its waiting
PROMPT_S = 2.0  # well under PREDECESSOR_WAIT_S: the wait was ended, it did not time out
BOUND_S = 10.0  # every request and wait in here ends well within this
SHORTLY_S = 0.1  # between the successor's arrival and its predecessor's


class QuickWaits(PredecessorWaits):
    """Predecessor waits that give up after QUICK_WAIT_S: a 412 for an unknown predecessor
    comes without the PREDECESSOR_WAIT_S wait."""

    async def wait(
        self,
        after: str,
        known: Callable[[str], Awaitable[bool]],
        timeout_s: float = QUICK_WAIT_S,
    ) -> None:
        await super().wait(after, known, timeout_s)


# ---------------------------------------------------------------- events


def event(event_id: str, sku: str = "snack", qty: int = 1) -> Event:
    """An order as the `order.placed` event a publisher sends (here as plain JSON)."""
    return order_event({"id": event_id, "sku": sku, "qty": qty})


def ack(one: Event) -> dict[str, str]:
    """The ACK of `one` applied."""
    return make_ack(one["id"], Receipt.APPLIED, payload_digest(one))


def taken(events: list[Event]) -> list[Incoming]:
    """Events as the inbox takes them."""
    return [Incoming.checked(one) for one in events]


# ---------------------------------------------------------------- the sink over HTTP


@dataclass
class Sink:
    base: str
    app: web.Application

    @property
    def waits(self) -> PredecessorWaits:
        return self.app[PREDECESSORS]


@pytest.fixture
async def sink(serve: Serve, sink_db: Path) -> Sink:
    """The real sink, with the real predecessor wait (PREDECESSOR_WAIT_S)."""
    app = create_app(sink_db)
    return Sink(await serve(app), app)


@pytest.fixture
async def quick_sink(serve: Serve, sink_db: Path) -> Sink:
    """The real sink whose predecessor wait gives up after QUICK_WAIT_S."""
    app = create_app(sink_db)
    app[PREDECESSORS] = QuickWaits()
    return Sink(await serve(app), app)


@contextlib.asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on loopback for the block only: leaving it stops the sink."""
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, LOOPBACK, 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def send(
    client: aiohttp.ClientSession, base: str, route: str, events: list[Any], after: str | None
) -> tuple[int, Any]:
    """post_events with `after` (if any) as its predecessor header."""
    headers = {} if after is None else {PREDECESSOR_HEADER: after}
    return await post_events(client, base, route, events, headers)


def applied_reply(route: str, events: list[Event]) -> Any:
    if route == "event":
        (one,) = events
        return ack(one)
    return {"acks": [ack(e) for e in events], "rejected": None}


async def missing_total(client: aiohttp.ClientSession, base: str) -> float:
    async with client.get(f"{base}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    found = re.search(r"^sink_predecessor_missing_requests_total (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found[1])


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await asyncio.wait_for(call, BOUND_S)
    return result, loop.time() - started


ROUTES = ["event", "batch"]


async def test_an_event_naming_an_unknown_predecessor_waits_then_is_412_and_applies_nothing(
    sink: Sink, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    await send(client, sink.base, "event", [event("e0", "tea", 5)], None)
    before = snapshot(sink_db)

    (status, body), took_s = await timed(
        send(client, sink.base, "event", [event("e1", "tea", 7)], "ghost")
    )

    assert status == 412
    assert body["error"] and body["after"] == "ghost"
    # Nobody in this process could hand "ghost" over: it waited the whole bounded time.
    assert PREDECESSOR_WAIT_S - 0.1 <= took_s < PREDECESSOR_WAIT_S + PROMPT_S
    assert snapshot(sink_db) == before
    assert await missing_total(client, sink.base) == 1
    assert len(sink.waits) == 0


async def test_a_batch_naming_an_unknown_predecessor_is_412_and_applies_nothing(
    quick_sink: Sink, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    known = event("e0", "tea", 5)
    await send(client, quick_sink.base, "event", [known], None)
    before = snapshot(sink_db)
    assert await missing_total(client, quick_sink.base) == 0

    status, body = await send(
        client, quick_sink.base, "batch", [event("b1", "tea", 7), known, event("b2")], "ghost"
    )

    assert status == 412
    assert body["error"] and body["after"] == "ghost"
    assert "acks" not in body
    assert snapshot(sink_db) == before  # not even the duplicate was counted
    assert await missing_total(client, quick_sink.base) == 1
    status, _ = await send(client, quick_sink.base, "event", [event("e2")], "ghost")
    assert status == 412
    assert await missing_total(client, quick_sink.base) == 2


@pytest.mark.parametrize("route", ROUTES)
async def test_a_request_whose_predecessor_is_in_the_inbox_is_applied_at_once(
    sink: Sink, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query, route: str
) -> None:
    first, second = event("e1", "tea", 2), event("e2", "tea", 3)
    assert await send(client, sink.base, "batch", [event("e0"), first], None) == (
        200,
        applied_reply("batch", [event("e0"), first]),
    )
    later = [second] if route == "event" else [second, event("e3")]

    reply, took_s = await timed(send(client, sink.base, route, later, "e1"))

    assert reply == (200, applied_reply(route, later))
    assert took_s < PROMPT_S
    assert inbox_ids(sink_db) == ["e0", "e1", *(e["id"] for e in later)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'tea'") == [(5,)]
    assert await missing_total(client, sink.base) == 0


@pytest.mark.parametrize("route", ROUTES)
async def test_a_predecessor_applied_before_a_restart_is_found_in_the_inbox(
    client: aiohttp.ClientSession, sink_db: Path, db_rows: Query, route: str
) -> None:
    before = event("e1", "tea", 2)
    async with running(create_app(sink_db)) as base:
        assert await send(client, base, "event", [before], None) == (200, ack(before))
    later = [event("e2", "tea", 3)] if route == "event" else [event("e2"), event("e3")]

    restarted = create_app(sink_db)
    async with running(restarted) as base:
        reply, took_s = await timed(send(client, base, route, later, "e1"))
        assert len(restarted[PREDECESSORS]) == 0

    assert reply == (200, applied_reply(route, later))
    assert took_s < PROMPT_S  # the inbox knew it: no PREDECESSOR_WAIT_S wait for a handover
    assert inbox_ids(sink_db) == ["e1", *(e["id"] for e in later)]


@pytest.mark.parametrize("route", ROUTES, ids=["after-an-event", "after-a-batch"])
@pytest.mark.parametrize("successor_route", ROUTES, ids=["event", "batch"])
async def test_a_successor_sent_before_its_predecessor_waits_and_is_applied_after_it(
    sink: Sink,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    route: str,
    successor_route: str,
) -> None:
    earlier = [event("p1", "tea", 2)] if route == "event" else [event("p0"), event("p1", "tea", 2)]
    successor = [event("s1", "tea", 3)]
    if successor_route == "batch":
        successor.append(event("s2"))

    waiting = asyncio.create_task(send(client, sink.base, successor_route, successor, "p1"))
    try:
        await eventually(lambda: len(sink.waits) == 1, PROMPT_S, what="the successor waits for p1")
        await asyncio.sleep(SHORTLY_S)
        assert not waiting.done()
        assert inbox_ids(sink_db) == []
        first = await asyncio.wait_for(send(client, sink.base, route, earlier, None), BOUND_S)
        later, took_s = await timed(waiting)
    finally:
        await settle(waiting)

    assert first == (200, applied_reply(route, earlier))
    assert later == (200, applied_reply(successor_route, successor))
    assert took_s < PROMPT_S
    assert inbox_ids(sink_db) == [
        *(e["id"] for e in earlier),
        *(e["id"] for e in successor),
    ]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'tea'") == [(5,)]
    assert await missing_total(client, sink.base) == 0
    assert len(sink.waits) == 0


@dataclass
class Gate:
    """Holds the next transaction on the database thread until released."""

    started: threading.Event
    release: threading.Event


def hold_next_transaction(inbox: Inbox, monkeypatch: pytest.MonkeyPatch) -> Gate:
    assert isinstance(inbox, SqliteInbox)
    gate = Gate(threading.Event(), threading.Event())
    db = inbox._db
    real_run = db.run
    held = [False]

    async def run(fn: Callable[[sqlite3.Connection], T]) -> T:
        if held[0]:
            return await real_run(fn)
        held[0] = True

        def holding(conn: sqlite3.Connection) -> T:
            gate.started.set()
            gate.release.wait(BOUND_S)
            return fn(conn)

        return await real_run(holding)

    monkeypatch.setattr(db, "run", run)
    return gate


@pytest.mark.parametrize("route", ROUTES, ids=["after-an-event", "after-a-batch"])
async def test_a_waiting_successor_goes_on_once_its_predecessor_is_handed_over(
    sink: Sink,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    # While the predecessor's commit is held, the successor must already have ended
    # its wait (it queues behind it for the same group commit), not wait for the reply.
    earlier = [event("p1")] if route == "event" else [event("p0"), event("p1")]
    gate = hold_next_transaction(sink.app[INBOX], monkeypatch)

    waiting = asyncio.create_task(send(client, sink.base, "event", [event("s1")], "p1"))
    first = None
    try:
        await eventually(lambda: len(sink.waits) == 1, PROMPT_S, what="the successor waits for p1")
        first = asyncio.create_task(send(client, sink.base, route, earlier, None))
        await eventually(gate.started.is_set, PROMPT_S, what="the predecessor's commit begins")
        await eventually(lambda: len(sink.waits) == 0, PROMPT_S, what="the successor stops waiting")
        assert not first.done() and not waiting.done()
        gate.release.set()
        replies = list(await asyncio.wait_for(asyncio.gather(first, waiting), BOUND_S))
    finally:
        gate.release.set()
        await settle(waiting, *([first] if first else []))

    assert replies == [(200, applied_reply(route, earlier)), (200, ack(event("s1")))]
    assert inbox_ids(sink_db) == [*(e["id"] for e in earlier), "s1"]


KNOWN = event("k0", "tea", 5)
INVALID = {**event("p2"), "data": []}
CHANGED = {**KNOWN, "data": {"sku": "tea", "qty": 6}}  # conflicts with KNOWN


@pytest.mark.parametrize(
    ("route", "earlier", "status", "applied"),
    [
        ("batch", [event("p1"), INVALID, event("p3")], 400, ["p1"]),
        ("batch", [event("p1"), CHANGED, event("p3")], 409, ["p1"]),
        ("event", [{**event("p3"), "data": []}], 400, []),
    ],
    ids=["batch-invalid-item", "batch-conflict", "event-invalid"],
)
async def test_a_successor_whose_named_event_is_refused_gets_412_promptly(
    sink: Sink,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    route: str,
    earlier: list[Any],
    status: int,
    applied: list[str],
) -> None:
    await send(client, sink.base, "event", [KNOWN], None)
    before = inbox_ids(sink_db)
    successor = event("s1", "tea", 3)

    started = asyncio.get_running_loop().time()
    waiting = asyncio.create_task(send(client, sink.base, "event", [successor], "p3"))
    try:
        await eventually(lambda: len(sink.waits) == 1, PROMPT_S, what="the successor waits for p3")
        first = await asyncio.wait_for(send(client, sink.base, route, earlier, None), BOUND_S)
        later = await asyncio.wait_for(waiting, BOUND_S)
    finally:
        await settle(waiting)
    took_s = asyncio.get_running_loop().time() - started

    if route == "batch":
        assert first[0] == 200
        assert first[1]["acks"] == [ack(event(i)) for i in applied]
        assert (first[1]["rejected"]["index"], first[1]["rejected"]["status"]) == (1, status)
    else:
        assert first[0] == status
    assert later[0] == 412 and later[1]["after"] == "p3"
    assert took_s < PROMPT_S  # woken when the predecessor's request gave up on p3
    assert inbox_ids(sink_db) == [*before, *applied]
    assert await missing_total(client, sink.base) == 1
    assert len(sink.waits) == 0


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "after", [" bad id", "x" * 200, "-dash", "a/b"], ids=["space", "long", "dash", "slash"]
)
async def test_a_malformed_predecessor_is_400_naming_the_header_and_applies_nothing(
    sink: Sink,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db_rows: Query,
    route: str,
    after: str,
) -> None:
    await send(client, sink.base, "event", [event("e0")], None)
    before = snapshot(sink_db)

    (status, body), took_s = await timed(
        send(client, sink.base, route, [event("e1", "tea", 3)], after)
    )

    assert status == 400
    assert body["field"] == PREDECESSOR_HEADER and PREDECESSOR_HEADER in body["error"]
    assert took_s < PROMPT_S  # refused before any wait for a predecessor
    assert snapshot(sink_db) == before
    assert await missing_total(client, sink.base) == 0


# ---------------------------------------------------------------- the SQLite inbox
# What every backend does with a predecessor is in tests/behaviour/test_inbox_store.py.


async def test_in_one_group_commit_predecessor_checks_see_the_calls_before_them_and_fail_alone(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    await inbox.receive_batch(taken([event("k0", "tea", 5)]))
    transactions: list[int] = []
    real_run = inbox._db.run

    async def counted(fn: Callable[[sqlite3.Connection], T]) -> T:
        transactions.append(1)
        return await real_run(fn)

    monkeypatch.setattr(inbox._db, "run", counted)
    calls: list[tuple[list[Event], str | None]] = [
        ([event("a1", "apple", 1), event("a2", "apple", 2)], None),
        ([event("b1", "bean", 4)], "a2"),  # applied earlier in this group
        ([event("f1", "fig", 8)], "g1"),  # g1 comes later in the group: not there yet
        ([event("c1", "corn", 16)], "ghost"),
        ([event("d1", "date", 32)], "k0"),  # applied before the group
        ([event("g1", "grape", 64)], "b1"),
    ]

    # Two write requests reported in progress: the one call naming no predecessor shares too.
    with inbox.arriving(), inbox.arriving():
        async with asyncio.timeout(BOUND_S):
            outcomes = await asyncio.gather(
                *(inbox.receive_batch(taken(e), after=a) for e, a in calls),
                return_exceptions=True,
            )

    assert len(transactions) == 1  # all six calls in one transaction
    for (events, _), outcome in zip(calls, outcomes, strict=True):
        if events[0]["id"] in ("f1", "c1"):
            assert isinstance(outcome, PredecessorMissing), outcome
        else:
            assert isinstance(outcome, BatchReceipt), outcome
            assert outcome.stopped is None
            assert [(r.receipt, r.digest) for r in outcome.received] == [
                (Receipt.APPLIED, payload_digest(e)) for e in events
            ]
    assert [o.after for o in outcomes if isinstance(o, PredecessorMissing)] == ["g1", "ghost"]
    assert inbox_ids(sink_db) == ["k0", "a1", "a2", "b1", "d1", "g1"]
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == {
        "tea": 5,
        "apple": 3,
        "bean": 4,
        "date": 32,
        "grape": 64,
    }
