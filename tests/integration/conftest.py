"""Fixtures the integration tests share: a source outbox and a sink inbox on files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from publisher import Outbox
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
async def outbox(db: Path) -> AsyncIterator[Outbox]:
    async with Outbox.open(db) as opened:
        yield opened
