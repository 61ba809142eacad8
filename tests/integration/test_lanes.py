"""Per-SKU ordering lanes: a blocked lane stalls only its SKU, order holds within a lane
under random failures, lanes in flight are bounded, and migration 2 gives old rows a lane.

The sink here is an in-process aiohttp app on loopback over a real Inbox file, with
failures injected around it; outcomes are read through independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest
from aiohttp import web
from relay_lines import relay_of, running, sender_for
from support import ack, entry_payload, eventually, placed, sent_events, sent_flags

from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.store import Outbox, Pending
from shared import Event, Order, Receipt
from shared.event import previous_canonical
from sink import Inbox
from sink.store import Incoming
from sqlite_tx import StorageError

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

Mode = Literal["batch", "single"]
MODES: list[Mode] = ["batch", "single"]


# ---------------------------------------------------------------- a sink we can steer


@dataclass
class LaneSink:
    """/events and /events/batch over a real Inbox, with failures injected.

    Requests carry CloudEvents (one object, or a batch array), read back as events
    whose key is their lane (the SKU). `reject` answers that status for every event
    of those keys (a batch applies the items before the first such event and names it
    in `rejected`). With `failure_rate`, that share of requests fails: half with 503
    before anything is applied, half by closing the connection after the commit;
    `script` names how the first requests fail ("503" or "drop"), before the dice
    decide. `delay_s` holds each request; `in_flight` and `max_in_flight` count
    requests being handled at once.
    """

    inbox: Inbox
    reject: frozenset[str] = frozenset()
    reject_status: int = 409
    failure_rate: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    delay_s: float = 0.0
    requests: list[list[str]] = field(default_factory=list)
    script: list[str] = field(default_factory=list)
    applications: list[str] = field(default_factory=list)
    failed_before: int = 0
    dropped_after: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.single)
        app.router.add_post("/events/batch", self.batch)
        return app

    async def single(self, request: web.Request) -> web.StreamResponse:
        (e,) = sent_events(json.loads(await request.read()))
        return await self._handle(request, [e], batch=False)

    async def batch(self, request: web.Request) -> web.StreamResponse:
        events = sent_events(json.loads(await request.read()))
        return await self._handle(request, events, batch=True)

    async def _handle(
        self, request: web.Request, events: list[Event], *, batch: bool
    ) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.requests.append([e["id"] for e in events])
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            roll = self.rng.random()
            if self.script:
                roll = {"503": 0.0, "drop": self.failure_rate * 0.75}[self.script.pop(0)]
            if roll < self.failure_rate / 2:
                self.failed_before += 1
                return web.json_response({"error": "overloaded"}, status=503)
            take = next(
                (n for n, e in enumerate(events) if e.get("key") in self.reject), len(events)
            )
            receipt = await self.inbox.receive_batch([Incoming.checked(e) for e in events[:take]])
            assert receipt.stopped is None
            acks = []
            for e, done in zip(events, receipt.received, strict=False):
                if done.receipt is Receipt.APPLIED:
                    self.applications.append(e["id"])
                acks.append(ack(e, done.receipt))
            if roll < self.failure_rate:
                self.dropped_after += 1
                assert request.transport is not None
                request.transport.abort()
                return web.Response(status=200)
            rejected = None
            if take < len(events):
                rejected = {"index": take, "status": self.reject_status, "error": "refused"}
            if batch:
                return web.json_response({"acks": acks, "rejected": rejected})
            if rejected is not None:
                return web.json_response({"error": "refused"}, status=self.reject_status)
            return web.json_response(acks[0])
        finally:
            self.in_flight -= 1

    @property
    def received(self) -> list[str]:
        return [event_id for request in self.requests for event_id in request]

    def heads(self) -> list[str]:
        """The first event of each request."""
        return [request[0] for request in self.requests]


@contextlib.asynccontextmanager
async def running_relay(
    outbox: Outbox, url: str, mode: Mode, **options: Any
) -> AsyncIterator[Relay]:
    """A running relay, batch or single; stopped (bounded) on exit."""
    options.setdefault("retry", RetryPolicy(base_s=0.05, cap_s=0.3))
    options.setdefault("poll_interval_s", 0.05)
    options.setdefault("rand", random.Random(7).random)
    async with sender_for(url) as sender:
        batch = sender.deliver_batch if mode == "batch" else None
        relay = relay_of(outbox, sender.deliver, deliver_batch=batch, **options)
        async with running(relay):
            yield relay


def seq_order(db_rows: Query, db: Path, lane: str) -> list[str]:
    """The outbox's IDs of events keyed `lane`, in seq order."""
    rows = db_rows(db, f"SELECT id, {entry_payload(db)} FROM outbox_entries ORDER BY seq")
    return [i for i, payload in rows if json.loads(payload).get("key") == lane]


def inbox_order(db_rows: Query, sink_db: Path, lane: str) -> list[str]:
    """The inbox's IDs of events keyed `lane`, in the order they were first applied."""
    rows = db_rows(sink_db, "SELECT id, payload FROM inbox_events ORDER BY applied_seq")
    return [i for i, payload in rows if json.loads(payload).get("key") == lane]


# ---------------------------------------------------------------- a blocked lane


INTERLEAVED = [(f"{sku}-{n}", sku) for n in range(4) for sku in ("bad", "snack", "juice")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", [409, 400])
async def test_a_blocked_lane_does_not_block_another(
    serve: Serve,
    inbox: Inbox,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    status: int,
) -> None:
    fake = LaneSink(inbox, reject=frozenset({"bad"}), reject_status=status)
    url = f"{await serve(fake.app())}/events"
    for event_id, sku in INTERLEAVED:
        assert await outbox.accept({"id": event_id, "sku": sku, "qty": 1}) == "accepted"
    good = [i for i, sku in INTERLEAVED if sku != "bad"]
    bad = [i for i, sku in INTERLEAVED if sku == "bad"]

    async with running_relay(outbox, url, mode, ordering="sku") as relay:
        await eventually(lambda: all(sent_flags(db)[i] for i in good))
        await eventually(lambda: "bad" in relay.blocked_lanes)
        blocked_lanes = relay.blocked_lanes
        blocked = relay.blocked
        snapshot = await outbox.snapshot()

    states = sent_flags(db)
    assert [i for i in bad if states[i]] == []
    assert set(blocked_lanes) == {"bad"}
    assert (blocked_lanes["bad"].event_id, blocked_lanes["bad"].permanent) == ("bad-0", True)
    assert str(status) in blocked_lanes["bad"].reason
    assert blocked is not None and blocked.event_id == "bad-0"
    assert [(h.lane, h.id) for h in snapshot.blocked_lanes] == [("bad", "bad-0")]
    assert snapshot.to_dict()["blocked_lanes"][0]["lane"] == "bad"
    assert snapshot.pending == len(bad)
    # Every request that held a bad entry started at the bad head: nothing overtook it.
    with_bad = [r for r in fake.requests if set(r) & set(bad)]
    assert with_bad and all(r[0] == "bad-0" for r in with_bad), with_bad
    if mode == "single":
        assert set(fake.received) & set(bad) == {"bad-0"}
    for sku in ("snack", "juice"):
        assert inbox_order(db_rows, sink_db, sku) == seq_order(db_rows, db, sku)
    assert inbox_order(db_rows, sink_db, "bad") == []


@pytest.mark.parametrize("mode", MODES)
async def test_in_global_order_the_same_bad_entry_stops_everything_behind_it(
    serve: Serve,
    inbox: Inbox,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
) -> None:
    fake = LaneSink(inbox, reject=frozenset({"bad"}))
    url = f"{await serve(fake.app())}/events"
    for event_id, sku in INTERLEAVED:
        assert await outbox.accept({"id": event_id, "sku": sku, "qty": 1}) == "accepted"

    async with running_relay(outbox, url, mode, ordering="global") as relay:
        await eventually(lambda: fake.received.count("bad-0") >= 2)
        blocked = relay.blocked
        blocked_lanes = relay.blocked_lanes

    assert set(sent_flags(db).values()) == {0}
    assert set(fake.heads()) == {"bad-0"}
    if mode == "single":
        assert set(fake.received) == {"bad-0"}
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(0,)]
    assert blocked is not None and blocked.event_id == "bad-0"
    assert blocked_lanes == {}


# ---------------------------------------------------------------- order under random failures

SKUS = ("snack", "juice", "tea", "soap")
PER_SKU = 15


@pytest.mark.parametrize("mode", MODES)
async def test_order_within_each_lane_holds_under_random_failures(
    serve: Serve,
    inbox: Inbox,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
) -> None:
    fake = LaneSink(inbox, failure_rate=0.3, rng=random.Random(2024), script=["503", "drop"])
    url = f"{await serve(fake.app())}/events"
    shuffle = random.Random(11)
    skus = [sku for sku in SKUS for _ in range(PER_SKU)]
    shuffle.shuffle(skus)
    qty: dict[str, int] = {}
    for n, sku in enumerate(skus):
        event_id = f"{sku}-{n:03d}"
        qty[event_id] = n + 1
        assert await outbox.accept({"id": event_id, "sku": sku, "qty": n + 1}) == "accepted"
    policy = RetryPolicy(base_s=0.01, cap_s=0.05)

    async with running_relay(outbox, url, mode, ordering="sku", retry=policy, limit=3):
        await eventually(lambda: set(sent_flags(db).values()) == {1}, timeout_s=20.0)

    # The injected failures did happen, both kinds.
    assert fake.failed_before > 0 and fake.dropped_after > 0
    assert len(fake.received) > len(skus)
    # Each entry took effect exactly once, and per SKU in seq order.
    assert sorted(fake.applications) == sorted(qty)
    assert len(fake.applications) == len(set(fake.applications)) == len(skus)
    for sku in SKUS:
        expected = seq_order(db_rows, db, sku)
        assert len(expected) == PER_SKU
        first_applied = [i for i in fake.applications if i.startswith(f"{sku}-")]
        assert first_applied == expected, sku
        assert inbox_order(db_rows, sink_db, sku) == expected, sku
    totals = {sku: sum(q for i, q in qty.items() if i.startswith(f"{sku}-")) for sku in SKUS}
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == totals
    assert db_rows(db, "SELECT count(*) FROM outbox_entries WHERE ack IS NULL") == [(0,)]
    redelivered = db_rows(sink_db, "SELECT count(*) FROM inbox_events WHERE deliveries > 1")[0][0]
    assert redelivered > 0, "no commit-then-fail was resent"


# ---------------------------------------------------------------- lanes are bounded


@pytest.mark.parametrize("mode", MODES)
async def test_lanes_in_flight_are_bounded_by_max_lanes(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, db_rows: Query, mode: Mode
) -> None:
    fake = LaneSink(inbox, delay_s=0.1)
    url = f"{await serve(fake.app(), handler_cancellation=True)}/events"
    skus = [f"sku{n}" for n in range(6)]
    for n in range(2):
        for sku in skus:
            assert await outbox.accept({"id": f"{sku}-{n}", "sku": sku, "qty": 1}) == "accepted"

    async with running_relay(outbox, url, mode, ordering="sku", max_lanes=2):
        await eventually(lambda: set(sent_flags(db).values()) == {1}, timeout_s=10.0)

    assert fake.max_in_flight == 2


# ---------------------------------------------------------------- migration 2

# A frozen copy on purpose: it stands for files written by the version before lanes,
# which must keep opening whatever later migrations do.
V1_SCHEMA = """
CREATE TABLE orders (
    id          TEXT PRIMARY KEY,
    sku         TEXT NOT NULL,
    qty         INTEGER NOT NULL,
    accepted_at REAL NOT NULL
);
CREATE TABLE outbox (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE REFERENCES orders (id),
    payload          TEXT NOT NULL,
    queued_at        REAL NOT NULL,
    sent             INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)),
    sent_at          REAL,
    ack              TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    last_attempt_at  REAL,
    first_failure_at REAL,
    quarantined      INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
    CHECK (NOT (sent = 1 AND quarantined = 1))
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE sent = 0 AND quarantined = 0;
CREATE INDEX outbox_quarantined ON outbox (seq) WHERE quarantined = 1;
CREATE INDEX outbox_sent_at ON outbox (sent_at) WHERE sent = 1;
CREATE TABLE quarantines (
    n                    INTEGER PRIMARY KEY AUTOINCREMENT,
    id                   TEXT NOT NULL REFERENCES orders (id),
    seq                  INTEGER NOT NULL,
    reason               TEXT NOT NULL,
    quarantined_by       TEXT NOT NULL,
    quarantined_at       REAL NOT NULL,
    released_by          TEXT,
    released_at          REAL,
    released_as          TEXT CHECK (released_as IN ('redriven', 'delivered')),
    delivered_past_count INTEGER,
    delivered_past       TEXT
);
CREATE INDEX quarantines_id ON quarantines (id);
PRAGMA user_version = 1;
"""

V1_ROWS = [
    ("old-1", "snack", 2, 1),
    ("old-2", "juice", 3, 0),
    ("old-3", "snack", 5, 0),
    ("old-4", "juice", 7, 0),
]


def make_v1_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(V1_SCHEMA)
        conn.execute("BEGIN")
        for event_id, sku, qty, was_sent in V1_ROWS:
            # That release stored the order itself, in its canonical form.
            payload = previous_canonical(Order(id=event_id, sku=sku, qty=qty))
            conn.execute("INSERT INTO orders VALUES (?, ?, ?, 1.0)", (event_id, sku, qty))
            conn.execute(
                "INSERT INTO outbox (id, payload, queued_at, sent, sent_at)"
                " VALUES (?, ?, 1.0, ?, ?)",
                (event_id, payload, was_sent, 2.0 if was_sent else None),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_a_v1_outbox_is_migrated_to_lanes_and_the_lanes_relay_delivers_it(
    serve_sink: ServeSink, tmp_path: Path, db_rows: Query
) -> None:
    db, sink_db = tmp_path / "v1.db", tmp_path / "sink.db"
    make_v1_db(db)
    assert db_rows(db, "PRAGMA user_version") == [(1,)]
    url = f"{await serve_sink(sink_db)}/events"

    async with Outbox.open(db) as outbox:
        assert db_rows(db, "PRAGMA user_version") == [(6,)]  # lanes, health, leases, events, apart
        assert db_rows(db, "SELECT id, lane FROM outbox_entries ORDER BY seq") == [
            (event_id, sku) for event_id, sku, _, _ in V1_ROWS
        ]
        assert await outbox.pending_lanes(10) == ["juice", "snack"]
        assert [row.event for row in await outbox.pending_batch(16, "snack")] == [
            placed("old-3", "snack", 5)
        ]
        assert await outbox.accept({"id": "new-1", "sku": "tea", "qty": 1}) == "accepted"

        async with running_relay(outbox, url, "batch", ordering="sku"):
            await eventually(lambda: set(sent_flags(db).values()) == {1})

    assert db_rows(db, "SELECT lane FROM outbox_entries WHERE id = 'new-1'") == [("tea",)]
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == {
        "juice": 10,
        "snack": 5,
        "tea": 1,
    }
    assert [r[0] for r in db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY rowid")] != []
    assert inbox_order(db_rows, sink_db, "juice") == ["old-2", "old-4"]
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events WHERE id = 'old-1'") == [(0,)]
    # Opening again changes nothing: the migration ran once.
    async with Outbox.open(db):
        pass
    assert db_rows(db, "PRAGMA user_version") == [(6,)]  # lanes, health, leases, events, apart


async def test_many_blocked_lanes_do_not_starve_a_healthy_one(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, sink_db: Path, db_rows: Query
) -> None:
    # 66 SKUs the sink refuses, all older than the one healthy SKU's entries: a blocked
    # head is to stall only its own SKU, however many SKUs are blocked.
    bad = [f"bad{n:02d}" for n in range(66)]
    fake = LaneSink(inbox, reject=frozenset(bad))
    url = f"{await serve(fake.app())}/events"
    for sku in bad:
        assert await outbox.accept({"id": f"{sku}-0", "sku": sku, "qty": 1}) == "accepted"
    for n in range(3):
        assert await outbox.accept({"id": f"snack-{n}", "sku": "snack", "qty": 1}) == "accepted"

    async with running_relay(outbox, url, "batch", ordering="sku", max_lanes=8) as relay:
        await eventually(
            lambda: all(sent_flags(db)[f"snack-{n}"] for n in range(3)), timeout_s=15.0
        )
        # The bad heads are older, so snack started only once every bad lane was
        # blocked or in flight: at most the 7 other slots' lanes still had their
        # answer coming (under load, after snack's). Then all of them are blocked.
        assert len(relay.blocked_lanes) >= len(bad) - 7
        await eventually(lambda: len(relay.blocked_lanes) == len(bad), timeout_s=15.0)

    assert inbox_order(db_rows, sink_db, "snack") == ["snack-0", "snack-1", "snack-2"]


# ---------------------------------------------------------------- many SKUs


def counting_pending_lanes(outbox: Outbox) -> list[int]:
    """Count the outbox's pending_lanes queries (the real method still answers)."""
    calls: list[int] = []
    real = outbox.pending_lanes

    async def counted(limit: int, skip: Iterable[str] = (), worker: str | None = None) -> list[str]:
        calls.append(limit)
        return await real(limit, skip, worker)

    outbox.pending_lanes = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("mode", MODES)
async def test_with_many_skus_one_query_lists_lanes_for_many_slots_in_head_order(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, sink_db: Path, db_rows: Query, mode: Mode
) -> None:
    skus = [f"sku{n:03d}" for n in range(150)]
    fake = LaneSink(inbox, delay_s=0.002)
    url = f"{await serve(fake.app())}/events"
    for sku in skus:
        assert await outbox.accept({"id": f"{sku}-0", "sku": sku, "qty": 1}) == "accepted"
    calls = counting_pending_lanes(outbox)
    max_lanes = 4

    # Polls are rare here: only lanes finishing (and the list running short) ask again.
    async with running_relay(
        outbox, url, mode, ordering="sku", max_lanes=max_lanes, poll_interval_s=30.0
    ):
        await eventually(lambda: all(sent_flags(db).values()), timeout_s=20.0)

    assert sorted(fake.applications) == sorted(f"{sku}-0" for sku in skus)
    # 150 lanes started through 4 slots: a query per lane would be about 150 of them.
    assert len(calls) <= 150 // 64 + 1, calls
    # Lanes start oldest head first: each arrives at most a slot count away from its turn.
    arrived = [request[0] for request in fake.requests]
    for turn, event_id in enumerate(arrived):
        assert abs(turn - skus.index(event_id.split("-")[0])) < max_lanes, arrived


async def test_intake_signalled_after_every_lane_was_listed_starts_its_lane_at_once(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # One slot, three lanes: the first query finds them all, so lanes finishing ask
    # nothing more. A lane that appears later is on no list; the intake signal (here
    # the in-process one, NOTIFY across processes) must make the next free slot list
    # again, or it would wait for the 30 s poll.
    fake = LaneSink(inbox, delay_s=0.05)
    url = f"{await serve(fake.app())}/events"
    for sku in ["a", "b", "c"]:
        assert await outbox.accept({"id": f"{sku}-0", "sku": sku, "qty": 1}) == "accepted"
    calls = counting_pending_lanes(outbox)

    async with running_relay(
        outbox, url, "single", ordering="sku", max_lanes=1, poll_interval_s=30.0
    ) as relay:
        await eventually(lambda: len(fake.requests) >= 1, timeout_s=10.0)
        assert await outbox.accept({"id": "late-0", "sku": "late", "qty": 1}) == "accepted"
        relay.wake()
        await eventually(lambda: all(sent_flags(db).values()), timeout_s=10.0)

    assert sorted(fake.applications) == ["a-0", "b-0", "c-0", "late-0"]
    assert len(calls) == 2, calls  # the first list, and the one after the signal


async def test_intake_signalled_while_its_own_lane_is_in_flight_is_delivered_at_once(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # The lane read its one entry and is sending it when a second entry of the same
    # key commits. The signal's listing leaves the busy lane out, and the lane ends
    # drained (its read was short): the entry must still go at once, not at the 30 s
    # poll.
    fake = LaneSink(inbox, delay_s=0.2)
    url = f"{await serve(fake.app())}/events"
    assert await outbox.accept({"id": "a-0", "sku": "a", "qty": 1}) == "accepted"

    async with running_relay(
        outbox, url, "single", ordering="sku", max_lanes=4, poll_interval_s=30.0
    ) as relay:
        await eventually(lambda: fake.in_flight >= 1, timeout_s=10.0)
        assert await outbox.accept({"id": "a-1", "sku": "a", "qty": 1}) == "accepted"
        relay.wake()
        await eventually(lambda: all(sent_flags(db).values()), timeout_s=10.0)

    assert fake.applications == ["a-0", "a-1"]


async def test_a_lane_whose_backoff_ends_goes_before_younger_listed_lanes(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # One slot. The oldest lane fails once (503) and backs off 40 ms; younger lanes,
    # each held 30 ms at the sink, take the slot meanwhile. Once the backoff is over
    # the old lane is next, though forty younger lanes were listed before it came back.
    skus = ["old"] + [f"young{n:02d}" for n in range(40)]
    fake = LaneSink(inbox, delay_s=0.03, script=["503"], failure_rate=1e-9)  # no dice
    url = f"{await serve(fake.app())}/events"
    for sku in skus:
        assert await outbox.accept({"id": f"{sku}-0", "sku": sku, "qty": 1}) == "accepted"

    async with running_relay(
        outbox,
        url,
        "batch",
        ordering="sku",
        max_lanes=1,
        poll_interval_s=30.0,
        retry=RetryPolicy(base_s=0.04, cap_s=0.04),
        rand=lambda: 0.999,
    ):
        await eventually(lambda: sent_flags(db)["old-0"] == 1, timeout_s=10.0)

    heads = fake.heads()
    assert heads[0] == "old-0"  # the failed attempt
    # Back in at most three requests later: the one running when the backoff ended,
    # and at most one more that started before the relay noticed.
    assert "old-0" in heads[1:4], heads


async def test_a_lane_that_failed_outside_delivery_waits_its_backoff_before_it_starts_again(
    serve: Serve, inbox: Inbox, outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # The oldest lane's first read fails (the database, not a delivery): the lane backs
    # off 0.3 s. Forty younger lanes keep both slots busy meanwhile, and the list of
    # lanes to start runs out and is read again well before the 0.3 s are over.
    backoff_s = 0.3
    skus = ["old"] + [f"young{n:02d}" for n in range(40)]
    fake = LaneSink(inbox, delay_s=0.002)
    url = f"{await serve(fake.app())}/events"
    for sku in skus:
        assert await outbox.accept({"id": f"{sku}-0", "sku": sku, "qty": 1}) == "accepted"
    reads: list[float] = []
    real = outbox.pending_batch

    async def failing_once(
        limit: int = 16, lane: str | None = None, skip: Iterable[str] = ()
    ) -> list[Pending]:
        if lane == "old":
            reads.append(time.monotonic())
            if len(reads) == 1:
                raise StorageError("disk I/O error (injected)")
        return await real(limit, lane, skip)

    outbox.pending_batch = failing_once  # type: ignore[method-assign]
    async with running_relay(
        outbox,
        url,
        "batch",
        ordering="sku",
        max_lanes=2,
        poll_interval_s=30.0,
        retry=RetryPolicy(base_s=backoff_s, cap_s=backoff_s),
        rand=lambda: 0.999,
    ):
        await eventually(lambda: all(sent_flags(db).values()), timeout_s=10.0)

    assert len(reads) >= 2
    assert reads[1] - reads[0] >= backoff_s * 0.9, reads
    assert sorted(fake.applications) == sorted(f"{sku}-0" for sku in skus)
