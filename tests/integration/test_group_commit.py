"""Group commit: concurrent sink writes, publisher intake and marks share transactions.

Real SQLite files, read back through independent sqlite3 connections; the sink is served
by create_app, with the chaos stall, on loopback. Each store's Database is watched by
wrappers on the instance that call the real `run` and `run_inline`: they note the
thread every transaction ran on (so grouped calls show as fewer worker-thread
transactions than calls), and can hold the next worker-thread transaction before it
begins, so that calls pile up behind it. A sink write shares its commit when more than
one write request is in progress: the tests report that as the sink does, through
`arriving`.

The publisher's SQLite outbox commits a group inline while its writes are quick
(sqlite_tx.InlineWrites), and on the worker thread after a slow one. The tests that
hold a group's transaction on the worker thread, for calls to pile up behind it,
put the outbox in that state (`groups_on_the_thread`); the grouping is the same
on either thread. The tests that count inline transactions make every write count
as quick (`groups_inline`), so that a slow disk does not send a group elsewhere.
The tactic itself has tests of its own below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import pytest
from support import (
    ManualClock,
    as_event,
    event,
    eventually,
    inbox_ids,
    inventory,
    placed,
    post_json,
    settle,
)

from publisher.app import OUTBOX, ServiceSettings, create_app
from publisher.backends.sqlite import GATHER_PASSES, SqliteOutbox
from publisher.errors import UnknownEntry
from publisher.settings import RelaySettings
from publisher.store import Intake, Outbox
from shared import Conflict, Event, Receipt, canonical_json, make_ack, payload_digest
from sink.app import INBOX
from sink.backends.sqlite import SqliteInbox
from sink.chaos import Chaos, chaos_app
from sink.store import BatchReceipt, Incoming
from sqlite_tx import INLINE_BACKOFF_S, Database, InlineWrites, StorageError
from sqlite_tx.aiosqlite_internals import raw_connection

if TYPE_CHECKING:
    from conftest import Query, Serve, ServeSink

T = TypeVar("T")

WAIT_S = 10.0  # a bound on what must happen: under a loaded CI run two fsyncs took over 1.5 s
PENDING_S = 0.1  # long enough for a call that is not held back to finish
ARRIVAL_S = 0.01  # between calls that arrive one by one while a transaction is held
STALL_S = 0.2  # the sink's chaos stall: concurrent POSTs are all in progress at once
REQUESTS = 6


# ---------------------------------------------------------------- watching transactions


@dataclass
class Gate:
    """Holds one worker-thread transaction before it begins, until released."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Trips:
    """The thread of each transaction run through Database.run (`worker`) and through
    run_inline (`inline`), in the order they ran."""

    worker: list[int] = field(default_factory=list)
    inline: list[int] = field(default_factory=list)
    gate: Gate | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[Gate]:
        """Hold the next worker-thread transaction; it is released on the way out."""
        gate = self.gate = Gate()
        try:
            yield gate
        finally:
            gate.release.set()


def watch(db: Database, monkeypatch: pytest.MonkeyPatch) -> Trips:
    """Wrap run and run_inline on this instance; each calls the real method."""
    trips = Trips()
    real_run, real_inline = db.run, db.run_inline

    async def run(fn: Callable[[sqlite3.Connection], T]) -> T:
        gate, trips.gate = trips.gate, None

        def traced(conn: sqlite3.Connection) -> T:
            trips.worker.append(threading.get_ident())
            if gate is not None:
                gate.started.set()
                gate.release.wait(WAIT_S)
            return fn(conn)

        return await real_run(traced)

    async def run_inline(fn: Callable[[sqlite3.Connection], T]) -> T:
        def traced(conn: sqlite3.Connection) -> T:
            trips.inline.append(threading.get_ident())
            return fn(conn)

        return await real_inline(traced)

    monkeypatch.setattr(db, "run", run)
    monkeypatch.setattr(db, "run_inline", run_inline)
    return trips


async def all_of(*calls: Awaitable[T]) -> list[T | BaseException]:
    """Run the calls concurrently (bounded); each one's result or exception, in order."""
    async with asyncio.timeout(WAIT_S):
        return list(await asyncio.gather(*calls, return_exceptions=True))


async def test_a_groups_new_orders_are_inserted_a_table_at_a_time_as_each_alone_would_be(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    await accept_in_lanes(outbox, "a0")
    inserts: list[str] = []

    def statement(sql: str) -> None:
        if sql.startswith("INSERT"):
            inserts.append(sql.split("(")[0].strip())

    # Times with every digit a double holds: each must come back exactly.
    stamps: list[float] = []

    def now() -> float:
        stamps.append(1_764_650_000.123456789 + len(stamps) / 7)
        return stamps[-1]

    monkeypatch.setattr(time, "time", now)
    raw_connection(outbox._db._connection).set_trace_callback(statement)
    grouped = [event("n1", "tea", 2), event("n2", "jam", 30), event("n3", "tea", 4)]
    results = await all_of(
        outbox.accept(grouped[0]), outbox.accept_many(grouped[1:]), outbox.accept(event("n4"))
    )
    assert results == ["accepted", ["accepted", "accepted"], "accepted"]
    # One executemany a table (SQLite traces each row): the four orders, then their
    # four entries, where each call on its own would alternate order and entry.
    assert inserts == ["INSERT INTO outbox_orders"] * 4 + ["INSERT INTO outbox_entries"] * 4

    # A known ID, or one twice in a group: each call on its own, as before.
    inserts.clear()
    known = await all_of(outbox.accept(event("a0", "lane-a")), outbox.accept(event("n5", "jam", 5)))
    assert known == ["duplicate", "accepted"]
    assert inserts == ["INSERT INTO outbox_orders", "INSERT INTO outbox_entries"]  # n5's
    inserts.clear()
    twice = await all_of(outbox.accept(event("n6")), outbox.accept_many([event("n7")] * 2))
    assert twice == ["accepted", ["accepted", "duplicate"]]
    assert inserts == ["INSERT INTO outbox_orders", "INSERT INTO outbox_entries"] * 2  # n6's, n7's

    # Written the same either way: the order's fields and time, the entry's canonical
    # payload, lane and time, in the order the calls were made.
    entries = db_rows(
        db,
        "SELECT o.id, o.sku, o.qty, typeof(o.qty), o.accepted_at, e.payload, e.lane,"
        " e.queued_at FROM outbox_entries e JOIN outbox_orders o USING (id) ORDER BY e.seq",
    )
    written = [event("a0", "lane-a"), *grouped, event("n4"), event("n5", "jam", 5)]
    written += [event("n6"), event("n7")]
    assert [row[:4] for row in entries] == [
        (e["id"], e["sku"], e["qty"], "integer") for e in written
    ]
    assert [(row[5], row[6]) for row in entries] == [
        (canonical_json(as_event(e)), e["sku"]) for e in written
    ]
    times = [row[4] for row in entries[1:]]
    assert times == [row[7] for row in entries[1:]] and set(times) <= set(stamps)
    assert times[1] == times[2] != times[0]  # one call's orders: its one time


def poison(db: Path, table: str, when: str, event_id: str) -> None:
    """A trigger, added through another connection, that fails the statement that
    inserts or updates this one row: a real sqlite3 error for one call only."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            f"CREATE TRIGGER poison BEFORE {when} ON {table} WHEN NEW.id = '{event_id}'"
            " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
        )
    finally:
        conn.close()


# ---------------------------------------------------------------- the sink's side


@contextlib.contextmanager
def others_in_progress(inbox: SqliteInbox) -> Iterator[None]:
    """What the sink reports while more than one write request is in progress: a
    write called inside shares its commit with the others (a group commit)."""
    with inbox.arriving(), inbox.arriving():
        yield


def taken(events: list[Event]) -> list[Incoming]:
    """The events as the inbox takes them, validated."""
    return [Incoming.checked(one) for one in events]


def receipts(result: object) -> list[tuple[Receipt, str]]:
    assert isinstance(result, BatchReceipt), result
    return [(r.receipt, r.digest) for r in result.received]


def applied(*events: Event) -> list[tuple[Receipt, str]]:
    return [(Receipt.APPLIED, payload_digest(e)) for e in events]


def received_at(db_rows: Query, db: Path, ids: list[str]) -> set[float]:
    marks = ",".join("?" * len(ids))
    return {
        r[0]
        for r in db_rows(db, f"SELECT received_at FROM inbox_events WHERE id IN ({marks})", (*ids,))
    }


async def test_concurrent_shared_batches_commit_in_one_transaction_each_with_its_own_receipts(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = placed("known", "tea", 9)
    await inbox.receive_batch(taken([known]))
    calls = [[placed(f"c{k}-{n}", f"sku{k}", 10 * k + n + 1) for n in range(3)] for k in range(5)]
    calls[3].insert(1, known)  # one call also repeats an event: applied, duplicate, applied...
    trips = watch(inbox._db, monkeypatch)

    with others_in_progress(inbox):
        results = await all_of(*(inbox.receive_batch(taken(c)) for c in calls))

    for call, result in zip(calls, results, strict=True):
        assert isinstance(result, BatchReceipt) and result.stopped is None
        expected = applied(*call)
        if known in call:
            expected[1] = (Receipt.DUPLICATE, payload_digest(known))
        assert receipts(result) == expected
    # One transaction on the worker thread for the five calls, none inline.
    assert len(trips.worker) == 1 and trips.worker[0] != threading.get_ident()
    assert trips.inline == []
    new = [e["id"] for call in calls for e in call if e is not known]
    assert inbox_ids(sink_db) == ["known", *new]
    assert len(received_at(db_rows, sink_db, new)) == 1  # one `now` for the whole group
    assert db_rows(sink_db, "SELECT deliveries FROM inbox_events WHERE id = 'known'") == [(2,)]
    assert inventory(sink_db) == {
        "tea": 9,
        **{f"sku{k}": sum(10 * k + n + 1 for n in range(3)) for k in range(5)},
    }


async def test_a_conflict_in_one_grouped_call_stops_that_call_only(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = placed("known", "tea", 9)
    await inbox.receive_batch(taken([known]))
    a = [
        placed("a0", "apple", 1),
        placed("a1", "apple", 2),
        placed("known", "tea", 10),
        placed("a3"),
    ]
    b = [placed("b0", "bean", 4), placed("b1", "bean", 8)]
    c = [placed("c0", "corn", 16)]
    trips = watch(inbox._db, monkeypatch)

    with others_in_progress(inbox):
        got_a, got_b, got_single, got_c = await all_of(
            inbox.receive_batch(taken(a)),
            inbox.receive_batch(taken(b)),
            inbox.receive_with_digest(Incoming.checked(placed("known", "tea", 11))),
            inbox.receive_batch(taken(c)),
        )

    assert receipts(got_a) == applied(*a[:2])
    assert isinstance(got_a, BatchReceipt) and isinstance(got_a.stopped, Conflict)
    assert got_a.stopped.event_id == "known"
    assert isinstance(got_single, Conflict) and got_single.event_id == "known"
    assert receipts(got_b) == applied(*b) and receipts(got_c) == applied(*c)
    assert len(trips.worker) == 1 and trips.inline == []
    # Nothing of a's conflicting item or what follows it; the known row is as it was.
    assert inbox_ids(sink_db) == ["known", "a0", "a1", "b0", "b1", "c0"]
    assert db_rows(sink_db, "SELECT payload, deliveries FROM inbox_events WHERE id = 'known'") == [
        (canonical_json(known), 1)
    ]
    assert inventory(sink_db) == {"tea": 9, "apple": 3, "bean": 12, "corn": 16}


async def test_a_new_id_in_two_grouped_calls_is_applied_by_the_first_and_a_duplicate_in_the_second(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = placed("x", "tea", 5)
    first, second = [x, placed("a1", "apple", 1)], [placed("b1", "bean", 2), x]
    trips = watch(inbox._db, monkeypatch)

    with others_in_progress(inbox):
        got_first, got_second = await all_of(
            inbox.receive_batch(taken(first)), inbox.receive_batch(taken(second))
        )

    assert receipts(got_first) == applied(*first)
    assert receipts(got_second) == [*applied(second[0]), (Receipt.DUPLICATE, payload_digest(x))]
    assert len(trips.worker) == 1
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY rowid") == [
        ("x", 2),
        ("a1", 1),
        ("b1", 1),
    ]
    assert inventory(sink_db) == {"tea": 5, "apple": 1, "bean": 2}


async def test_a_write_alone_commits_inline_and_a_shared_one_on_the_worker_thread(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = watch(inbox._db, monkeypatch)
    loop_thread = threading.get_ident()

    alone = await inbox.receive_batch(taken([placed("alone", qty=2)]))
    assert (trips.inline, trips.worker) == ([loop_thread], [])
    with others_in_progress(inbox):
        shared = await inbox.receive_with_digest(Incoming.checked(placed("shared", qty=3)))

    assert receipts(alone) == applied(placed("alone", qty=2))
    assert (shared.receipt, shared.digest) == applied(placed("shared", qty=3))[0]
    assert trips.inline == [loop_thread]
    assert len(trips.worker) == 1 and trips.worker[0] != loop_thread
    assert inbox_ids(sink_db) == ["alone", "shared"]
    assert inventory(sink_db) == {"snack": 5}


async def test_a_write_not_shared_joins_the_next_group_while_a_committer_runs(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = watch(inbox._db, monkeypatch)
    with trips.hold() as gate:
        with others_in_progress(inbox):
            first = asyncio.create_task(inbox.receive_batch(taken([placed("e1")])))
            await eventually(gate.started.is_set)
        assert inbox.writes_in_progress == 0  # the next call is alone: not shared
        unshared = asyncio.create_task(inbox.receive_batch(taken([placed("e2")])))
        await asyncio.sleep(ARRIVAL_S)  # each call in its own turn of the loop
        with others_in_progress(inbox):
            shared = asyncio.create_task(inbox.receive_batch(taken([placed("e3")])))
            await asyncio.sleep(ARRIVAL_S)  # it decides how to commit as it starts
        try:
            await asyncio.sleep(PENDING_S)
            assert not any(t.done() for t in (first, unshared, shared))
            assert trips.inline == [] and inbox_ids(sink_db) == []
        finally:
            gate.release.set()
            async with asyncio.timeout(WAIT_S):
                await asyncio.wait([first, unshared, shared])
            await settle(first, unshared, shared)

    assert [receipts(t.result()) for t in (first, unshared, shared)] == [
        applied(placed(i)) for i in ("e1", "e2", "e3")
    ]
    # The held group, then one more with both calls that came while it ran.
    assert len(trips.worker) == 2 and trips.inline == []
    assert inbox_ids(sink_db) == ["e1", "e2", "e3"]
    assert len(received_at(db_rows, sink_db, ["e2", "e3"])) == 1
    assert received_at(db_rows, sink_db, ["e1"]).isdisjoint(
        received_at(db_rows, sink_db, ["e2", "e3"])
    )


async def test_a_grouped_call_whose_sql_fails_gets_a_storage_error_and_leaves_nothing(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison(sink_db, "inbox_events", "INSERT", "b-poison")
    a = [placed("a0", "apple", 1), placed("a1", "apple", 2)]
    b = [placed("b0", "bean", 4), placed("b-poison", "bean", 8), placed("b2", "bean", 16)]
    c = [placed("c0", "corn", 32)]
    trips = watch(inbox._db, monkeypatch)

    with others_in_progress(inbox):
        got_a, got_b, got_c = await all_of(
            *(inbox.receive_batch(taken(call)) for call in (a, b, c))
        )

    assert isinstance(got_b, StorageError) and "poisoned row" in str(got_b)
    assert receipts(got_a) == applied(*a) and receipts(got_c) == applied(*c)
    assert len(trips.worker) == 1
    assert inbox_ids(sink_db) == ["a0", "a1", "c0"]
    assert inventory(sink_db) == {"apple": 3, "corn": 32}
    # The committer is not stuck: the next write alone commits inline again.
    assert receipts(await inbox.receive_batch(taken([b[0]]))) == applied(b[0])
    assert trips.inline == [threading.get_ident()]


async def test_a_cancelled_shared_write_still_commits_and_later_writes_go_inline_again(
    inbox: SqliteInbox, sink_db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = watch(inbox._db, monkeypatch)
    with trips.hold() as gate, others_in_progress(inbox):
        running = asyncio.create_task(inbox.receive_batch(taken([placed("e1")])))
        await eventually(gate.started.is_set)
        queued = asyncio.create_task(inbox.receive_batch(taken([placed("e2")])))
        waited = asyncio.create_task(inbox.receive_batch(taken([placed("e3")])))
        await asyncio.sleep(0)
        try:
            await settle(running, queued)  # one in the held transaction, one queued
        finally:
            gate.release.set()
        try:
            result = await asyncio.wait_for(waited, WAIT_S)
        finally:
            await settle(waited)

    assert running.cancelled() and queued.cancelled()
    assert receipts(result) == applied(placed("e3"))
    assert inbox_ids(sink_db) == ["e1", "e2", "e3"]
    assert len(trips.worker) == 2 and trips.inline == []
    assert receipts(await inbox.receive_batch(taken([placed("e4")]))) == applied(placed("e4"))
    assert trips.inline == [threading.get_ident()] and len(trips.worker) == 2
    assert inventory(sink_db) == {"snack": 4}


# ---------------------------------------------------------------- the sink over HTTP


@dataclass
class Served:
    base: str
    trips: Trips
    state_of: Callable[[], int]


@pytest.fixture
async def stalled_sink(serve: Serve, sink_db: Path, monkeypatch: pytest.MonkeyPatch) -> Served:
    """The real sink, each POST stalled so that concurrent ones are in progress at once."""
    app = chaos_app(sink_db, Chaos(stall_s=STALL_S))
    base = await serve(app)
    inbox = app[INBOX]
    assert isinstance(inbox, SqliteInbox)
    trips = watch(inbox._db, monkeypatch)
    return Served(base, trips, lambda: inbox.writes_in_progress)


async def test_concurrent_batch_posts_share_commits_and_each_gets_its_own_acks(
    stalled_sink: Served, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    url = f"{stalled_sink.base}/events/batch"
    known = placed("known", "tea", 9)
    assert (await post_json(client, url, {"events": [known]}))[0] == 200
    assert (len(stalled_sink.trips.inline), stalled_sink.trips.worker) == (1, [])  # alone
    bodies = [[placed(f"r{k}-{n}", f"sku{k}", n + 1) for n in range(3)] for k in range(REQUESTS)]
    bodies[1][1] = placed("known", "tea", 10)  # conflicts: r1-0 commits, r1-2 does not

    replies = await all_of(*(post_json(client, url, {"events": body}) for body in bodies))

    for k, (body, reply) in enumerate(zip(bodies, replies, strict=True)):
        assert not isinstance(reply, BaseException), reply
        status, answer = reply
        prefix = body[:1] if k == 1 else body
        assert status == 200
        assert answer["acks"] == [
            make_ack(e["id"], Receipt.APPLIED, payload_digest(e)) for e in prefix
        ]
        if k == 1:
            assert answer["rejected"]["index"] == 1
            assert (answer["rejected"]["status"], answer["rejected"]["id"]) == (409, "known")
        else:
            assert answer["rejected"] is None
    stored = {r[0] for r in db_rows(sink_db, "SELECT id FROM inbox_events")}
    assert stored == {"known"} | {e["id"] for body in bodies for e in body} - {"r1-2"}
    assert db_rows(sink_db, "SELECT deliveries FROM inbox_events WHERE id = 'known'") == [(1,)]
    trips = stalled_sink.trips
    grouped = len(trips.worker) + len(trips.inline) - 1
    assert 1 <= len(trips.worker) and grouped < REQUESTS
    assert stalled_sink.state_of() == 0


async def test_concurrent_event_posts_share_commits_and_each_gets_its_own_ack(
    stalled_sink: Served, client: aiohttp.ClientSession, sink_db: Path, db_rows: Query
) -> None:
    url = f"{stalled_sink.base}/events"
    events = [placed(f"p{k}", f"sku{k % 2}", k + 1) for k in range(REQUESTS)]
    events.append(events[0])  # the same event again: a duplicate

    replies = await all_of(*(post_json(client, url, e) for e in events))

    assert replies[1:-1] == [
        (200, make_ack(e["id"], Receipt.APPLIED, payload_digest(e))) for e in events[1:-1]
    ]
    # p0 twice in one group: whichever was queued first applied it, the other is a duplicate.
    assert sorted([replies[0], replies[-1]], key=lambda reply: str(reply)) == [
        (200, make_ack("p0", kind, payload_digest(events[0])))
        for kind in (Receipt.APPLIED, Receipt.DUPLICATE)
    ]
    assert dict(db_rows(sink_db, "SELECT id, deliveries FROM inbox_events")) == {
        e["id"]: 2 if e is events[0] else 1 for e in events[:-1]
    }
    assert inventory(sink_db) == {"sku0": 1 + 3 + 5, "sku1": 2 + 4 + 6}
    trips = stalled_sink.trips
    assert 1 <= len(trips.worker) and len(trips.worker) + len(trips.inline) < len(events)
    assert stalled_sink.state_of() == 0


# ---------------------------------------------------------------- the publisher's side


class OnTheThread(InlineWrites):
    """The tactic as it is while backing off after a slow write, for as long as a
    test runs: groups go to the worker thread (a call alone with no intake request
    in progress still commits inline)."""

    @property
    def allowed(self) -> bool:
        return False


def groups_on_the_thread(outbox: Outbox) -> None:
    assert isinstance(outbox, SqliteOutbox)
    outbox._inline = OnTheThread()


def groups_inline(outbox: Outbox, clock: Callable[[], float] = time.monotonic) -> InlineWrites:
    """Every write counts as quick, however long it took (SQLITE_BUSY still backs off)."""
    assert isinstance(outbox, SqliteOutbox)
    outbox._inline = InlineWrites(slow_s=math.inf, clock=clock)
    return outbox._inline


async def accept_in_lanes(outbox: Outbox, *ids: str) -> None:
    """Accept each of `ids`, its SKU (so its lane) named after its first letter."""
    for event_id in ids:
        assert await outbox.accept(event(event_id, f"lane-{event_id[0]}")) == "accepted"


def acked(ids: list[str]) -> list[tuple[str, dict[str, str]]]:
    return [(i, make_ack(i, Receipt.APPLIED)) for i in ids]


def outbox_rows(db_rows: Query, db: Path) -> dict[str, tuple[Any, ...]]:
    """id -> (sent, attempts, ack) for every entry."""
    rows = db_rows(db, "SELECT id, sent, attempts, ack FROM outbox_entries ORDER BY seq")
    return {i: (sent, n, None if ack is None else json.loads(ack)) for i, sent, n, ack in rows}


def marked(ids: list[str]) -> dict[str, tuple[Any, ...]]:
    return {i: (1, 1, make_ack(i, Receipt.APPLIED)) for i in ids}


def unmarked(ids: list[str]) -> dict[str, tuple[Any, ...]]:
    return {i: (0, 0, None) for i in ids}


async def test_marks_asked_for_while_one_commits_are_committed_together_next(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = [[f"{lane}{n}" for n in range(3)] for lane in "abcde"]
    await accept_in_lanes(outbox, *(i for call in calls for i in call))
    groups_on_the_thread(outbox)
    trips = watch(outbox._db, monkeypatch)

    with trips.hold() as gate:
        # Two calls at once: a group of two, which commits on the worker thread.
        first = [asyncio.create_task(outbox.mark_sent_many(acked(c))) for c in calls[:2]]
        await eventually(gate.started.is_set)
        later = []
        for call in calls[2:]:  # each call in its own turn of the loop
            later.append(asyncio.create_task(outbox.mark_sent_many(acked(call))))
            await asyncio.sleep(ARRIVAL_S)
        try:
            await asyncio.sleep(PENDING_S)
            assert not any(t.done() for t in (*first, *later))
            assert db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 1") == [(0,)]
        finally:
            gate.release.set()
            async with asyncio.timeout(WAIT_S):
                await asyncio.wait([*first, *later])
            await settle(*first, *later)

    assert [t.result() for t in (*first, *later)] == [None] * 5
    # The held transaction had the first two calls; the three that came meanwhile
    # shared one.
    assert len(trips.worker) == 2 and trips.inline == []
    assert outbox_rows(db_rows, db) == marked([i for call in calls for i in call])
    for call in calls:  # each call's marks carry the one time it was asked at
        marks = ",".join("?" * len(call))
        query = f"SELECT DISTINCT sent_at FROM outbox_entries WHERE id IN ({marks})"
        assert len(db_rows(db, query, (*call,))) == 1


async def test_a_grouped_call_with_an_unknown_id_fails_alone_and_marks_none_of_its_entries(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = ["a0", "a1"], ["b0", "b1"], ["c0"]
    await accept_in_lanes(outbox, *a, *b, *c)
    groups_inline(outbox)
    trips = watch(outbox._db, monkeypatch)

    got_a, got_b, got_single, got_c = await all_of(
        outbox.mark_sent_many(acked(a)),
        outbox.mark_sent_many(acked([b[0], "ghost", b[1]])),
        outbox.mark_sent("phantom", make_ack("phantom", Receipt.APPLIED)),
        outbox.mark_sent_many(acked(c)),
    )

    assert (got_a, got_c) == (None, None)
    assert isinstance(got_b, UnknownEntry) and got_b.event_id == "ghost"
    assert isinstance(got_single, UnknownEntry) and got_single.event_id == "phantom"
    assert (len(trips.inline), trips.worker) == (1, [])  # the four calls in one, inline
    assert outbox_rows(db_rows, db) == {**marked(a), **unmarked(b), **marked(c)}
    await outbox.mark_sent_many(acked(b))  # without the unknown ID, b is marked
    assert outbox_rows(db_rows, db) == marked([*a, *b, *c])


async def test_cancelled_mark_callers_entries_are_still_marked_and_later_marks_work(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    await accept_in_lanes(outbox, "a0", "a1", "b0", "b1", "c0", "d0")
    groups_on_the_thread(outbox)
    trips = watch(outbox._db, monkeypatch)

    with trips.hold() as gate:
        running = asyncio.create_task(outbox.mark_sent_many(acked(["a0"])))
        beside = asyncio.create_task(outbox.mark_sent_many(acked(["a1"])))  # a group of two
        await eventually(gate.started.is_set)
        queued = asyncio.create_task(outbox.mark_sent_many(acked(["b0", "b1"])))
        waited = asyncio.create_task(outbox.mark_sent_many(acked(["c0"])))
        await asyncio.sleep(0)
        try:
            await settle(running, queued)  # one in the held transaction, one queued
        finally:
            gate.release.set()
        try:
            await asyncio.wait_for(asyncio.gather(beside, waited), WAIT_S)
        finally:
            await settle(beside, waited)

    assert running.cancelled() and queued.cancelled()
    assert len(trips.worker) == 2
    assert outbox_rows(db_rows, db) == {
        **marked(["a0", "a1", "b0", "b1", "c0"]),
        **unmarked(["d0"]),
    }
    # The marker was reset: a later mark starts a new one and is committed (alone:
    # inline, on the loop's thread).
    await asyncio.wait_for(outbox.mark_sent("d0", make_ack("d0", Receipt.APPLIED)), WAIT_S)
    assert len(trips.worker) == 2 and trips.inline == [threading.get_ident()]
    assert outbox_rows(db_rows, db) == marked(["a0", "a1", "b0", "b1", "c0", "d0"])


async def test_a_grouped_mark_whose_sql_fails_fails_alone(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept_in_lanes(outbox, "a0", "b0", "b1")
    poison(db, "outbox_entries", "UPDATE OF sent", "b1")

    got_a, got_b = await all_of(
        outbox.mark_sent_many(acked(["a0"])), outbox.mark_sent_many(acked(["b0", "b1"]))
    )

    assert isinstance(got_b, StorageError)
    assert got_a is None
    assert outbox_rows(db_rows, db) == {**marked(["a0"]), **unmarked(["b0", "b1"])}


# ---------------------------------------------------------------- intake, with the marks


def order_ids(db_rows: Query, db: Path) -> tuple[list[str], list[str]]:
    """The IDs of every order, and of every entry in seq order."""
    return (
        [r[0] for r in db_rows(db, "SELECT id FROM outbox_orders ORDER BY id")],
        [r[0] for r in db_rows(db, "SELECT id FROM outbox_entries ORDER BY seq")],
    )


async def test_intake_and_marks_asked_for_while_one_commits_share_the_next_transaction(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    await accept_in_lanes(outbox, "a0", "b0")
    groups_on_the_thread(outbox)
    trips = watch(outbox._db, monkeypatch)

    with trips.hold() as gate:
        first = asyncio.create_task(outbox.accept(event("n0")))
        beside = asyncio.create_task(outbox.accept(event("n6")))  # a group of two
        await eventually(gate.started.is_set)
        later = [
            asyncio.create_task(outbox.mark_sent_many(acked(["a0"]))),
            *(asyncio.create_task(outbox.accept(event(f"n{n}"))) for n in range(1, 6)),
            asyncio.create_task(outbox.accept_many([event("m0"), event("m1")])),
            asyncio.create_task(outbox.mark_sent_many(acked(["b0"]))),
        ]
        try:
            await asyncio.sleep(PENDING_S)
            assert not any(t.done() for t in (first, beside, *later))  # no reply before commit
        finally:
            gate.release.set()
            async with asyncio.timeout(WAIT_S):
                await asyncio.wait([first, beside, *later])
            await settle(first, beside, *later)

    assert [t.result() for t in (first, beside, *later)] == [
        "accepted",
        "accepted",
        None,
        *["accepted"] * 5,
        ["accepted", "accepted"],
        None,
    ]
    assert len(trips.worker) == 2  # the held one, then one for all eight calls
    new = [f"n{n}" for n in range(7)]
    assert order_ids(db_rows, db)[1] == ["a0", "b0", "n0", "n6", *new[1:6], "m0", "m1"]
    assert outbox_rows(db_rows, db) == {
        **marked(["a0", "b0"]),
        **unmarked([*new, "m0", "m1"]),
    }


async def test_an_accept_alone_and_a_group_commit_inline_while_writes_are_quick(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups_inline(outbox)
    trips = watch(outbox._db, monkeypatch)
    loop_thread = threading.get_ident()
    for n in range(3):
        assert await asyncio.wait_for(outbox.accept(event(f"a{n}")), WAIT_S) == "accepted"
        assert order_ids(db_rows, db)[1] == [f"a{k}" for k in range(n + 1)]
    assert trips.inline == [loop_thread] * 3 and trips.worker == []
    assert await all_of(*(outbox.accept(event(f"b{n}")) for n in range(3))) == ["accepted"] * 3
    assert trips.inline == [loop_thread] * 4 and trips.worker == []  # the three in one
    assert order_ids(db_rows, db)[1] == [*(f"a{n}" for n in range(3)), "b0", "b1", "b2"]


def slow_inserts(outbox: Outbox, prefix: str, pause: Callable[[], object]) -> None:
    """Make every insert of an order whose ID starts with `prefix` call `pause` on the
    outbox's own connection, inside its transaction: a temporary trigger."""
    assert isinstance(outbox, SqliteOutbox)
    conn = raw_connection(outbox._db._connection)
    conn.create_function("pause", 0, pause)
    conn.execute(
        "CREATE TEMP TRIGGER slow_insert AFTER INSERT ON outbox_orders"
        f" WHEN NEW.id LIKE '{prefix}%' BEGIN SELECT pause(); END"
    )


async def test_after_a_slow_write_groups_commit_on_the_worker_thread_and_later_inline_again(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that held the loop longer than slow_s sends the next groups to the
    worker thread for backoff_s; then a group commits inline again. The first
    write is alone (inline, then timed), the groups are of three."""
    clock = ManualClock(64.0)
    assert isinstance(outbox, SqliteOutbox)
    outbox._inline = InlineWrites(slow_s=0.005, backoff_s=1.0, clock=clock)
    slow_inserts(outbox, "slow", lambda: clock.advance(1 / 64))  # over 0.005 s
    trips = watch(outbox._db, monkeypatch)
    loop_thread = threading.get_ident()

    assert await asyncio.wait_for(outbox.accept(event("slow0")), WAIT_S) == "accepted"
    assert await all_of(*(outbox.accept(event(f"b{n}")) for n in range(3))) == ["accepted"] * 3
    assert trips.inline == [loop_thread] and len(trips.worker) == 1
    assert trips.worker[0] != loop_thread
    clock.advance(1 - 1 / 1024)  # binary fractions: the sums are exact
    assert await all_of(*(outbox.accept(event(f"c{n}")) for n in range(3))) == ["accepted"] * 3
    assert trips.inline == [loop_thread] and len(trips.worker) == 2  # still backing off
    clock.advance(1 / 1024)
    assert await all_of(*(outbox.accept(event(f"d{n}")) for n in range(3))) == ["accepted"] * 3
    assert trips.inline == [loop_thread] * 2 and len(trips.worker) == 2
    assert order_ids(db_rows, db)[1] == [
        "slow0",
        *(f"{group}{n}" for group in "bcd" for n in range(3)),
    ]


async def test_a_write_lock_held_elsewhere_sends_the_groups_to_the_worker_thread_for_a_while(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection holds the write lock: the inline try fails at once with
    SQLITE_BUSY and the group waits for the lock on the worker thread; however short
    that was, the next groups go there too for backoff_s (the other writer may be
    back), and inline again after it."""
    clock = ManualClock(64.0)
    inline = groups_inline(outbox, clock)  # quick, whatever they take: BUSY alone counts
    trips = watch(outbox._db, monkeypatch)
    loop_thread = threading.get_ident()
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        group = asyncio.ensure_future(all_of(*(outbox.accept(event(f"b{n}")) for n in range(2))))
        await eventually(lambda: len(trips.worker) == 1)  # tried inline, then handed over
        assert not group.done() and not inline.allowed
        other.execute("ROLLBACK")
        assert await group == ["accepted"] * 2
    finally:
        other.close()
    # The try that found the lock held, then the same call handed to the worker.
    tried = [loop_thread, trips.worker[0]]
    assert trips.inline == tried and trips.worker[0] != loop_thread
    assert await all_of(*(outbox.accept(event(f"c{n}")) for n in range(2))) == ["accepted"] * 2
    assert trips.inline == tried and len(trips.worker) == 2
    clock.advance(INLINE_BACKOFF_S)
    assert await all_of(*(outbox.accept(event(f"d{n}")) for n in range(2))) == ["accepted"] * 2
    assert trips.inline == [*tried, loop_thread] and len(trips.worker) == 2
    assert order_ids(db_rows, db)[1] == [f"{g}{n}" for g in "bcd" for n in range(2)]


async def test_an_accept_within_the_outboxs_gather_passes_joins_the_group(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outbox takes a group GATHER_PASSES passes of the loop after its first call:
    an accept that starts with the first and submits that many passes later shares
    its transaction, one pass later it makes the next."""
    groups_inline(outbox)
    trips = watch(outbox._db, monkeypatch)

    async def accept_after(passes: int, event_id: str) -> Intake:
        for _ in range(passes):
            await asyncio.sleep(0)
        return await outbox.accept(event(event_id))

    for late_by, transactions in ((GATHER_PASSES, 1), (GATHER_PASSES + 1, 2)):
        trips.inline.clear()
        first = asyncio.create_task(outbox.accept(event(f"first{late_by}")))
        late = asyncio.create_task(accept_after(late_by, f"late{late_by}"))
        assert await all_of(first, late) == ["accepted", "accepted"]
        assert (len(trips.inline), trips.worker) == (transactions, [])
    assert order_ids(db_rows, db)[1] == [
        f"first{GATHER_PASSES}",
        f"late{GATHER_PASSES}",
        f"first{GATHER_PASSES + 1}",
        f"late{GATHER_PASSES + 1}",
    ]


async def test_a_grouped_intake_whose_sql_fails_fails_alone_and_leaves_nothing(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    await accept_in_lanes(outbox, "a0")
    poison(db, "outbox_entries", "INSERT", "bad")
    groups_inline(outbox)
    trips = watch(outbox._db, monkeypatch)

    results = await all_of(
        outbox.accept(event("n0")),
        outbox.accept_many([event("m0"), event("bad"), event("m1")]),
        outbox.accept(event("bad")),
        outbox.mark_sent_many(acked(["a0"])),
        outbox.accept(event("n1")),
    )

    assert results[0] == "accepted" and results[3] is None and results[4] == "accepted"
    assert isinstance(results[1], StorageError) and "poisoned row" in str(results[1])
    assert isinstance(results[2], StorageError) and "poisoned row" in str(results[2])
    assert (len(trips.inline), trips.worker) == (1, [])  # the five calls in one, inline
    # The order rows written before each failed entry insert are gone with it.
    assert order_ids(db_rows, db) == (["a0", "n0", "n1"], ["a0", "n0", "n1"])
    assert outbox_rows(db_rows, db)["a0"] == marked(["a0"])["a0"]


@dataclass
class SyncLevels:
    """What each transaction on the outbox's own connection wrote ("intake",
    "marks") and the synchronous level it committed under, as the connection reports
    its statements (a trace callback)."""

    commits: list[tuple[str, str]] = field(default_factory=list)
    _level: str = "FULL"  # what the connection is opened with (sqlite_tx.PRAGMAS)
    _wrote: set[str] = field(default_factory=set)

    def statement(self, sql: str) -> None:
        if sql.startswith("PRAGMA synchronous = "):
            self._level = sql.removeprefix("PRAGMA synchronous = ")
        elif sql.startswith("BEGIN"):
            self._wrote = set()
        elif sql.startswith("INSERT INTO outbox_orders"):
            self._wrote.add("intake")
        elif sql.lstrip().startswith("UPDATE outbox_entries SET sent = 1"):
            self._wrote.add("marks")
        elif sql == "ROLLBACK TO all_pending":  # not every entry pending: none marked
            self._wrote.discard("marks")
        elif sql == "COMMIT" and self._wrote:
            self.commits.append(("+".join(sorted(self._wrote)), self._level))


async def test_marks_alone_commit_without_a_sync_and_every_transaction_with_intake_syncs(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost mark only sends its entry again (the sink answers with a duplicate ACK):
    a transaction of marks alone, every entry pending, commits at synchronous=NORMAL,
    and the connection is FULL again for the next one. Any other marks sync: an
    undone mark of a quarantined entry would leave it quarantined, not pending. An
    order must be on disk before its reply: every transaction with intake syncs,
    marks among it or not."""
    await accept_in_lanes(outbox, "a0", "b0", "c0", "q0")
    await outbox.quarantine("q0", "looked stuck", "op")
    groups_on_the_thread(outbox)
    levels = SyncLevels()
    raw_connection(outbox._db._connection).set_trace_callback(levels.statement)
    trips = watch(outbox._db, monkeypatch)

    await outbox.mark_sent_many(acked(["a0"]))  # alone: inline
    await all_of(outbox.mark_sent_many(acked(["b0"])), outbox.accept(event("d0")))
    with pytest.raises(UnknownEntry):
        await outbox.mark_sent_many(acked(["nope"]))
    await outbox.mark_sent_many(acked(["q0"]))  # its ACK wins over the quarantine
    await outbox.accept(event("e0"))
    with trips.hold() as gate:
        held = asyncio.create_task(outbox.accept(event("f0")))
        beside = asyncio.create_task(outbox.accept(event("f1")))  # a group of two
        await eventually(gate.started.is_set)
        later = [asyncio.create_task(outbox.mark_sent_many(acked(i))) for i in (["c0"], ["d0"])]
        await asyncio.sleep(PENDING_S)
        gate.release.set()
        async with asyncio.timeout(WAIT_S):
            await asyncio.wait([held, beside, *later])
        await settle(held, beside, *later)

    assert levels.commits == [
        ("marks", "NORMAL"),
        ("intake+marks", "FULL"),
        ("marks", "FULL"),  # the unknown ID's: it writes nothing, and fails alone
        ("marks", "FULL"),  # the quarantined entry's, with its record closed
        ("intake", "FULL"),
        ("intake", "FULL"),
        ("marks", "NORMAL"),  # the two marks that waited for the held group
    ]
    level = await outbox._db.run(lambda conn: conn.execute("PRAGMA synchronous").fetchone())
    assert level == (2,)  # FULL
    assert db_rows(db, "SELECT id FROM outbox_entries WHERE sent = 1 ORDER BY seq") == [
        ("a0",),
        ("b0",),
        ("c0",),
        ("q0",),
        ("d0",),
    ]
    assert db_rows(db, "SELECT id, released_as FROM outbox_quarantines") == [("q0", "delivered")]


async def test_an_inline_group_of_intake_and_marks_syncs_and_an_inline_group_of_marks_does_not(
    outbox: Outbox, db: Path, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same levels when groups commit inline on the loop's thread, as they do while
    writes are quick: a group with intake in it commits at FULL, marks among it or
    not, and a group of marks alone at NORMAL; the connection is FULL after each."""
    await accept_in_lanes(outbox, "a0", "b0", "c0")
    groups_inline(outbox)
    levels = SyncLevels()
    raw_connection(outbox._db._connection).set_trace_callback(levels.statement)
    trips = watch(outbox._db, monkeypatch)

    first = await all_of(outbox.mark_sent_many(acked(["a0"])), outbox.accept(event("d0")))
    second = await all_of(
        outbox.mark_sent_many(acked(["b0"])), outbox.mark_sent_many(acked(["c0"]))
    )

    assert first == [None, "accepted"] and second == [None, None]
    assert levels.commits == [("intake+marks", "FULL"), ("marks", "NORMAL")]
    assert (trips.inline, trips.worker) == ([threading.get_ident()] * 2, [])
    level = await outbox._db.run(lambda conn: conn.execute("PRAGMA synchronous").fetchone())
    assert level == (2,)  # FULL
    sent = db_rows(db, "SELECT id FROM outbox_entries WHERE sent = 1 ORDER BY seq")
    assert sent == [("a0",), ("b0",), ("c0",)]


async def test_when_the_groups_transaction_fails_every_caller_fails_and_nothing_is_written(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept_in_lanes(outbox, "a0")
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # RAISE(ROLLBACK) ends the whole transaction, not only the statement
        conn.execute(
            "CREATE TRIGGER doom BEFORE INSERT ON outbox_entries WHEN NEW.id = 'doom'"
            " BEGIN SELECT RAISE(ROLLBACK, 'transaction lost'); END"
        )
    finally:
        conn.close()

    results = await all_of(
        outbox.accept(event("n0")),
        outbox.mark_sent_many(acked(["a0"])),
        outbox.accept(event("doom")),
        outbox.accept_many([event("m0"), event("m1")]),
    )

    assert all(isinstance(r, StorageError) for r in results), results
    assert order_ids(db_rows, db) == (["a0"], ["a0"])
    assert outbox_rows(db_rows, db) == unmarked(["a0"])
    assert await outbox.accept(event("n0")) == "accepted"  # the next group commits


# ---------------------------------------------------------------- the publisher over HTTP


@dataclass
class IntakeCommits:
    """The thread each intake transaction (one that inserted an order) committed on,
    in order, as the outbox's own connection reports its statements (a trace callback
    on the sqlite3 connection: it runs on whichever thread runs the statement)."""

    threads: list[int] = field(default_factory=list)
    _orders: bool = False

    def statement(self, sql: str) -> None:
        if sql.startswith("BEGIN"):
            self._orders = False
        elif sql.startswith("INSERT INTO outbox_orders"):
            self._orders = True
        elif sql == "COMMIT" and self._orders:
            self.threads.append(threading.get_ident())


@dataclass
class Publisher:
    base: str
    commits: IntakeCommits
    outbox: Outbox


@pytest.fixture
async def publisher(
    serve: Serve,
    serve_sink: ServeSink,
    client: aiohttp.ClientSession,
    sink_db: Path,
    db: Path,
    db_rows: Query,
) -> Publisher:
    """`publisher serve`'s application on loopback in front of a real sink, its
    outbox's intake commits traced from after one order has been delivered and
    marked: the relay then waits for the next wake (its poll is far off), so
    nothing of its own runs on the database thread when a test's first order
    commits."""
    sink = await serve_sink(sink_db)
    settings = ServiceSettings(
        db=str(db), sink=f"{sink}/events", relay=RelaySettings(poll_interval_s=30.0)
    )
    app = create_app(settings)
    base = await serve(app)
    assert await post_json(client, f"{base}/orders", event("warm")) == (
        201,
        {"id": "warm", "result": "accepted"},
    )
    await eventually(lambda: db_rows(db, "SELECT sent FROM outbox_entries") == [(1,)])
    await asyncio.sleep(PENDING_S)  # the relay's reads after the mark, done
    outbox, commits = app[OUTBOX], IntakeCommits()
    assert isinstance(outbox, SqliteOutbox)
    raw_connection(outbox._db._connection).set_trace_callback(commits.statement)
    return Publisher(base, commits, outbox)


@contextlib.asynccontextmanager
async def body_still_arriving(
    base: str, order: Event
) -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
    """A POST /orders whose headers are sent and whose body is not, all but its last
    byte: in progress at the publisher until `finish()` sends the rest and returns
    the reply's status line."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(order).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /orders HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body[:-1])
    await writer.drain()

    async def finish() -> bytes:
        writer.write(body[-1:])
        async with asyncio.timeout(WAIT_S):
            return await reader.readline()

    try:
        yield finish
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_concurrent_order_posts_share_commits_and_each_gets_its_own_reply(
    publisher: Publisher, client: aiohttp.ClientSession, db: Path, db_rows: Query
) -> None:
    orders = [event(f"h{n}", f"sku{n % 3}", n + 1) for n in range(REQUESTS * 2)]

    replies = await all_of(*(post_json(client, f"{publisher.base}/orders", o) for o in orders))

    assert replies == [(201, {"id": o["id"], "result": "accepted"}) for o in orders]
    assert order_ids(db_rows, db)[0] == sorted(["warm", *(o["id"] for o in orders)])
    assert 1 <= len(publisher.commits.threads) < len(orders)


async def test_an_order_posted_while_another_is_in_progress_commits_inline_while_writes_are_quick(
    publisher: Publisher, client: aiohttp.ClientSession, db: Path, db_rows: Query
) -> None:
    loop_thread = threading.get_ident()
    groups_inline(publisher.outbox)
    async with body_still_arriving(publisher.base, event("slow")) as finish:
        assert await post_json(client, f"{publisher.base}/orders", event("quick")) == (
            201,
            {"id": "quick", "result": "accepted"},
        )
        assert publisher.commits.threads == [loop_thread]
        assert (await finish()).startswith(b"HTTP/1.1 201")
    assert order_ids(db_rows, db)[0] == ["quick", "slow", "warm"]
    # The second on whichever thread: the relay, woken by the first, may be reading.
    assert len(publisher.commits.threads) == 2
    assert publisher.outbox.intake_in_progress == 0


async def test_after_a_slow_write_an_order_posted_while_another_is_in_progress_commits_off_the_loop(
    publisher: Publisher, client: aiohttp.ClientSession, db: Path, db_rows: Query
) -> None:
    """Inline after a slow write, the next commit could hold the loop as long again
    while the other request's bytes wait in its socket: it goes to the worker thread."""
    loop_thread = threading.get_ident()
    publisher.outbox._inline = InlineWrites(slow_s=0.005, backoff_s=WAIT_S * 6)
    slow_inserts(publisher.outbox, "pause", lambda: time.sleep(0.02))
    assert await post_json(client, f"{publisher.base}/orders", event("pause0")) == (
        201,
        {"id": "pause0", "result": "accepted"},
    )
    assert publisher.commits.threads == [loop_thread]  # alone: inline, and slow
    # Its delivery and mark done, and the relay's reads after them: the worker
    # thread is idle again, so only the backoff keeps the next commit off the loop.
    await eventually(
        lambda: db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 0") == [(0,)]
    )
    await asyncio.sleep(PENDING_S)
    async with body_still_arriving(publisher.base, event("slow")) as finish:
        assert await post_json(client, f"{publisher.base}/orders", event("quick")) == (
            201,
            {"id": "quick", "result": "accepted"},
        )
        assert len(publisher.commits.threads) == 2
        assert publisher.commits.threads[1] != loop_thread
        assert (await finish()).startswith(b"HTTP/1.1 201")
    assert order_ids(db_rows, db)[0] == ["pause0", "quick", "slow", "warm"]
    assert len(publisher.commits.threads) == 3
    assert publisher.outbox.intake_in_progress == 0
