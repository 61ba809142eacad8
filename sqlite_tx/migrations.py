"""The schema of a file, brought up to date by numbered migrations.

The version is SQLite's own `user_version`, set in the same transaction as the
migrations that reach it, so a file is never left halfway between two versions. A
schema newer than the program is refused rather than used.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from plumbing.storage import StorageError

from .transactions import transaction


def migrate(conn: sqlite3.Connection, migrations: Sequence[str]) -> None:
    """Bring the schema to the newest of `migrations`, in one transaction;
    StorageError if it is newer than `migrations` knows."""
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(migrations):
            raise StorageError(
                f"schema version {version} is newer than this program knows ({len(migrations)})"
            )
        for number, script in enumerate(migrations[version:], start=version + 1):
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT our transaction; split on ';' instead (no ';' in our DDL
    # except as terminators).
    return [part.strip() for part in script.split(";") if part.strip()]
