"""The SQLite inbox's own properties, the factory that opens it from a location, and
a file of the previous release brought up to date.

The behaviour every inbox backend shares (receive, duplicates, conflicts, batches,
predecessors, one transaction) is in tests/behaviour/test_inbox_store.py. Real files
and a real PostgreSQL server, checked through independent connections.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pg_faults import PgAccess

from plumbing.storage import BadLocation, StorageError
from shared import Conflict, Order, Receipt, digest_of, order_canonical, order_event
from shared.event import previous_canonical
from sink import Inbox
from sink.backends import sqlite_sql
from sink.backends.sqlite import SqliteInbox
from sink.store import Incoming

if TYPE_CHECKING:
    from conftest import Query

EVENT = order_event({"id": "order-1", "sku": "snack", "qty": 7})
FIXTURES = Path(__file__).parents[1] / "fixtures" / "previous_release"
# What the previous release's sink applied in the fixtures, in that order (see
# make_fixtures.py there), and the inventory it left.
PREVIOUS: list[Order] = [
    {"id": "o-1", "sku": "snack", "qty": 1},
    {"id": "o-2", "sku": "juice", "qty": 2},
    {"id": "o-4", "sku": "snack", "qty": 4},
]
PREVIOUS_STOCK = {"snack": 5, "juice": 2}


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

    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]


async def test_a_relative_sqlite_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_rows: Query
) -> None:
    monkeypatch.chdir(tmp_path)

    async with Inbox.open("sqlite:rel.db") as inbox:
        await inbox.receive(dict(EVENT))

    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == ["rel.db"]
    assert db_rows(tmp_path / "rel.db", "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


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
    assert database.query("SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert database.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]


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
        order: Order = {"id": event_id, "sku": "snack", "qty": 1}
        conn.execute(
            # The release's own table name: the upgrade renames it.
            "INSERT INTO inbox (id, payload, received_at, last_delivery_at) VALUES (?, ?, 0, 0)",
            (event_id, previous_canonical(order)),
        )
    conn.close()

    async with Inbox.open(sink_db) as inbox:
        await inbox.receive(dict(EVENT))
        record = await inbox.record("order-1")

    assert db_rows(sink_db, "SELECT id, applied_seq FROM inbox_events ORDER BY applied_seq") == [
        ("c", 1),
        ("a", 2),
        ("b", 3),
        ("order-1", 4),
    ]
    assert record is not None and record.applied_seq == 4


# ---------------------------------------------------------------- a file of the previous release


async def check_the_previous_release_upgraded(location: str, db_rows: Query) -> None:
    """Open the inbox the previous release wrote at `location` with this release: its
    orders are the order.placed events they record, in canonical form, with their
    type; the stock is as it was; each is a duplicate (no second effect) as the event
    a publisher of this release sends and as the order one of the previous release
    sends, and a conflict when changed. Shared with the PostgreSQL test."""
    async with Inbox.open(location) as inbox:
        for order in PREVIOUS:
            record = await inbox.record(order["id"])
            assert record is not None
            assert (record.event, record.deliveries) == (order_event(order), 1)
            assert record.digest == digest_of(order_canonical(order))
        rows = "SELECT id, type, payload FROM inbox_events ORDER BY applied_seq"
        assert db_rows(location, rows) == [
            (order["id"], "order.placed", order_canonical(order)) for order in PREVIOUS
        ]
        assert dict(db_rows(location, "SELECT sku, qty FROM inbox_inventory")) == PREVIOUS_STOCK

        as_event = Incoming.checked(order_event(PREVIOUS[2]))
        assert (await inbox.receive_with_digest(as_event)).receipt is Receipt.DUPLICATE
        as_order = Incoming.of_order(PREVIOUS[1])
        assert (await inbox.receive_with_digest(as_order)).receipt is Receipt.DUPLICATE
        with pytest.raises(Conflict):
            await inbox.receive_with_digest(Incoming.of_order({**PREVIOUS[0], "qty": 2}))
        assert await inbox.receive(EVENT) is Receipt.APPLIED

    deliveries = dict(db_rows(location, "SELECT id, deliveries FROM inbox_events"))
    assert deliveries == {"o-1": 1, "o-2": 2, "o-4": 2, "order-1": 1}
    assert dict(db_rows(location, "SELECT sku, qty FROM inbox_inventory")) == {
        "snack": 12,
        "juice": 2,
    }


async def test_a_file_of_the_previous_release_holds_its_orders_as_order_placed_events(
    sink_db: Path, db_rows: Query
) -> None:
    shutil.copyfile(FIXTURES / "sink.sqlite", sink_db)

    await check_the_previous_release_upgraded(str(sink_db), db_rows)

    assert db_rows(sink_db, "PRAGMA user_version") == [(len(sqlite_sql.MIGRATIONS),)]
