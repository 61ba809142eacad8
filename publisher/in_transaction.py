"""Write an event's outbox entry inside the caller's own transaction.

The point of the outbox pattern for a program whose business rows live in the same
database as the outbox: the caller's own rows and the outbox entry commit together
or roll back together. The caller passes the connection it is working with, inside
its transaction; nothing here commits, rolls back or begins one:

    with psycopg.connect(url) as conn:          # a transaction until the block ends
        conn.execute("UPDATE payments SET ...")
        publish_in(conn, {"id": "p-1", "type": "payment.captured", "key": "c-9",
                          "data": {"amount_cents": 1999}})
    # committed: the entry is pending and the relay delivers it

- `publish_in(conn, event)`: a psycopg `Connection` (PostgreSQL) or a `sqlite3`
  `Connection` (a SQLite outbox file); or a SQLAlchemy `Connection` or `Session` on
  either (`sqlite`, `postgresql+psycopg`).
- `await publish_in_async(conn, event)`: a psycopg `AsyncConnection`; or a SQLAlchemy
  `AsyncConnection` or `AsyncSession` (`sqlite+aiosqlite`, `postgresql+psycopg`).
- `accept_in` / `accept_in_async`: the same for an order of the example's intake
  (`{id, sku, qty}`), which also writes its `orders` row.

With SQLAlchemy (optional: imported only once the caller has) the entry is written
by `exec_driver_sql` on the Session's connection, in the caller's SQLAlchemy
transaction; one not begun yet is begun as its next statement would begin it
(autobegin), and stays the caller's to commit or roll back. A Session's pending
objects are not flushed here: they go in at its next flush, in the same transaction.

All validate the event (InvalidEvent), and return "accepted" or "duplicate" as
`Outbox.publish` does (Conflict for the same ID with another canonical event). The schema must
exist: open the outbox once beforehand (`Outbox.open`, or any publisher command).
On PostgreSQL the entry takes the same commit-order lock as intake, held until the
caller's transaction ends, so keep the transaction short after this call (write the
outbox entry last); its commit notifies a listening relay. On SQLite the relay finds
the entry at its next poll. Driver errors (SQLAlchemy's DBAPIError included) become
StorageError; the caller's transaction is then failed and theirs to roll back. A
connection in autocommit (SQLAlchemy's AUTOCOMMIT isolation level included) outside
a transaction is refused: NotInTransaction.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from plumbing.storage import StorageError
from publisher.store import EventCheck, Intake, Publication
from shared import checked_event, order_canonical, order_event, validate_order

# The classes taken, by module and name: looked up in sys.modules, so that a driver
# (or SQLAlchemy) the caller has not imported is never imported here to find out.
_SQLALCHEMY_SYNC = (("sqlalchemy.engine", "Connection"), ("sqlalchemy.orm", "Session"))
_SQLALCHEMY_ASYNC = (
    ("sqlalchemy.ext.asyncio", "AsyncConnection"),
    ("sqlalchemy.ext.asyncio", "AsyncSession"),
)
_PSYCOPG_ANY = (("psycopg", "Connection"), ("psycopg", "AsyncConnection"))


class NotInTransaction(ValueError):
    """The connection would commit each statement on its own (autocommit outside a
    transaction): the event and the caller's rows would not commit together."""


def publish_in(conn: Any, event: object, check: EventCheck = checked_event) -> Intake:
    """Record the event's outbox entry in `conn`'s current transaction (a psycopg or
    sqlite3 Connection, a SQLAlchemy Connection or Session), without committing it."""
    return _record_in(conn, Publication(*check(event)))


async def publish_in_async(conn: Any, event: object, check: EventCheck = checked_event) -> Intake:
    """Record the event's outbox entry in `conn`'s current transaction (a psycopg
    AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession), without
    committing it."""
    return await _record_in_async(conn, Publication(*check(event)))


def accept_in(conn: Any, order: object) -> Intake:
    """`publish_in` for an order of the example's intake (`{id, sku, qty}`): its
    `orders` row and its entry, the event `order.placed`."""
    return _record_in(conn, _order_publication(order))


async def accept_in_async(conn: Any, order: object) -> Intake:
    """`publish_in_async` for an order of the example's intake (`{id, sku, qty}`)."""
    return await _record_in_async(conn, _order_publication(order))


def _order_publication(order: object) -> Publication:
    valid = validate_order(order)
    return Publication(order_event(valid), order_canonical(valid), valid)


def _record_in(conn: Any, item: Publication) -> Intake:
    if _is_one_of(conn, (("psycopg", "Connection"),)):
        return _record_postgres(conn, conn, item)
    if _is_one_of(conn, (("sqlite3", "Connection"),)):
        return _record_sqlite(conn, conn, item)
    if _is_one_of(conn, _SQLALCHEMY_SYNC):
        return _record_sqlalchemy(conn, item)
    raise TypeError(
        "publish_in takes a psycopg.Connection, a sqlite3.Connection or a SQLAlchemy"
        f" Connection or Session, not {type(conn)!r} (publish_in_async takes the"
        " async ones)"
    )


async def _record_in_async(conn: Any, item: Publication) -> Intake:
    if _is_one_of(conn, _SQLALCHEMY_ASYNC):
        # The same path as the sync objects, on the sync Connection or Session the
        # async one wraps: under run_sync its statements await the driver.
        intake: Intake = await conn.run_sync(_record_sqlalchemy, item)
        return intake
    if not _is_one_of(conn, (("psycopg", "AsyncConnection"),)):
        raise TypeError(
            "publish_in_async takes a psycopg.AsyncConnection or a SQLAlchemy"
            f" AsyncConnection or AsyncSession, not {type(conn)!r}"
        )
    import pg_tx
    from publisher.backends import postgres, postgres_sql

    _check_psycopg_transaction(conn)
    with pg_tx.translated_sync(_pg_where(conn)):
        params = postgres.accept_params(item, time.time())
        queued = await conn.execute(postgres_sql.ACCEPT.encode(), params)
        entry = await queued.fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = await conn.execute(postgres_sql.KNOWN.encode(), {"id": item.event["id"]})
            known = await stored.fetchone()
    return postgres.intake_result(item, entry, known)


def _is_one_of(conn: Any, classes: tuple[tuple[str, str], ...]) -> bool:
    """Whether `conn` is an instance of one of `classes` (module, name) among the
    modules imported so far."""
    for module_name, name in classes:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(conn, getattr(module, name)):
            return True
    return False


def _record_postgres(statements: Any, driver: Any, item: Publication) -> Intake:
    """ACCEPT, then KNOWN for an ID already known, run by `statements` (the psycopg
    Connection `driver`, or _DriverSql) in the transaction of `driver` (a psycopg
    Connection or AsyncConnection)."""
    import pg_tx
    from publisher.backends import postgres, postgres_sql

    _check_psycopg_transaction(driver)
    with pg_tx.translated_sync(_pg_where(driver)):
        params = postgres.accept_params(item, time.time())
        entry = statements.execute(postgres_sql.ACCEPT, params).fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = statements.execute(postgres_sql.KNOWN, {"id": item.event["id"]})
            known = stored.fetchone()
    return postgres.intake_result(item, entry, known)


def _check_psycopg_transaction(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the connection is in autocommit mode outside a transaction:"
            " open one first (with conn.transaction(): ...)"
        )


def _pg_where(conn: Any) -> str:
    return f"PostgreSQL database {conn.info.dbname!r} on {conn.info.host}:{conn.info.port}"


def _pg_failed(driver: Any, exc: BaseException) -> StorageError:
    """What pg_tx.translated_sync makes of a psycopg error, for one SQLAlchemy wrapped."""
    import pg_tx

    return StorageError(f"{_pg_where(driver)}: {pg_tx.describe(exc)}")


class _DriverSql(NamedTuple):
    """A SQLAlchemy Connection as the backends' paths use a driver's: `execute(sql,
    params)` runs their driver-style SQL (its paramstyle, the driver's) through
    `exec_driver_sql`, in SQLAlchemy's transaction; the result has `fetchone()`."""

    execute: Callable[[str, Any], Any]


def _record_sqlite(statements: Any, driver: Any, item: Publication) -> Intake:
    """queue_event run by `statements` (the sqlite3.Connection `driver`, or
    _DriverSql) in the transaction of `driver` (a sqlite3.Connection, or aiosqlite's,
    which answers the same attributes)."""
    import sqlite3

    from publisher.backends.sqlite import queue_event

    if not driver.in_transaction and (
        driver.isolation_level is None or getattr(driver, "autocommit", None) is True
    ):
        raise NotInTransaction(
            "the sqlite3 connection is in autocommit mode outside a transaction:"
            ' execute "BEGIN IMMEDIATE" first'
        )
    try:
        return queue_event(statements, item, time.time())
    except sqlite3.Error as exc:
        raise _sqlite_failed(exc) from exc


def _sqlite_failed(exc: BaseException) -> StorageError:
    return StorageError(f"SQLite outbox: {exc}")


def _record_sqlalchemy(conn: Any, item: Publication) -> Intake:
    """Through a SQLAlchemy Connection or Session (or the sync side of an async one,
    under run_sync): the backend's own path above, its driver-style SQL passed
    through `exec_driver_sql` so that SQLAlchemy's transaction is the one it joins."""
    from sqlalchemy import orm

    connection = conn.connection() if isinstance(conn, orm.Session) else conn
    driver = connection.connection.driver_connection
    record, failed = _sqlalchemy_backend(connection.dialect, driver)
    if not connection.in_transaction():
        # What its next statement would do (autobegin), done before the checks so
        # that they see the transaction as it will be (a "begin" event that emits
        # BEGIN, the SQLite recipe): the caller's still, to commit or roll back.
        connection.begin()
    with _driver_errors(failed):
        return record(_DriverSql(connection.exec_driver_sql), driver, item)


def _sqlalchemy_backend(
    dialect: Any, driver: Any
) -> tuple[Callable[[Any, Any, Publication], Intake], Callable[[BaseException], StorageError]]:
    """The backend's path for a SQLAlchemy dialect and its driver's connection, and
    what a driver error becomes on it; TypeError for one not taken."""
    if dialect.name == "sqlite":  # pysqlite, aiosqlite: sqlite3's paramstyles
        return _record_sqlite, _sqlite_failed
    if dialect.name == "postgresql" and _is_one_of(driver, _PSYCOPG_ANY):
        return _record_postgres, functools.partial(_pg_failed, driver)
    raise TypeError(
        "SQLAlchemy is taken on SQLite (sqlite, sqlite+aiosqlite) and on PostgreSQL"
        f" through psycopg (postgresql+psycopg), not on {dialect.name}+{dialect.driver}"
    )


@contextlib.contextmanager
def _driver_errors(failed: Callable[[BaseException], StorageError]) -> Iterator[None]:
    """SQLAlchemy's wrapping of a driver error (DBAPIError) as the StorageError the
    driver's own error becomes."""
    from sqlalchemy.exc import DBAPIError

    try:
        yield
    except DBAPIError as exc:
        raise failed(exc.orig or exc) from exc


__all__ = [
    "NotInTransaction",
    "accept_in",
    "accept_in_async",
    "publish_in",
    "publish_in_async",
]
