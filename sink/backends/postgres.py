"""The PostgreSQL inbox: the inbox and inventory tables in one PostgreSQL database.

The interface and rows are in `sink.store`; the SQL is in `sink.backends.postgres_sql`;
the pool, migrations, durable commits and error translation are pg_tx's.

A batch is one transaction sent in pipeline mode: BEGIN, the durable-commit
settings, the fence check and one statement that records every new event and adds
up its inventory go out together and come back in one round trip, then COMMIT. If
any of its events was known already (a redelivery, a conflict, an ID twice in the
batch), that statement is undone to a savepoint and the batch is applied event by
event, which stops at a conflict with the prefix kept.

Concurrent requests each use a connection of the pool: PostgreSQL flushes the WAL
of commits that wait together in one write (its own group commit), so they share
fsyncs without a queue here. Two transactions inserting the same ID apply it once:
the second one's insert waits for the first to commit and then does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import psycopg.errors

from pg_tx import DURABLE, Conn, PgDatabase
from plumbing.storage import StorageError
from shared import Conflict, Event, FenceNotMet, Receipt, canonical_json, digest_of
from sink.backends import postgres_sql as sql
from sink.store import BatchReceipt, Inbox, InboxRecord, Received

T = TypeVar("T")
SIDE: Final = "sink"
ATTEMPTS: Final = 3  # a transaction that PostgreSQL chose to abort (deadlock) is run again
# Aborted whole, so running them again is safe (nothing of them committed).
_RETRYABLE: Final = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


class PostgresInbox(Inbox):
    """The sink's inbox and inventory in a PostgreSQL database (a libpq URI)."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    @classmethod
    async def connect(cls, url: str) -> PostgresInbox:
        """Connect and bring the sink's schema up to date (StorageError if the server
        cannot be reached or its schema is newer than this program)."""
        db = await PgDatabase.open(
            url, side=SIDE, migrations=sql.MIGRATIONS, probe_table=sql.PROBE_TABLE
        )
        return cls(db)

    @property
    def location(self) -> str:
        return self._db.location

    async def close(self) -> None:
        await self._db.close()

    async def check_writable(self) -> None:
        await self._db.check_writable()

    # ------------------------------------------------------------------ writes

    async def receive_batch(
        self, events: Sequence[Event], *, after: str | None = None
    ) -> BatchReceipt:
        items = list(events)
        if not items:
            return BatchReceipt([], None)
        return await _retrying(lambda: self._receive(items, after, time.time()))

    async def _receive(self, events: list[Event], after: str | None, now: float) -> BatchReceipt:
        payloads = [canonical_json(event) for event in events]
        ids = [event["id"] for event in events]
        distinct = len(set(ids)) == len(ids)
        async with self._db.connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute(DURABLE)
            fence = None if after is None else await conn.execute(sql.FIND, (after,))
            new = None
            if distinct:  # try them all as new, in the same round trip as the fence
                await conn.execute(sql.SAVEPOINT)
                new = await conn.execute(sql.INSERT_NEW, _columns(events, payloads, now))
            if fence is not None and await fence.fetchone() is None:
                raise FenceNotMet(after or "")  # rolls back whatever was inserted
            if new is not None:
                row = await new.fetchone()
                if row is not None and row[0] == len(events):
                    applied = [Received(Receipt.APPLIED, digest_of(p)) for p in payloads]
                    return BatchReceipt(applied, None)
                await conn.execute(sql.ROLLBACK_TO_SAVEPOINT)
            return await _one_by_one(conn, events, payloads, now)

    # ------------------------------------------------------------------ reads

    async def knows(self, event_id: str) -> bool:
        return await self._one(sql.FIND, (event_id,)) is not None

    async def inventory(self, sku: str) -> int:
        row = await self._one(sql.INVENTORY, (sku,))
        return 0 if row is None else int(row[0])

    async def record(self, event_id: str) -> InboxRecord | None:
        row = await self._one(sql.RECORD, (event_id,))
        if row is None:
            return None
        payload, received_at, deliveries, last_delivery_at, applied_seq = row
        return InboxRecord(
            event_id, digest_of(payload), received_at, deliveries, last_delivery_at, applied_seq
        )

    async def count(self) -> int:
        row = await self._one(sql.COUNT_EVENTS, ())
        return 0 if row is None else int(row[0])

    async def _one(self, statement: bytes, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of one read, in one round trip (BEGIN, the read and COMMIT
        pipelined)."""
        async with self._db.connection() as conn, conn.pipeline():
            async with conn.transaction():
                cursor = await conn.execute(statement, params)
            row: tuple[Any, ...] | None = await cursor.fetchone()
            return row


def _columns(events: list[Event], payloads: list[str], now: float) -> dict[str, Any]:
    """A batch as the arrays INSERT_NEW unnests."""
    return {
        "ids": [event["id"] for event in events],
        "payloads": payloads,
        "skus": [event["sku"] for event in events],
        "qtys": [event["qty"] for event in events],
        "now": now,
    }


async def _one_by_one(
    conn: Conn, events: list[Event], payloads: list[str], now: float
) -> BatchReceipt:
    """Inside the transaction: apply in order, counting duplicates, stopping at the
    first conflict (the prefix commits; nothing of the conflicting event ran)."""
    done: list[Received] = []
    for event, payload in zip(events, payloads, strict=True):
        inserted = await conn.execute(sql.INSERT_ONE, {**event, "payload": payload, "now": now})
        stored = await conn.execute(sql.FIND, (event["id"],))  # same round trip
        if await inserted.fetchone() is not None:
            done.append(Received(Receipt.APPLIED, digest_of(payload)))
            continue
        row = await stored.fetchone()
        known: str = row[0] if row is not None else ""
        if known != payload:
            return BatchReceipt(done, Conflict(event["id"]))
        await conn.execute(sql.COUNT_DUPLICATE, (now, event["id"]))  # sent with the next
        done.append(Received(Receipt.DUPLICATE, digest_of(known)))
    return BatchReceipt(done, None)


async def _retrying(attempt: Callable[[], Awaitable[T]]) -> T:
    """`await attempt()`, again (up to ATTEMPTS in all) when PostgreSQL aborted the
    transaction to break a deadlock between two batches that share IDs."""
    for left in range(ATTEMPTS - 1, -1, -1):
        try:
            return await attempt()
        except StorageError as exc:
            if left == 0 or not isinstance(exc.__cause__, _RETRYABLE):
                raise
    raise AssertionError("unreachable")
