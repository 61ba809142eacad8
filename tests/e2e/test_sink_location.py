"""`python -m sink --db` with a sqlite: URL opens that file, a postgresql:// URI that
database; a location it cannot open is one line. Real sink processes; the files read
back with sqlite3, the database with psycopg."""

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
from support import LOOPBACK, listening, run_module, spawn, stop_process

if TYPE_CHECKING:
    from conftest import Query, RunCli

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
    assert db_rows(path, "SELECT id, deliveries FROM inbox") == [("order-1", 1)]
    assert db_rows(path, "SELECT sku, qty FROM inventory") == [("snack", 7)]
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
    assert database.query("SELECT id, deliveries FROM inbox") == [("order-1", 1)]
    assert database.query("SELECT sku, qty FROM inventory") == [("snack", 7)]
    assert list(tmp_path.glob("*.db")) == []


def assert_one_line(
    result: subprocess.CompletedProcess[str], tmp_path: Path, status: int, *words: str
) -> None:
    assert result.returncode == status
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("sink: ")
    for word in words:
        assert word in result.stderr
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == [], "nothing is created for a refused location"


@pytest.mark.parametrize("location", ["mysql://u@h/db", "postgresql://u@h/db?no_such_parameter=1"])
def test_a_location_no_backend_opens_is_one_line_and_status_2(
    tmp_path: Path, run_cli: RunCli, location: str
) -> None:
    result = run_cli("sink", "--db", location, "--port", "0")  # in tmp_path

    assert_one_line(result, tmp_path, 2)


def test_a_bad_outbox_db_is_one_line_and_status_2(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    env = {**child_env, "OUTBOX_DB": "mysql://u@h/db"}

    result = run_module("sink", "--port", "0", env=env, cwd=tmp_path, timeout=30)

    assert_one_line(result, tmp_path, 2, "mysql://")


def test_a_postgresql_server_that_cannot_be_reached_is_one_line_and_status_1(
    tmp_path: Path, run_cli: RunCli, closed_port: int
) -> None:
    location = f"postgresql://outbox@127.0.0.1:{closed_port}/sink"

    result = run_cli("sink", "--db", location, "--port", "0")

    assert_one_line(result, tmp_path, 1, location, "cannot connect")
