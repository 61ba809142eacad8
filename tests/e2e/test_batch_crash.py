"""Batch delivery and lanes across real OS processes that share the same disk.

The publisher ends itself right after a verified batch ACK, before the mark; the
rerun resends the batch and the inbox absorbs it. `publisher serve --ordering sku`
runs as a process of its own. Outcomes are read from both databases through
independent connections (SQLite or PostgreSQL: each test runs on both).
"""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING

import pytest
from support import STOP_TIMEOUT_S, ack, dispatch, event, post_order, serve_args, wait_until

from shared import Receipt

if TYPE_CHECKING:
    from conftest import Databases, Query, RunCli, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

CHAOS_EXIT = 73

ORDERS = [("order-1", "snack", 7), ("order-2", "juice", 3), ("order-3", "snack", 5)]


def test_crash_after_a_batch_ack_marks_nothing_and_the_rerun_is_absorbed(
    databases: Databases, run_cli: RunCli, sink_process: StartSink, db_rows: Query
) -> None:
    source, sink_db = databases.source, databases.sink
    for event_id, sku, qty in ORDERS:
        accepted = run_cli(
            "publisher", "accept", "--db", str(source), "--id", event_id, "--sku", sku,
            "--qty", str(qty),
        )  # fmt: skip
        assert (accepted.returncode, accepted.stdout.strip()) == (0, f"accepted {event_id}")
    sink = sink_process(sink_db)
    ids = [event_id for event_id, _, _ in ORDERS]

    status, stdout, stderr = dispatch(
        run_cli, source, sink.url, "--delivery", "batch", "--chaos", "exit-after-ack"
    )

    assert status == CHAOS_EXIT, stderr
    assert stdout == ""
    # The one batch request applied all three before the publisher died...
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY applied_seq") == [
        (event_id, 1) for event_id in ids
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("juice", 3),
        ("snack", 12),
    ]
    # ...and not one of them is marked: the hook ran before the mark.
    assert db_rows(source, "SELECT id, sent, ack FROM outbox_entries ORDER BY seq") == [
        (event_id, 0, None) for event_id in ids
    ]

    status, stdout, stderr = dispatch(run_cli, source, sink.url, "--delivery", "batch")

    assert status == 0, stderr
    assert stdout.strip() == "delivered 3: order-1 order-2 order-3"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox_events ORDER BY applied_seq") == [
        (event_id, 2) for event_id in ids
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == [
        ("juice", 3),
        ("snack", 12),
    ]
    marks = db_rows(source, "SELECT id, sent, ack FROM outbox_entries ORDER BY seq")
    assert [(event_id, sent) for event_id, sent, _ in marks] == [(i, 1) for i in ids]
    # Each ACK carries the digest of the order.placed event the order was recorded as.
    assert [json.loads(stored) for _, _, stored in marks] == [
        ack(event(i, s, q), Receipt.DUPLICATE) for i, s, q in ORDERS
    ]
    assert sink.proc.poll() is None, "the sink process should still be serving"


# ---------------------------------------------------------------- serve --ordering sku


def test_serve_with_sku_ordering_delivers_posted_orders_and_sigterm_exits_zero(
    databases: Databases, sink_process: StartSink, publisher_process: StartPublisher, db_rows: Query
) -> None:
    sink = sink_process(databases.sink)
    source = databases.source
    publisher = publisher_process(
        *serve_args(source, sink.url),
        "--ordering", "sku", "--lanes", "3", "--poll-interval", "5", "--retry-base", "0.05",
        "--retry-cap", "0.5", "--send-timeout", "2", "--log-format", "json",
    )  # fmt: skip
    proc, port, log = publisher.proc, publisher.port, publisher.log
    orders = [
        {"id": f"order-{n:02d}", "sku": ("snack", "juice", "tea", "soap")[n % 4], "qty": n}
        for n in range(1, 13)
    ]

    for order in orders:
        assert post_order(port, order) == (201, {"id": order["id"], "result": "accepted"})

    def all_sent() -> bool:
        states = dict(db_rows(source, "SELECT id, sent FROM outbox_entries"))
        return len(states) == len(orders) and all(states.values())

    wait_until(all_sent)
    applied = [r[0] for r in db_rows(sink.db, "SELECT id FROM inbox_events ORDER BY applied_seq")]
    assert sorted(applied) == [o["id"] for o in orders]
    for sku in ("snack", "juice", "tea", "soap"):
        expected = [o["id"] for o in orders if o["sku"] == sku]
        assert [i for i in applied if i in expected] == expected, sku
    inventory = dict(db_rows(sink.db, "SELECT sku, qty FROM inbox_inventory"))
    assert inventory == {
        sku: sum(o["qty"] for o in orders if o["sku"] == sku)
        for sku in ("snack", "juice", "tea", "soap")
    }
    assert db_rows(sink.db, "SELECT max(deliveries) FROM inbox_events") == [(1,)]
    assert db_rows(source, "SELECT count(*) FROM outbox_entries WHERE ack IS NULL") == [(0,)]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    started = [r for r in records if r.get("message") == "relay started"]
    # "sku" is the name "key" ordering had for orders: taken, and reported, as "key".
    assert [r.get("ordering") for r in started] == ["key"]
    # A line covers one request: its entries in `event_ids` when it carried several.
    delivered = [
        event_id
        for r in records
        if r.get("outcome") == "delivered"
        for event_id in r.get("event_ids", [r["event_id"]])
    ]
    assert sorted(delivered) == [o["id"] for o in orders]
