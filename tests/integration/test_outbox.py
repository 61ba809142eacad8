"""The SQLite outbox: its file, journal, locks and schema.

What every outbox backend must do is in tests/behaviour/test_outbox_store.py; this
module holds what is SQLite's own, checked through independent sqlite3 connections.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plumbing.storage import StorageError
from publisher.backends.sqlite import SqliteOutbox
from publisher.store import Outbox


def rows(path: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read through a fresh connection, closed afterwards."""
    conn = sqlite3.connect(path, timeout=5)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def execute(path: Path, *statements: str) -> None:
    """Run statements through a fresh autocommit connection."""
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def count(path: Path, table: str) -> int:
    n: int = rows(path, f"SELECT count(*) FROM {table}")[0][0]
    return n


def wal_file(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def order(event_id: str, sku: str = "snack", qty: int = 7) -> dict[str, Any]:
    return {"id": event_id, "sku": sku, "qty": qty}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "source.db"


@pytest.fixture
async def outbox(path: Path) -> AsyncIterator[SqliteOutbox]:
    async with Outbox.open(path) as opened:
        assert isinstance(opened, SqliteOutbox)
        yield opened


# ---------------------------------------------------------------- opening


async def test_open_creates_orders_and_outbox_tables(outbox: Outbox, path: Path) -> None:
    names = {r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"orders", "outbox"} <= names
    assert "inbox" not in names
    columns = {r[1] for r in rows(path, "PRAGMA table_info(outbox)")}
    assert {"seq", "id", "payload", "sent"} <= columns


async def test_outbox_seq_is_declared_autoincrement(outbox: Outbox, path: Path) -> None:
    # What keeps a deleted entry's seq from being given again (the behaviour suite
    # checks that it is not).
    (ddl,) = rows(path, "SELECT sql FROM sqlite_master WHERE name = 'outbox'")[0]
    assert "AUTOINCREMENT" in ddl.upper()


async def test_open_uses_wal_journal_mode(outbox: Outbox, path: Path) -> None:
    assert rows(path, "PRAGMA journal_mode") == [("wal",)]


async def test_open_sets_synchronous_full_on_its_connection(outbox: SqliteOutbox) -> None:
    synchronous = await outbox._db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert synchronous == 2  # FULL


async def test_await_open_returns_an_outbox(path: Path) -> None:
    outbox = await Outbox.open(path)
    try:
        assert isinstance(outbox, SqliteOutbox)
        assert await outbox.accept(order("a")) == "accepted"
        assert outbox.path == str(path)
    finally:
        await outbox.close()
    assert count(path, "orders") == 1


async def test_async_with_open_closes_on_exit(path: Path) -> None:
    async with Outbox.open(path) as outbox:
        assert isinstance(outbox, Outbox)
        await outbox.accept(order("a"))
        assert wal_file(path).exists()
    # The last connection to close checkpoints the WAL and deletes it.
    assert not wal_file(path).exists()
    assert count(path, "outbox") == 1


async def test_opening_a_file_that_is_not_a_database_is_a_storage_error(path: Path) -> None:
    path.write_bytes(b"garbage, not SQLite\n" * 200)
    try:
        outbox = await Outbox.open(path)
    except StorageError:
        return
    await outbox.close()
    pytest.fail("a garbage file opened as an outbox")


# ---------------------------------------------------------------- locks


async def test_failed_intake_leaves_no_lock_behind(outbox: Outbox, path: Path) -> None:
    execute(
        path,
        "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox"
        " BEGIN SELECT RAISE(ABORT, 'boom'); END",
    )
    with pytest.raises(StorageError):
        await outbox.accept(order("a"))
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (id, sku, qty, accepted_at) VALUES ('x', 's', 1, 0)")
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert rows(path, "SELECT id FROM orders") == [("x",)]


async def test_pending_leaves_no_lock_or_snapshot_behind(outbox: Outbox, path: Path) -> None:
    for event_id in ["a", "b"]:
        await outbox.accept(order(event_id))
    assert len(await outbox.pending()) == 2
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.close()
    assert busy == 0
