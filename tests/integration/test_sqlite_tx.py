"""sqlite_tx against real SQLite files, checked through independent sqlite3 connections."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import ITEMS_SCHEMA, query, try_write_lock

from sqlite_tx import Database, StorageError, transaction, unsynced


class Boom(Exception):
    pass


def user_version(path: Path) -> int:
    version: int = query(path, "PRAGMA user_version")[0][0]
    return version


def tables(path: Path) -> set[str]:
    return {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


async def open_fails(path: Path, migrations: tuple[str, ...]) -> StorageError:
    """The StorageError that opening raises; a database that opens anyway is closed."""
    try:
        db = await Database.open(path, migrations)
    except StorageError as exc:
        return exc
    await db.close()
    pytest.fail(f"{path} opened, expected StorageError")


# ---------------------------------------------------------------- opening and migrations


async def test_open_creates_the_schema_and_sets_user_version(
    items_db: Database, items_path: Path
) -> None:
    assert "items" in tables(items_path)
    assert user_version(items_path) == 1
    assert items_db.path == str(items_path)


async def test_open_sets_wal_and_synchronous_full(items_db: Database, items_path: Path) -> None:
    assert query(items_path, "PRAGMA journal_mode") == [("wal",)]
    assert await items_db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    assert await items_db.run(lambda c: c.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
    assert await items_db.run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) > 0


async def test_reopening_applies_only_the_new_migrations(items_path: Path) -> None:
    db = await Database.open(items_path, ITEMS_SCHEMA)
    await db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('kept')"))
    await db.close()

    second = (*ITEMS_SCHEMA, "CREATE TABLE more (x INTEGER); CREATE TABLE most (y INTEGER);")
    db = await Database.open(items_path, second)
    await db.close()

    assert user_version(items_path) == 2
    assert {"items", "more", "most"} <= tables(items_path)
    assert query(items_path, "SELECT name FROM items") == [("kept",)]


async def test_an_open_cancelled_while_the_file_opens_waits_for_its_thread(
    items_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled (a SIGTERM, say) while aiosqlite's thread opens the file: the open
    ends only once that thread has, so nothing reports to a loop that may be closed
    by then ("Event loop is closed" from the thread). The open is slowed down to
    make the moment wide."""
    real_connect, opening = sqlite3.connect, threading.Event()

    def slow_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opening.set()
        time.sleep(0.3)
        return real_connect(*args, **kwargs)

    before = set(threading.enumerate())
    monkeypatch.setattr(sqlite3, "connect", slow_connect)
    task = asyncio.create_task(Database.open(items_path, ITEMS_SCHEMA))
    assert await asyncio.to_thread(opening.wait, 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    # The loop's executor threads (asyncio_N) stay for later calls; no other may.
    assert [t for t in started if not t.name.startswith("asyncio_")] == []


async def test_a_failing_migration_changes_nothing(items_path: Path) -> None:
    db = await Database.open(items_path, ITEMS_SCHEMA)
    await db.close()

    broken = (*ITEMS_SCHEMA, "CREATE TABLE half (x INTEGER); CREATE TABLE items (again INTEGER);")
    await open_fails(items_path, broken)

    assert user_version(items_path) == 1
    assert "half" not in tables(items_path)


async def test_a_newer_schema_version_is_a_storage_error(items_path: Path) -> None:
    conn = sqlite3.connect(items_path)
    conn.execute("PRAGMA user_version = 5")
    conn.close()

    assert "newer" in str(await open_fails(items_path, ITEMS_SCHEMA))

    assert user_version(items_path) == 5
    assert "items" not in tables(items_path)


async def test_a_file_that_is_not_a_database_is_a_storage_error(items_path: Path) -> None:
    garbage = b"this is not an SQLite database, only some bytes\n" * 100
    items_path.write_bytes(garbage)

    await open_fails(items_path, ITEMS_SCHEMA)

    assert items_path.read_bytes() == garbage


async def test_a_path_in_a_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    await open_fails(tmp_path / "missing" / "store.db", ITEMS_SCHEMA)


# ---------------------------------------------------------------- run


async def test_run_returns_the_result_of_the_function(items_db: Database) -> None:
    assert await items_db.run(lambda c: c.execute("SELECT 40 + 2").fetchone()[0]) == 42


async def test_run_translates_sqlite_errors_to_storage_error(items_db: Database) -> None:
    with pytest.raises(StorageError) as excinfo:
        await items_db.run(lambda c: c.execute("SELECT * FROM no_such_table"))
    assert isinstance(excinfo.value.__cause__, sqlite3.Error)
    assert "no_such_table" in str(excinfo.value)


async def test_run_translates_constraint_errors_to_storage_error(items_db: Database) -> None:
    await items_db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('a')"))
    with pytest.raises(StorageError) as excinfo:
        await items_db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('a')"))
    assert isinstance(excinfo.value.__cause__, sqlite3.IntegrityError)


async def test_run_lets_other_exceptions_through_unchanged(items_db: Database) -> None:
    error = Boom("not storage")

    def fail(conn: sqlite3.Connection) -> None:
        raise error

    with pytest.raises(Boom) as excinfo:
        await items_db.run(fail)
    assert excinfo.value is error


async def test_the_database_stays_usable_after_an_error(
    items_db: Database, items_path: Path
) -> None:
    with pytest.raises(StorageError):
        await items_db.run(lambda c: c.execute("SELECT * FROM no_such_table"))
    await items_db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('after')"))
    assert query(items_path, "SELECT name FROM items") == [("after",)]


async def test_a_plain_statement_autocommits(items_db: Database, items_path: Path) -> None:
    await items_db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('auto')"))
    assert query(items_path, "SELECT name FROM items") == [("auto",)]
    try_write_lock(items_path)


async def test_a_read_leaves_no_lock_behind(items_db: Database, items_path: Path) -> None:
    await items_db.run(lambda c: c.execute("SELECT * FROM items").fetchall())
    try_write_lock(items_path)
    assert query(items_path, "PRAGMA wal_checkpoint(TRUNCATE)")[0][0] == 0


# ---------------------------------------------------------------- transaction


async def test_transaction_commits_on_success(items_db: Database, items_path: Path) -> None:
    def write(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('a')")
            conn.execute("INSERT INTO items (name) VALUES ('b')")

    await items_db.run(write)
    assert query(items_path, "SELECT name FROM items ORDER BY name") == [("a",), ("b",)]
    try_write_lock(items_path)


async def test_transaction_rolls_back_on_exception(items_db: Database, items_path: Path) -> None:
    error = Boom("half way")

    def write(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('a')")
            raise error

    with pytest.raises(Boom) as excinfo:
        await items_db.run(write)

    assert excinfo.value is error
    assert query(items_path, "SELECT * FROM items") == []
    try_write_lock(items_path)


async def test_transaction_rolls_back_on_a_failing_statement(
    items_db: Database, items_path: Path
) -> None:
    def write(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.execute("INSERT INTO items (name) VALUES ('a')")
            conn.execute("INSERT INTO items (name) VALUES ('a')")

    with pytest.raises(StorageError):
        await items_db.run(write)

    assert query(items_path, "SELECT * FROM items") == []
    try_write_lock(items_path)


# A constraint checked at COMMIT: the COMMIT fails, and SQLite keeps the transaction.
DEFERRED = (
    "CREATE TABLE parents (id INTEGER PRIMARY KEY)",
    "CREATE TABLE children (id INTEGER PRIMARY KEY, parent INTEGER NOT NULL"
    " REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
)


def orphan(conn: sqlite3.Connection) -> None:
    with transaction(conn):
        conn.execute("INSERT INTO children (id, parent) VALUES (1, 99)")


def synchronous(conn: sqlite3.Connection) -> int:
    level: int = conn.execute("PRAGMA synchronous").fetchone()[0]
    return level


async def test_a_failed_commit_is_rolled_back_and_leaves_no_transaction(items_path: Path) -> None:
    db = await Database.open(items_path, DEFERRED)
    try:
        with pytest.raises(StorageError, match="FOREIGN KEY constraint failed"):
            await db.run(orphan)
        assert await db.run(lambda conn: conn.in_transaction) is False
        assert query(items_path, "SELECT * FROM children") == []
        try_write_lock(items_path)  # no lock left held either
    finally:
        await db.close()


async def test_unsynced_commits_at_normal_and_leaves_full_even_when_its_commit_fails(
    items_path: Path,
) -> None:
    """Only `transaction` rolling a failed COMMIT back lets the level go back to FULL:
    SQLite refuses to change it inside a transaction."""
    db = await Database.open(items_path, DEFERRED)

    def levels(conn: sqlite3.Connection) -> list[int]:
        seen = [synchronous(conn)]
        with unsynced(conn):
            seen.append(synchronous(conn))
            with transaction(conn):
                conn.execute("INSERT INTO parents (id) VALUES (1)")
        seen.append(synchronous(conn))
        with unsynced(conn):
            try:
                orphan(conn)
            except sqlite3.IntegrityError:
                seen.append(-1)  # the COMMIT's own error, not one of the PRAGMA's
        seen.append(synchronous(conn))
        return seen

    try:
        assert await db.run(levels) == [2, 1, 2, -1, 2]  # FULL, NORMAL, FULL, ..., FULL
        assert query(items_path, "SELECT id FROM parents") == [(1,)]
    finally:
        await db.close()


def test_unsynced_changes_nothing_outside_wal_mode() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)  # journal_mode "memory"
    try:
        conn.execute("PRAGMA synchronous = FULL")
        with unsynced(conn):
            assert synchronous(conn) == 2
            with transaction(conn):
                conn.execute("CREATE TABLE t (n INTEGER)")
        assert synchronous(conn) == 2
    finally:
        conn.close()


async def test_immediate_transaction_holds_the_write_lock(
    items_db: Database, items_path: Path
) -> None:
    def inside(conn: sqlite3.Connection) -> str:
        with transaction(conn):
            try:
                try_write_lock(items_path)
            except sqlite3.OperationalError as exc:
                return str(exc)
            return "no lock"

    assert "locked" in await items_db.run(inside)
    try_write_lock(items_path)


async def test_deferred_transaction_does_not_take_the_write_lock(
    items_db: Database, items_path: Path
) -> None:
    def inside(conn: sqlite3.Connection) -> int:
        with transaction(conn, immediate=False):
            count: int = conn.execute("SELECT count(*) FROM items").fetchone()[0]
            try_write_lock(items_path)
            return count

    assert await items_db.run(inside) == 0
