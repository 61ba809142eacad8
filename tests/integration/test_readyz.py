"""GET /readyz on both services: 503 while the database cannot be written, 200 again after.

The fault is real where this machine allows it: the file made immutable (root
writes through any mode bits) or read-only; else a trigger that refuses writes
stands in. /healthz stays 200 throughout: it says the process is alive.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlite_faults import unwritable
from support import get_json

from publisher.app import ServiceSettings
from publisher.app import create_app as create_publisher
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from sink import Inbox
from sink import create_app as create_sink

if TYPE_CHECKING:
    from conftest import Serve

TOKEN = "sink-token-0123456789abc"


async def gauge(client: aiohttp.ClientSession, base: str, name: str) -> float:
    async with client.get(f"{base}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


async def check_readiness(
    client: aiohttp.ClientSession, base: str, db: Path, gauge_name: str
) -> None:
    assert await get_json(client, f"{base}/readyz") == (200, {"status": "ready"})
    assert await gauge(client, base, gauge_name) == 1
    with unwritable(db, "read-only"):
        status, body = await get_json(client, f"{base}/readyz")
        assert status == 503, body
        assert "cannot be written" in body["error"]
        assert body["reason"], body
        assert await get_json(client, f"{base}/healthz") == (200, {"status": "ok"})
        assert await gauge(client, base, gauge_name) == 0
    assert await get_json(client, f"{base}/readyz") == (200, {"status": "ready"})
    assert await gauge(client, base, gauge_name) == 1


async def test_sink_readyz_follows_the_database(
    serve: Serve, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    db = tmp_path / "sink.db"
    base = await serve(create_sink(db, token=TOKEN))  # /readyz needs no token
    await check_readiness(client, base, db, "sink_ready")


async def test_publisher_readyz_follows_the_database(
    serve: Serve, serve_sink: Any, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    sink = await serve_sink(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    settings = ServiceSettings(
        db=str(db),
        sink=f"{sink}/events",
        relay=RelaySettings(poll_interval_s=0.1, retry=RetryPolicy(base_s=0.05, cap_s=0.3)),
    )
    base = await serve(create_publisher(settings))
    await check_readiness(client, base, db, "publisher_ready")


async def test_a_file_read_only_when_the_service_starts_is_told_and_needs_a_restart(
    serve: Serve, client: aiohttp.ClientSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite opens a file it cannot write read-only, and the connection stays so once
    the file is fixed: the service says so at start and in /readyz, rather than look
    like the fault that heals by itself."""
    db = tmp_path / "sink.db"
    async with Inbox.open(db):  # the sink's tables
        pass
    # A connection of another process's kind keeps the WAL's files (a service killed
    # leaves them too), so SQLite can open the main file read-only.
    with contextlib.closing(sqlite3.connect(db)) as keeper, unwritable(db, "read-only"):
        keeper.execute("SELECT count(*) FROM inbox_events").fetchone()
        try:
            os.close(os.open(db, os.O_RDWR))
        except OSError:
            pass
        else:
            pytest.skip("no file here can be made one that cannot be opened for writing")
        base = await serve(create_sink(db))
        status, body = await get_json(client, f"{base}/readyz")
        assert status == 503, body
        assert "read-only" in body["reason"], body
    said = [r.getMessage() for r in caplog.records if "opened it read-only" in r.getMessage()]
    assert len(said) == 1, said
    assert "restart it once the file can be written" in said[0]
    # Writable again, but not to this process's connection: it says so still.
    status, body = await get_json(client, f"{base}/readyz")
    assert status == 503, body
    assert "restart once it can be written" in body["reason"], body
