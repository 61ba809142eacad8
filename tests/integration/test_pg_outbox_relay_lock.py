"""PostgreSQL: the relay lock is a session-level advisory lock held by a connection of
its own. A relay whose session is lost while it runs (the server restarted, an
operator ended it) takes the lock again as soon as it can; leaving the block lets it
go. Refusal naming the holder, and a SIGKILLed holder, are in the behaviour suite."""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from support import eventually

from publisher.errors import RelayAlreadyRunning
from publisher.store import Outbox

HOLDER = "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'outbox relay %%'"


def holders(url: str) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [pid for (pid,) in conn.execute(HOLDER.encode()).fetchall()]


def end_session(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(b"SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def test_a_lost_lock_session_is_replaced_and_the_lock_taken_again(
    pg_outbox: Outbox, pg_database: str
) -> None:
    async with Outbox.open(pg_database) as other:
        async with pg_outbox.relay_lock("publisher serve"):
            [first] = holders(pg_database)
            end_session(pg_database, first)

            await eventually(lambda: len(holders(pg_database)) == 1, timeout_s=5)
            [second] = holders(pg_database)
            assert second != first
            with pytest.raises(RelayAlreadyRunning, match=f"process {os.getpid()} "):
                async with other.relay_lock("publisher dispatch"):
                    pytest.fail("the lock was not taken again")
        async with other.relay_lock("publisher dispatch"):  # let go: free at once
            pass
        # The server ends a closed session's backend on its own time: it may still be
        # listed for a moment after the lock went with the connection.
        await eventually(lambda: holders(pg_database) == [], timeout_s=5)
