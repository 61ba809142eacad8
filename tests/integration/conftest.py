"""Fixtures the integration tests share: a source outbox and a sink inbox on files, and
the PostgreSQL outbox in the test's own schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from publisher import Outbox
from publisher.backends.postgres import PostgresOutbox
from publisher.backends.sqlite import SqliteOutbox
from sink.backends.sqlite import SqliteInbox


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
