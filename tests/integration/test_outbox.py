"""The SQLite outbox: its file, journal, locks and schema, and which locations open it
(a PostgreSQL URL opens the PostgreSQL outbox).

What every outbox backend must do is in tests/behaviour/test_outbox_store.py; this
module holds what is SQLite's own, checked through independent sqlite3 connections.
"""

from __future__ import annotations

import sqlite3
from functools import partial
from pathlib import Path

import pytest
from support import event, placed, query

from plumbing.schema import VERSIONS_TABLE
from plumbing.storage import BadLocation, StorageError
from publisher.backends import sqlite_sql as outbox_sql
from publisher.backends.sqlite import SqliteOutbox
from publisher.store import Outbox, State
from shared import Conflict, Order
from shared.event import previous_canonical


def execute(db: Path, *statements: str) -> None:
    """Run statements through a fresh autocommit connection."""
    conn = sqlite3.connect(db, timeout=5, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def count(db: Path, table: str) -> int:
    n: int = query(db, f"SELECT count(*) FROM {table}")[0][0]
    return n


def wal_file(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


order = partial(event, qty=7)  # the orders of these tests: qty 7 unless said


def files_under(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


# ---------------------------------------------------------------- opening


async def test_open_creates_orders_and_outbox_tables(outbox: Outbox, db: Path) -> None:
    names = {r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"outbox_orders", "outbox_entries", VERSIONS_TABLE} <= names
    # No table of an earlier release's name, nor the sink's.
    assert not {"orders", "outbox", "quarantines", "health", "inbox_events"} & names
    columns = {r[1] for r in query(db, "PRAGMA table_info(outbox_entries)")}
    assert {"seq", "id", "payload", "sent"} <= columns
    # The version is a row of the outbox's own; the file's user_version is left alone.
    assert query(db, f"SELECT side, version FROM {VERSIONS_TABLE}") == [
        ("publisher", len(outbox_sql.MIGRATIONS))
    ]
    assert query(db, "PRAGMA user_version") == [(0,)]


async def test_outbox_seq_is_declared_autoincrement(outbox: Outbox, db: Path) -> None:
    # What keeps a deleted entry's seq from being given again (the behaviour suite
    # checks that it is not).
    (ddl,) = query(db, "SELECT sql FROM sqlite_master WHERE name = 'outbox_entries'")[0]
    assert "AUTOINCREMENT" in ddl.upper()


async def test_open_uses_wal_journal_mode(outbox: Outbox, db: Path) -> None:
    assert query(db, "PRAGMA journal_mode") == [("wal",)]


async def test_open_sets_synchronous_full_on_its_connection(outbox: SqliteOutbox) -> None:
    synchronous = await outbox._db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert synchronous == 2  # FULL


async def test_await_open_returns_an_outbox(db: Path) -> None:
    outbox = await Outbox.open(db)
    try:
        assert isinstance(outbox, SqliteOutbox)
        assert await outbox.accept(order("a")) == "accepted"
        assert outbox.path == str(db)
    finally:
        await outbox.close()
    assert count(db, "outbox_orders") == 1


async def test_async_with_open_closes_on_exit(db: Path) -> None:
    async with Outbox.open(db) as outbox:
        assert isinstance(outbox, Outbox)
        await outbox.accept(order("a"))
        assert wal_file(db).exists()
    # The last connection to close checkpoints the WAL and deletes it.
    assert not wal_file(db).exists()
    assert count(db, "outbox_entries") == 1


async def test_opening_a_file_that_is_not_a_database_is_a_storage_error(db: Path) -> None:
    db.write_bytes(b"garbage, not SQLite\n" * 200)
    try:
        outbox = await Outbox.open(db)
    except StorageError:
        return
    await outbox.close()
    pytest.fail("a garbage file opened as an outbox")


# ---------------------------------------------------------------- which file a location names


@pytest.mark.parametrize(
    ("location", "where"),
    [
        ("source.db", "cwd"),
        ("sqlite:source.db", "cwd"),
        ("{data}/source.db", "data"),
        ("sqlite:{data}/source.db", "data"),
        ("sqlite://{data}/source.db", "data"),  # sqlite:///abs/path
    ],
    ids=["path", "sqlite:rel", "abs-path", "sqlite:/abs", "sqlite:///abs"],
)
async def test_a_path_or_a_sqlite_url_opens_that_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str, where: str
) -> None:
    dirs = {"cwd": tmp_path / "cwd", "data": tmp_path / "data"}
    for directory in dirs.values():
        directory.mkdir()
    monkeypatch.chdir(dirs["cwd"])

    async with Outbox.open(location.format(data=dirs["data"])) as outbox:
        assert isinstance(outbox, SqliteOutbox)
        assert await outbox.accept(order("a")) == "accepted"

    expected = dirs[where] / "source.db"
    assert files_under(tmp_path) == [expected.relative_to(tmp_path)]
    assert query(expected, "SELECT id FROM outbox_orders") == [("a",)]


@pytest.mark.parametrize(
    "location",
    [
        "postgresql://app:secret@127.0.0.1:5432/outbox?prepare=maybe",
        "postgres://app:secret@127.0.0.1/outbox?no_such_parameter=1",
        "postgresql://app:secret@[127.0.0.1/outbox",
        "mysql://app:secret@localhost/outbox",
        "sqlite://host/source.db",
        "sqlite:",
        "",
    ],
)
async def test_a_location_no_backend_here_opens_is_refused_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(BadLocation) as excinfo:
        async with Outbox.open(location):
            pytest.fail(f"{location!r} opened")
    with pytest.raises(BadLocation):
        await Outbox.open(location)

    assert "secret" not in str(excinfo.value)  # a refused URL is not echoed with its password
    assert files_under(tmp_path) == []


async def test_a_postgresql_url_opens_that_database(pg_database: str) -> None:
    from publisher.backends.postgres import PostgresOutbox

    async with Outbox.open(pg_database) as outbox:
        assert isinstance(outbox, PostgresOutbox)
        assert await outbox.accept(order("a")) == "accepted"
    async with Outbox.open(pg_database.replace("postgresql://", "postgres://", 1)) as outbox:
        assert [e["id"] for e in await outbox.pending()] == ["a"]


async def test_an_unreachable_postgresql_server_is_a_storage_error_without_the_password(
    closed_port: int,
) -> None:
    location = f"postgresql://app:secret@127.0.0.1:{closed_port}/outbox"
    opening = Outbox.open(location)  # a well-formed URI: nothing is refused yet
    with pytest.raises(StorageError, match="cannot connect") as excinfo:
        await opening
    assert "secret" not in str(excinfo.value)
    assert str(excinfo.value).count("\n") == 0


# ---------------------------------------------------------------- locks


async def test_failed_intake_leaves_no_lock_behind(outbox: Outbox, db: Path) -> None:
    execute(
        db,
        "CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox_entries"
        " BEGIN SELECT RAISE(ABORT, 'boom'); END",
    )
    with pytest.raises(StorageError):
        await outbox.accept(order("a"))
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO outbox_orders (id, sku, qty, accepted_at) VALUES ('x', 's', 1, 0)"
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert query(db, "SELECT id FROM outbox_orders") == [("x",)]


async def test_pending_leaves_no_lock_or_snapshot_behind(outbox: Outbox, db: Path) -> None:
    for event_id in ["a", "b"]:
        await outbox.accept(order(event_id))
    assert len(await outbox.pending()) == 2
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.close()
    assert busy == 0


# ---------------------------------------------------------------- a file written before lanes

OLD_ROWS = [("old-1", "snack", 2, 1), ("old-2", "juice", 3, 0), ("old-3", "snack", 5, 0)]


def write_before_lanes(db: Path) -> None:
    """A file as the release before lanes left it: migration 1 only, no lane column,
    payloads in that release's canonical form of an order, old-1 sent and pruned since
    (its order row kept)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.executescript(outbox_sql.MIGRATIONS[0])
        conn.execute("PRAGMA user_version = 1")
        for event_id, sku, qty, sent in OLD_ROWS:
            conn.execute("INSERT INTO orders VALUES (?, ?, ?, 1.0)", (event_id, sku, qty))
            conn.execute(
                "INSERT INTO outbox (id, payload, queued_at, sent) VALUES (?, ?, 1.0, ?)",
                (event_id, previous_canonical(Order(id=event_id, sku=sku, qty=qty)), sent),
            )
        conn.execute("DELETE FROM outbox WHERE sent = 1")
    finally:
        conn.close()


async def test_entries_written_before_lanes_come_back_with_their_lane_and_are_judged_as_new_ones(
    db: Path,
) -> None:
    write_before_lanes(db)
    async with Outbox.open(db) as outbox:
        # Its version now a row of the outbox's own; the user_version that release
        # read raised too, so that it refuses the file.
        newest = len(outbox_sql.MIGRATIONS)
        assert query(db, f"SELECT side, version FROM {VERSIONS_TABLE}") == [("publisher", newest)]
        assert query(db, "PRAGMA user_version") == [(newest,)]
        names = {r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not {"orders", "outbox", "quarantines", "health"} & names
        pending = await outbox.pending_batch(16)
        assert [(row.event, row.lane) for row in pending] == [
            (placed("old-2", "juice", 3), "juice"),
            (placed("old-3", "snack", 5), "snack"),
        ]
        assert [row.lane for row in await outbox.pending_batch(16, "snack")] == ["snack"]
        listed = await outbox.entries(State.PENDING)
        assert [(e.id, e.lane) for e in listed] == [("old-2", "juice"), ("old-3", "snack")]
        # Their duplicates and conflicts, old-1's too though its entry was pruned.
        assert await outbox.accept(order("old-3", "snack", qty=5)) == "duplicate"
        assert await outbox.accept(order("old-1", "snack", qty=2)) == "duplicate"
        for changed in (order("old-3", "snack", qty=6), order("old-1", "tea", qty=2)):
            with pytest.raises(Conflict):
                await outbox.accept(changed)
    assert count(db, "outbox_entries") == 2
