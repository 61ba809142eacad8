"""The backends the inbox behaviour suite runs on, and how a test reaches each one.

A test gets an inbox opened with `Inbox.open(backend.location)`, and through
`backend` a way to the `inbox` and `inventory` tables that does not go through the
inbox: a connection of the test's own, opened for each call, as another process
would see the data. A new backend plugs in with one class that implements `Backend`
and one factory in `BACKENDS`; the tests are not copied.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pg_faults
import pytest
import sqlite_faults
from sqlite_faults import FAULTS as FAULTS  # the faults every backend can make
from sqlite_faults import Fault as Fault

Row = tuple[Any, ...]
Write = Literal["INSERT", "UPDATE"]


class Backend(ABC):
    """One backend as a behaviour test sees it: where to open it, and its raw tables."""

    @property
    @abstractmethod
    def location(self) -> str:
        """What `Inbox.open` is given (the --db value an operator would give)."""

    @abstractmethod
    def query(self, sql: str, *params: object) -> list[Row]:
        """Every row `sql` selects, read through a fresh connection closed afterwards."""

    @abstractmethod
    def ids_in_arrival_order(self) -> list[str]:
        """The inbox's IDs in the order their rows were recorded."""

    @abstractmethod
    def refusing(
        self, table: str, writes: tuple[Write, ...], message: str
    ) -> contextlib.AbstractContextManager[None]:
        """While inside, every write of these kinds to `table` fails in the database
        with an error whose text holds `message` (one statement of a transaction
        failing, set up through a connection of the test's own)."""

    @abstractmethod
    def unwritable(self, fault: Fault) -> contextlib.AbstractContextManager[None]:
        """While inside, the database cannot take a write, for the reason `fault`
        names (read-only, its write lock held elsewhere, gone); left, it can again."""

    @abstractmethod
    def others_cannot_write(self) -> bool:
        """Whether a write of the test's own, through a connection of its own, fails
        now: the fault is real, not only seen by the store."""


class SqliteBackend(sqlite_faults.SqliteFileAccess, Backend):
    """A SQLite file in the test's temporary directory, read with the sqlite3 module."""

    def ids_in_arrival_order(self) -> list[str]:
        return [row[0] for row in self.query("SELECT id FROM inbox_events ORDER BY rowid")]


class PostgresBackend(pg_faults.PgAccess, Backend):
    """A fresh schema, alone in its process's database on the run's throwaway
    PostgreSQL server (pg_database), read with psycopg. The faults that take the
    database (read-only, gone) take that whole database, as they would an operator's."""

    def ids_in_arrival_order(self) -> list[str]:
        return [row[0] for row in self.query("SELECT id FROM inbox_events ORDER BY applied_seq")]


BackendFactory = Callable[[pytest.FixtureRequest], contextlib.AbstractContextManager[Backend]]


@contextlib.contextmanager
def sqlite_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    yield SqliteBackend(tmp_path / "sink.db")


@contextlib.contextmanager
def postgres_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    url: str = request.getfixturevalue("pg_database")  # skips without PostgreSQL
    yield PostgresBackend(url, "inbox_health")


# name -> factory: the suite runs once per entry. A backend that needs a server the
# machine may lack skips (pytest.skip) in its factory.
BACKENDS: dict[str, BackendFactory] = {"sqlite": sqlite_backend, "postgres": postgres_backend}
