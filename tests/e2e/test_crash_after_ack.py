"""Crashes across real OS processes that share the same disk, on both backends.

The publisher ends itself right after a verified ACK and before the mark; the sink
is killed with SIGKILL right after it answered. A checker then reads both databases
(SQLite files, or two PostgreSQL databases) with its own connections.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import aiohttp
import pytest
from support import dispatch

if TYPE_CHECKING:
    from conftest import AcceptOrders, Databases, Query, RunCli, StartSink

pytestmark = pytest.mark.e2e

CHAOS_EXIT = 73


def test_crash_after_ack_keeps_the_entry_and_the_resend_is_a_duplicate(
    databases: Databases, run_cli: RunCli, sink_process: StartSink, db_rows: Query
) -> None:
    source, sink_db = databases.source, databases.sink
    order = ["--id", "order-1", "--sku", "snack", "--qty", "7"]
    accepted = run_cli("publisher", "accept", "--db", str(source), *order)
    assert (accepted.returncode, accepted.stdout.strip()) == (0, "accepted order-1")
    sink = sink_process(sink_db)

    status, _, stderr = dispatch(run_cli, source, sink.url, "--chaos", "exit-after-ack")

    assert status == CHAOS_EXIT, stderr
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'") == [(0,)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]

    status, stdout, stderr = dispatch(run_cli, source, sink.url)

    assert status == 0, stderr
    assert stdout.strip() == "delivered 1: order-1"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'") == [(1,)]
    assert sink.proc.poll() is None, "the sink process should still be serving"


def test_crash_after_the_first_of_two_acks_marks_neither_and_rerun_applies_each_once(
    databases: Databases,
    run_cli: RunCli,
    sink_process: StartSink,
    accept_orders: AcceptOrders,
    db_rows: Query,
) -> None:
    source, sink_db = databases.source, databases.sink
    accept_orders(
        source,
        {"id": "order-1", "sku": "snack", "qty": 7},
        {"id": "order-2", "sku": "drink", "qty": 3},
    )
    sink = sink_process(sink_db)

    status, _, stderr = dispatch(run_cli, source, sink.url, "--chaos", "exit-after-ack")

    assert status == CHAOS_EXIT, stderr
    assert db_rows(source, "SELECT id, sent FROM outbox_entries ORDER BY seq") == [
        ("order-1", 0),
        ("order-2", 0),
    ]
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]

    status, stdout, stderr = dispatch(run_cli, source, sink.url)

    assert status == 0, stderr
    assert stdout.strip() == "delivered 2: order-1 order-2"
    assert db_rows(source, "SELECT id, sent FROM outbox_entries ORDER BY seq") == [
        ("order-1", 1),
        ("order-2", 1),
    ]
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("order-1", 2),
        ("order-2", 1),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("drink", 3),
        ("snack", 7),
    ]


async def test_commit_survives_sigkill_of_the_sink(
    databases: Databases, sink_process: StartSink, db_rows: Query
) -> None:
    sink_db = databases.sink
    event = {"id": "order-1", "sku": "snack", "qty": 7}
    sink = sink_process(sink_db)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.post(sink.url, json=event) as response:
            status, ack = response.status, await response.json()
        killed = sink.kill()

        assert (status, ack["ack"], ack["status"]) == (200, "order-1", "applied")
        assert killed == -signal.SIGKILL
        assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]

        restarted = sink_process(sink_db)
        async with session.get(f"{restarted.base}/inventory/snack") as response:
            assert await response.json() == {"sku": "snack", "qty": 7}
        async with session.post(restarted.url, json=event) as response:
            again = await response.json()

    assert (again["ack"], again["status"]) == ("order-1", "duplicate")
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
