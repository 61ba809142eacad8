"""The SQLite backends' writability probe against a real full disk, and the migration
that gives both files their health row. Checked through sqlite3 connections of our own."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from small_disk import fill, small_disk
from support import placed

from plumbing.storage import StorageError
from publisher.backends import sqlite_sql as outbox_sql
from publisher.store import Outbox
from shared import Receipt
from sink.backends import sqlite_sql as inbox_sql
from sink.store import Inbox
from sqlite_tx import BUSY_TIMEOUT_MS, Database

if TYPE_CHECKING:
    from conftest import Query


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
    try:
        assert db_rows(path, "SELECT id, at FROM health") == [(1, 0)]
        await store.check_writable()
        [(first,)] = db_rows(path, "SELECT at FROM health")
        await store.check_writable()
        [(second,)] = db_rows(path, "SELECT at FROM health")
        assert 0 < first <= second  # updated in place: one row, ever
    finally:
        await store.close()


async def test_an_outbox_of_schema_2_gains_the_health_row_and_a_newer_file_is_refused(
    tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / "v2.db"
    old = await Database.open(path, outbox_sql.MIGRATIONS[:2])  # the program before
    await old.close()
    assert db_rows(path, "PRAGMA user_version") == [(2,)]
    async with Outbox.open(path) as outbox:
        await outbox.check_writable()
    assert db_rows(path, "PRAGMA user_version") == [(len(outbox_sql.MIGRATIONS),)]
    assert len(db_rows(path, "SELECT * FROM health")) == 1
    with pytest.raises(StorageError, match="newer"):  # the program before refuses it
        await Database.open(path, outbox_sql.MIGRATIONS[:2])


async def test_an_inbox_of_schema_1_gains_the_health_row_and_a_newer_file_is_refused(
    tmp_path: Path, db_rows: Query
) -> None:
    path = tmp_path / "v1.db"
    old = await Database.open(path, inbox_sql.MIGRATIONS[:1])
    await old.close()
    async with Inbox.open(path) as inbox:
        await inbox.check_writable()
    assert db_rows(path, "PRAGMA user_version") == [(len(inbox_sql.MIGRATIONS),)]
    assert len(db_rows(path, "SELECT * FROM health")) == 1
    with pytest.raises(StorageError, match="newer"):
        await Database.open(path, inbox_sql.MIGRATIONS[:1])


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
