"""The backends the outbox behaviour suite runs on, and how a test reaches each one.

A test gets an outbox opened with `Outbox.open(backend.location)`, and through
`backend` a way to the tables behind it (`outbox_orders`, `outbox_entries`,
`outbox_pruned`, `outbox_quarantines`, and the relay workers' `outbox_line_leases`
and `outbox_relay_workers`) that does not go through the outbox: a connection of
the test's own, opened for each call, as another process would see the data; and
the connections a program that writes its own rows beside the outbox would hold
(`user_connection`, `async_user_connection`).

A new backend plugs in with one class that implements `Backend` and one factory in
`BACKENDS`; the tests are not copied. The suite writes its SQL with `?` placeholders
and in the dialect SQLite and PostgreSQL share; a backend whose driver wants another
placeholder style translates it in `query` and `execute`. The suite reads the
columns of today's schema; a backend keeps their names and meaning (0/1 or a boolean
both compare equal to the 0/1 the tests expect). An entry's canonical event is read
through `entry_payload`, the backend's SQL for it over `outbox_entries`: SQLite keeps
a large event in `outbox_payloads`, not in the entry's row.
"""

from __future__ import annotations

import contextlib
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pg_faults
import psycopg
import pytest
import sqlite_faults
from sqlite_faults import FAULTS as FAULTS  # the faults every backend can make
from sqlite_faults import Fault as Fault
from support import SQLITE_ENTRY_PAYLOAD

from plumbing.storage import with_schema

Row = tuple[Any, ...]


class Backend(ABC):
    """One backend as a behaviour test sees it: where to open it, and its raw tables."""

    # SQL over outbox_entries for an entry's canonical event, wherever it is kept.
    entry_payload = "payload"

    @property
    @abstractmethod
    def location(self) -> str:
        """What `Outbox.open` is given (the --db value an operator would give)."""

    @abstractmethod
    def query(self, sql: str, *params: object) -> list[Row]:
        """Every row `sql` selects, read through a fresh connection closed afterwards."""

    @abstractmethod
    def execute(self, *statements: str) -> None:
        """Run statements through a fresh connection, each committed on its own (what
        another writer, or time passing, would do to the rows)."""

    @abstractmethod
    def refusing_inserts(self, table: str, message: str) -> contextlib.AbstractContextManager[None]:
        """While inside, every insert into `table` fails in the database with an error
        whose text holds `message` (a failure of one statement in a transaction)."""

    @abstractmethod
    def unwritable(self, fault: Fault) -> contextlib.AbstractContextManager[None]:
        """While inside, the database cannot take a write, for the reason `fault`
        names (read-only, its write lock held elsewhere, gone); left, it can again."""

    @abstractmethod
    def others_cannot_write(self) -> bool:
        """Whether a write of the test's own, through a connection of its own, fails
        now: the fault is real, not only seen by the store."""

    @abstractmethod
    def user_connection(
        self, *, autocommit: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """A connection of the driver a user of this database would hold (sqlite3,
        psycopg), as it comes: its first write begins a transaction, which the test
        commits or rolls back (`autocommit`: each statement commits on its own).
        Closed on the way out, uncommitted work rolled back."""

    @abstractmethod
    def async_user_connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """`user_connection` for a program on an event loop (what publish_in_async
        takes): a psycopg AsyncConnection. A backend whose users have no such driver
        skips the test (pytest.skip)."""


class SqliteBackend(sqlite_faults.SqliteFileAccess, Backend):
    """A SQLite file in the test's temporary directory, read with the sqlite3 module."""

    entry_payload = SQLITE_ENTRY_PAYLOAD  # a large event's row holds '' (outbox_payloads)

    def refusing_inserts(self, table: str, message: str) -> contextlib.AbstractContextManager[None]:
        return self.refusing(table, ("INSERT",), message)

    @contextlib.contextmanager
    def user_connection(self, *, autocommit: bool = False) -> Iterator[Any]:
        conn = sqlite3.connect(self.path, timeout=5, isolation_level=None if autocommit else "")
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.asynccontextmanager
    async def async_user_connection(self) -> AsyncIterator[Any]:
        pytest.skip("no asynchronous SQLite driver is supported: publish_in_async is psycopg's")
        yield  # unreachable: makes this a generator


class PostgresBackend(pg_faults.PgAccess, Backend):
    """A fresh schema, alone in its process's database on the session's throwaway
    PostgreSQL server (pg_database), read with psycopg. The faults that take the
    database (read-only, gone) take that whole database, as they would an operator's."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "outbox_health")

    def refusing_inserts(self, table: str, message: str) -> contextlib.AbstractContextManager[None]:
        return self.refusing(table, ("INSERT",), message)

    @contextlib.contextmanager
    def user_connection(self, *, autocommit: bool = False) -> Iterator[Any]:
        conn = psycopg.connect(self.url, autocommit=autocommit, connect_timeout=5)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.asynccontextmanager
    async def async_user_connection(self) -> AsyncIterator[Any]:
        conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=5)
        try:
            yield conn
        finally:
            await conn.close()


class PostgresSchemaBackend(PostgresBackend):
    """PostgreSQL with the outbox's tables in a schema of their own (`ob`), named in
    every statement (`schema=ob` in the URI the outbox is opened with): the outbox's
    connections have as their search_path another schema, one without its tables, so
    a statement that did not name the schema would fail. The test's own connections,
    and the user's, find the tables by their search_path."""

    SCHEMA = "ob"

    def __init__(self, url: str, outbox_url: str) -> None:
        super().__init__(url)
        self._outbox_url = outbox_url

    @property
    def location(self) -> str:
        return self._outbox_url


BackendFactory = Callable[[pytest.FixtureRequest], contextlib.AbstractContextManager[Backend]]


@contextlib.contextmanager
def sqlite_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    yield SqliteBackend(tmp_path / "source.db")


@contextlib.contextmanager
def postgres_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield PostgresBackend(request.getfixturevalue("pg_database"))


@contextlib.contextmanager
def postgres_schema_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    elsewhere: str = request.getfixturevalue("pg_database")  # an empty schema's search_path
    database = urlsplit(elsewhere)._replace(query="").geturl()
    schema = PostgresSchemaBackend.SCHEMA
    with psycopg.connect(database, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())  # the user's tables may be there first
    search_path = quote(f"-csearch_path={schema}", safe="")
    yield PostgresSchemaBackend(f"{database}?options={search_path}", with_schema(elsewhere, schema))


# name -> factory: the behaviour suite runs once per entry. A backend that needs a
# server the machine may lack skips (pytest.skip) in its factory, it does not leave.
BACKENDS: dict[str, BackendFactory] = {
    "sqlite": sqlite_backend,
    "postgres": postgres_backend,
    "postgres-schema": postgres_schema_backend,
}
