"""The relay in process, against the real sink and against loopback sinks that misbehave.

Every outcome is checked on disk through independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from relay_lines import relay_of
from support import accept, eventually, placed, sent_events, sent_ids

from publisher.head_policy import AUTO_QUARANTINE_BY
from publisher.http import HttpSender
from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.store import Outbox, State
from shared import Receipt, make_ack, payload_digest

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

FAST = RetryPolicy(base_s=0.05, cap_s=0.2)
STOP_TIMEOUT_S = 5.0
WAIT_S = 5.0


# ---------------------------------------------------------------- a sink we can steer


@dataclass
class FakeSink:
    """A loopback /events endpoint that answers as told, per event ID.

    By default it ACKs like the real sink (with the payload digest). `reject` answers
    409 for those IDs; `fail_first` answers 503 that many times first; `store_other`
    ACKs with the digest of a different payload; `delay_s` sleeps before answering.
    """

    reject: set[str] = field(default_factory=set)
    fail_first: int = 0
    store_other: bool = False
    delay_s: float = 0.0
    received: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    on_request: Callable[[str], Any] | None = None

    async def handle(self, request: web.Request) -> web.Response:
        (event,) = sent_events(json.loads(await request.read()))
        self.received.append(event["id"])
        self.times.append(time.monotonic())
        self.started.set()
        if self.on_request is not None:
            await self.on_request(event["id"])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if event["id"] in self.reject:
            return web.json_response({"error": "conflict", "id": event["id"]}, status=409)
        if self.fail_first > 0:
            self.fail_first -= 1
            return web.json_response({"error": "overloaded"}, status=503)
        stored = event.copy()
        if self.store_other:
            stored["data"] = {**event["data"], "qty": event["data"]["qty"] + 1}
        return web.json_response(make_ack(event["id"], Receipt.APPLIED, payload_digest(stored)))

    def count(self, event_id: str) -> int:
        return self.received.count(event_id)


@pytest.fixture
def fake() -> FakeSink:
    return FakeSink()


@pytest.fixture
async def fake_url(serve: Serve, fake: FakeSink) -> str:
    app = web.Application()
    app.router.add_post("/events", fake.handle)
    return f"{await serve(app, handler_cancellation=True)}/events"


class Outcomes:
    """An Observer that keeps every delivery outcome, and the type of each event
    delivered."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.types: list[str] = []

    def delivery(self, outcome: str) -> None:
        self.seen.append(outcome)

    def delivered(self, event_type: str) -> None:
        self.types.append(event_type)


@contextlib.asynccontextmanager
async def relay_for(
    outbox: Outbox,
    url: str,
    *,
    timeout_s: float = 5.0,
    **options: Any,
) -> AsyncIterator[tuple[Relay, asyncio.Task[None]]]:
    """A running relay; stopped (bounded) on exit."""
    options.setdefault("retry", FAST)
    options.setdefault("poll_interval_s", 0.05)
    async with HttpSender(url, timeout_s=timeout_s, connect_timeout_s=1.0) as sender:
        relay = relay_of(outbox, sender.deliver, **options)
        task = asyncio.create_task(relay.run())
        try:
            yield relay, task
        finally:
            relay.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def row(db_rows: Query, db: Path, event_id: str) -> dict[str, Any]:
    names = [
        "seq",
        "sent",
        "quarantined",
        "attempts",
        "last_error",
        "last_attempt_at",
        "first_failure_at",
        "ack",
    ]
    [values] = db_rows(
        db, f"SELECT {', '.join(names)} FROM outbox_entries WHERE id = ?", (event_id,)
    )
    return dict(zip(names, values, strict=True))


# ---------------------------------------------------------------- the real sink


async def test_delivers_everything_in_order_to_the_real_sink(
    serve_sink: ServeSink, tmp_path: Path, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    sink_db = tmp_path / "sink.db"
    url = f"{await serve_sink(sink_db)}/events"
    ids = [f"z{n:02d}" if n % 2 else f"a{n:02d}" for n in range(20)]  # not in text order
    await accept(outbox, *ids, qty=3)

    async with relay_for(outbox, url) as (relay, task):
        await eventually(lambda: len(sent_ids(db)) == 20, WAIT_S)
        assert not task.done()
        assert relay.blocked is None

    assert [r[0] for r in db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY rowid")] == ids
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(60,)]
    for event_id in ids:
        stored = json.loads(row(db_rows, db, event_id)["ack"])
        event = placed(event_id, "snack", 3)
        assert stored == {"ack": event_id, "status": "applied", "sha256": payload_digest(event)}


# ---------------------------------------------------------------- transient failures


async def test_transient_503_is_retried_until_delivered_and_every_attempt_recorded(
    fake: FakeSink,
    fake_url: str,
    outbox: Outbox,
    db: Path,
    db_rows: Query,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="publisher.relay")
    fake.fail_first = 2
    await accept(outbox, "a")
    outcomes = Outcomes()

    async with relay_for(outbox, fake_url, observer=outcomes) as (relay, _):
        await eventually(lambda: set(sent_ids(db)) == {"a"}, WAIT_S)
        # The mark is on disk a moment before the step that made it returns.
        await eventually(lambda: relay.blocked is None, WAIT_S)

    entry = row(db_rows, db, "a")
    assert entry["attempts"] == 3
    assert "503" in entry["last_error"]
    assert entry["first_failure_at"] is not None
    assert entry["last_attempt_at"] > entry["first_failure_at"]
    assert fake.received == ["a", "a", "a"]
    assert outcomes.seen == ["transient", "transient", "delivered"]
    assert outcomes.types == ["order.placed"]  # delivered once
    deliveries = [r for r in caplog.records if r.getMessage() == "delivery"]
    assert [(r.event_id, r.seq, r.attempt, r.outcome) for r in deliveries] == [  # type: ignore[attr-defined]
        ("a", 1, 1, "transient"),
        ("a", 1, 2, "transient"),
        ("a", 1, 3, "delivered"),
    ]
    assert all(r.latency_ms >= 0 for r in deliveries)  # type: ignore[attr-defined]


async def test_transient_failures_back_off_instead_of_hammering(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.fail_first = 10_000
    await accept(outbox, "a", "b")

    async with relay_for(outbox, fake_url, retry=RetryPolicy(0.05, 0.3)) as (relay, _):
        await asyncio.sleep(1.2)
        assert relay.blocked is not None
        assert (relay.blocked.event_id, relay.blocked.permanent) == ("a", False)

    # Waits of up to 0.05, 0.1, 0.2, 0.3, 0.3 ... with full jitter: far from a hot loop.
    assert 3 <= fake.count("a") <= 60
    assert fake.count("b") == 0
    assert row(db_rows, db, "a")["attempts"] == fake.count("a")
    assert row(db_rows, db, "b")["attempts"] == 0


# ---------------------------------------------------------------- permanent failures


async def test_permanent_rejection_is_not_hot_looped_and_blocks_the_line(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.reject = {"a"}
    await accept(outbox, "a", "b", "c")
    outcomes = Outcomes()
    started = time.time()

    async with relay_for(
        outbox, fake_url, retry=RetryPolicy(base_s=0.05, cap_s=0.5), observer=outcomes
    ) as (relay, task):
        await asyncio.sleep(1.2)
        blocked = relay.blocked
        snapshot = await outbox.snapshot()
        assert not task.done()

    # A permanent failure waits 0.25-0.5 s: at most 1 + 1.2 / 0.25 tries in 1.2 s.
    tries = fake.count("a")
    assert 2 <= tries <= 6
    assert fake.received == ["a"] * tries  # nothing behind it was sent
    assert outcomes.seen == ["permanent"] * tries
    gaps = [b - a for a, b in zip(fake.times, fake.times[1:], strict=False)]
    assert all(gap >= 0.2 for gap in gaps), gaps
    assert blocked is not None
    assert (blocked.event_id, blocked.permanent) == ("a", True)
    assert "409" in blocked.reason
    assert started <= blocked.since <= time.time()
    assert set(sent_ids(db)) == set()
    a = row(db_rows, db, "a")
    assert (a["sent"], a["quarantined"], a["attempts"]) == (0, 0, tries)
    assert "409" in a["last_error"]
    assert row(db_rows, db, "b")["attempts"] == 0
    assert snapshot.head is not None
    assert (snapshot.head.id, snapshot.head.blocked, snapshot.pending) == ("a", True, 3)
    assert snapshot.to_dict()["head_blocked"] is True


async def test_quarantine_after_moves_the_head_aside_and_later_entries_flow(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.reject = {"a"}
    await accept(outbox, "a", "b", "c")
    policy = RetryPolicy(base_s=0.05, cap_s=0.2, quarantine_after=2)

    async with relay_for(outbox, fake_url, retry=policy) as (relay, _):
        await eventually(lambda: set(sent_ids(db)) == {"b", "c"}, WAIT_S)
        assert relay.blocked is None

    assert fake.received == ["a", "a", "b", "c"]
    a = row(db_rows, db, "a")
    assert (a["sent"], a["quarantined"], a["attempts"]) == (0, 1, 2)
    [(by, reason, released)] = db_rows(
        db, "SELECT quarantined_by, reason, released_at FROM outbox_quarantines WHERE id = 'a'"
    )
    assert by == AUTO_QUARANTINE_BY
    assert "rejected 2 times" in reason and "409" in reason
    assert released is None
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined, snapshot.head) == (0, 1, None)


async def test_redrive_puts_it_back_at_its_seq_and_it_goes_next(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.reject = {"a"}
    await accept(outbox, "a", "b", "c")
    policy = RetryPolicy(base_s=0.05, cap_s=0.2, quarantine_after=2)
    async with relay_for(outbox, fake_url, retry=policy):
        await eventually(lambda: set(sent_ids(db)) == {"b", "c"}, WAIT_S)
    await accept(outbox, "d", "e")
    fake.reject.clear()  # the sink has been fixed
    fake.received.clear()

    record = await outbox.redrive("a", "alice")

    assert record.delivered_past == ["b", "c"]
    assert (record.released_as, record.released_by) == ("redriven", "alice")
    async with relay_for(outbox, fake_url, retry=policy):
        await eventually(lambda: set(sent_ids(db)) == {"a", "b", "c", "d", "e"}, WAIT_S)
    assert fake.received == ["a", "d", "e"]
    a = row(db_rows, db, "a")
    assert (a["seq"], a["sent"], a["quarantined"], a["attempts"]) == (1, 1, 0, 3)


async def test_relay_survives_an_operator_quarantining_the_head_while_it_is_in_flight(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # An operator sees the blocked head and quarantines it by hand while the relay's
    # next try is in flight; that try is rejected too and reaches quarantine-after.
    fake.reject = {"a"}
    operator = await Outbox.open(db)

    async def quarantine_on_second_try(event_id: str) -> None:
        if event_id == "a" and fake.count("a") == 2:
            await operator.quarantine("a", "poison, by hand", "alice")

    fake.on_request = quarantine_on_second_try
    await accept(outbox, "a", "b")
    policy = RetryPolicy(base_s=0.05, cap_s=0.2, quarantine_after=2)
    try:
        async with relay_for(outbox, fake_url, retry=policy) as (_, task):
            await eventually(lambda: fake.count("a") == 2, WAIT_S)
            await accept(outbox, "c")
            await eventually(lambda: set(sent_ids(db)) == {"b", "c"} or task.done(), 3.0)
            assert not task.done(), f"the relay loop ended: {task.exception()!r}"
            assert set(sent_ids(db)) == {"b", "c"}
    finally:
        await operator.close()
    assert row(db_rows, db, "a")["quarantined"] == 1


# ---------------------------------------------------------------- ACK with a wrong digest


async def test_a_sink_that_stored_something_else_is_caught(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.store_other = True
    await accept(outbox, "a", "b")
    outcomes = Outcomes()

    async with relay_for(outbox, fake_url, observer=outcomes) as (relay, _):
        await eventually(lambda: fake.count("a") >= 2, WAIT_S)
        blocked = relay.blocked

    assert set(sent_ids(db)) == set()
    a = row(db_rows, db, "a")
    assert a["ack"] is None
    assert a["attempts"] >= 2
    assert "digest" in a["last_error"]
    assert fake.count("b") == 0
    assert blocked is not None and blocked.event_id == "a"
    assert blocked.permanent is False  # retried: the sink may yet store the right payload
    assert set(outcomes.seen) == {"transient"}


# ---------------------------------------------------------------- wake and poll


async def test_wake_delivers_at_once_without_waiting_for_the_poll(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    async with relay_for(outbox, fake_url, poll_interval_s=5.0) as (relay, _):
        await asyncio.sleep(0.2)  # the relay found nothing and sleeps for 5 s
        await accept(outbox, "a")
        await asyncio.sleep(0.5)
        assert set(sent_ids(db)) == set(), "delivered without a wake: poll is not 5 s"

        relay.wake()
        took = await eventually(lambda: set(sent_ids(db)) == {"a"}, 2.0)

    assert took < 1.0
    assert fake.received == ["a"]


async def test_poll_picks_up_entries_written_by_another_connection(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    async with relay_for(outbox, fake_url, poll_interval_s=0.1):
        await asyncio.sleep(0.2)
        async with Outbox.open(db) as other:
            await accept(other, "from-cli")
        took = await eventually(lambda: set(sent_ids(db)) == {"from-cli"}, 3.0)
    assert took < 1.0


# ---------------------------------------------------------------- stop


async def test_stop_lets_the_send_in_flight_finish_and_starts_no_other(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.delay_s = 0.5
    await accept(outbox, "a", "b")

    async with HttpSender(fake_url, timeout_s=5.0) as sender:
        relay = relay_of(outbox, sender.deliver, retry=FAST, poll_interval_s=0.05)
        task = asyncio.create_task(relay.run())
        await asyncio.wait_for(fake.started.wait(), WAIT_S)
        stopping = time.monotonic()
        relay.stop()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)
        took = time.monotonic() - stopping

    assert took >= 0.3, "run() returned before the send in flight finished"
    assert fake.received == ["a"]
    assert set(sent_ids(db)) == {"a"}
    assert json.loads(row(db_rows, db, "a")["ack"])["ack"] == "a"
    assert row(db_rows, db, "b")["attempts"] == 0
    entry = await outbox.entry("b")
    assert entry is not None and entry.state is State.PENDING


async def test_stop_waits_for_a_hanging_send_only_until_its_timeout(
    fake: FakeSink, fake_url: str, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    fake.delay_s = 30.0
    await accept(outbox, "a")

    async with HttpSender(fake_url, timeout_s=0.5, connect_timeout_s=0.5) as sender:
        relay = relay_of(outbox, sender.deliver, retry=FAST, poll_interval_s=0.05)
        task = asyncio.create_task(relay.run())
        await asyncio.wait_for(fake.started.wait(), WAIT_S)
        stopping = time.monotonic()
        relay.stop()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)
        took = time.monotonic() - stopping

    assert took < 2.0
    assert fake.received == ["a"]
    a = row(db_rows, db, "a")
    assert (a["sent"], a["attempts"]) == (0, 1)
    assert "no reply in time" in a["last_error"]


async def test_stop_during_a_backoff_returns_at_once(
    fake: FakeSink, fake_url: str, outbox: Outbox
) -> None:
    fake.reject = {"a"}
    await accept(outbox, "a")

    async with HttpSender(fake_url, timeout_s=5.0) as sender:
        relay = relay_of(outbox, sender.deliver, retry=RetryPolicy(1.0, 30.0))
        task = asyncio.create_task(relay.run())
        await asyncio.wait_for(fake.started.wait(), WAIT_S)
        await asyncio.sleep(0.2)  # rejected: now waiting 15-30 s before the next try
        stopping = time.monotonic()
        relay.stop()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)

    assert time.monotonic() - stopping < 1.0
    assert fake.received == ["a"]
