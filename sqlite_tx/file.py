"""SqliteFile: the part every SQLite backend shares, whatever its interface.

A backend subclasses it with its MIGRATIONS and gets the opening of its file, its
location, the writability probe and close.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self

from .database import Database


class SqliteFile:
    """What every SQLite backend is on top of its interface: one file, opened with its
    migrations, and closed. `connect` is what a backend's factory awaits."""

    MIGRATIONS: ClassVar[Sequence[str]] = ()

    def __init__(self, db: Database) -> None:
        self._db = db

    @classmethod
    async def connect(cls, path: str | Path) -> Self:
        """Open (or create) the file and bring its schema up to date."""
        return cls(await Database.open(path, cls.MIGRATIONS))

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
