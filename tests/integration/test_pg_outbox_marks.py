"""PostgreSQL: marks of concurrent callers share one transaction (group commit), and
each call still succeeds or fails on its own. Rows written by one transaction carry
its ID (`xmin`), read through a connection of the test's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from publisher.errors import UnknownEntry
from publisher.store import Mark, Outbox


@pytest.fixture
async def outbox(pg_database: str) -> AsyncIterator[Outbox]:
    async with Outbox.open(pg_database) as opened:
        for n in range(8):
            assert await opened.accept({"id": f"m{n}", "sku": "snack", "qty": 1}) == "accepted"
        yield opened


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


async def test_concurrent_marks_share_one_transaction(outbox: Outbox, pg_database: str) -> None:
    await asyncio.gather(
        *(outbox.mark_sent_many([Mark(f"m{2 * k}"), Mark(f"m{2 * k + 1}")]) for k in range(4))
    )
    assert rows(pg_database, "SELECT count(*) FROM outbox WHERE sent = 0") == [(0,)]
    # The first call committed alone; the three that came meanwhile, together.
    xmins = dict(rows(pg_database, "SELECT id, xmin::text FROM outbox"))
    assert len(set(xmins.values())) <= 2
    assert len({xmins[f"m{n}"] for n in range(2, 8)}) == 1


async def test_a_failing_call_fails_alone_and_all_of_it(outbox: Outbox, pg_database: str) -> None:
    results = await asyncio.gather(
        outbox.mark_sent_many([Mark("m0"), Mark("m1")]),
        outbox.mark_sent_many([Mark("m2"), Mark("no-such-entry")]),
        outbox.mark_sent_many([Mark("m3"), Mark("m4")]),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], UnknownEntry)
    assert dict(rows(pg_database, "SELECT id, sent FROM outbox")) == {
        "m0": 1,
        "m1": 1,
        "m2": 0,
        "m3": 1,
        "m4": 1,
        "m5": 0,
        "m6": 0,
        "m7": 0,
    }
