"""A side's tables as its storage packages create and upgrade them.

A database that holds none of a side's tables gets the newest schema at once
(`fresh`), so no table of an earlier release's name is ever created beside the
user's own tables. A database an earlier release wrote is brought up by the
`migrations` after its version, the history each release added to, ending in the
newest schema as well: a test checks that both roads lead to the same tables.

The version of each side is a row in VERSIONS_TABLE, a table of its own in the
database, never SQLite's `user_version` or any other setting of the user's database.
Releases before that table kept it elsewhere (`user_version` on SQLite,
`schema_versions` on PostgreSQL): that is read, only where the side's tables of
that release are (`legacy_table`, with its columns), and then set to the newest version too, so that
an earlier release refuses the upgraded database instead of misreading it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from plumbing.storage import StorageError

VERSIONS_TABLE: Final = "outbox_relay_versions"  # one row per side; both may share a database


@dataclass(frozen=True)
class Schema:
    """How a side's tables are made. `tables` names every table its statements may
    name, of this release and of earlier ones (the names that a schema qualifies on
    PostgreSQL); `probe_table` is the one-row table of the writability probe."""

    side: str
    fresh: str
    migrations: Sequence[str]
    tables: frozenset[str]
    probe_table: str
    legacy_table: str  # a table of the release before VERSIONS_TABLE ...
    legacy_columns: frozenset[str]  # ... with these columns (a user's own table has others)

    @property
    def version(self) -> int:
        """The newest version: that of `fresh`, and of the last migration."""
        return len(self.migrations)


def scripts_to_run(schema: Schema, version: int) -> list[str]:
    """What brings a side at `version` (0: none of its tables) to the newest: the
    fresh schema, or the migrations after its version (none when it is there).
    StorageError, in one line, for a version newer than this program knows, or for
    one no release writes (a row changed by hand: text, a negative number)."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise StorageError(
            f"the {schema.side} schema version is recorded as {version!r}, which no"
            f" release writes: the {VERSIONS_TABLE} table was changed by hand"
        )
    if version > schema.version:
        raise StorageError(
            f"the {schema.side} schema is version {version}, newer than this program"
            f" knows ({schema.version}): run the release that wrote it, or a newer one"
        )
    return [schema.fresh] if version == 0 else list(schema.migrations[version:])


def statements(script: str) -> list[str]:
    """A script's statements, split on `;` (none of ours holds one but as a terminator)."""
    return [part.strip() for part in script.split(";") if part.strip()]


def history(side: str, migrations: Sequence[str], probe_table: str = "") -> Schema:
    """A schema of tables no earlier release kept anywhere else: its fresh tables are
    its migrations run in order (a store of tests' own, the bench's commit table)."""
    return Schema(
        side=side,
        fresh=";\n".join(migrations),
        migrations=tuple(migrations),
        tables=frozenset(),
        probe_table=probe_table,
        legacy_table="",
        legacy_columns=frozenset(),
    )
