"""The sink commits and then closes the connection with no reply (separate processes),
on both backends: two SQLite files, or two PostgreSQL databases."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from support import dispatch

if TYPE_CHECKING:
    from conftest import AcceptOrders, Databases, Query, RunCli, StartSink

pytestmark = pytest.mark.e2e

DROP_ONE = ("--chaos", "drop-after-commit=1")


def test_dropped_reply_keeps_the_entry_and_the_resend_gets_a_duplicate_ack(
    databases: Databases,
    run_cli: RunCli,
    sink_process: StartSink,
    accept_orders: AcceptOrders,
    db_rows: Query,
) -> None:
    source, sink_db = databases.source, databases.sink
    accept_orders(source, {"id": "order-1", "sku": "snack", "qty": 7})
    sink = sink_process(sink_db, *DROP_ONE)

    status, stdout, stderr = dispatch(run_cli, source, sink.url)

    assert status == 1
    assert len(stderr.splitlines()) == 1, stderr
    assert "order-1" in stderr
    assert stdout == ""
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'") == [(0,)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]

    status, stdout, stderr = dispatch(run_cli, source, sink.url)

    assert status == 0, stderr
    assert stdout.strip() == "delivered 1: order-1"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(7,)]
    assert db_rows(source, "SELECT sent FROM outbox_entries WHERE id = 'order-1'") == [(1,)]


def test_dropped_reply_stops_the_batch_before_later_entries(
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
    sink = sink_process(sink_db, *DROP_ONE)

    status, _, stderr = dispatch(run_cli, source, sink.url)

    assert status == 1, stderr
    assert db_rows(source, "SELECT id, sent FROM outbox_entries ORDER BY seq") == [
        ("order-1", 0),
        ("order-2", 0),
    ]
    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [("order-1",)]

    status, stdout, stderr = dispatch(run_cli, source, sink.url)

    assert status == 0, stderr
    assert stdout.strip() == "delivered 2: order-1 order-2"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("order-1", 2),
        ("order-2", 1),
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("drink", 3),
        ("snack", 7),
    ]
