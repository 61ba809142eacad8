"""The schema of a file, created or brought up to date (see plumbing.schema).

The side's version is its row in VERSIONS_TABLE, written in the same transaction as
what reaches it, so a file is never left halfway between two versions. A schema
newer than the program is refused rather than used.
"""

from __future__ import annotations

import sqlite3

from plumbing.schema import VERSIONS_TABLE, Schema, scripts_to_run, statements

from .transactions import transaction


def migrate(conn: sqlite3.Connection, schema: Schema) -> None:
    """Bring `schema.side`'s tables to the newest version, in one transaction;
    StorageError if they are newer than this program knows."""
    with transaction(conn):
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE}"
            " (side TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = conn.execute(
            f"SELECT version FROM {VERSIONS_TABLE} WHERE side = ?", (schema.side,)
        ).fetchone()
        legacy = row is None and _is_legacy(conn, schema) and _user_version(conn) > 0
        version = row[0] if row is not None else _user_version(conn) if legacy else 0
        scripts = scripts_to_run(schema, version)
        if not scripts:
            return
        for script in scripts:
            for statement in statements(script):
                conn.execute(statement)
        conn.execute(
            f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES (?, ?)"
            " ON CONFLICT (side) DO UPDATE SET version = excluded.version",
            (schema.side, schema.version),
        )
        if legacy:  # an earlier release reads this: it must now refuse the file
            conn.execute(f"PRAGMA user_version = {schema.version}")


def _is_legacy(conn: sqlite3.Connection, schema: Schema) -> bool:
    """Whether the file holds the side's table of the release before VERSIONS_TABLE."""
    columns = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM pragma_table_info(?)", (schema.legacy_table,)
        ).fetchall()
    }
    return schema.legacy_columns <= columns and bool(columns)


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])
