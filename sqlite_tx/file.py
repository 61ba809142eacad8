"""SqliteFile: the part every SQLite backend shares, whatever its interface.

A backend subclasses it with its SCHEMA and gets the opening of its file, its
location, the writability probe and close.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Self

from plumbing.schema import Schema

from .database import Database


class SqliteFile:
    """What every SQLite backend is on top of its interface: one file, opened with its
    schema, and closed. `connect` is what a backend's factory awaits."""

    SCHEMA: ClassVar[Schema]

    def __init__(self, db: Database) -> None:
        self._db = db

    @classmethod
    async def connect(cls, path: str | Path) -> Self:
        """Open (or create) the file and bring its schema up to date."""
        return cls(await Database.open(path, cls.SCHEMA))

    @property
    def location(self) -> str:
        return self._db.path

    @property
    def path(self) -> str:
        return self._db.path

    async def check_writable(self) -> None:
        """Return if the database can take a write now, else StorageError (see
        Database.check_writable)."""
        await self._db.check_writable()

    async def close(self) -> None:
        await self._db.close()
