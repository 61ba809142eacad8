"""The SQLite backends' writability probe against a real full disk, and the migration
that gives both files their health row. Checked through sqlite3 connections of our own."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from small_disk import fill, small_disk
from support import placed, query

from plumbing.schema import VERSIONS_TABLE, history
from plumbing.storage import StorageError
from publisher.backends import sqlite_sql as outbox_sql
from publisher.store import Outbox
from shared import Receipt
from sink.backends import sqlite_sql as inbox_sql
from sink.store import Inbox
from sqlite_tx import BUSY_TIMEOUT_MS, Database

if TYPE_CHECKING:
    from conftest import Query


def tables(path: Path) -> set[str]:
    return {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


async def test_a_full_disk_fails_the_probe_of_both_sides_and_freeing_it_passes_again(
    tmp_path: Path, db_rows: Query
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        async with Outbox.open(disk / "source.db") as outbox, Inbox.open(disk / "sink.db") as inbox:
            await outbox.accept({"id": "a", "sku": "snack", "qty": 1})
            await inbox.receive(placed("a"))
            await outbox.check_writable()
            await inbox.check_writable()
            filler = fill(disk)
            for store in (outbox, inbox):
                with pytest.raises(StorageError, match="full"):
                    await store.check_writable()
            # The disk is full for real writes too, not only for the probe.
            with pytest.raises(StorageError, match="full"):
                await outbox.accept({"id": "b", "sku": "snack", "qty": 1})
            filler.unlink()
            await outbox.check_writable()
            await inbox.check_writable()
            assert await outbox.accept({"id": "b", "sku": "snack", "qty": 1}) == "accepted"
            receipt = await inbox.receive(placed("b"))
            assert receipt is Receipt.APPLIED
        assert db_rows(disk / "source.db", "SELECT id FROM outbox_entries ORDER BY seq") == [
            ("a",),
            ("b",),
        ]
        assert db_rows(disk / "sink.db", "SELECT qty FROM inbox_inventory") == [(2,)]


@pytest.mark.parametrize("side", ["outbox", "inbox"])
async def test_the_probe_commits_a_write_that_another_connection_sees(
    side: str, tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / f"{side}.db"
    store = await (Outbox.open(path) if side == "outbox" else Inbox.open(path))
    health = f"{side}_health"  # the side's probe table (Schema.probe_table)
    assert health == (outbox_sql if side == "outbox" else inbox_sql).SCHEMA.probe_table
    try:
        assert db_rows(path, f"SELECT id, at FROM {health}") == [(1, 0)]
        await store.check_writable()
        [(first,)] = db_rows(path, f"SELECT at FROM {health}")
        await store.check_writable()
        [(second,)] = db_rows(path, f"SELECT at FROM {health}")
        assert 0 < first <= second  # updated in place: one row, ever
    finally:
        await store.close()


async def test_a_store_of_its_own_is_probed_on_the_probe_table_its_history_names(
    tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / "own.db"
    schema = history(
        "own",
        (
            "CREATE TABLE beat (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL);"
            " INSERT INTO beat (id, at) VALUES (1, 0)",
        ),
        probe_table="beat",
    )
    db = await Database.open(path, schema)
    try:
        await db.check_writable()
        [(at,)] = db_rows(path, "SELECT at FROM beat")
        assert at > 0
        await db.run(lambda conn: conn.execute("DELETE FROM beat"))
        with pytest.raises(StorageError, match="health row is missing"):
            await db.check_writable()
    finally:
        await db.close()


def write_release(path: Path, migrations: Sequence[str]) -> None:
    """A file as an earlier release left it: its migrations run, its version in
    user_version (that release kept it there, and its tables had their old names)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for script in migrations:
            conn.executescript(script)
        conn.execute(f"PRAGMA user_version = {len(migrations)}")
    finally:
        conn.close()


async def test_an_outbox_of_schema_2_gains_the_health_row_and_a_newer_file_is_refused(
    tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / "v2.db"
    write_release(path, outbox_sql.MIGRATIONS[:2])  # the program before: no health table
    assert "health" not in tables(path)
    async with Outbox.open(path) as outbox:
        await outbox.check_writable()
    newest = len(outbox_sql.MIGRATIONS)
    assert db_rows(path, f"SELECT side, version FROM {VERSIONS_TABLE}") == [("publisher", newest)]
    # What the program before reads, raised so that it refuses the file.
    assert db_rows(path, "PRAGMA user_version") == [(newest,)]
    [(at,)] = db_rows(path, "SELECT at FROM outbox_health")
    assert at > 0  # probed there
    assert "health" not in tables(path)
    older = replace(outbox_sql.SCHEMA, migrations=outbox_sql.MIGRATIONS[:2])
    with pytest.raises(StorageError, match="newer"):
        await Database.open(path, older)


async def test_an_inbox_of_schema_1_gains_the_health_row_and_a_newer_file_is_refused(
    tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / "v1.db"
    write_release(path, inbox_sql.MIGRATIONS[:1])
    assert "health" not in tables(path)
    async with Inbox.open(path) as inbox:
        await inbox.check_writable()
    newest = len(inbox_sql.MIGRATIONS)
    assert db_rows(path, f"SELECT side, version FROM {VERSIONS_TABLE}") == [("sink", newest)]
    assert db_rows(path, "PRAGMA user_version") == [(newest,)]
    [(at,)] = db_rows(path, "SELECT at FROM inbox_health")
    assert at > 0
    assert "health" not in tables(path)
    older = replace(inbox_sql.SCHEMA, migrations=inbox_sql.MIGRATIONS[:1])
    with pytest.raises(StorageError, match="newer"):
        await Database.open(path, older)


async def test_a_removed_file_fails_the_probe_though_sqlite_still_writes(tmp_path: Path) -> None:
    # SQLite goes on writing to the unlinked file (lost on close): only the probe's
    # look at the path tells.
    path = tmp_path / "gone.db"
    async with Outbox.open(path) as outbox:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink()
        assert await outbox.accept({"id": "a", "sku": "snack", "qty": 1}) == "accepted"
        with pytest.raises(StorageError, match="gone"):
            await outbox.check_writable()
        sqlite3.connect(path).close()  # another file at the same path
        with pytest.raises(StorageError, match="replaced"):
            await outbox.check_writable()


async def test_probes_asked_for_while_one_waits_for_the_lock_share_it(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with Outbox.open(path) as outbox:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            first = asyncio.ensure_future(outbox.check_writable())
            await asyncio.sleep(0.5)
            later = [asyncio.ensure_future(outbox.check_writable()) for _ in range(4)]
            outcomes = await asyncio.gather(first, *later, return_exceptions=True)
            took_s = time.monotonic() - started
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert all(isinstance(o, StorageError) and "locked" in str(o) for o in outcomes)
        # One wait of the busy timeout, not five queued one after another.
        assert took_s < 2 * BUSY_TIMEOUT_MS / 1000
        await outbox.check_writable()  # and the next one is a probe of its own
