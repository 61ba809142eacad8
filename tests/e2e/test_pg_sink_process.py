"""A real sink process on PostgreSQL, killed right after it acknowledged: a new one on
the same database knows the event (a redelivery is a duplicate, applied once), and
GET /events/{id} and /metrics say so. Real processes started from the CLI, SIGKILL,
the session's throwaway server; rows read back with psycopg."""

from __future__ import annotations

import http.client
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from pg_faults import PgAccess
from support import LOOPBACK, STOP_TIMEOUT_S, listening, spawn, stop_process

pytestmark = pytest.mark.e2e

LISTENING = re.compile(r"sink listening on http://127\.0\.0\.1:(\d+)/events")
EVENTS = [{"id": f"order-{n}", "sku": "snack", "qty": n} for n in (1, 2, 3)]


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
    try:
        headers = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_sink_killed_after_its_ack_is_replaced_by_one_that_knows_the_event(
    pg_database: str, child_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["-m", "sink", "--db", pg_database, "--host", LOOPBACK, "--port", "0"]
    first = spawn(args, tmp_path / "first.log", child_env, tmp_path)
    try:
        port = int(listening(first, tmp_path / "first.log", LISTENING, "sink")[1])
        for event in EVENTS:
            status, body = call(port, "POST", "/events", event)
            assert (status, json.loads(body)["status"]) == (200, "applied")
        first.send_signal(signal.SIGKILL)  # right after the last ACK: no shutdown code
        assert first.wait(timeout=STOP_TIMEOUT_S) == -signal.SIGKILL
    finally:
        stop_process(first)

    second = spawn(args, tmp_path / "second.log", child_env, tmp_path)
    try:
        port = int(listening(second, tmp_path / "second.log", LISTENING, "sink")[1])
        status, body = call(port, "POST", "/events", EVENTS[-1])
        assert (status, json.loads(body)["status"]) == (200, "duplicate")
        status, body = call(port, "GET", "/events/order-3")
        record = json.loads(body)
        assert (status, record["deliveries"]) == (200, 2)
        status, body = call(port, "GET", "/metrics")
        assert status == 200 and "sink_inbox_events 3.0" in body.decode()
    finally:
        assert stop_process(second) == 0

    database = PgAccess(pg_database, "inbox_health")
    rows = database.query("SELECT id, applied_seq FROM inbox_events ORDER BY applied_seq")
    assert [event_id for event_id, _ in rows] == [e["id"] for e in EVENTS]
    applied_seq: dict[str, int] = dict(rows)
    assert applied_seq["order-3"] == record["applied_seq"]
    assert database.query("SELECT qty FROM inbox_inventory") == [(6,)]
