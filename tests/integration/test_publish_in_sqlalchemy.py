"""publish_in / accept_in (and the async ones) through SQLAlchemy: a Connection, a
Session, an AsyncConnection and an AsyncSession, on SQLite files (pysqlite,
aiosqlite) and on PostgreSQL (postgresql+psycopg), each test for every pair. The
outbox is opened beforehand with Outbox.open, as a program does; the caller's own
rows are payments, an ORM model of its own (written through the ORM in a Session,
through Core on a Connection); what commits is read back through a fresh connection
and through the relay's side (Outbox.pending)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from support import as_event, query

from plumbing.storage import StorageError
from publisher import (
    NotInTransaction,
    Outbox,
    accept_in,
    accept_in_async,
    publish_in,
    publish_in_async,
)
from shared import Conflict, InvalidEvent, Order

if TYPE_CHECKING:
    from conftest import Databases

KINDS = ["Connection", "Session", "AsyncConnection", "AsyncSession"]


class Base(orm.DeclarativeBase):
    pass


class Payment(Base):
    """The caller's own rows, beside the outbox in the same database."""

    __tablename__ = "payments"

    id: orm.Mapped[str] = orm.mapped_column(primary_key=True)
    amount_cents: orm.Mapped[int]


def captured(payment_id: str, amount_cents: int = 1999) -> dict[str, Any]:
    """The event a payment program publishes with its payment row."""
    return {
        "id": payment_id,
        "type": "payment.captured",
        "key": "c-9",
        "data": {"amount_cents": amount_cents},
    }


def placed(order_id: str, qty: int = 1) -> Order:
    return {"id": order_id, "sku": "snack", "qty": qty}


async def done(result: Any) -> Any:
    """The result of a call on a sync or an async SQLAlchemy object alike."""
    return await result if inspect.isawaitable(result) else result


@dataclass
class Caller:
    """The caller's side: one SQLAlchemy object of one kind, in whatever transaction
    it is in, with async methods whatever its kind (the sync ones call straight
    through)."""

    obj: Any
    is_async: bool

    async def publish(self, event: object) -> str:
        if self.is_async:
            return await publish_in_async(self.obj, event)
        return publish_in(self.obj, event)

    async def accept(self, order: object) -> str:
        if self.is_async:
            return await accept_in_async(self.obj, order)
        return accept_in(self.obj, order)

    async def pay(self, payment_id: str, amount_cents: int) -> None:
        """The caller's own row: through the ORM in a Session, Core on a Connection."""
        if isinstance(self.obj, orm.Session | AsyncSession):
            self.obj.add(Payment(id=payment_id, amount_cents=amount_cents))
        else:
            row = {"id": payment_id, "amount_cents": amount_cents}
            await done(self.obj.execute(sa.insert(Payment), [row]))

    async def commit(self) -> None:
        await done(self.obj.commit())

    async def rollback(self) -> None:
        await done(self.obj.rollback())

    def in_transaction(self) -> bool:
        return bool(self.obj.in_transaction())


class Callers:
    """Opens the caller's objects of one kind on one database, by its SQLAlchemy
    URL (a fresh engine, disposed of by `close`)."""

    def __init__(self, kind: str, location: Path | str) -> None:
        self.kind = kind
        self.is_async = kind.startswith("Async")
        url = sqlalchemy_url(location, self.is_async)
        self.engine: sa.Engine | AsyncEngine = (
            create_async_engine(url) if self.is_async else sa.create_engine(url)
        )

    @property
    def sync_engine(self) -> sa.Engine:
        """Where engine events are listened for, an async engine's included."""
        return self.engine.sync_engine if isinstance(self.engine, AsyncEngine) else self.engine

    @contextlib.asynccontextmanager
    async def open(self, autocommit: bool = False) -> AsyncIterator[Caller]:
        """A new object of this kind, not begun (its first statement begins it), in
        the AUTOCOMMIT isolation level if asked."""
        engine: Any = self.engine
        if autocommit:
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        if self.kind == "Connection":
            with engine.connect() as conn:
                yield Caller(conn, is_async=False)
        elif self.kind == "Session":
            with orm.Session(engine) as session:
                yield Caller(session, is_async=False)
        elif self.kind == "AsyncConnection":
            async with engine.connect() as conn:
                yield Caller(conn, is_async=True)
        else:
            async with AsyncSession(engine) as session:
                yield Caller(session, is_async=True)

    async def close(self) -> None:
        await done(self.engine.dispose())


def sqlalchemy_url(location: Path | str, is_async: bool) -> sa.URL:
    """The SQLAlchemy URL of a database as `--db` takes it: a SQLite file (pysqlite,
    or aiosqlite), or a libpq URI (psycopg, whose async dialect create_async_engine
    picks)."""
    if isinstance(location, Path):
        return sa.URL.create("sqlite+aiosqlite" if is_async else "sqlite", database=str(location))
    return sa.make_url(location).set(drivername="postgresql+psycopg")


@pytest.fixture
def payments(databases: Databases) -> None:
    """The caller's own table, made by its own metadata (a short-lived engine: no
    connection of it is left in the pool of the engines the tests use)."""
    engine = sa.create_engine(sqlalchemy_url(databases.source, is_async=False))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()


@pytest.fixture
async def source_outbox(databases: Databases) -> AsyncIterator[Outbox]:
    """The outbox at the source, opened (its schema made) before the caller writes."""
    async with Outbox.open(databases.source) as opened:
        yield opened


@pytest.fixture(params=KINDS)
async def callers(
    request: pytest.FixtureRequest, databases: Databases, source_outbox: Outbox, payments: None
) -> AsyncIterator[Callers]:
    opened = Callers(request.param, databases.source)
    try:
        yield opened
    finally:
        await opened.close()


def rows(databases: Databases, sql: str) -> list[tuple[Any, ...]]:
    return query(databases.source, sql)


async def pending_ids(outbox: Outbox) -> list[str]:
    return [event["id"] for event in await outbox.pending()]


async def test_the_callers_rows_and_the_entries_commit_together(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    async with callers.open() as caller:
        await caller.pay("p-1", 1999)
        assert await caller.publish(captured("p-1")) == "accepted"
        assert await caller.accept(placed("o-1", qty=2)) == "accepted"
        # Not committed: the relay sees nothing yet, a reader neither.
        assert await source_outbox.pending() == []
        assert rows(databases, "SELECT count(*) FROM outbox_entries") == [(0,)]
        await caller.commit()
    assert rows(databases, "SELECT id, amount_cents FROM payments") == [("p-1", 1999)]
    assert rows(databases, "SELECT id, sku, qty FROM outbox_orders") == [("o-1", "snack", 2)]
    assert await source_outbox.pending() == [captured("p-1"), as_event(placed("o-1", qty=2))]


async def test_a_rollback_leaves_neither_the_callers_rows_nor_the_entries(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    async with callers.open() as caller:
        await caller.pay("p-1", 1999)
        assert await caller.publish(captured("p-1")) == "accepted"
        assert await caller.accept(placed("o-1")) == "accepted"
        await caller.rollback()
    assert rows(databases, "SELECT count(*) FROM payments") == [(0,)]
    assert rows(databases, "SELECT count(*) FROM outbox_orders") == [(0,)]
    assert await source_outbox.pending() == []
    assert await source_outbox.publish(captured("p-1")) == "accepted"  # nothing was left


async def test_an_object_not_begun_yet_is_begun_and_stays_the_callers_transaction(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    async with callers.open() as caller:
        assert not caller.in_transaction()
        assert await caller.publish(captured("p-1")) == "accepted"
        assert caller.in_transaction()  # not committed on its own: the caller's to end
        await caller.pay("p-1", 1999)  # written after it, in the same transaction
        await caller.rollback()
    assert rows(databases, "SELECT count(*) FROM payments") == [(0,)]
    assert await source_outbox.pending() == []
    async with callers.open() as caller:
        assert await caller.publish(captured("p-2")) == "accepted"
        await caller.pay("p-2", 500)
        await caller.commit()
    assert rows(databases, "SELECT id FROM payments") == [("p-2",)]
    assert await pending_ids(source_outbox) == ["p-2"]


async def test_duplicates_and_conflicts_are_judged_as_publish_judges_them(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    assert await source_outbox.publish(captured("p-1")) == "accepted"
    async with callers.open() as caller:
        assert await caller.publish(captured("p-1")) == "duplicate"
        with pytest.raises(Conflict):
            await caller.publish(captured("p-1", amount_cents=1))
        with pytest.raises(InvalidEvent):
            await caller.publish({"id": "p-2", "type": "payment.captured"})
        # In one transaction, the second time is a duplicate of the first.
        assert await caller.publish(captured("p-3")) == "accepted"
        assert await caller.publish(captured("p-3")) == "duplicate"
        with pytest.raises(Conflict):
            await caller.publish(captured("p-3", amount_cents=1))
        await caller.pay("p-3", 1999)  # the transaction goes on after a Conflict
        await caller.commit()
    assert rows(databases, "SELECT id FROM payments") == [("p-3",)]
    assert await pending_ids(source_outbox) == ["p-1", "p-3"]
    # What publish itself says of the same events now.
    assert await source_outbox.publish(captured("p-3")) == "duplicate"
    with pytest.raises(Conflict):
        await source_outbox.publish(captured("p-1", amount_cents=1))


async def test_autocommit_is_refused_and_writes_nothing(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    async with callers.open(autocommit=True) as caller:
        # Told in SQLAlchemy's terms, not its driver's (psycopg's conn.transaction()).
        with pytest.raises(NotInTransaction, match=r'"AUTOCOMMIT".*conn\.begin\(\)'):
            await caller.publish(captured("p-1"))
        with pytest.raises(NotInTransaction, match="AUTOCOMMIT"):
            await caller.accept(placed("o-1"))
    assert rows(databases, "SELECT count(*) FROM outbox_entries") == [(0,)]
    assert rows(databases, "SELECT count(*) FROM outbox_orders") == [(0,)]


async def test_the_sync_and_the_async_objects_are_not_mixed_up(callers: Callers) -> None:
    async with callers.open() as caller:
        other = Caller(caller.obj, is_async=not caller.is_async)
        with pytest.raises(TypeError):
            await other.publish(captured("p-1"))
        with pytest.raises(TypeError):
            await other.accept(placed("o-1"))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_driver_error_is_a_storage_error(
    kind: str, databases: Databases, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # No outbox was opened here: the driver finds no table (a SQLAlchemy DBAPIError),
    # and the error says what to do: open the outbox once, or name its schema.
    if isinstance(databases.source, Path):
        location: Path | str = tmp_path / "blank.db"
    else:
        location = request.getfixturevalue("pg_schemas").new()
    callers = Callers(kind, location)
    try:
        async with callers.open() as caller:
            with pytest.raises(StorageError, match=r"Outbox\.open") as failed:
                await caller.publish(captured("p-1"))
            await caller.rollback()
    finally:
        await callers.close()
    assert "outbox_entries" in str(failed.value) and "schema=" in str(failed.value)


@pytest.mark.parametrize("databases", ["sqlite"], indirect=True)
async def test_sqlite_with_sqlalchemys_recipe_for_real_transactions(
    callers: Callers, databases: Databases, source_outbox: Outbox
) -> None:
    """SQLAlchemy's recipe for SQLite (pysqlite's own transaction handling off, BEGIN
    emitted when SQLAlchemy begins): the driver is in autocommit until SQLAlchemy
    begins, which publish_in does as the next statement would, and is then in a
    transaction."""

    @sa.event.listens_for(callers.sync_engine, "connect")
    def driver_autocommit(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(callers.sync_engine, "begin")
    def begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    async with callers.open() as caller:
        assert await caller.publish(captured("p-1")) == "accepted"
        await caller.pay("p-1", 1999)
        await caller.rollback()
    assert await source_outbox.pending() == []
    async with callers.open() as caller:
        assert await caller.publish(captured("p-2")) == "accepted"
        await caller.pay("p-2", 1999)
        await caller.commit()
    assert rows(databases, "SELECT id FROM payments") == [("p-2",)]
    assert await pending_ids(source_outbox) == ["p-2"]
