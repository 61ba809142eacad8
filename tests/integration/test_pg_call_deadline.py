"""A write to the PostgreSQL inbox is answered within the database's deadline, counted
from the call, even when the sink tries its transaction again (a lock waited for in
each of them): not after the sum of the tries. What the abandoned tries commit later
is each event once, with its effect."""

from __future__ import annotations

import asyncio
import time
from typing import Any

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


async def test_a_handlers_statement_past_the_deadline_is_ended_by_the_server_not_committed_later(
    pg_database: str,
) -> None:
    """The pool cuts a connection whose call passed its deadline, but the server does not
    see a closed socket while a statement runs: a handler's slow statement went on and
    committed the event, its effect and the COMMIT sent with it long after the 503 (and
    held the event's row meanwhile, so that a fixed handler could not take it). The
    server now ends the statement at the deadline, and the transaction with it."""
    handlers = Handlers("slow")
    handlers.schema("CREATE TABLE slow_effects (id TEXT PRIMARY KEY)")

    @handlers.on("slow.one")
    def slow(event: Any) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("SELECT pg_sleep(8)", {}),
            ("INSERT INTO slow_effects (id) VALUES (%(id)s)", {"id": event.id}),
        ]

    url = f"{pg_database}&deadline=1" if "?" in pg_database else f"{pg_database}?deadline=1"
    async with Inbox.open(url, handlers) as inbox:
        started = time.monotonic()
        with pytest.raises(StorageTimeout):
            await inbox.receive({"id": "s-1", "type": "slow.one", "data": {}})
        assert time.monotonic() - started < 1 + SLACK_S
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as check:
        sleeping: object = None
        for _ in range(50):  # the server ends it within a second or so of the deadline
            row = await (
                await check.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(8)%'"
                    " AND pid <> pg_backend_pid() AND state = 'active'"
                )
            ).fetchone()
            sleeping = None if row is None else row[0]
            if sleeping == 0:
                break
            await asyncio.sleep(0.1)
        assert sleeping == 0
        rows = await (
            await check.execute(
                "SELECT (SELECT count(*) FROM inbox_events WHERE id = 's-1'),"
                " (SELECT count(*) FROM slow_effects)"
            )
        ).fetchone()
    assert rows == (0, 0)  # rolled back: a retry applies it, with the handler it finds then


@pytest.mark.parametrize(
    ("params", "shown"), [("deadline=2", "2s"), ("deadline=2&prepare=off", "0")]
)
async def test_the_sessions_statement_timeout_is_the_deadline_except_behind_a_pooler(
    pg_database: str, params: str, shown: str
) -> None:
    """With prepare=off (a pooler in transaction mode lends each server connection to
    other clients in turn), no session setting is made: it would outlive the
    transaction on a connection others use."""
    from pg_tx import PgDatabase
    from publisher.backends import postgres_sql

    url = f"{pg_database}&{params}" if "?" in pg_database else f"{pg_database}?{params}"
    db = await PgDatabase.open(url, postgres_sql.SCHEMA)
    try:
        seen = set()
        async with db.connection() as first, db.connection() as second:  # adopted, then new
            for conn in (first, second):
                row = await (await conn.execute(b"SHOW statement_timeout")).fetchone()
                assert row is not None
                seen.add(row[0])
                await conn.rollback()
    finally:
        await db.close()
    assert seen == {shown}
