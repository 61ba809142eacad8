"""The sink while its PostgreSQL server is away: its writes and reads answer 503 with
a JSON error and /readyz fails; once the server is back the sink recovers on its
own, with nothing applied twice. A throwaway server of the test's own, stopped and
started for real under the running HTTP app."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from pg_faults import PgAccess
from support import request_json

from plumbing.pgserver import ThrowawayServer, throwaway_server
from sink import create_app

if TYPE_CHECKING:
    from conftest import Serve

RECOVERY_S = 15.0  # the server is taking connections again: the sink follows within this


async def until_ok(client: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    """The first 200 reply's body, asking again until RECOVERY_S has passed."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        status, reply = await request_json(client, method, url, body)
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, reply
            return reply
        await asyncio.sleep(0.2)


async def test_a_stopped_server_is_503_and_the_sink_recovers_when_it_is_back(
    serve: Serve, pg_server: ThrowawayServer
) -> None:
    # pg_server: skips (or fails under CI) where there is no PostgreSQL, as elsewhere.
    # A server of its own, not a schema on pg_server: the test stops it.
    first = {"id": "order-1", "sku": "snack", "qty": 2}
    second = {"id": "order-2", "sku": "snack", "qty": 3}
    with throwaway_server() as server:
        url = server.create_database("sink")
        base = await serve(create_app(url))
        async with aiohttp.ClientSession() as client:
            assert (await request_json(client, "POST", f"{base}/events", first))[0] == 200

            await asyncio.to_thread(server.stop, "fast")
            started = time.monotonic()
            status, reply = await request_json(client, "POST", f"{base}/events", second)
            assert (status, reply) == (503, {"error": "storage unavailable, try again"})
            batch = {"events": [second]}
            status, reply = await request_json(client, "POST", f"{base}/events/batch", batch)
            assert (status, reply) == (503, {"error": "storage unavailable, try again"})
            status, reply = await request_json(client, "GET", f"{base}/events/order-1")
            assert (status, reply) == (503, {"error": "storage unavailable, try again"})
            status, reply = await request_json(client, "GET", f"{base}/readyz")
            assert status == 503 and reply["error"].startswith("not ready")
            assert "psycopg" not in reply["reason"] and "\n" not in reply["reason"]
            assert time.monotonic() - started < 10  # refused at once, not a hang
            status, reply = await request_json(client, "GET", f"{base}/healthz")
            assert status == 200  # alive: only the database is away

            await asyncio.to_thread(server.start)
            ack = await until_ok(client, "POST", f"{base}/events", second)
            assert (ack["ack"], ack["status"]) == ("order-2", "applied")
            assert await until_ok(client, "GET", f"{base}/readyz") == {"status": "ready"}
            again = await until_ok(client, "POST", f"{base}/events", first)
            assert again["status"] == "duplicate"

        database = PgAccess(url, "inbox_health")
        assert database.query("SELECT id, deliveries FROM inbox_events ORDER BY applied_seq") == [
            ("order-1", 2),
            ("order-2", 1),
        ]
        assert database.query("SELECT qty FROM inbox_inventory") == [(5,)]
