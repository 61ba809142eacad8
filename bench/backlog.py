"""Source databases built fast: the real schema, rows inserted in one transaction.

The schema comes from `Outbox.open`; the rows go in with plain sqlite3 and
executemany (a SQLite file), or with psycopg's COPY (a PostgreSQL database), using
the real columns (and the `lane` column when the schema has one). Both backends
keep the same columns: flags 0/1, times in seconds since the epoch, JSON as text.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from bench import naive
from chaos.dbs import DbLocation, is_postgres, value
from publisher import Outbox
from shared import Event, Receipt, canonical_json, digest_of

SENT_ACK: Final = '{{"ack": "{id}", "status": "{status}", "sha256": "{digest}"}}'
SKUS: Final = tuple(f"sku-{n}" for n in range(8))


def event(n: int, prefix: str = "order", skus: int = len(SKUS)) -> Event:
    """The nth order; SKUs take turns (the first `skus` of sku-0, sku-1, ...)."""
    return {"id": f"{prefix}-{n:08d}", "sku": f"sku-{n % skus}", "qty": 1 + n % 5}


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
) -> None:
    """Add `count` orders with their outbox entries, pending or already sent, over
    `skus` SKUs."""
    if is_postgres(location):
        _copy_entries(str(location), count, start=start, sent=sent, skus=skus)
        return
    conn = sqlite3.connect(location, isolation_level=None)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(outbox)")}
        with_lane = "lane" in columns
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO orders (id, sku, qty, accepted_at) VALUES (?, ?, ?, ?)",
            ((e["id"], e["sku"], e["qty"], now) for e in _events(start, count, skus)),
        )
        names = ["id", "payload", "queued_at"]
        if sent:
            names += ["sent", "sent_at", "ack", "attempts", "last_attempt_at"]
        if with_lane:
            names.append("lane")
        marks = ", ".join(["?"] * len(names))
        conn.executemany(
            f"INSERT INTO outbox ({', '.join(names)}) VALUES ({marks})",
            (_entry_row(e, now, sent, with_lane) for e in _events(start, count, skus)),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _copy_entries(url: str, count: int, *, start: int, sent: bool, skus: int) -> None:
    """insert_entries on PostgreSQL: COPY into both tables, one transaction, then
    ANALYZE so the planner knows the tables' new size."""
    import psycopg

    from pg_tx import parse

    now = time.time()
    names = ["id", "payload", "queued_at"]
    if sent:
        names += ["sent", "sent_at", "ack", "attempts", "last_attempt_at"]
    names.append("lane")
    with psycopg.connect(parse(url).conninfo) as conn:
        with conn.cursor() as cur:
            with cur.copy("COPY orders (id, sku, qty, accepted_at) FROM STDIN") as copy:
                for e in _events(start, count, skus):
                    copy.write_row((e["id"], e["sku"], e["qty"], now))
            with cur.copy(f"COPY outbox ({', '.join(names)}) FROM STDIN") as copy:
                for e in _events(start, count, skus):
                    copy.write_row(_entry_row(e, now, sent, True))
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE orders")
        conn.execute("ANALYZE outbox")


def _events(start: int, count: int, skus: int = len(SKUS)) -> Iterator[Event]:
    for n in range(start, start + count):
        yield event(n, skus=skus)


def _entry_row(e: Event, now: float, sent: bool, with_lane: bool) -> tuple[object, ...]:
    payload = canonical_json(e)
    row: tuple[object, ...] = (e["id"], payload, now)
    if sent:
        # The ACK as mark_sent stores it (json.dumps of make_ack), written out directly:
        # IDs and digests need no escaping, and a million dumps calls would dominate.
        ack = SENT_ACK.format(id=e["id"], status=Receipt.APPLIED.value, digest=digest_of(payload))
        row += (1, now, ack, 1, now)
    if with_lane:
        row += (e["sku"],)
    return row


def create_naive_source(path: Path, count: int) -> None:
    """The naive peer's own source database (default sqlite3 settings), `count` pending."""
    conn = naive.create_source(str(path))
    try:
        events = list(_events(0, count))
        conn.executemany(
            "INSERT INTO orders (id, sku, qty) VALUES (?, ?, ?)",
            [(e["id"], e["sku"], e["qty"]) for e in events],
        )
        conn.executemany(
            "INSERT INTO outbox (id, payload) VALUES (?, ?)",
            [(e["id"], canonical_json(e)) for e in events],
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
