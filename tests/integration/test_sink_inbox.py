"""The SQLite inbox's own properties, and the factory that opens it from a location.

The behaviour every inbox backend shares (receive, duplicates, conflicts, batches,
predecessors, one transaction) is in tests/behaviour/test_inbox_store.py. Real files
and a real PostgreSQL server, checked through independent connections.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pg_faults import PgAccess

from plumbing.storage import BadLocation, StorageError
from sink import Inbox
from sink.backends import sqlite_sql
from sink.backends.sqlite import SqliteInbox

if TYPE_CHECKING:
    from conftest import Query

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}


async def test_database_is_in_wal_mode_seen_from_another_connection(
    sink_db: Path, db_rows: Query
) -> None:
    async with Inbox.open(sink_db) as inbox:
        await inbox.receive(dict(EVENT))
    assert db_rows(sink_db, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize("form", ["PATH", "sqlite:PATH", "sqlite:///PATH"])
async def test_a_path_or_a_sqlite_url_opens_the_sqlite_inbox_on_that_file(
    sink_db: Path, db_rows: Query, form: str
) -> None:
    location = form.replace("///PATH", f"//{sink_db}").replace("PATH", str(sink_db))

    async with Inbox.open(location) as inbox:
        assert isinstance(inbox, SqliteInbox)
        assert inbox.location == str(sink_db)
        await inbox.receive(dict(EVENT))

    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox") == [("order-1", 1)]


async def test_a_relative_sqlite_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_rows: Query
) -> None:
    monkeypatch.chdir(tmp_path)

    async with Inbox.open("sqlite:rel.db") as inbox:
        await inbox.receive(dict(EVENT))

    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == ["rel.db"]
    assert db_rows(tmp_path / "rel.db", "SELECT sku, qty FROM inventory") == [("snack", 7)]


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_a_postgresql_uri_opens_the_postgresql_inbox_on_that_database(
    pg_database: str, scheme: str
) -> None:
    from sink.backends.postgres import PostgresInbox

    location = pg_database.replace("postgresql://", f"{scheme}://", 1)

    async with Inbox.open(location) as inbox:
        assert isinstance(inbox, PostgresInbox)
        assert inbox.location == location
        await inbox.receive(dict(EVENT))

    database = PgAccess(pg_database, "inbox_health")
    assert database.query("SELECT id, deliveries FROM inbox") == [("order-1", 1)]
    assert database.query("SELECT sku, qty FROM inventory") == [("snack", 7)]


@pytest.mark.parametrize(
    "location",
    [
        "ftp://h/x",
        "mysql://u@h/db",
        "postgresql://u@h/db?no_such_parameter=1",
        "postgresql://u@h/db?pool_max=0",
    ],
)
def test_a_location_no_backend_opens_is_refused_by_the_call_itself(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(BadLocation) as refused:
        Inbox.open(location)  # not awaited: refused before anything is opened

    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


async def test_a_server_that_cannot_be_reached_is_a_storage_error_of_one_line(
    closed_port: int,
) -> None:
    opening = Inbox.open(f"postgresql://outbox@127.0.0.1:{closed_port}/sink")

    with pytest.raises(StorageError) as failed:
        await opening

    message = str(failed.value)
    assert message.startswith(f"postgresql://outbox@127.0.0.1:{closed_port}/sink: cannot connect")
    assert "\n" not in message


async def test_an_older_file_gets_applied_seq_in_the_order_its_rows_were_recorded(
    sink_db: Path, db_rows: Query
) -> None:
    # A file as the release before applied_seq left it: schema version 2, three rows.
    conn = sqlite3.connect(sink_db, isolation_level=None)
    for script in sqlite_sql.MIGRATIONS[:2]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version = 2")
    for event_id in ("c", "a", "b"):
        conn.execute(
            "INSERT INTO inbox (id, payload, received_at, last_delivery_at) VALUES (?, '{}', 0, 0)",
            (event_id,),
        )
    conn.close()

    async with Inbox.open(sink_db) as inbox:
        await inbox.receive(dict(EVENT))
        record = await inbox.record("order-1")

    assert db_rows(sink_db, "SELECT id, applied_seq FROM inbox ORDER BY applied_seq") == [
        ("c", 1),
        ("a", 2),
        ("b", 3),
        ("order-1", 4),
    ]
    assert record is not None and record.applied_seq == 4
