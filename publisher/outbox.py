"""The outbox: orders and their pending deliveries, in the source database.

All SQL of the publisher side lives here. `Outbox` is the SQLite backend; `dispatch`
only needs `pending` and `mark_sent`, so another backend is one new class.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Final, Literal

from publisher.errors import UnknownEntry
from shared import Conflict, Event, canonical_json, validate_event
from sqlite_tx import ClosesOnExit, Database, Opening, transaction

MAX_BATCH: Final = 16

Intake = Literal["accepted", "duplicate"]

MIGRATIONS: Final = (
    """
    CREATE TABLE orders (
        id          TEXT PRIMARY KEY,
        sku         TEXT NOT NULL,
        qty         INTEGER NOT NULL,
        accepted_at REAL NOT NULL
    );
    CREATE TABLE outbox (
        seq       INTEGER PRIMARY KEY AUTOINCREMENT,
        id        TEXT NOT NULL UNIQUE REFERENCES orders (id),
        payload   TEXT NOT NULL,
        sent      INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)),
        queued_at REAL NOT NULL,
        sent_at   REAL
    );
    -- Pending reads stay an index range scan however many sent rows pile up.
    CREATE INDEX outbox_pending ON outbox (seq) WHERE sent = 0;
    """,
)

SQL_FIND_ORDER: Final = "SELECT sku, qty FROM orders WHERE id = ?"
SQL_INSERT_ORDER: Final = "INSERT INTO orders (id, sku, qty, accepted_at) VALUES (?, ?, ?, ?)"
SQL_INSERT_OUTBOX: Final = "INSERT INTO outbox (id, payload, queued_at) VALUES (?, ?, ?)"
SQL_PENDING: Final = "SELECT payload FROM outbox WHERE sent = 0 ORDER BY seq LIMIT ?"
SQL_MARK_SENT: Final = "UPDATE outbox SET sent = 1, sent_at = ? WHERE id = ? AND sent = 0"
SQL_ENTRY_EXISTS: Final = "SELECT 1 FROM outbox WHERE id = ?"


def check_limit(limit: object) -> int:
    """Return `limit` if it is a batch size dispatch accepts (an int, 1 to 16)."""
    if type(limit) is not int or not 1 <= limit <= MAX_BATCH:
        raise ValueError(f"limit must be an integer from 1 to {MAX_BATCH}, got {limit!r}")
    return limit


class Outbox(ClosesOnExit):
    """Orders and outbox entries in one SQLite file."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @staticmethod
    def open(path: str | Path) -> Opening[Outbox]:
        """Open the source database, creating the schema when missing."""

        async def opener() -> Outbox:
            return Outbox(await Database.open(path, MIGRATIONS))

        return Opening(opener)

    @property
    def path(self) -> str:
        return self._db.path

    async def accept(self, event: object) -> Intake:
        """Record the order and its outbox entry in one transaction: both or neither."""
        valid = validate_event(event)
        return await self._db.run(lambda conn: _accept(conn, valid, time.time()))

    async def pending(self, limit: int = MAX_BATCH) -> list[Event]:
        """Up to `limit` unsent events, oldest first by insertion order. Changes nothing."""
        check_limit(limit)
        rows = await self._db.run(lambda conn: conn.execute(SQL_PENDING, (limit,)).fetchall())
        return [json.loads(payload) for (payload,) in rows]

    async def mark_sent(self, event_id: str) -> None:
        """Save the entry as sent. Marking an entry already sent changes nothing."""
        await self._db.run(lambda conn: _mark_sent(conn, event_id, time.time()))

    async def close(self) -> None:
        await self._db.close()


def _accept(conn: sqlite3.Connection, event: Event, now: float) -> Intake:
    with transaction(conn):
        known = conn.execute(SQL_FIND_ORDER, (event["id"],)).fetchone()
        if known is not None:
            if tuple(known) != (event["sku"], event["qty"]):
                raise Conflict(event["id"])
            return "duplicate"
        conn.execute(SQL_INSERT_ORDER, (event["id"], event["sku"], event["qty"], now))
        conn.execute(SQL_INSERT_OUTBOX, (event["id"], canonical_json(event), now))
    return "accepted"


def _mark_sent(conn: sqlite3.Connection, event_id: str, now: float) -> None:
    # A single UPDATE is its own transaction in autocommit mode.
    if conn.execute(SQL_MARK_SENT, (now, event_id)).rowcount == 0:
        if conn.execute(SQL_ENTRY_EXISTS, (event_id,)).fetchone() is None:
            raise UnknownEntry(event_id)
