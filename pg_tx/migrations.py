"""Each side's schema, brought up to date by numbered migrations.

Both sides may share one database, so the version is kept per side, one row each in
VERSIONS_TABLE, and one advisory lock for both makes processes that start together
migrate once. A schema newer than the program is refused rather than used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from plumbing.storage import StorageError

from .pool import Conn

VERSIONS_TABLE: Final = "schema_versions"  # one row per side; both sides may share a database


async def migrate(conn: Conn, side: str, migrations: Sequence[str]) -> None:
    """Bring `side`'s schema to the newest of `migrations`, each applied once;
    StorageError if the schema is newer than `migrations` knows."""
    async with conn.transaction():
        # One migrating process at a time per database (both sides share the lock).
        await conn.execute(b"SELECT pg_advisory_xact_lock(hashtext('outbox-relay schema'))")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} ("
            " side TEXT PRIMARY KEY, version INTEGER NOT NULL)".encode()
        )
        row = await (
            await conn.execute(
                f"SELECT version FROM {VERSIONS_TABLE} WHERE side = %s".encode(), (side,)
            )
        ).fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(migrations):
            raise StorageError(
                f"the {side} schema is version {version}, newer than this program knows"
                f" ({len(migrations)}): run the release that wrote it, or a newer one"
            )
        for number, script in enumerate(migrations[version:], start=version + 1):
            await conn.execute(script.encode())
            await conn.execute(
                f"INSERT INTO {VERSIONS_TABLE} (side, version) VALUES (%s, %s)"
                " ON CONFLICT (side) DO UPDATE SET version = excluded.version".encode(),
                (side, number),
            )
