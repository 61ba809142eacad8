"""Fixtures the integration tests share: a source outbox and a sink inbox on files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from publisher import Outbox
from sink.inbox import Inbox


@pytest.fixture
def sink_db(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


@pytest.fixture
async def inbox(sink_db: Path) -> AsyncIterator[Inbox]:
    async with Inbox.open(sink_db) as opened:
        yield opened


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "source.db"


@pytest.fixture
async def outbox(db: Path) -> AsyncIterator[Outbox]:
    async with Outbox.open(db) as opened:
        yield opened
