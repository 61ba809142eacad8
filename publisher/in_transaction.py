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
  (`{id, sku, qty}`), which also writes its `outbox_orders` row.

With SQLAlchemy (optional: imported only once the caller has) the entry is written
by `exec_driver_sql` on the Session's connection, in the caller's SQLAlchemy
transaction; one not begun yet is begun as its next statement would begin it
(autobegin), and stays the caller's to commit or roll back. A Session's pending
objects are not flushed here: they go in at its next flush, in the same transaction.

On PostgreSQL, an outbox whose tables are in a schema of their own (opened with
`schema=NAME` in its URI, or `--schema NAME`) is named by `schema="NAME"`: every
table is then written in that schema, whatever the connection's search_path (which
stays the caller's). Without it, the tables are those the search_path finds. A
SQLite file has no schemas: `schema=` is refused there (ValueError).

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

import functools
import time
from typing import Any, Final

from plumbing.in_transaction import SQLALCHEMY_ASYNC as _SQLALCHEMY_ASYNC
from plumbing.in_transaction import SQLALCHEMY_SYNC as _SQLALCHEMY_SYNC
from plumbing.in_transaction import DriverSql as _DriverSql
from plumbing.in_transaction import (
    NotInTransaction,
    autobegin,
    sqlalchemy_backend,
    sqlalchemy_connection,
)
from plumbing.in_transaction import check_psycopg_transaction as _check_psycopg_transaction
from plumbing.in_transaction import check_sqlite_transaction as _check_sqlite_transaction
from plumbing.in_transaction import driver_errors as _driver_errors
from plumbing.in_transaction import is_one_of as _is_one_of
from plumbing.in_transaction import pg_where as _pg_where
from plumbing.in_transaction import tables_hinted as _tables_hinted
from plumbing.storage import StorageError
from publisher.store import EventCheck, Intake, Publication
from shared import checked_event, order_canonical, order_event, validate_order

_NO_TABLES: Final = (
    " (the outbox's tables are not there: open the outbox once beforehand, with"
    " Outbox.open or any outbox-publisher command, to create them; tables in a schema"
    ' of their own are named by schema="NAME")'
)


def publish_in(
    conn: Any, event: object, check: EventCheck = checked_event, *, schema: str | None = None
) -> Intake:
    """Record the event's outbox entry in `conn`'s current transaction (a psycopg or
    sqlite3 Connection, a SQLAlchemy Connection or Session), without committing it;
    on PostgreSQL, in the outbox whose tables are in `schema` if one is named."""
    return _record_in(conn, Publication(*check(event)), schema)


async def publish_in_async(
    conn: Any, event: object, check: EventCheck = checked_event, *, schema: str | None = None
) -> Intake:
    """Record the event's outbox entry in `conn`'s current transaction (a psycopg
    AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession), without
    committing it; in the outbox whose tables are in `schema` if one is named."""
    return await _record_in_async(conn, Publication(*check(event)), schema)


def accept_in(conn: Any, order: object, *, schema: str | None = None) -> Intake:
    """`publish_in` for an order of the example's intake (`{id, sku, qty}`): its
    `outbox_orders` row and its entry, the event `order.placed`."""
    return _record_in(conn, _order_publication(order), schema)


async def accept_in_async(conn: Any, order: object, *, schema: str | None = None) -> Intake:
    """`publish_in_async` for an order of the example's intake (`{id, sku, qty}`)."""
    return await _record_in_async(conn, _order_publication(order), schema)


def _order_publication(order: object) -> Publication:
    valid = validate_order(order)
    return Publication(order_event(valid), order_canonical(valid), valid)


def _record_in(conn: Any, item: Publication, schema: str | None) -> Intake:
    with _tables_hinted(_NO_TABLES):
        return _record_in_any(conn, item, schema)


def _record_in_any(conn: Any, item: Publication, schema: str | None) -> Intake:
    if _is_one_of(conn, (("psycopg", "Connection"),)):
        return _record_postgres(conn, conn, item, schema)
    if _is_one_of(conn, (("sqlite3", "Connection"),)):
        return _record_sqlite(conn, conn, item, schema)
    if _is_one_of(conn, _SQLALCHEMY_SYNC):
        return _record_sqlalchemy(conn, item, schema)
    raise TypeError(
        "publish_in takes a psycopg.Connection, a sqlite3.Connection or a SQLAlchemy"
        f" Connection or Session, not {type(conn)!r} (publish_in_async takes the"
        " async ones)"
    )


async def _record_in_async(conn: Any, item: Publication, schema: str | None) -> Intake:
    with _tables_hinted(_NO_TABLES):
        return await _record_in_async_any(conn, item, schema)


async def _record_in_async_any(conn: Any, item: Publication, schema: str | None) -> Intake:
    if _is_one_of(conn, _SQLALCHEMY_ASYNC):
        # The same path as the sync objects, on the sync Connection or Session the
        # async one wraps: under run_sync its statements await the driver.
        intake: Intake = await conn.run_sync(_record_sqlalchemy, item, schema)
        return intake
    if not _is_one_of(conn, (("psycopg", "AsyncConnection"),)):
        raise TypeError(
            "publish_in_async takes a psycopg.AsyncConnection or a SQLAlchemy"
            f" AsyncConnection or AsyncSession, not {type(conn)!r}"
        )
    import pg_tx
    from publisher.backends import postgres

    sql = _pg_statements(schema)
    _check_psycopg_transaction(conn)
    with pg_tx.translated_sync(_pg_where(conn)):
        params = postgres.accept_params(item, time.time())
        queued = await conn.execute(sql.ACCEPT.encode(), params)
        entry = await queued.fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = await conn.execute(sql.KNOWN.encode(), {"id": item.event["id"]})
            known = await stored.fetchone()
    return postgres.intake_result(item, entry, known)


def _record_postgres(statements: Any, driver: Any, item: Publication, schema: str | None) -> Intake:
    """ACCEPT, then KNOWN for an ID already known, run by `statements` (the psycopg
    Connection `driver`, or _DriverSql) in the transaction of `driver` (a psycopg
    Connection or AsyncConnection), each table written in `schema` if one is named."""
    import pg_tx
    from publisher.backends import postgres

    sql = _pg_statements(schema)
    _check_psycopg_transaction(driver)
    with pg_tx.translated_sync(_pg_where(driver)):
        params = postgres.accept_params(item, time.time())
        entry = statements.execute(sql.ACCEPT, params).fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = statements.execute(sql.KNOWN, {"id": item.event["id"]})
            known = stored.fetchone()
    return postgres.intake_result(item, entry, known)


@functools.cache
def _pg_statements(schema: str | None) -> Any:
    """postgres_sql's statements with each table written in `schema` (as the outbox
    opened with `schema=NAME` runs them); as written without one. BadLocation for a
    name that is not a plain identifier."""
    import pg_tx
    from publisher.backends import postgres_sql

    return pg_tx.qualified(postgres_sql, pg_tx.qualifier(schema, postgres_sql.SCHEMA.tables))


def _record_sqlite(statements: Any, driver: Any, item: Publication, schema: str | None) -> Intake:
    """queue_event run by `statements` (the sqlite3.Connection `driver`, or
    _DriverSql) in the transaction of `driver` (a sqlite3.Connection, or aiosqlite's,
    which answers the same attributes)."""
    import sqlite3

    from publisher.backends.sqlite import queue_event

    _refuse_schema_on_sqlite(schema)
    _check_sqlite_transaction(driver)
    try:
        return queue_event(statements, item, time.time())
    except sqlite3.Error as exc:
        raise _sqlite_failed(exc) from exc


def _refuse_schema_on_sqlite(schema: str | None) -> None:
    if schema is not None:
        raise ValueError(
            f"schema={schema!r} names a PostgreSQL schema: a SQLite file has none"
            " (its outbox tables are the file's own)"
        )


def _sqlite_failed(exc: BaseException) -> StorageError:
    return StorageError(f"SQLite outbox: {exc}")


def _record_sqlalchemy(conn: Any, item: Publication, schema: str | None) -> Intake:
    """Through a SQLAlchemy Connection or Session (or the sync side of an async one,
    under run_sync): the backend's own path above, its driver-style SQL passed
    through `exec_driver_sql` so that SQLAlchemy's transaction is the one it joins."""
    connection, driver = sqlalchemy_connection(conn)
    record, failed = sqlalchemy_backend(
        connection.dialect, driver, _record_sqlite, _record_postgres, _sqlite_failed
    )
    if record is _record_sqlite:
        _refuse_schema_on_sqlite(schema)  # before a Connection's transaction is begun
    autobegin(connection)
    with _driver_errors(failed):
        return record(_DriverSql(connection.exec_driver_sql), driver, item, schema)


__all__ = [
    "NotInTransaction",
    "accept_in",
    "accept_in_async",
    "publish_in",
    "publish_in_async",
]
