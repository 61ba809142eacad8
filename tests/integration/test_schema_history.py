"""Both roads to the newest schema lead to the same tables.

A database with none of a side's tables is given the newest schema at once (each
backend's FRESH); a database written by the previous release is brought there by
the migrations after its version. Here the previous release's own databases
(tests/fixtures/previous_release) are upgraded and compared, table by table, with
fresh ones: the columns (name, type, NOT NULL, default), the indexes and the
constraints, read from each database's catalog, on both backends and both sides.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from plumbing.schema import VERSIONS_TABLE
from publisher import Outbox
from sink import Inbox

if TYPE_CHECKING:
    from conftest import PgSchemas

FIXTURES = Path(__file__).parents[1] / "fixtures" / "previous_release"
Opener = Callable[[str], Awaitable[None]]


async def open_outbox(location: str) -> None:
    async with Outbox.open(location):
        pass


async def open_inbox(location: str) -> None:
    async with Inbox.open(location):
        pass


SIDES: dict[str, tuple[str, str, Opener]] = {
    # side: (its SQLite fixture, its tables' prefix, how it is opened)
    "publisher": ("source.sqlite", "outbox_", open_outbox),
    "sink": ("sink.sqlite", "inbox_", open_inbox),
}


def sqlite_tables(path: Path, prefix: str) -> dict[str, Any]:
    """Each table of the side (named with `prefix`) as SQLite describes it."""
    conn = sqlite3.connect(path)
    try:
        names = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
            if name.startswith(prefix) and name != VERSIONS_TABLE
        ]
        described: dict[str, Any] = {}
        for name in names:
            columns = sorted(
                (c[1], c[2].upper(), c[3], c[4], c[5])
                for c in conn.execute(f"PRAGMA table_xinfo({name})")
            )
            indexes = sorted(
                (
                    i[1],
                    i[2],
                    i[4],
                    tuple(c[2] for c in conn.execute(f"PRAGMA index_info({i[1]})")),
                )
                for i in conn.execute(f"PRAGMA index_list({name})")
                if not i[1].startswith("sqlite_autoindex")
            )
            (sql,) = conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = ?", (name,)
            ).fetchone()
            checks = sorted(
                re.sub(r"\s+", " ", check) for check in re.findall(r"CHECK \(.*?\)\)?", sql)
            )
            described[name] = (columns, indexes, checks, "WITHOUT ROWID" in sql)
        return described
    finally:
        conn.close()


_PG_COLUMNS = """
    SELECT table_name, column_name, data_type, is_nullable,
           regexp_replace(coalesce(column_default, ''), '"?[a-z0-9_]+"?\\.', '', 'g'),
           is_identity
    FROM information_schema.columns WHERE table_schema = %s AND table_name LIKE %s
    ORDER BY table_name, column_name
"""
_PG_INDEXES = """
    SELECT tablename, indexname,
           regexp_replace(indexdef, ' ON "?[a-z0-9_]+"?\\.', ' ON ')
    FROM pg_indexes WHERE schemaname = %s AND tablename LIKE %s ORDER BY indexname
"""
_PG_CONSTRAINTS = """
    SELECT t.relname, c.conname, c.contype, pg_get_constraintdef(c.oid)
    FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid
    JOIN pg_namespace AS n ON n.oid = t.relnamespace
    WHERE n.nspname = %s AND t.relname LIKE %s ORDER BY t.relname, c.conname
"""


def pg_tables(url: str, schema: str, prefix: str) -> list[list[tuple[Any, ...]]]:
    """The side's tables (named with `prefix`) in `schema`, as the catalog describes
    them, the schema's name left out."""
    like = prefix.replace("_", "\\_") + "%"
    with psycopg.connect(url, autocommit=True) as conn:
        return [
            [
                row
                for row in conn.execute(query.encode(), (schema, like)).fetchall()
                if row[0] != VERSIONS_TABLE
            ]
            for query in (_PG_COLUMNS, _PG_INDEXES, _PG_CONSTRAINTS)
        ]


@pytest.mark.parametrize("side", list(SIDES))
async def test_an_upgraded_sqlite_file_has_the_tables_of_a_fresh_one(
    side: str, tmp_path: Path
) -> None:
    fixture, prefix, open_side = SIDES[side]
    upgraded, fresh = tmp_path / "upgraded.db", tmp_path / "fresh.db"
    shutil.copyfile(FIXTURES / fixture, upgraded)
    await open_side(str(upgraded))
    await open_side(str(fresh))
    assert sqlite_tables(upgraded, prefix), "the side's tables are named with its prefix"
    assert sqlite_tables(upgraded, prefix) == sqlite_tables(fresh, prefix)


@pytest.mark.parametrize("named", ["search_path", "schema"])
@pytest.mark.parametrize("side", list(SIDES))
async def test_an_upgraded_postgresql_schema_has_the_tables_of_a_fresh_one(
    side: str, named: str, pg_schemas: PgSchemas
) -> None:
    # The previous release's dump makes its tables in schema `release`; this release
    # finds them by the search_path, or by the schema it names in every statement.
    _, prefix, open_side = SIDES[side]
    base = pg_schemas.database_url
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute((FIXTURES / "postgres.sql").read_bytes())
        if named == "search_path":
            conn.execute(b"CREATE SCHEMA fresh_one")
    if named == "search_path":
        await open_side(f"{base}?options=-csearch_path%3Drelease")
        await open_side(f"{base}?options=-csearch_path%3Dfresh_one")
    else:
        await open_side(f"{base}?schema=release")
        await open_side(f"{base}?schema=fresh_one")
    upgraded = pg_tables(base, "release", prefix)
    assert upgraded[0], "the side's tables are named with its prefix"
    assert upgraded == pg_tables(base, "fresh_one", prefix)
