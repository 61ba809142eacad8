"""`python -m sink --db` with a sqlite: URL opens that file, a postgresql:// URI that
database. Real sink processes serving; the files read back with sqlite3, the
database with psycopg. A location the sink cannot open (one line, nothing created)
needs no process: tests/unit/test_sink_cli.py."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pg_faults import PgAccess
from support import LOOPBACK, listening, spawn, stop_process

if TYPE_CHECKING:
    from conftest import Query

pytestmark = pytest.mark.e2e

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
LISTENING = re.compile(r"sink listening on http://127\.0\.0\.1:(\d+)/events")


def post_event(port: int, event: dict[str, Any]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
    try:
        conn.request("POST", "/events", json.dumps(event), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture
def sink_at(child_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """Start `python -m sink --db LOCATION` in tmp_path; returns its port. Stopped at
    teardown, each with exit status 0."""
    started: list[subprocess.Popen[bytes]] = []

    def start(location: str | None, env: dict[str, str] | None = None) -> int:
        log = tmp_path / f"sink-{len(started)}.log"
        db = [] if location is None else ["--db", location]
        args = ["-m", "sink", *db, "--host", LOOPBACK, "--port", "0"]
        proc = spawn(args, log, {**child_env, **(env or {})}, tmp_path)
        started.append(proc)
        return int(listening(proc, log, LISTENING, "sink")[1])

    yield start
    for proc in reversed(started):
        assert stop_process(proc) == 0


@pytest.mark.parametrize("form", ["sqlite:///ABS", "sqlite:REL"])
def test_a_sqlite_url_opens_that_file(
    sink_at: Any, tmp_path: Path, db_rows: Query, form: str
) -> None:
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "inbox.db"
    location = form.replace("/ABS", str(path)).replace("REL", "data/inbox.db")

    port = sink_at(location)
    status, ack = post_event(port, EVENT)

    assert (status, ack["ack"], ack["status"]) == (200, "order-1", "applied")
    assert db_rows(path, "SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert db_rows(path, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.suffix == ".db") == [
        "inbox.db"
    ]


@pytest.mark.parametrize("given", ["--db", "OUTBOX_DB"])
def test_a_postgresql_uri_opens_that_database(
    sink_at: Any, tmp_path: Path, pg_database: str, given: str
) -> None:
    if given == "--db":
        port = sink_at(pg_database)
    else:
        port = sink_at(None, {"OUTBOX_DB": pg_database})
    status, ack = post_event(port, EVENT)

    assert (status, ack["ack"], ack["status"]) == (200, "order-1", "applied")
    database = PgAccess(pg_database, "inbox_health")
    assert database.query("SELECT id, deliveries FROM inbox_events") == [("order-1", 1)]
    assert database.query("SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]
    assert list(tmp_path.glob("*.db")) == []
