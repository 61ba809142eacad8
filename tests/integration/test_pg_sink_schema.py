"""The PostgreSQL inbox's schema: versioned migrations applied once (also by sinks
starting together), a newer schema refused with one line, a schema of its own
through the URI, and the probe row another connection sees updated. The session's
throwaway server; rows read through connections of the test's own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from pg_faults import PgAccess
from support import in_progress
from test_sink_inbox import FIXTURES, check_the_previous_release_upgraded

from plumbing.schema import VERSIONS_TABLE
from plumbing.storage import StorageError, with_schema
from shared import Receipt, order_event
from sink import HandledEvent, HandlerFailed, Handlers, Inbox, Statement
from sink.backends import postgres_sql
from sink.cli import main as sink_main
from sink.store import Incoming

if TYPE_CHECKING:
    from conftest import PgSchemas, Query

EVENT = order_event({"id": "order-1", "sku": "snack", "qty": 7})


def version(inbox_database: PgAccess) -> list[tuple[object, ...]]:
    return inbox_database.query(f"SELECT side, version FROM {VERSIONS_TABLE} WHERE side = 'sink'")


def legacy_versions_table(inbox_database: PgAccess) -> list[tuple[object, ...]]:
    """Where releases before VERSIONS_TABLE kept the version, if anywhere."""
    return inbox_database.query("SELECT to_regclass('schema_versions') IS NOT NULL")


async def test_sinks_opening_together_migrate_the_schema_once(
    pg_database: str, inbox_database: PgAccess
) -> None:
    inboxes = await asyncio.gather(*(Inbox.open(pg_database) for _ in range(4)))
    try:
        assert await inboxes[0].receive(dict(EVENT)) is Receipt.APPLIED
        assert await inboxes[3].receive(dict(EVENT)) is Receipt.DUPLICATE
    finally:
        for inbox in inboxes:
            await inbox.close()

    assert version(inbox_database) == [("sink", len(postgres_sql.MIGRATIONS))]
    assert legacy_versions_table(inbox_database) == [(False,)]  # no earlier release's table
    assert inbox_database.query("SELECT id, at FROM inbox_health") == [(1, 0.0)]


async def test_a_newer_schema_is_refused_with_one_line(
    pg_database: str, inbox_database: PgAccess
) -> None:
    async with Inbox.open(pg_database):
        pass
    inbox_database.execute(f"UPDATE {VERSIONS_TABLE} SET version = 99 WHERE side = 'sink'")

    with pytest.raises(StorageError) as refused:
        await Inbox.open(pg_database)

    assert "newer" in str(refused.value) and "\n" not in str(refused.value)


async def test_the_probe_commits_a_write_that_another_connection_sees(
    pg_database: str, inbox_database: PgAccess
) -> None:
    async with Inbox.open(pg_database) as inbox:
        await inbox.check_writable()
        [(first,)] = inbox_database.query("SELECT at FROM inbox_health")
        await inbox.check_writable()
        [(second,)] = inbox_database.query("SELECT at FROM inbox_health")

    assert 0 < first <= second  # one row, updated in place
    assert inbox_database.query("SELECT count(*) FROM inbox_health") == [(1,)]


async def test_a_search_path_in_the_uri_puts_the_tables_in_that_schema(
    pg_schemas: PgSchemas, inbox_database: PgAccess
) -> None:
    # The database's own URI (pg_database's sets a search_path of its own); the
    # schema is dropped with the test's.
    inbox_database.execute("CREATE SCHEMA warehouse")
    location = f"{pg_schemas.database_url}?options=-csearch_path%3Dwarehouse"

    async with Inbox.open(location) as inbox:
        assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED

    tables = inbox_database.query(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_name IN ('inbox_events', 'inbox_inventory', 'inbox_health',"
        " 'outbox_relay_versions', 'inbox', 'inventory', 'schema_versions')"
        " ORDER BY table_name"
    )
    assert tables == [
        ("warehouse", "inbox_events"),
        ("warehouse", "inbox_health"),
        ("warehouse", "inbox_inventory"),
        ("warehouse", VERSIONS_TABLE),
    ]
    assert inbox_database.query("SELECT id FROM warehouse.inbox_events") == [("order-1",)]


async def test_a_schema_named_holds_every_table_whatever_the_search_path(
    pg_schemas: PgSchemas, inbox_database: PgAccess
) -> None:
    # Its connections' search_path names a schema holding a user's own tables called
    # inbox_events and inbox_inventory: every statement of the inbox names its own.
    inbox_database.execute(
        "CREATE SCHEMA shop",
        "CREATE TABLE shop.inbox_events (note TEXT)",
        "CREATE TABLE shop.inbox_inventory (note TEXT)",
    )
    location = f"{pg_schemas.database_url}?options=-csearch_path%3Dshop&schema=warehouse"

    async with Inbox.open(location) as inbox:
        assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
        assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE
        assert await inbox.inventory("snack") == 7
        await inbox.check_writable()

    assert inbox_database.query("SELECT id FROM warehouse.inbox_events") == [("order-1",)]
    assert inbox_database.query("SELECT qty FROM warehouse.inbox_inventory") == [(7,)]
    assert inbox_database.query("SELECT count(*) FROM shop.inbox_events") == [(0,)]
    assert inbox_database.query("SELECT count(*) FROM shop.inbox_inventory") == [(0,)]


def test_the_schema_flag_of_the_sink_is_applied_or_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert with_schema("postgresql://h/db", "warehouse") == "postgresql://h/db?schema=warehouse"
    assert sink_main(["--db", str(tmp_path / "sink.db"), "--schema", "warehouse"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "outbox-sink: --schema is for a PostgreSQL database; a SQLite file has none\n",
    )
    assert sink_main(["--db", "postgresql://h/db", "--schema", "1x"]) == 2
    assert "schema must be" in capsys.readouterr().err


async def test_a_schema_of_the_previous_release_holds_its_orders_as_order_placed_events(
    pg_schemas: PgSchemas, db_rows: Query
) -> None:
    # Both sides as the previous release wrote them, in the schema `release` (dropped
    # with the test's schemas).
    with psycopg.connect(pg_schemas.database_url, autocommit=True) as conn:
        conn.execute((FIXTURES / "postgres.sql").read_bytes())
    location = f"{pg_schemas.database_url}?options=-csearch_path%3Drelease"

    await check_the_previous_release_upgraded(location, db_rows)

    # Its version is now a row of VERSIONS_TABLE; the previous release's marker is
    # raised to it too, so that that release refuses the upgraded tables.
    newest = len(postgres_sql.MIGRATIONS)
    versions = f"SELECT side, version FROM {VERSIONS_TABLE} ORDER BY side"
    assert db_rows(location, versions) == [("sink", newest)]
    legacy = "SELECT side, version FROM schema_versions WHERE side = 'sink'"
    assert db_rows(location, legacy) == [("sink", newest)]
    tables = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'release'"
    assert not {"inbox", "inventory", "lease_fences"} & {
        name for (name,) in db_rows(location, tables)
    }


async def test_handlers_run_with_the_inbox_schema_first_and_their_sql_is_left_as_written(
    pg_schemas: PgSchemas, inbox_database: PgAccess
) -> None:
    # A user's table named like a table of an earlier release of the inbox, a column
    # named `inventory`, and a literal naming the inbox: none of them is rewritten.
    handlers = Handlers("shop")
    handlers.schema("CREATE TABLE stock (sku TEXT PRIMARY KEY, inventory INTEGER NOT NULL)")

    @handlers.on("order.placed")
    def placed(event: HandledEvent) -> list[Statement]:
        data = event.data
        return [
            (
                "INSERT INTO stock (sku, inventory) VALUES (:sku, :qty)"
                " ON CONFLICT (sku) DO UPDATE SET inventory = stock.inventory + excluded.inventory",
                {"sku": data["sku"], "qty": data["qty"]},
            ),
            ("INSERT INTO inbox_inventory (sku, qty) VALUES ('note: inbox', 0)", {}),
        ]

    for schema in ("north", "south"):  # one registry, two inboxes, each its own tables
        location = f"{pg_schemas.database_url}?schema={schema}"
        async with Inbox.open(location, handlers) as inbox:
            assert await inbox.receive(dict(EVENT)) is Receipt.APPLIED
            assert await inbox.receive(dict(EVENT)) is Receipt.DUPLICATE

    for schema in ("north", "south"):
        assert inbox_database.query(f"SELECT sku, inventory FROM {schema}.stock") == [("snack", 7)]
        assert inbox_database.query(f"SELECT sku FROM {schema}.inbox_inventory") == [
            ("note: inbox",)
        ]
        assert inbox_database.query(
            f"SELECT version FROM {schema}.{VERSIONS_TABLE} WHERE side = 'handlers:shop'"
        ) == [(1,)]


async def test_a_deferred_constraint_a_handler_breaks_fails_its_event_alone(
    pg_database: str, inbox_database: PgAccess
) -> None:
    handlers = Handlers("deferred")
    handlers.schema(
        "CREATE TABLE customers (id TEXT PRIMARY KEY)",
        "INSERT INTO customers (id) VALUES ('known')",
        "CREATE TABLE payments (id TEXT PRIMARY KEY, customer TEXT NOT NULL"
        " REFERENCES customers (id) DEFERRABLE INITIALLY DEFERRED)",
    )

    @handlers.on("paid")
    def paid(event: HandledEvent) -> list[Statement]:
        customer = event.data["customer"]
        return [
            (
                "INSERT INTO payments (id, customer) VALUES (:id, :c)",
                {"id": event.id, "c": customer},
            )
        ]

    def pay(event_id: str, customer: str = "known") -> Incoming:
        return Incoming.checked({"id": event_id, "type": "paid", "data": {"customer": customer}})

    calls = [[pay("a")], [pay("b1"), pay("b2", "nobody"), pay("b3")]]
    async with Inbox.open(pg_database, handlers) as inbox:
        with in_progress(inbox, len(calls)):
            got = await asyncio.gather(*(inbox.receive_batch(call) for call in calls))

    assert [len(one.received) for one in got] == [1, 1]
    assert got[0].stopped is None
    assert isinstance(got[1].stopped, HandlerFailed) and got[1].stopped.event_id == "b2"
    assert inbox_database.query("SELECT id FROM payments ORDER BY id") == [("a",), ("b1",)]
    assert inbox_database.query("SELECT id FROM inbox_events ORDER BY id") == [("a",), ("b1",)]
