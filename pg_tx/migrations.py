"""Each side's schema, created or brought up to date (see plumbing.schema).

Both sides may share one database, so the version is kept per side, one row each in
VERSIONS_TABLE, and one advisory lock for both makes processes that start together
migrate once. A schema newer than the program is refused rather than used.
"""

from __future__ import annotations

from typing import Final

from plumbing.schema import VERSIONS_TABLE, Schema, scripts_to_run

from .names import Qualify
from .pool import Conn

# Where releases before VERSIONS_TABLE kept each side's version (side, version).
LEGACY_VERSIONS_TABLE: Final = "schema_versions"
# One migrating process at a time per database (both sides, and handlers' schemas,
# share the lock), held to the end of the transaction.
MIGRATION_LOCK: Final = b"SELECT pg_advisory_xact_lock(hashtext('outbox-relay schema'))"


async def migrate(conn: Conn, schema: Schema, qualify: Qualify) -> None:
    """Bring `schema.side`'s tables to the newest version, each statement qualified
    by `qualify`; StorageError if they are newer than this program knows."""
    versions = qualify(VERSIONS_TABLE)
    async with conn.transaction():
        await conn.execute(MIGRATION_LOCK)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {versions} ("
            " side TEXT PRIMARY KEY, version INTEGER NOT NULL)".encode()
        )
        row = await (
            await conn.execute(
                f"SELECT version FROM {versions} WHERE side = %s".encode(), (schema.side,)
            )
        ).fetchone()
        legacy = None if row is not None else await _legacy_version(conn, schema, qualify)
        version = int(row[0]) if row is not None else legacy or 0
        scripts = scripts_to_run(schema, version)
        if not scripts:
            return
        for script in scripts:
            await conn.execute(qualify(script).encode())
        await conn.execute(
            f"INSERT INTO {versions} (side, version) VALUES (%s, %s)"
            " ON CONFLICT (side) DO UPDATE SET version = excluded.version".encode(),
            (schema.side, schema.version),
        )
        if legacy:  # an earlier release reads this: it must now refuse the database
            await conn.execute(
                f"UPDATE {qualify(LEGACY_VERSIONS_TABLE)} SET version = %s"
                " WHERE side = %s".encode(),
                (schema.version, schema.side),
            )


async def side_is_there(conn: Conn, schema: Schema, qualify: Qualify) -> bool:
    """Whether the side's tables are in the database (its row in VERSIONS_TABLE, or
    an earlier release's version of it), asked without creating anything."""
    versions = qualify(VERSIONS_TABLE)
    found = await (await conn.execute(b"SELECT to_regclass(%s)", (versions,))).fetchone()
    if found is not None and found[0] is not None:
        row = await (
            await conn.execute(f"SELECT 1 FROM {versions} WHERE side = %s".encode(), (schema.side,))
        ).fetchone()
        if row is not None:
            return True
    return await _legacy_version(conn, schema, qualify) is not None


async def _legacy_version(conn: Conn, schema: Schema, qualify: Qualify) -> int | None:
    """The side's version as a release before VERSIONS_TABLE kept it, where that
    release's table of the side is there with its columns; else None."""
    table = qualify(schema.legacy_table)
    columns = await (
        await conn.execute(
            b"SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            b" AND attname = ANY(%s) AND NOT attisdropped",
            (table, sorted(schema.legacy_columns)),
        )
    ).fetchone()
    legacy = qualify(LEGACY_VERSIONS_TABLE)
    found = await (await conn.execute(b"SELECT to_regclass(%s)", (legacy,))).fetchone()
    if columns is None or columns[0] != len(schema.legacy_columns) or found is None:
        return None
    if found[0] is None:
        return None
    row = await (
        await conn.execute(f"SELECT version FROM {legacy} WHERE side = %s".encode(), (schema.side,))
    ).fetchone()
    return None if row is None else int(row[0])
