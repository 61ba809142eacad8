"""The inbox: which event IDs the sink has applied, and the inventory they changed.

All SQL of the sink side lives here. Recording the ID and applying the effect happen
in one transaction, so the inbox can never claim an event whose effect is missing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Final

from shared import Conflict, Event, Receipt, canonical_json, validate_event
from sqlite_tx import ClosesOnExit, Database, Opening, transaction

MIGRATIONS: Final = (
    """
    CREATE TABLE inbox (
        id               TEXT PRIMARY KEY,
        payload          TEXT NOT NULL,
        received_at      REAL NOT NULL,
        deliveries       INTEGER NOT NULL DEFAULT 1,
        last_delivery_at REAL NOT NULL
    );
    CREATE TABLE inventory (
        sku TEXT PRIMARY KEY,
        qty INTEGER NOT NULL
    );
    """,
)

SQL_FIND: Final = "SELECT payload FROM inbox WHERE id = ?"
SQL_INSERT: Final = (
    "INSERT INTO inbox (id, payload, received_at, last_delivery_at) VALUES (?, ?, ?, ?)"
)
SQL_COUNT_DUPLICATE: Final = (
    "UPDATE inbox SET deliveries = deliveries + 1, last_delivery_at = ? WHERE id = ?"
)
SQL_APPLY: Final = (
    "INSERT INTO inventory (sku, qty) VALUES (?, ?)"
    " ON CONFLICT (sku) DO UPDATE SET qty = qty + excluded.qty"
)
SQL_INVENTORY: Final = "SELECT qty FROM inventory WHERE sku = ?"


class Inbox(ClosesOnExit):
    """The sink's inbox and inventory in one SQLite file."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @staticmethod
    def open(path: str | Path) -> Opening[Inbox]:
        """Open the sink database, creating the schema when missing."""

        async def opener() -> Inbox:
            return Inbox(await Database.open(path, MIGRATIONS))

        return Opening(opener)

    @property
    def path(self) -> str:
        return self._db.path

    async def receive(self, event: object) -> Receipt:
        """Apply the event once: record its ID and its effect in one transaction.

        The same ID with the same payload again is a duplicate (no second effect);
        with a different payload it raises Conflict and changes nothing.
        """
        valid = validate_event(event)
        return await self._db.run(lambda conn: _receive(conn, valid, time.time()))

    async def inventory(self, sku: str) -> int:
        """The quantity held for `sku`, 0 if it was never seen."""
        row = await self._db.run(lambda conn: conn.execute(SQL_INVENTORY, (sku,)).fetchone())
        return 0 if row is None else int(row[0])

    async def close(self) -> None:
        await self._db.close()


def _receive(conn: sqlite3.Connection, event: Event, now: float) -> Receipt:
    payload = canonical_json(event)
    with transaction(conn):
        known = conn.execute(SQL_FIND, (event["id"],)).fetchone()
        if known is not None:
            if known[0] != payload:
                raise Conflict(event["id"])
            conn.execute(SQL_COUNT_DUPLICATE, (now, event["id"]))
            return Receipt.DUPLICATE
        conn.execute(SQL_INSERT, (event["id"], payload, now, now))
        conn.execute(SQL_APPLY, (event["sku"], event["qty"]))
    return Receipt.APPLIED
