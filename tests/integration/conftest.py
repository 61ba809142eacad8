"""Fixtures the integration tests share: a source outbox and a sink inbox on files, and
the PostgreSQL outbox in the test's own schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pg_faults import PgAccess
from support import ITEMS_SCHEMA

from plumbing.schema import history
from publisher import Outbox
from publisher.backends.postgres import PostgresOutbox
from publisher.backends.sqlite import SqliteOutbox
from sink.backends.sqlite import SqliteInbox
from sqlite_tx import Database

if TYPE_CHECKING:
    from conftest import ServeSink


@pytest.fixture
def sink_db(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


@pytest.fixture
async def inbox(sink_db: Path) -> AsyncIterator[SqliteInbox]:
    """The SQLite inbox on sink_db: these tests read its file, and some watch its
    Database (the behaviour every backend shares is in tests/behaviour)."""
    async with await SqliteInbox.connect(str(sink_db)) as opened:
        yield opened


@pytest.fixture
async def sink_base(serve_sink: ServeSink, sink_db: Path) -> str:
    """The real sink on sink_db, served on loopback: its base URL."""
    return await serve_sink(sink_db)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "source.db"


@pytest.fixture
async def outbox(db: Path) -> AsyncIterator[SqliteOutbox]:
    """The SQLite outbox on db: these tests read its file, and some watch its Database
    (the behaviour every backend shares is in tests/behaviour)."""
    async with Outbox.open(db) as opened:
        assert isinstance(opened, SqliteOutbox)
        yield opened


@pytest.fixture
async def pg_outbox(pg_database: str) -> AsyncIterator[PostgresOutbox]:
    """The PostgreSQL outbox in the test's schema (pg_database)."""
    async with Outbox.open(pg_database) as opened:
        assert isinstance(opened, PostgresOutbox)
        yield opened


@pytest.fixture
def items_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def items_db(items_path: Path) -> AsyncIterator[Database]:
    """A sqlite_tx Database on items_path, its schema ITEMS_SCHEMA (a table of items),
    its version recorded as the side "items"."""
    database = await Database.open(items_path, history("items", ITEMS_SCHEMA))
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def inbox_database(pg_database: str) -> PgAccess:
    """The test's PostgreSQL schema as a sink's inbox sees it (probe table inbox_health),
    read and written through connections of the test's own."""
    return PgAccess(pg_database, "inbox_health")
