"""Source databases built fast: the real schema, rows inserted in one transaction.

The schema comes from `Outbox.open`; the rows go in with plain sqlite3 and
executemany (a SQLite file), or with psycopg's COPY (a PostgreSQL database), as
intake writes them: each entry's payload is its canonical event (an order's is its
`order.placed` event, shared.order_canonical), its type and its lane (the event's
key) in their columns, and an order's row in `outbox_orders` beside it. Both backends keep
the same columns: flags 0/1, times in seconds since the epoch, JSON as text.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NamedTuple

from bench import naive
from bench.events import SKUS, Kind, order, stored
from chaos.dbs import DbLocation, is_postgres, value
from publisher import Outbox
from shared import Receipt, digest_of

SENT_ACK: Final = '{{"ack": "{id}", "status": "{status}", "sha256": "{digest}"}}'
ENTRY_COLUMNS: Final = ("id", "type", "payload", "queued_at", "lane")
SENT_COLUMNS: Final = ("sent", "sent_at", "ack", "attempts", "last_attempt_at")
ORDER_COLUMNS: Final = ("id", "sku", "qty", "accepted_at")


class Row(NamedTuple):
    """One entry to insert: its outbox columns, and its order's row (None: no order)."""

    entry: tuple[object, ...]
    order: tuple[object, ...] | None


async def create_source(location: DbLocation) -> None:
    """Create the source database with the product's schema and migrations."""
    async with Outbox.open(location):
        pass


def insert_entries(
    location: DbLocation,
    count: int,
    *,
    start: int = 0,
    sent: bool = False,
    skus: int = len(SKUS),
    kind: Kind = Kind.ORDER,
) -> None:
    """Add `count` entries of events of `kind` (orders with their order rows), pending
    or already sent, keyed over `skus` SKUs."""
    rows = list(_rows(kind, start, count, skus, sent, time.time()))
    if is_postgres(location):
        _copy_rows(str(location), rows, sent)
        return
    conn = sqlite3.connect(location, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            _insert("outbox_orders", ORDER_COLUMNS), [r.order for r in rows if r.order]
        )
        conn.executemany(_insert("outbox_entries", _entry_columns(sent)), [r.entry for r in rows])
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _insert(table: str, columns: tuple[str, ...]) -> str:
    marks = ", ".join(["?"] * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def _entry_columns(sent: bool) -> tuple[str, ...]:
    return ENTRY_COLUMNS + SENT_COLUMNS if sent else ENTRY_COLUMNS


def _copy_rows(url: str, rows: list[Row], sent: bool) -> None:
    """insert_entries on PostgreSQL: COPY into both tables, one transaction, then
    ANALYZE so the planner knows the tables' new size."""
    import psycopg

    from pg_tx import parse

    with psycopg.connect(parse(url).conninfo) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY outbox_orders ({', '.join(ORDER_COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    if row.order is not None:
                        copy.write_row(row.order)
            with cur.copy(
                f"COPY outbox_entries ({', '.join(_entry_columns(sent))}) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row(row.entry)
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE outbox_orders")
        conn.execute("ANALYZE outbox_entries")


def _rows(kind: Kind, start: int, count: int, skus: int, sent: bool, now: float) -> Iterator[Row]:
    for n in range(start, start + count):
        event, payload = stored(kind, n, keys=skus)
        entry: tuple[object, ...] = (event["id"], event["type"], payload, now, event["key"])
        if sent:
            # The ACK as mark_sent stores it (shared.ack.ack_json), written out directly:
            # IDs and digests need no escaping, and a million calls would dominate.
            digest = digest_of(payload)
            ack = SENT_ACK.format(id=event["id"], status=Receipt.APPLIED.value, digest=digest)
            entry += (1, now, ack, 1, now)
        data = event["data"]
        as_order = (event["id"], data["sku"], data["qty"], now) if kind is Kind.ORDER else None
        yield Row(entry, as_order)


def create_naive_source(path: Path, count: int) -> None:
    """The naive peer's own source database (default sqlite3 settings), `count` pending."""
    conn = naive.create_source(str(path))
    try:
        orders = [order(n) for n in range(count)]
        conn.executemany(
            "INSERT INTO orders (id, sku, qty) VALUES (?, ?, ?)",  # the naive peer's tables
            [(o["id"], o["sku"], o["qty"]) for o in orders],
        )
        conn.executemany(
            "INSERT INTO outbox (id, payload) VALUES (?, ?)",
            [(o["id"], naive.payload(o)) for o in orders],
        )
        conn.commit()
    finally:
        conn.close()


def count_rows(location: DbLocation, sql: str) -> int:
    """One figure read through a connection of our own."""
    if is_postgres(location):
        return int(value(location, sql))
    conn = sqlite3.connect(location, timeout=5)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()
