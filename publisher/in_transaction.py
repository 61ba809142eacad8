"""Write an order and its outbox entry inside the caller's own transaction.

The point of the outbox pattern for a program whose business rows live in the same
database as the outbox: the order, its outbox entry and the caller's own rows commit
together or roll back together. The caller passes the connection it is working
with, inside its transaction; nothing here commits, rolls back or begins one:

    with psycopg.connect(url) as conn:          # a transaction until the block ends
        conn.execute("UPDATE accounts SET ...")
        accept_in(conn, {"id": "o-1", "sku": "snack", "qty": 2})
    # committed: the entry is pending and the relay delivers it

- `accept_in(conn, event)`: a psycopg `Connection` (PostgreSQL) or a `sqlite3`
  `Connection` (a SQLite outbox file).
- `await accept_in_async(conn, event)`: a psycopg `AsyncConnection`.

Both validate the event (InvalidEvent), and return "accepted" or "duplicate" as
`Outbox.accept` does (Conflict for the same ID with another payload). The schema must
exist: open the outbox once beforehand (`Outbox.open`, or any publisher command).
On PostgreSQL the entry takes the same commit-order lock as intake, held until the
caller's transaction ends, so keep the transaction short after this call (write the
outbox entry last); its commit notifies a listening relay. On SQLite the relay finds
the entry at its next poll. Driver errors become StorageError; the caller's
transaction is then failed and theirs to roll back.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from plumbing.storage import StorageError
from publisher.store import Intake
from shared import Event, validate_event


class NotInTransaction(ValueError):
    """The connection would commit each statement on its own (autocommit outside a
    transaction): the order and its entry would not be the caller's transaction's."""


def accept_in(conn: Any, event: object) -> Intake:
    """Record the order and its outbox entry in `conn`'s current transaction (a
    psycopg Connection or a sqlite3 Connection), without committing it."""
    valid = validate_event(event)
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(conn, psycopg.Connection):
        return _accept_psycopg(conn, valid)
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(conn, sqlite3.Connection):
        return _accept_sqlite(conn, valid)
    raise TypeError(
        f"accept_in takes a psycopg.Connection or a sqlite3.Connection, not {type(conn)!r}"
        " (accept_in_async takes a psycopg.AsyncConnection)"
    )


async def accept_in_async(conn: Any, event: object) -> Intake:
    """Record the order and its outbox entry in `conn`'s current transaction (a
    psycopg AsyncConnection), without committing it."""
    valid = validate_event(event)
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(f"accept_in_async takes a psycopg.AsyncConnection, not {type(conn)!r}")
    import pg_tx
    from publisher.backends import postgres, postgres_sql

    _check_psycopg_transaction(conn)
    with pg_tx.translated_sync(_pg_where(conn)):
        queued = await conn.execute(
            postgres_sql.ACCEPT.encode(), postgres.accept_params(valid, time.time())
        )
        entry = await queued.fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = await conn.execute(postgres_sql.STORED_PAYLOAD.encode(), (valid["id"],))
            known = await stored.fetchone()
    return postgres.intake_result(valid, entry, None if known is None else known[0])


def _accept_psycopg(conn: Any, event: Event) -> Intake:
    import pg_tx
    from publisher.backends import postgres, postgres_sql

    _check_psycopg_transaction(conn)
    with pg_tx.translated_sync(_pg_where(conn)):
        params = postgres.accept_params(event, time.time())
        entry = conn.execute(postgres_sql.ACCEPT.encode(), params).fetchone()
        known = None
        if entry is None:  # the ID is known: what was stored for it
            stored = conn.execute(postgres_sql.STORED_PAYLOAD.encode(), (event["id"],))
            known = stored.fetchone()
    return postgres.intake_result(event, entry, None if known is None else known[0])


def _check_psycopg_transaction(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the connection is in autocommit mode outside a transaction:"
            " open one first (with conn.transaction(): ...)"
        )


def _pg_where(conn: Any) -> str:
    return f"PostgreSQL database {conn.info.dbname!r} on {conn.info.host}:{conn.info.port}"


def _accept_sqlite(conn: Any, event: Event) -> Intake:
    import sqlite3

    from publisher.backends.sqlite import queue_order

    if not conn.in_transaction and (
        conn.isolation_level is None or getattr(conn, "autocommit", None) is True
    ):
        raise NotInTransaction(
            "the sqlite3 connection is in autocommit mode outside a transaction:"
            ' execute "BEGIN IMMEDIATE" first'
        )
    try:
        return queue_order(conn, event, time.time())
    except sqlite3.Error as exc:
        raise StorageError(f"SQLite outbox: {exc}") from exc


__all__ = ["NotInTransaction", "accept_in", "accept_in_async"]
