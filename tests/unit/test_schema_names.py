"""Table names written in a schema (pg_tx.names), and --schema applied to a --db value
(plumbing.storage.with_schema)."""

from __future__ import annotations

import pytest

from pg_tx import parse, qualifier
from plumbing.storage import BadLocation, with_schema

TABLES = {"outbox_entries", "outbox", "inbox_raced", "inbox_applied_seq"}


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SELECT seq FROM outbox_entries AS e", 'SELECT seq FROM "ob".outbox_entries AS e'),
        ("SELECT 'outbox_entries'::regclass", "SELECT '\"ob\".outbox_entries'::regclass"),
        ("UPDATE outbox SET sent = 1", 'UPDATE "ob".outbox SET sent = 1'),
        (
            "ALTER TABLE outbox RENAME TO outbox_entries",
            'ALTER TABLE "ob".outbox RENAME TO outbox_entries',
        ),
        ("SELECT inbox_raced()", 'SELECT "ob".inbox_raced()'),
        ("DEFAULT nextval('inbox_applied_seq')", "DEFAULT nextval('\"ob\".inbox_applied_seq')"),
        # Not a table of ours: longer names, columns, names already qualified.
        (
            "CREATE INDEX outbox_pending ON outbox_entries (seq)",
            'CREATE INDEX outbox_pending ON "ob".outbox_entries (seq)',
        ),
        ("SELECT e.outbox FROM x AS e", "SELECT e.outbox FROM x AS e"),
        ("SELECT 1 FROM other.outbox_entries", "SELECT 1 FROM other.outbox_entries"),
        ('SELECT 1 FROM "outbox_entries"', 'SELECT 1 FROM "outbox_entries"'),
        ("SELECT outbox_entries_pkey", "SELECT outbox_entries_pkey"),
    ],
)
def test_each_table_of_ours_is_named_in_the_schema(statement: str, expected: str) -> None:
    assert qualifier("ob", TABLES)(statement) == expected


def test_without_a_schema_statements_are_left_as_written() -> None:
    statement = "SELECT seq FROM outbox_entries"
    assert qualifier(None, TABLES)(statement) is statement


@pytest.mark.parametrize("name", ["1st", "a-b", 'a"b', "", "x" * 64, "a.b", "ob;DROP"])
def test_a_schema_that_is_not_a_plain_name_is_refused(name: str) -> None:
    with pytest.raises(BadLocation, match="schema must be"):
        qualifier(name, TABLES)
    with pytest.raises(BadLocation, match="schema must be"):
        parse(f"postgresql://h/db?schema={name}")


def test_schema_flag_is_added_to_a_postgresql_uri() -> None:
    assert with_schema("postgresql://h/db", "ob") == "postgresql://h/db?schema=ob"
    assert with_schema("postgresql://h/db?sslmode=disable", "ob") == (
        "postgresql://h/db?sslmode=disable&schema=ob"
    )
    assert with_schema("postgresql://h/db?schema=ob", "ob") == "postgresql://h/db?schema=ob"
    assert with_schema("source.db", None) == "source.db"
    assert parse("postgresql://h/db?schema=ob").schema == "ob"
    assert parse("postgresql://h/db").schema is None
    assert "schema" not in parse("postgresql://h/db?schema=ob").conninfo


@pytest.mark.parametrize(
    ("db", "message"),
    [
        ("source.db", "a SQLite file has none"),
        ("sqlite:///tmp/x.db", "a SQLite file has none"),
        ("postgresql://h/db?schema=other", "differ"),
    ],
)
def test_schema_flag_that_cannot_apply_is_refused(db: str, message: str) -> None:
    with pytest.raises(BadLocation, match=message):
        with_schema(db, "ob")
