"""Fixtures the integration tests of the sink's storage share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sink.inbox import Inbox


@pytest.fixture
def sink_db(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


@pytest.fixture
async def inbox(sink_db: Path) -> AsyncIterator[Inbox]:
    async with Inbox.open(sink_db) as opened:
        yield opened
