"""Durable transactions on a connection the caller holds, and their settings.

Every transaction here sets for itself whether its COMMIT waits for the WAL flush
and how long a lock is waited for, whatever the server's or the role's defaults:
the services' promises (an ACK sent after a durable commit, a request that fails
rather than hangs) must not depend on how the server was configured. Driver errors
are left to the caller to translate (errors.translated).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import psycopg

from .arrays import array_literal
from .pool import Conn

LOCK_WAIT_MS: Final = 5_000  # the busy timeout's analogue: a lock waited for at most this


def _transaction_settings(synchronous_commit: str) -> bytes:
    """One transaction's settings: whether its COMMIT waits for the WAL flush, and
    a lock waited for at most LOCK_WAIT_MS (the busy timeout's analogue), not forever."""
    return (
        f"SELECT set_config('synchronous_commit', '{synchronous_commit}', true),"
        f" set_config('lock_timeout', '{LOCK_WAIT_MS}', true)"
    ).encode()


# For one transaction: its commit waits for the WAL flush.
DURABLE: Final = _transaction_settings("on")
# For a transaction whose loss in a crash of the server costs no more than making it
# again (the publisher's marks of pending entries: an entry whose mark is lost is
# pending again, sent again, and the sink answers with a duplicate ACK): its COMMIT
# returns before the WAL is flushed.
# The WAL writer flushes it within three wal_writer_delay (200 ms by default), and
# any durable commit after it flushes it too, as the WAL is flushed in order; a crash
# of the client loses nothing, the server has the commit.
UNFLUSHED: Final = _transaction_settings("off")
SNAPSHOT: Final = b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


@contextlib.asynccontextmanager
async def durable(conn: Conn, *, pipeline: bool = False) -> AsyncIterator[Conn]:
    """A durable transaction (see PgDatabase.transaction) on a connection the caller
    holds; in pipeline mode with `pipeline`. Driver errors are the caller's to
    translate."""
    if pipeline:
        async with conn.pipeline(), conn.transaction():
            await conn.execute(DURABLE)
            yield conn
    else:
        async with conn.transaction():
            await conn.execute(DURABLE)
            yield conn


async def in_one_round_trip(
    conn: Conn, statement: bytes, params: dict[str, Any], *, flush: bool = True
) -> tuple[Any, ...] | None:
    """`statement` in a durable transaction of its own (with `flush` False, one whose
    COMMIT does not wait for the WAL flush: UNFLUSHED), and its first row: BEGIN,
    the settings (DURABLE), the statement and COMMIT as one simple query, so one
    message each way (in pipeline mode psycopg sends each statement and the sync as
    messages of their own, and a row must be fetched before the COMMIT can be sent:
    two round trips). `conn` is one the caller holds, outside any transaction. The
    parameters are bound client side (psycopg's ClientCursor quotes them; a list is
    written as an array literal first, see `array_literal`). An error
    in the statement skips the COMMIT: the transaction is then rolled back here and
    the (driver's) error raised, for the caller to translate."""
    await conn.set_autocommit(True)  # the text has its own BEGIN and COMMIT
    try:
        cursor = psycopg.AsyncClientCursor(conn)
        bound = {k: array_literal(v) if isinstance(v, list) else v for k, v in params.items()}
        settings = DURABLE if flush else UNFLUSHED
        await cursor.execute(b"BEGIN;" + settings + b";" + statement + b";COMMIT", bound)
        cursor.nextset()  # past BEGIN's and the settings' results
        cursor.nextset()
        row: tuple[Any, ...] | None = await cursor.fetchone()
        return row
    finally:
        await _back_to_transactions(conn)


@contextlib.asynccontextmanager
async def sent_together(conn: Conn) -> AsyncIterator[Conn]:
    """A durable transaction whose statements go to the server in one round trip,
    each with its own parameters bound by the server (prepared like any other):
    BEGIN, the settings (DURABLE), what the body queues and COMMIT, in pipeline mode
    with one Sync at the end. psycopg's own transaction() syncs after its BEGIN and
    again after its COMMIT, waiting for the replies each time; here BEGIN and COMMIT
    are statements of the pipeline (in autocommit, psycopg adds none of its own).
    A result the body fetches waits for the replies so far: a round trip more. A
    statement that fails makes the server skip the rest, COMMIT
    included: the transaction is then rolled back here and the (driver's) error
    raised when the block ends, for the caller to translate; so is an error of the
    body's own, after which nothing commits either. `conn` is one the caller holds,
    outside any transaction."""
    await conn.set_autocommit(True)  # BEGIN and COMMIT are the pipeline's own
    try:
        async with conn.pipeline():
            await conn.execute(b"BEGIN")
            await conn.execute(DURABLE)
            yield conn
            await conn.execute(b"COMMIT")
    finally:
        await _back_to_transactions(conn)


async def _back_to_transactions(conn: Conn) -> None:
    """Leave `conn` as the pool lends it (idle, autocommit off), or closed so that
    the pool drops it."""
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.execute(b"ROLLBACK")
        await conn.set_autocommit(False)
    except psycopg.Error:
        await conn.close()
