"""The outbox's tables where a user's database holds them: in a PostgreSQL schema of
their own, and the same whether made at once or brought up through every release.

With `schema=NAME` (or `--schema NAME`) every table of the outbox is made in that
schema and named in it in every statement, whatever the search_path of the
connection: the outbox's own, and the caller's own connection, in whose transaction
`publish_in(..., schema=NAME)` writes an entry that the relay then reads. A
database given the newest schema at once (FRESH) and one brought there from the
first release's schema by every migration since have the same tables, columns,
indexes, constraints and sequences, on both backends (the previous release's own
databases are compared in test_schema_history, whose catalog reads are used here).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import orm
from support import placed, query
from test_schema_history import pg_tables, sqlite_tables

from plumbing.schema import VERSIONS_TABLE
from plumbing.storage import BadLocation, StorageError
from publisher import Outbox, accept_in, accept_in_async, publish_in, publish_in_async
from publisher.backends import postgres_sql, sqlite_sql
from publisher.cli import main

if TYPE_CHECKING:
    from conftest import PgSchemas

SCHEMA = "ob"
PAYMENT: dict[str, Any] = {
    "id": "pay-1",
    "type": "payment.captured",
    "key": "customer-9",
    "data": {"amount_cents": 1999},
}
REFUND: dict[str, Any] = {**PAYMENT, "id": "refund-1", "type": "payment.refunded"}
TABLES = {
    "outbox_orders",
    "outbox_entries",
    "outbox_quarantines",
    "outbox_health",
    "outbox_line_leases",
    "outbox_relay_workers",
    "outbox_source",
    "outbox_pruned",
}
SQLITE_ONLY = {"outbox_payloads"}  # large events kept apart (PostgreSQL's TOAST does it)
# The user's schema: tables of the user's own, one of them named as the outbox's
# entries are, with another shape.
USERS_SCHEMA = (
    "CREATE SCHEMA shop",
    "CREATE TABLE shop.orders (n INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
    "CREATE TABLE shop.outbox_entries (note TEXT PRIMARY KEY)",
    "INSERT INTO shop.outbox_entries (note) VALUES ('the user''s own')",
)


def execute(url: str, *statements: str) -> None:
    """Statements run through a connection of the test's own, each committed."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def in_search_path(url: str, schema: str) -> str:
    """`url` (no query of its own) with `schema` as its search_path."""
    return f"{url}?options=-csearch_path%3D{schema}"


def relations(url: str, schema: str) -> dict[str, str]:
    """Every table, index and sequence in `schema`: name -> kind (pg_class.relkind)."""
    rows = query(
        url,
        "SELECT relname, relkind::text FROM pg_class"
        " WHERE relnamespace = to_regnamespace(?) ORDER BY relname",
        (schema,),
    )
    return dict(rows)


# ---------------------------------------------------------------- PostgreSQL: schema=


async def test_the_tables_are_made_in_the_schema_named_and_nowhere_else(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url  # its search_path: public
    async with Outbox.open(f"{base}?schema={SCHEMA}") as outbox:
        assert await outbox.accept({"id": "o-1", "sku": "tea", "qty": 2}) == "accepted"
        await outbox.check_writable()
    made = relations(base, SCHEMA)
    tables = {name for name, kind in made.items() if kind == "r"}
    assert tables == TABLES | {VERSIONS_TABLE}
    assert all(name.startswith("outbox_") for name in made), made  # indexes, sequences too
    assert relations(base, "public") == {}
    assert query(base, f"SELECT id FROM {SCHEMA}.outbox_entries") == [("o-1",)]


async def test_publish_in_writes_into_the_schema_named_whatever_the_callers_search_path(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url
    execute(base, *USERS_SCHEMA)
    async with Outbox.open(f"{base}?schema={SCHEMA}") as outbox:
        with psycopg.connect(in_search_path(base, "shop")) as conn:  # the user's own
            conn.execute(b"INSERT INTO orders (n, total) VALUES (1, 1999)")
            assert publish_in(conn, PAYMENT, schema=SCHEMA) == "accepted"
            assert accept_in(conn, {"id": "o-1", "sku": "tea", "qty": 2}, schema=SCHEMA) == (
                "accepted"
            )
            assert publish_in(conn, PAYMENT, schema=SCHEMA) == "duplicate"
            conn.commit()
        async with await psycopg.AsyncConnection.connect(in_search_path(base, "shop")) as aconn:
            assert await publish_in_async(aconn, REFUND, schema=SCHEMA) == "accepted"
            order = {"id": "o-2", "sku": "cup", "qty": 1}
            assert await accept_in_async(aconn, order, schema=SCHEMA) == "accepted"
            await aconn.commit()

        # The relay reads them, in the order they committed.
        batch = await outbox.pending_batch(16)
        assert [row.event for row in batch] == [
            PAYMENT,
            placed("o-1", "tea", 2),
            REFUND,
            placed("o-2", "cup", 1),
        ]
    assert query(base, "SELECT n, total FROM shop.orders") == [(1, 1999)]
    assert query(base, "SELECT note FROM shop.outbox_entries") == [("the user's own",)]
    assert query(base, f"SELECT id FROM {SCHEMA}.outbox_orders ORDER BY id") == [
        ("o-1",),
        ("o-2",),
    ]


async def test_without_schema_publish_in_names_the_tables_its_search_path_finds(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url
    execute(base, *USERS_SCHEMA)
    async with Outbox.open(f"{base}?schema={SCHEMA}") as outbox:
        with psycopg.connect(in_search_path(base, "shop")) as conn:
            with pytest.raises(StorageError):  # the user's outbox_entries, not the outbox's
                publish_in(conn, PAYMENT)
            conn.rollback()
        assert await outbox.pending() == []
    assert query(base, "SELECT note FROM shop.outbox_entries") == [("the user's own",)]


async def test_publish_in_through_sqlalchemy_writes_into_the_schema_named(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url
    execute(base, *USERS_SCHEMA)
    url = in_search_path(base.replace("postgresql://", "postgresql+psycopg://", 1), "shop")
    engine = sa.create_engine(url)
    try:
        async with Outbox.open(f"{base}?schema={SCHEMA}") as outbox:
            with orm.Session(engine) as session, session.begin():
                session.execute(sa.text("INSERT INTO orders (n, total) VALUES (1, 1999)"))
                assert publish_in(session, PAYMENT, schema=SCHEMA) == "accepted"
            assert await outbox.pending() == [PAYMENT]
    finally:
        engine.dispose()
    assert query(base, "SELECT n FROM shop.orders") == [(1,)]


async def test_a_schema_that_is_not_a_plain_name_is_refused_by_publish_in(
    pg_schemas: PgSchemas,
) -> None:
    base = pg_schemas.database_url
    async with Outbox.open(f"{base}?schema={SCHEMA}"):
        with psycopg.connect(base) as conn:
            with pytest.raises(BadLocation, match="schema must be"):
                publish_in(conn, PAYMENT, schema='ob"; DROP TABLE x; --')
    assert query(base, f"SELECT count(*) FROM {SCHEMA}.outbox_entries") == [(0,)]


async def test_outboxes_in_two_schemas_of_one_database_are_apart(pg_schemas: PgSchemas) -> None:
    base = pg_schemas.database_url
    async with (
        Outbox.open(f"{base}?schema=ob") as one,
        Outbox.open(f"{base}?schema=ob2") as two,
        # Each relay lock is keyed by its own entries table: both are held at once.
        one.relay_lock("test"),
        two.relay_lock("test"),
    ):
        assert await one.accept({"id": "o-1", "sku": "tea", "qty": 2}) == "accepted"
        assert await two.accept({"id": "o-1", "sku": "tea", "qty": 3}) == "accepted"
        assert await one.pending() == [placed("o-1", "tea", 2)]
        assert await two.pending() == [placed("o-1", "tea", 3)]
        assert one.source != two.source


async def test_publish_in_refuses_a_schema_on_a_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "source.db"
    async with Outbox.open(db):
        pass
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(ValueError, match="a SQLite file has none"):
            publish_in(conn, PAYMENT, schema=SCHEMA)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with orm.Session(engine) as session, pytest.raises(ValueError, match="has none"):
            publish_in(session, PAYMENT, schema=SCHEMA)
        with engine.connect() as connection:
            with pytest.raises(ValueError, match="a SQLite file has none"):
                publish_in(connection, PAYMENT, schema=SCHEMA)
            assert not connection.in_transaction()  # refused before it was begun
    finally:
        engine.dispose()
    assert query(db, "SELECT count(*) FROM outbox_entries") == [(0,)]


# ---------------------------------------------------------------- the command line


@pytest.mark.usefixtures("like_a_child_process")
def test_the_schema_flag_names_the_schema_of_every_command(
    pg_schemas: PgSchemas, capsys: pytest.CaptureFixture[str]
) -> None:
    base = pg_schemas.database_url
    order = ["--id", "o-1", "--sku", "tea", "--qty", "2"]
    assert main(["accept", "--db", base, "--schema", SCHEMA, *order]) == 0
    assert main(["trace", "o-1", "--db", base, "--schema", SCHEMA]) == 0
    assert "o-1" in capsys.readouterr().out
    assert query(base, f"SELECT id FROM {SCHEMA}.outbox_entries") == [("o-1",)]
    assert relations(base, "public") == {}
    # The same schema in the URI too is no conflict; another one is.
    assert main(["status", "--db", f"{base}?schema={SCHEMA}", "--schema", SCHEMA]) == 0
    capsys.readouterr()
    assert main(["status", "--db", f"{base}?schema=other", "--schema", SCHEMA]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ" in err, err


@pytest.mark.usefixtures("like_a_child_process")
def test_the_schema_flag_on_a_sqlite_file_is_one_line_and_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "source.db"
    assert main(["status", "--db", str(db), "--schema", SCHEMA]) == 2
    err = capsys.readouterr().err
    assert (
        err == "outbox-publisher: --schema is for a PostgreSQL database; a SQLite file has none\n"
    )
    assert not db.exists()


# ---------------------------------------------------------------- fresh = the whole history


def sqlite_relations(path: Path) -> dict[str, tuple[str, str]]:
    """Every table and index of the file: name -> (type, its table)."""
    rows = query(path, "SELECT name, type, tbl_name FROM sqlite_master")
    return {name: (kind, table) for name, kind, table in rows}


async def test_a_sqlite_file_of_the_first_release_is_brought_to_the_fresh_schema(
    tmp_path: Path,
) -> None:
    replayed, fresh = tmp_path / "replayed.db", tmp_path / "fresh.db"
    conn = sqlite3.connect(replayed, isolation_level=None)  # as the first release left it
    try:
        conn.executescript(sqlite_sql.MIGRATIONS[0])
        conn.execute("PRAGMA user_version = 1")
    finally:
        conn.close()
    for path in (replayed, fresh):
        async with Outbox.open(path) as outbox:
            assert await outbox.accept({"id": "o-1", "sku": "tea", "qty": 2}) == "accepted"

    assert sqlite_relations(replayed) == sqlite_relations(fresh)
    assert sqlite_tables(replayed, "outbox_") == sqlite_tables(fresh, "outbox_")
    assert set(sqlite_tables(fresh, "outbox_")) == TABLES | SQLITE_ONLY
    assert query(replayed, "SELECT name FROM sqlite_sequence") == [("outbox_entries",)]
    assert query(replayed, "PRAGMA user_version") == [(len(sqlite_sql.MIGRATIONS),)]
    assert query(fresh, "PRAGMA user_version") == [(0,)]


@pytest.mark.parametrize("named", ["search_path", "schema"])
async def test_a_postgresql_schema_of_the_first_release_is_brought_to_the_fresh_schema(
    named: str, pg_schemas: PgSchemas
) -> None:
    base = pg_schemas.database_url
    with psycopg.connect(base, autocommit=True) as conn:  # as the first release left it
        conn.execute(b"CREATE SCHEMA replayed")
        conn.execute(b"CREATE SCHEMA fresh")
        conn.execute(b"SET search_path = replayed")
        conn.execute(postgres_sql.MIGRATIONS[0].encode())
        conn.execute(b"CREATE TABLE schema_versions (side TEXT PRIMARY KEY, version INT NOT NULL)")
        conn.execute(b"INSERT INTO schema_versions (side, version) VALUES ('publisher', 1)")
    for schema in ("replayed", "fresh"):
        url = in_search_path(base, schema) if named == "search_path" else f"{base}?schema={schema}"
        async with Outbox.open(url) as outbox:
            assert await outbox.accept({"id": "o-1", "sku": "tea", "qty": 2}) == "accepted"

    legacy = {"schema_versions", "schema_versions_pkey"}
    replayed = {k: v for k, v in relations(base, "replayed").items() if k not in legacy}
    assert replayed == relations(base, "fresh")
    assert all(name.startswith("outbox_") for name in replayed), replayed
    assert pg_tables(base, "replayed", "outbox_") == pg_tables(base, "fresh", "outbox_")
    assert query(base, "SELECT version FROM replayed.schema_versions") == [
        (len(postgres_sql.MIGRATIONS),)
    ]
    payload = query(base, "SELECT payload FROM replayed.outbox_entries")
    assert payload == query(base, "SELECT payload FROM fresh.outbox_entries")
