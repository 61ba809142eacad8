"""Durable before the ACK, on PostgreSQL: what the sink acknowledged survives a crash
of the server even where the server's default is not to wait for the WAL flush.

A throwaway server of the test's own, started with synchronous_commit off and the
WAL writer asleep for 10 s between flushes: a commit that does not ask for the flush
itself is only in memory for up to that long. The real HTTP app takes events; then
the server is stopped with `immediate` (no checkpoint, no flush: as a crash) and
started again. The control in the same run, a plain commit on that server, is lost
by the same stop, so the test would see a sink that relied on the default.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
from pg_faults import PgAccess

from plumbing.pgserver import ThrowawayServer, throwaway_server
from sink import create_app

if TYPE_CHECKING:
    from conftest import Serve

# The WAL writer flushes an asynchronous commit within this delay (10 s is its
# largest): nothing else flushes the control's commit before the stop.
LAZY_SERVER = {"synchronous_commit": "off", "wal_writer_delay": "10000ms"}
EVENTS = [{"id": f"order-{n}", "sku": "snack", "qty": n} for n in range(1, 6)]


async def test_acked_events_survive_a_crash_of_a_server_that_does_not_flush_commits(
    serve: Serve, pg_server: ThrowawayServer
) -> None:
    # pg_server: skips (or fails under CI) where there is no PostgreSQL, as elsewhere.
    # A server of its own, not a schema on pg_server: it runs with settings of its
    # own and the test crashes it.
    with throwaway_server(LAZY_SERVER) as server:
        url = server.create_database("sink")
        database = PgAccess(url, "inbox_health")
        base = await serve(create_app(url))
        database.execute("CREATE TABLE control (n INTEGER)")
        async with aiohttp.ClientSession() as client:
            for event in EVENTS:
                async with client.post(f"{base}/events", json=event) as response:
                    assert response.status == 200
                    assert (await response.json())["status"] == "applied"
        assert database.query("SHOW synchronous_commit") == [("off",)]  # the server's default
        database.execute("INSERT INTO control (n) VALUES (1)")  # committed, not flushed
        assert database.query("SELECT n FROM control") == [(1,)]

        await asyncio.to_thread(server.stop, "immediate")
        await asyncio.to_thread(server.start)

        assert database.query("SELECT id FROM inbox_events ORDER BY applied_seq") == [
            (event["id"],) for event in EVENTS
        ]
        assert database.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 15)]
        assert database.query("SELECT n FROM control") == []  # the control was lost
