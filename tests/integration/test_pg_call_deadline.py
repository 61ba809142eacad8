"""A write to the PostgreSQL inbox is answered within the database's deadline, counted
from the call, even when the sink tries its transaction again (a lock waited for in
each of them): not after the sum of the tries. What the abandoned tries commit later
is each event once, with its effect."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from plumbing.storage import StorageTimeout
from sink import Handlers, Inbox

DEADLINE_S = 6.0  # the default; above the lock wait (5 s), as it is by default
SLACK_S = 1.5


def held_row_handlers() -> Handlers:
    handlers = Handlers("held")
    handlers.schema(
        "CREATE TABLE held (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
        "INSERT INTO held VALUES (1, 0)",
    )

    @handlers.on("row.bumped")
    def bumped(event: object) -> list[str]:
        return ["UPDATE held SET v = v + 1 WHERE id = 1"]

    return handlers


async def test_a_handler_blocked_on_a_row_lock_is_answered_within_the_deadline(
    pg_database: str,
) -> None:
    handlers = held_row_handlers()
    async with Inbox.open(pg_database, handlers) as inbox:
        holder = await psycopg.AsyncConnection.connect(pg_database)
        try:
            await holder.execute("SELECT v FROM held WHERE id = 1 FOR UPDATE")

            async def receive(n: int) -> float:
                started = time.monotonic()
                event = {"id": f"b-{n}", "type": "row.bumped", "key": "k", "data": {"n": n}}
                with pytest.raises(StorageTimeout) as failed:
                    await inbox.receive(event)
                assert "did not answer within 6 s" in str(failed.value.reason)
                return time.monotonic() - started

            lone = await receive(0)  # a transaction of its own
            grouped = await asyncio.gather(*(receive(n) for n in range(1, 4)))  # group commit
            for elapsed in (lone, *grouped):
                assert elapsed < DEADLINE_S + SLACK_S, elapsed
        finally:
            await holder.rollback()  # the lock is let go: the abandoned tries go on
            await holder.close()
        # Each of them ends committed (the lock free now) or not at all: read until the
        # four are recorded, then once more, in a bounded wait.
        counts: tuple[object, object] = (None, None)
        async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as check:
            for _ in range(100):
                row = await (
                    await check.execute(
                        "SELECT (SELECT v FROM held),"
                        " (SELECT count(*) FROM inbox_events WHERE id LIKE 'b-%')"
                    )
                ).fetchone()
                assert row is not None
                counts = (row[0], row[1])
                if counts == (4, 4):
                    break
                await asyncio.sleep(0.2)
    assert counts == (4, 4)  # each event recorded once, with its effect once
