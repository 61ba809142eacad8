"""A SQLite outbox keeps a large event apart from its entry's row (`outbox_payloads`),
so that marking the entry sent does not write the event into the WAL once more; read
back with connections of the test's own.

The behaviour suite (tests/behaviour) runs a large event through publish, publish_in,
pending reads, duplicates, conflicts and prune on both backends; this is what only
SQLite does: where the text lies, and what a mark writes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support import query

from publisher.backends.sqlite import PAYLOAD_APART_CHARS
from publisher.store import Mark, Outbox
from shared.ack import digest_of
from shared.event import canonical_json

COUNT = 32


def large(n: int) -> dict[str, Any]:
    """An event of about 16 KB in its canonical form."""
    lines = [
        {"line": k, "text": f"Zeile {k} von Auftrag {n}: \u00e4\u00f6\u00fc " * 12}
        for k in range(40)
    ]
    return {
        "id": f"doc-{n}",
        "type": "document.stored",
        "key": f"c-{n % 3}",
        "data": {"lines": lines},
    }


def checkpoint(db: Path) -> None:
    """Copy the WAL into the file and empty it, through a connection of the test's own."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        conn.close()


def wal_bytes(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def test_marking_large_events_sent_writes_their_rows_not_the_events(tmp_path: Path) -> None:
    db = tmp_path / "source.db"
    events = [large(n) for n in range(COUNT)]
    texts = [canonical_json(e) for e in events]  # type: ignore[arg-type]
    assert min(len(text) for text in texts) >= PAYLOAD_APART_CHARS
    async with Outbox.open(db) as outbox:
        assert await outbox.publish_many(events[:-1]) == ["accepted"] * (COUNT - 1)
        assert await outbox.publish(events[-1]) == "accepted"  # the single path too
        checkpoint(db)
        await outbox.mark_sent_many(
            [Mark(e["id"], {"ack": e["id"], "status": "applied"}) for e in events]
        )
        written = wal_bytes(db)
        assert [p.event for p in await outbox.pending_batch(16)] == []

    # Each mark rewrote its entry's row: a 16 KB event in it would have been written
    # again (over half a megabyte for these); apart, the rows are a few pages.
    assert 0 < written < sum(len(text) for text in texts) // 8, written
    assert query(db, "SELECT DISTINCT payload, sent FROM outbox_entries") == [("", 1)]
    assert query(
        db,
        "SELECT e.id, p.payload FROM outbox_entries AS e JOIN outbox_payloads AS p"
        " ON p.seq = e.seq ORDER BY e.seq",
    ) == [(e["id"], text) for e, text in zip(events, texts, strict=True)]


async def test_a_large_event_apart_is_read_judged_and_pruned_with_its_entry(
    tmp_path: Path,
) -> None:
    db = tmp_path / "source.db"
    one, small = large(1), {"id": "small-1", "type": "t.x", "data": {"n": 1}}
    async with Outbox.open(db) as outbox:
        assert await outbox.publish_many([one, small]) == ["accepted"] * 2
        [pending, _] = await outbox.pending_batch(16)
        assert (pending.event, pending.payload) == (one, canonical_json(one))  # type: ignore[arg-type]
        entry = await outbox.entry(one["id"])
        assert entry is not None and entry.event == one
        assert await outbox.publish(one) == "duplicate"
        assert query(db, "SELECT count(*) FROM outbox_payloads") == [
            (1,)
        ]  # the small one in its row

        await outbox.mark_sent_many(
            [Mark(e["id"], {"ack": e["id"], "status": "applied"}) for e in (one, small)]
        )
        await asyncio.sleep(0.01)
        assert await outbox.prune(older_than_s=0) == 2
        assert await outbox.publish(one) == "duplicate"  # judged by the digest kept

    assert query(db, "SELECT count(*) FROM outbox_payloads") == [(0,)]
    assert query(db, "SELECT digest FROM outbox_pruned WHERE id = ?", (one["id"],)) == [
        (digest_of(canonical_json(one)),)  # type: ignore[arg-type]
    ]


async def test_a_large_event_written_in_its_row_before_is_read_and_delivered_as_ever(
    tmp_path: Path,
) -> None:
    """Entries written before large events were kept apart hold them in their rows;
    they are read from there, and a mark leaves them there."""
    db = tmp_path / "source.db"
    one = large(2)
    async with Outbox.open(db):
        pass
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO outbox_entries (id, type, payload, queued_at, lane)"
            " VALUES (?, ?, ?, 1, ?)",
            (one["id"], one["type"], canonical_json(one), one["key"]),  # type: ignore[arg-type]
        )
    finally:
        conn.close()
    async with Outbox.open(db) as outbox:
        [pending] = await outbox.pending_batch(16)
        assert pending.event == one
        assert await outbox.publish(one) == "duplicate"
        await outbox.mark_sent_many([Mark(one["id"], {"ack": one["id"], "status": "applied"})])
        entry = await outbox.entry(one["id"])
        assert entry is not None and entry.event == one
    assert query(db, "SELECT payload, sent FROM outbox_entries") == [(canonical_json(one), 1)]  # type: ignore[arg-type]
    assert query(db, "SELECT count(*) FROM outbox_payloads") == [(0,)]


async def test_a_rebuild_of_the_entries_table_is_refused_rather_than_losing_the_events(
    tmp_path: Path,
) -> None:
    """A migration runs with foreign keys on (as every connection of the outbox does).
    One that dropped outbox_entries to rebuild it, as migration 5 rebuilt the outbox,
    must fail on the events kept apart, not delete them with it."""
    db = tmp_path / "source.db"
    async with Outbox.open(db) as outbox:
        assert await outbox.publish(large(3)) == "accepted"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute("DROP TABLE outbox_entries")
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert query(db, "SELECT count(*) FROM outbox_payloads") == [(1,)]
