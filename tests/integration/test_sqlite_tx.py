"""sqlite_tx against real SQLite files, checked through independent sqlite3 connections."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import ITEMS_SCHEMA, query, try_write_lock

from plumbing.schema import VERSIONS_TABLE, Schema, history
from sqlite_tx import Database, StorageError, database, transaction, unsynced


class Boom(Exception):
    pass


def user_version(path: Path) -> int:
    version: int = query(path, "PRAGMA user_version")[0][0]
    return version


def versions(path: Path) -> list[tuple[str, int]]:
    """Each side's version as the file records it (VERSIONS_TABLE), by side."""
    return query(path, f"SELECT side, version FROM {VERSIONS_TABLE} ORDER BY side")


def tables(path: Path) -> set[str]:
    return {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def write_by_hand(path: Path, *statements: str) -> None:
    """Run statements on the file through a connection of our own."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


# The tests' own store: one table of items, its version a row of VERSIONS_TABLE.
ITEMS = history("items", ITEMS_SCHEMA)


async def open_fails(path: Path, schema: Schema) -> StorageError:
    """The StorageError that opening raises; a database that opens anyway is closed."""
    try:
        db = await Database.open(path, schema)
    except StorageError as exc:
        return exc
    await db.close()
    pytest.fail(f"{path} opened, expected StorageError")


# ---------------------------------------------------------------- opening and migrations


async def test_open_creates_the_schema_and_records_its_version_in_a_table_of_its_own(
    items_db: Database, items_path: Path
) -> None:
    assert tables(items_path) == {"items", VERSIONS_TABLE}
    assert versions(items_path) == [("items", 1)]
    assert user_version(items_path) == 0  # the user's, never ours
    assert items_db.path == str(items_path)


async def test_a_fresh_file_keeps_the_user_version_and_the_tables_its_user_gave_it(
    items_path: Path,
) -> None:
    write_by_hand(
        items_path,
        "PRAGMA user_version = 7",
        "CREATE TABLE mine (x INTEGER)",
        "INSERT INTO mine (x) VALUES (42)",
    )
    db = await Database.open(items_path, ITEMS)
    await db.close()
    db = await Database.open(items_path, ITEMS)  # and reopened: no migration is replayed
    await db.close()

    assert user_version(items_path) == 7
    assert versions(items_path) == [("items", 1)]
    assert tables(items_path) == {"mine", "items", VERSIONS_TABLE}
    assert query(items_path, "SELECT x FROM mine") == [(42,)]


async def test_open_sets_wal_and_synchronous_full(items_db: Database, items_path: Path) -> None:
    assert query(items_path, "PRAGMA journal_mode") == [("wal",)]
    assert await items_db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    assert await items_db.run(lambda c: c.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
    assert await items_db.run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) > 0


async def test_reopening_applies_only_the_new_migrations(items_path: Path) -> None:
    db = await Database.open(items_path, ITEMS)
    await db.run(lambda c: c.execute("INSERT INTO items (name) VALUES ('kept')"))
    await db.close()

    # Were the first migration run again, CREATE TABLE items would fail the open.
    more = "CREATE TABLE more (x INTEGER); CREATE TABLE most (y INTEGER);"
    db = await Database.open(items_path, history("items", (*ITEMS_SCHEMA, more)))
    await db.close()

    assert versions(items_path) == [("items", 2)]
    assert user_version(items_path) == 0
    assert {"items", "more", "most"} <= tables(items_path)
    assert query(items_path, "SELECT name FROM items") == [("kept",)]


async def test_sides_sharing_a_file_each_keep_their_own_version(items_path: Path) -> None:
    db = await Database.open(items_path, ITEMS)
    await db.close()
    other = history("other", ("CREATE TABLE a (x INTEGER)", "CREATE TABLE b (y INTEGER)"))
    db = await Database.open(items_path, other)
    await db.close()

    assert versions(items_path) == [("items", 1), ("other", 2)]
    assert {"items", "a", "b"} <= tables(items_path)


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
    task = asyncio.create_task(Database.open(items_path, ITEMS))
    assert await asyncio.to_thread(opening.wait, 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    # The loop's executor threads (asyncio_N) stay for later calls; no other may.
    assert [t for t in started if not t.name.startswith("asyncio_")] == []


async def test_an_open_cancelled_after_connecting_leaves_no_thread(
    items_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cancelled on its first trip to the connected worker (a SIGTERM as a run starts):
    # the thread must be gone, or it would report to an event loop closed by then.
    real_check, checking = database.check_internals, asyncio.Event()

    async def slow_check(connection: Any) -> None:
        checking.set()
        await asyncio.sleep(5)
        await real_check(connection)

    before = set(threading.enumerate())
    monkeypatch.setattr(database, "check_internals", slow_check)
    task = asyncio.create_task(Database.open(items_path, ITEMS))
    await asyncio.wait_for(checking.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert [t for t in started if not t.name.startswith("asyncio_")] == []


async def test_a_failing_migration_changes_nothing(items_path: Path) -> None:
    db = await Database.open(items_path, ITEMS)
    await db.close()

    broken = (*ITEMS_SCHEMA, "CREATE TABLE half (x INTEGER); CREATE TABLE items (again INTEGER);")
    await open_fails(items_path, history("items", broken))

    assert versions(items_path) == [("items", 1)]
    assert "half" not in tables(items_path)


async def test_a_failing_fresh_schema_leaves_not_even_the_versions_table(items_path: Path) -> None:
    broken = ("CREATE TABLE half (x INTEGER)", "CREATE TABLE half (again INTEGER)")
    await open_fails(items_path, history("items", broken))

    assert tables(items_path) == set()


async def test_a_newer_schema_version_is_a_storage_error(items_path: Path) -> None:
    write_by_hand(
        items_path,
        f"CREATE TABLE {VERSIONS_TABLE} (side TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES ('items', 5)",
    )

    message = str(await open_fails(items_path, ITEMS))
    assert "newer" in message and "items" in message and "5" in message

    assert versions(items_path) == [("items", 5)]
    assert "items" not in tables(items_path)


@pytest.mark.parametrize("recorded", ["'abc'", "-1", "1.5"])
async def test_a_version_no_release_writes_is_a_storage_error(
    items_path: Path, recorded: str
) -> None:
    write_by_hand(
        items_path,
        f"CREATE TABLE {VERSIONS_TABLE} (side TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES ('items', {recorded})",
    )

    message = str(await open_fails(items_path, ITEMS))
    assert "no release writes" in message and "items" in message
    assert "items" not in tables(items_path)


async def test_another_sides_newer_version_is_not_this_sides(items_path: Path) -> None:
    write_by_hand(
        items_path,
        f"CREATE TABLE {VERSIONS_TABLE} (side TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES ('other', 5)",
    )
    db = await Database.open(items_path, ITEMS)
    await db.close()

    assert versions(items_path) == [("items", 1), ("other", 5)]


# ---------------------------------------------------------------- a file of an earlier release

# A store whose earlier releases kept their version in user_version, their table
# named `items`; this release names it `store_items` and keeps its version in
# VERSIONS_TABLE. Its fresh schema is what the migrations reach.
LEGACY_RELEASE = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)"
RENAMED = Schema(
    side="items",
    fresh="CREATE TABLE store_items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
    migrations=(LEGACY_RELEASE, "ALTER TABLE items RENAME TO store_items"),
    tables=frozenset({"items", "store_items"}),
    probe_table="",
    legacy_table="items",
    legacy_columns=frozenset({"id", "name"}),
)


def write_legacy(path: Path, version: int = 1) -> None:
    """A file as the earlier release left it: its table, a row, and user_version."""
    write_by_hand(
        path,
        LEGACY_RELEASE,
        "INSERT INTO items (name) VALUES ('kept')",
        f"PRAGMA user_version = {version}",
    )


async def test_an_earlier_releases_file_is_migrated_and_its_user_version_raised(
    items_path: Path,
) -> None:
    write_legacy(items_path)
    db = await Database.open(items_path, RENAMED)
    await db.close()

    assert tables(items_path) == {"store_items", VERSIONS_TABLE}
    assert query(items_path, "SELECT name FROM store_items") == [("kept",)]
    assert versions(items_path) == [("items", 2)]
    # What the earlier release reads: it now refuses the file as newer than it knows.
    assert user_version(items_path) == 2


@pytest.mark.parametrize(
    "user_tables",
    [
        # A user's own table of the legacy name, other columns, and a user_version.
        (
            "CREATE TABLE items (sku TEXT, qty INTEGER)",
            "INSERT INTO items (sku, qty) VALUES ('tea', 3)",
            "PRAGMA user_version = 1",
        ),
        # The legacy table's columns but user_version 0: no release of ours wrote it.
        (LEGACY_RELEASE, "INSERT INTO items (name) VALUES ('theirs')", "PRAGMA user_version = 0"),
    ],
    ids=["other-columns", "user-version-0"],
)
async def test_a_table_of_the_legacy_name_that_no_release_wrote_gets_the_fresh_schema(
    items_path: Path, user_tables: tuple[str, ...]
) -> None:
    write_by_hand(items_path, *user_tables)
    before = query(items_path, "SELECT * FROM items")
    version = user_version(items_path)
    db = await Database.open(items_path, RENAMED)
    await db.close()

    assert tables(items_path) == {"items", "store_items", VERSIONS_TABLE}
    assert query(items_path, "SELECT * FROM items") == before  # the user's, untouched
    assert query(items_path, "SELECT * FROM store_items") == []
    assert versions(items_path) == [("items", 2)]
    assert user_version(items_path) == version


async def test_a_failing_migration_of_an_earlier_releases_file_changes_nothing(
    items_path: Path,
) -> None:
    write_legacy(items_path)
    broken = replace(
        RENAMED, migrations=(*RENAMED.migrations[:1], "CREATE TABLE half (x INTEGER); nonsense")
    )
    await open_fails(items_path, broken)

    assert tables(items_path) == {"items"}  # not even the versions table
    assert query(items_path, "SELECT name FROM items") == [("kept",)]
    assert user_version(items_path) == 1


async def test_an_earlier_releases_file_of_a_newer_version_is_a_storage_error(
    items_path: Path,
) -> None:
    write_legacy(items_path, version=5)

    assert "newer" in str(await open_fails(items_path, RENAMED))

    assert tables(items_path) == {"items"}
    assert user_version(items_path) == 5


async def test_a_file_that_is_not_a_database_is_a_storage_error(items_path: Path) -> None:
    garbage = b"this is not an SQLite database, only some bytes\n" * 100
    items_path.write_bytes(garbage)

    await open_fails(items_path, ITEMS)

    assert items_path.read_bytes() == garbage


async def test_a_path_in_a_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    await open_fails(tmp_path / "missing" / "store.db", ITEMS)


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
DEFERRED = history(
    "deferred",
    (
        "CREATE TABLE parents (id INTEGER PRIMARY KEY)",
        "CREATE TABLE children (id INTEGER PRIMARY KEY, parent INTEGER NOT NULL"
        " REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
    ),
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
