"""receive_in / receive_in_async: an event's inbox row written in the caller's own
transaction, on a SQLite file (sqlite3; SQLAlchemy's sqlite and sqlite+aiosqlite) and
on PostgreSQL (psycopg's Connection and AsyncConnection; SQLAlchemy's
postgresql+psycopg), each test for every pair that exists. The inbox is opened
beforehand with Inbox.open, as a program does; the caller's own rows are payments
(the publish_in tests' model); what commits is read through connections of the
test's own and through the inbox itself (Inbox.count, Inbox.record, Inbox.receive).
ack_body and read_cloudevents are compared with the real sink on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import orm
from support import query
from test_outbox_schema import execute, in_search_path
from test_publish_in_sqlalchemy import Base, Callers, done, sqlalchemy_url
from test_sink_cloudevents import PAYMENT, PLACED, TICK, cloudevent, post

from plumbing.storage import BadLocation, StorageError
from shared import Conflict, Event, InvalidEvent, Receipt, canonical_json, digest_of
from shared.cloudevents import BATCHED, JSON, STRUCTURED
from sink import (
    Inbox,
    InvalidRequest,
    NotInTransaction,
    ack_body,
    create_app,
    read_cloudevents,
    receive_in,
    receive_in_async,
)

if TYPE_CHECKING:
    from conftest import Databases, PgSchemas, Serve

SQLALCHEMY_KINDS = ["Connection", "Session", "AsyncConnection", "AsyncSession"]
CASES = [
    *[("sqlite", kind) for kind in ["sqlite3", *SQLALCHEMY_KINDS]],
    *[("postgres", kind) for kind in ["psycopg", "psycopg-async", *SQLALCHEMY_KINDS]],
]
CHANGED: Event = {**PAYMENT, "data": {**PAYMENT["data"], "amount": 13}}


def payment(event_id: str) -> Event:
    return {**PAYMENT, "id": event_id}


@dataclass
class DriverCaller:
    """The caller's side on a connection of the driver's own (sqlite3, psycopg sync
    or async), in whatever transaction it is in, with the methods of the SQLAlchemy
    tests' Caller."""

    obj: Any
    is_async: bool

    async def pay(self, payment_id: str, amount_cents: int) -> None:
        if isinstance(self.obj, sqlite3.Connection):
            sql: str | bytes = "INSERT INTO payments (id, amount_cents) VALUES (?, ?)"
        else:
            sql = b"INSERT INTO payments (id, amount_cents) VALUES (%s, %s)"
        await done(self.obj.execute(sql, (payment_id, amount_cents)))

    async def commit(self) -> None:
        await done(self.obj.commit())

    async def rollback(self) -> None:
        await done(self.obj.rollback())


class Consumer:
    """Opens the caller's objects of one kind on one database; closed without a
    commit, an object's uncommitted work is rolled back."""

    def __init__(self, kind: str, location: Path | str) -> None:
        self.kind = kind
        self.location = location
        self._sqlalchemy = Callers(kind, location) if kind in SQLALCHEMY_KINDS else None

    @contextlib.asynccontextmanager
    async def open(self, autocommit: bool = False) -> AsyncIterator[Any]:
        if self._sqlalchemy is not None:
            async with self._sqlalchemy.open(autocommit) as caller:
                yield caller
        elif self.kind == "sqlite3":
            isolation = None if autocommit else ""
            conn = sqlite3.connect(self.location, timeout=5, isolation_level=isolation)
            try:
                yield DriverCaller(conn, is_async=False)
            finally:
                conn.close()
        elif self.kind == "psycopg":
            sync = psycopg.connect(str(self.location), autocommit=autocommit, connect_timeout=5)
            try:
                yield DriverCaller(sync, is_async=False)
            finally:
                sync.close()
        else:
            aconn = await psycopg.AsyncConnection.connect(
                str(self.location), autocommit=autocommit, connect_timeout=5
            )
            try:
                yield DriverCaller(aconn, is_async=True)
            finally:
                await aconn.close()

    async def close(self) -> None:
        if self._sqlalchemy is not None:
            await self._sqlalchemy.close()


async def receive(caller: Any, event: object, **kwargs: Any) -> str:
    """receive_in, or receive_in_async for an async object."""
    if caller.is_async:
        return await receive_in_async(caller.obj, event, **kwargs)
    return receive_in(caller.obj, event, **kwargs)


def make_payments(location: Path | str) -> None:
    """The caller's own table, made by its own metadata (a short-lived engine)."""
    engine = sa.create_engine(sqlalchemy_url(location, is_async=False))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()


@dataclass(frozen=True)
class Case:
    backend: str
    kind: str
    location: Path | str


@pytest.fixture(params=CASES, ids=[f"{backend}-{kind}" for backend, kind in CASES])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    backend, kind = request.param
    if backend == "sqlite":
        return Case(backend, kind, tmp_path / "consumer.db")
    return Case(backend, kind, request.getfixturevalue("pg_database"))


@pytest.fixture
async def opened(case: Case) -> AsyncIterator[Inbox]:
    """The inbox at the consumer's database, opened (its tables made) beforehand."""
    async with Inbox.open(case.location) as inbox:
        make_payments(case.location)
        yield inbox


@pytest.fixture
async def consumer(case: Case, opened: Inbox) -> AsyncIterator[Consumer]:
    made = Consumer(case.kind, case.location)
    try:
        yield made
    finally:
        await made.close()


def rows(case: Case, sql: str) -> list[tuple[Any, ...]]:
    """Read through a connection of the test's own: what another process sees."""
    return query(case.location, sql)


# ---------------------------------------------------------------- every connection kind


async def test_new_then_duplicate_then_conflict_as_the_inbox_judges_them(
    consumer: Consumer, opened: Inbox, case: Case
) -> None:
    async with consumer.open() as caller:
        assert await receive(caller, PAYMENT) == "new"
        assert await receive(caller, PAYMENT) == "duplicate"  # its own transaction sees it
        with pytest.raises(Conflict):
            await receive(caller, CHANGED)
        with pytest.raises(InvalidEvent):
            await receive(caller, {"id": "p-2", "type": "payment.captured"})
        await caller.pay("p-123", 1250)  # the transaction goes on after a Conflict
        await caller.commit()
    async with consumer.open() as caller:
        assert await receive(caller, PAYMENT) == "duplicate"
        with pytest.raises(Conflict):
            await receive(caller, CHANGED)
        await caller.commit()

    # What the inbox itself says of the same event now.
    assert await opened.receive(PAYMENT) is Receipt.DUPLICATE
    with pytest.raises(Conflict):
        await opened.receive(CHANGED)
    record = await opened.record("p-123")
    assert record is not None
    assert (record.event, record.deliveries) == (PAYMENT, 4)
    assert record.digest == digest_of(canonical_json(PAYMENT))
    assert rows(case, "SELECT id, amount_cents FROM payments") == [("p-123", 1250)]


async def test_the_callers_rows_and_the_inbox_row_commit_together(
    consumer: Consumer, opened: Inbox, case: Case
) -> None:
    async with consumer.open() as caller:
        await caller.pay("p-123", 1250)
        assert await receive(caller, PAYMENT) == "new"
        # Not committed: neither is there for anyone else.
        assert rows(case, "SELECT count(*) FROM inbox_events") == [(0,)]
        assert rows(case, "SELECT count(*) FROM payments") == [(0,)]
        assert await opened.count() == 0
        assert await opened.record("p-123") is None
        await caller.commit()

    assert rows(case, "SELECT id, amount_cents FROM payments") == [("p-123", 1250)]
    assert rows(case, "SELECT id, type, payload FROM inbox_events") == [
        ("p-123", "payment.captured", canonical_json(PAYMENT))
    ]
    assert await opened.count() == 1
    record = await opened.record("p-123")
    assert record is not None
    assert (record.event, record.deliveries, record.applied_seq) == (PAYMENT, 1, 1)
    assert record.last_delivery_at == record.received_at


class EffectRefused(Exception):
    """The caller's own code failing after receive_in, before its commit."""


async def test_a_caller_that_fails_before_its_commit_leaves_neither_row(
    consumer: Consumer, opened: Inbox, case: Case
) -> None:
    with pytest.raises(EffectRefused):
        async with consumer.open() as caller:
            try:
                assert await receive(caller, PAYMENT) == "new"
                await caller.pay("p-123", 1250)
                raise EffectRefused
            except BaseException:
                await caller.rollback()
                raise

    assert rows(case, "SELECT count(*) FROM payments") == [(0,)]
    assert rows(case, "SELECT count(*) FROM inbox_events") == [(0,)]
    assert await opened.count() == 0  # on PostgreSQL, the tally went back too
    assert await opened.record("p-123") is None
    # Delivered again, it is new: nothing of the first attempt was left.
    async with consumer.open() as caller:
        assert await receive(caller, PAYMENT) == "new"
        await caller.pay("p-123", 1250)
        await caller.commit()
    assert await opened.count() == 1
    assert rows(case, "SELECT id FROM payments") == [("p-123",)]


async def test_the_order_of_application_and_the_count_are_the_inboxs_own(
    consumer: Consumer, opened: Inbox
) -> None:
    assert await opened.receive(payment("a")) is Receipt.APPLIED  # by the sink's own path
    async with consumer.open() as caller:
        assert await receive(caller, payment("b")) == "new"
        assert await receive(caller, payment("a")) == "duplicate"
        await caller.commit()
    assert await opened.receive(payment("c")) is Receipt.APPLIED
    assert await opened.receive(payment("b")) is Receipt.DUPLICATE

    records = [await opened.record(event_id) for event_id in "abc"]
    assert [(r.applied_seq, r.deliveries) for r in records if r is not None] == [
        (1, 2),
        (2, 2),
        (3, 1),
    ]
    a, b = records[0], records[1]
    assert a is not None and a.last_delivery_at > a.received_at
    assert b is not None and b.last_delivery_at > b.received_at
    assert await opened.count() == 3


async def test_autocommit_is_refused_and_writes_nothing(consumer: Consumer, case: Case) -> None:
    async with consumer.open(autocommit=True) as caller:
        with pytest.raises(NotInTransaction):
            await receive(caller, PAYMENT)
    assert rows(case, "SELECT count(*) FROM inbox_events") == [(0,)]


async def test_the_sync_and_the_async_objects_are_not_mixed_up(consumer: Consumer) -> None:
    async with consumer.open() as caller:
        other = DriverCaller(caller.obj, is_async=not caller.is_async)
        with pytest.raises(TypeError):
            await receive(other, PAYMENT)
    with pytest.raises(TypeError, match="receive_in takes"):
        receive_in(object(), PAYMENT)
    with pytest.raises(TypeError, match="receive_in_async takes"):
        await receive_in_async(object(), PAYMENT)


@pytest.mark.parametrize("kind", ["driver", *SQLALCHEMY_KINDS])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_database_without_the_inbox_tables_says_to_open_the_inbox_first(
    backend: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    location: Path | str
    if backend == "sqlite":
        location, kinds = tmp_path / "blank.db", {"driver": "sqlite3"}
    else:
        location = request.getfixturevalue("pg_schemas").new()
        kinds = {"driver": "psycopg"}
    consumer = Consumer(kinds.get(kind, kind), location)
    try:
        async with consumer.open() as caller:
            with pytest.raises(StorageError, match=r"Inbox\.open") as failed:
                await receive(caller, PAYMENT)
            await caller.rollback()
    finally:
        await consumer.close()
    assert "inbox_events" in str(failed.value) and "schema=" in str(failed.value)


# ---------------------------------------------------------------- PostgreSQL


async def test_a_second_delivery_waits_for_the_first_transaction_then_is_judged(
    pg_database: str,
) -> None:
    async with Inbox.open(pg_database) as inbox:
        first = await psycopg.AsyncConnection.connect(pg_database)
        second = await psycopg.AsyncConnection.connect(pg_database)
        try:
            assert await receive_in_async(first, PAYMENT) == "new"
            waiting = asyncio.ensure_future(receive_in_async(second, PAYMENT))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # its insert waits for the first transaction
            await first.rollback()
            assert await waiting == "new"  # nothing of the first is left
            await second.commit()
        finally:
            await first.close()
            await second.close()
        assert await inbox.count() == 1
        record = await inbox.record("p-123")
        assert record is not None and record.deliveries == 1

        first = await psycopg.AsyncConnection.connect(pg_database)
        second = await psycopg.AsyncConnection.connect(pg_database)
        try:
            assert await receive_in_async(first, payment("b")) == "new"
            waiting = asyncio.ensure_future(receive_in_async(second, payment("b")))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await first.commit()
            assert await waiting == "duplicate"  # judged as the first committed it
            await second.commit()
        finally:
            await first.close()
            await second.close()
        assert await inbox.count() == 2


INBOX_SCHEMA = "ib"


async def test_receive_in_writes_into_the_schema_named_whatever_the_callers_search_path(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url
    execute(base, "CREATE SCHEMA shop", "CREATE TABLE shop.payments (id TEXT PRIMARY KEY)")
    users = in_search_path(base, "shop")
    url = in_search_path(base.replace("postgresql://", "postgresql+psycopg://", 1), "shop")
    engine = sa.create_engine(url)
    try:
        async with Inbox.open(f"{base}?schema={INBOX_SCHEMA}") as inbox:
            with psycopg.connect(users) as conn:
                conn.execute(b"INSERT INTO payments (id) VALUES ('a')")
                assert receive_in(conn, payment("a"), schema=INBOX_SCHEMA) == "new"
                assert receive_in(conn, payment("a"), schema=INBOX_SCHEMA) == "duplicate"
                with pytest.raises(StorageError, match=r"Inbox\.open"):  # none in its path
                    receive_in(conn, payment("x"))
                conn.rollback()
                assert receive_in(conn, payment("a"), schema=INBOX_SCHEMA) == "new"
                conn.commit()
            async with await psycopg.AsyncConnection.connect(users) as aconn:
                assert await receive_in_async(aconn, payment("b"), schema=INBOX_SCHEMA) == "new"
                await aconn.commit()
            with orm.Session(engine) as session, session.begin():
                assert receive_in(session, payment("c"), schema=INBOX_SCHEMA) == "new"
            assert await inbox.count() == 3
            assert [(await inbox.record(i)) is not None for i in "abc"] == [True] * 3
    finally:
        engine.dispose()
    assert query(base, f"SELECT id FROM {INBOX_SCHEMA}.inbox_events ORDER BY id") == [
        ("a",),
        ("b",),
        ("c",),
    ]
    assert query(base, "SELECT to_regclass('shop.inbox_events') IS NULL") == [(True,)]


async def test_a_schema_that_is_not_a_plain_name_is_refused(pg_schemas: PgSchemas) -> None:
    base = pg_schemas.database_url
    async with Inbox.open(f"{base}?schema={INBOX_SCHEMA}"):
        with psycopg.connect(base) as conn, pytest.raises(BadLocation, match="schema must be"):
            receive_in(conn, PAYMENT, schema='ib"; DROP TABLE x; --')
    assert query(base, f"SELECT count(*) FROM {INBOX_SCHEMA}.inbox_events") == [(0,)]


async def test_a_schema_is_refused_on_a_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "consumer.db"
    async with Inbox.open(db):
        pass
    conn = sqlite3.connect(db)
    try:
        with pytest.raises(ValueError, match="a SQLite file has none"):
            receive_in(conn, PAYMENT, schema=INBOX_SCHEMA)
        assert not conn.in_transaction
    finally:
        conn.close()
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as connection:
            with pytest.raises(ValueError, match="a SQLite file has none"):
                receive_in(connection, PAYMENT, schema=INBOX_SCHEMA)
            assert not connection.in_transaction()  # refused before it was begun
    finally:
        engine.dispose()
    assert query(db, "SELECT count(*) FROM inbox_events") == [(0,)]


# ---------------------------------------------------------------- the sink's answers


async def receive_committed(location: Path | str, event: Event) -> str:
    """receive_in in a transaction of its own, committed (the driver's connection)."""
    consumer = Consumer("sqlite3" if isinstance(location, Path) else "psycopg", location)
    async with consumer.open() as caller:
        arrival = await receive(caller, event)
        await caller.commit()
    return arrival


async def test_ack_body_is_what_the_sink_answers_for_the_same_event(
    databases: Databases, serve: Serve, client: aiohttp.ClientSession
) -> None:
    """The consumer's database is the source; a sink of its own serves the other.
    Another sink on the consumer's database takes its rows as its own."""
    async with Inbox.open(databases.source):
        pass
    sink = await serve(create_app(databases.sink))
    beside = await serve(create_app(databases.source))
    for one in (PAYMENT, PLACED, TICK):
        new = await receive_committed(databases.source, one)
        assert (new, await post(client, f"{sink}/events", cloudevent(one), STRUCTURED)) == (
            "new",
            (200, ack_body(one, new)),
        )
        again = await receive_committed(databases.source, one)
        assert (again, await post(client, f"{sink}/events", cloudevent(one), STRUCTURED)) == (
            "duplicate",
            (200, ack_body(one, again)),
        )
        status, reply = await post(client, f"{beside}/events", cloudevent(one), STRUCTURED)
        assert (status, reply) == (200, ack_body(one, "duplicate"))

    async with client.get(f"{beside}/events/p-123") as response:
        record = await response.json()
    assert (record["deliveries"], record["sha256"]) == (3, ack_body(PAYMENT, "new")["sha256"])


def request_of(media: str, body: object, headers: dict[str, str] | None = None) -> Any:
    return media, headers or {}, json.dumps(body).encode()


# (Content-Type, headers, body) of requests the sink takes: their events are read
# as it reads them, and acknowledged as it acknowledges them.
TAKEN = {
    "structured": request_of(STRUCTURED, cloudevent(PAYMENT)),
    "binary": request_of(
        JSON,
        PLACED["data"],
        {"ce-specversion": "1.0", "ce-id": "o-1", "ce-source": "urn:t", "ce-type": "order.placed"}
        | {"ce-partitionkey": "snack"},
    ),
    "batched": request_of(BATCHED, [cloudevent(TICK), cloudevent({**PAYMENT, "id": "p-9"})]),
}
# Requests the sink refuses: the same status and body.
REFUSED = {
    "bad-key": request_of(STRUCTURED, {**cloudevent(PAYMENT), "partitionkey": "a b"}),
    "no-source": request_of(
        STRUCTURED, {k: v for k, v in cloudevent(PAYMENT).items() if k != "source"}
    ),
    "bad-ce-id": request_of(
        JSON,
        {},
        {"ce-specversion": "1.0", "ce-id": "-x", "ce-source": "urn:t", "ce-type": "t"},
    ),
    "empty-batch": request_of(BATCHED, []),
    "not-json": (STRUCTURED, {}, b'{"id": '),
}


async def posted(
    client: aiohttp.ClientSession, base: str, request: tuple[str, dict[str, str], bytes]
) -> tuple[int, Any]:
    media, headers, raw = request
    path = "/events/batch" if media == BATCHED else "/events"
    sent = {"Content-Type": media, **headers}
    async with client.post(f"{base}{path}", data=io.BytesIO(raw), headers=sent) as response:
        return response.status, await response.json()


@pytest.mark.parametrize("name", list(TAKEN))
async def test_read_cloudevents_reads_a_request_as_the_sink_does(
    name: str, client: aiohttp.ClientSession, sink_base: str
) -> None:
    media, headers, raw = TAKEN[name]
    events = read_cloudevents(media, headers, raw)
    status, reply = await posted(client, sink_base, TAKEN[name])

    acks = [ack_body(one, "new") for one in events]
    expected = {"acks": acks, "rejected": None} if media == BATCHED else acks[0]
    assert (status, reply) == (200, expected)


@pytest.mark.parametrize("name", list(REFUSED))
async def test_read_cloudevents_refuses_what_the_sink_refuses_with_its_answer(
    name: str, client: aiohttp.ClientSession, sink_base: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        read_cloudevents(*REFUSED[name])
    assert await posted(client, sink_base, REFUSED[name]) == (
        refused.value.status,
        refused.value.body,
    )


async def test_a_batch_item_the_sink_rejects_is_refused_whole_with_the_sinks_reason(
    client: aiohttp.ClientSession, sink_base: str
) -> None:
    bad = {**cloudevent(PAYMENT), "id": "p-2", "data": {"x": [0, 2**60]}}
    request = request_of(BATCHED, [cloudevent(TICK), bad])
    with pytest.raises(InvalidRequest) as refused:
        read_cloudevents(*request)

    status, reply = await posted(client, sink_base, request)
    assert (status, reply["acks"]) == (200, [ack_body(TICK, "new")])  # the sink keeps the prefix
    assert reply["rejected"] == {"index": 1, **refused.value.body, "status": refused.value.status}
