"""The publisher's commands on PostgreSQL, beside a sink and `publisher serve` as
separate processes: `--db` takes a postgresql:// URI for every command; intake in
another process (this one: the one-shot commands run to completion in the test
process) wakes `publisher serve` through NOTIFY at once, however long its poll
interval; with `prepare=off` (for PgBouncer) it polls; a second serve on the same
database is a worker standing by, which takes the line over when the first is
killed. The test server trusts loopback: no password is given anywhere (a real one
comes from PGPASSWORD or a .pgpass file, never from the command line)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from cli_support import run_publisher
from support import LOOPBACK, wait_until

if TYPE_CHECKING:
    from conftest import StartPublisher, StartSink

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("like_a_child_process")]
Capsys = pytest.CaptureFixture[str]

LONG_POLL = ("--poll-interval", "30")  # nothing but a wake-up delivers within a test
WAKE_WITHIN_S = 3.0


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def execute(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


def sent(url: str) -> dict[str, int]:
    return dict(rows(url, "SELECT id, sent FROM outbox_entries"))


def publisher(capsys: Capsys, *args: str) -> str:
    done = run_publisher(capsys, *args)
    assert done.status == 0, done.err
    assert "Traceback" not in done.err
    return done.out


def accept(capsys: Capsys, url: str, event_id: str, sku: str = "snack") -> None:
    out = publisher(capsys, "accept", "--db", url, "--id", event_id, "--sku", sku, "--qty", "1")
    assert out == f"accepted {event_id}\n"


def test_every_command_works_on_a_postgresql_database(
    pg_database: str, sink_process: StartSink, capsys: Capsys, tmp_path: Path
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    for event_id in ("o-1", "o-2", "o-3"):
        accept(capsys, pg_database, event_id)
    status = json.loads(publisher(capsys, "status", "--db", pg_database, "--json"))
    assert (status["pending"], status["head"]["id"]) == (3, "o-1")
    publisher(capsys, "quarantine", "--db", pg_database, "o-2", "--reason", "hold", "--by", "op")
    listed = publisher(capsys, "list", "--db", pg_database, "--state", "quarantined", "--json")
    assert [json.loads(line)["id"] for line in listed.splitlines()] == ["o-2"]

    out = publisher(capsys, "dispatch", "--db", pg_database, "--sink", sink.url)
    assert out == "delivered 2: o-1 o-3\n"
    out = publisher(capsys, "redrive", "--db", pg_database, "o-2", "--by", "op")
    assert out == "redriven o-2; 1 delivered past it: o-3\n"
    assert publisher(capsys, "dispatch", "--db", pg_database, "--sink", sink.url) == (
        "delivered 1: o-2\n"
    )
    trace = json.loads(
        publisher(capsys, "trace", "--db", pg_database, "o-2", "--sink", sink.url, "--json")
    )
    assert [stage["proof"] for stage in trace["stages"]] == ["proven"] * len(trace["stages"])
    assert sent(pg_database) == {"o-1": 1, "o-2": 1, "o-3": 1}
    execute(pg_database, "UPDATE outbox_entries SET sent_at = sent_at - 7200 WHERE id = 'o-1'")
    assert publisher(capsys, "prune", "--db", pg_database, "--older-than", "1h") == (
        "pruned 1 sent entries\n"
    )
    assert sorted(sent(pg_database)) == ["o-2", "o-3"]


@pytest.mark.parametrize("prepare", ["on", "off"])
def test_serve_delivers_intake_from_another_process_woken_or_by_polling(
    prepare: str,
    pg_database: str,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    capsys: Capsys,
    tmp_path: Path,
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    url = f"{pg_database}&prepare={prepare}"  # after the search_path pg_database sets
    # prepare=off (a transaction pooler): no LISTEN, so a short poll interval instead.
    poll = LONG_POLL if prepare == "on" else ("--poll-interval", "0.5")
    publisher_process("--db", url, "--sink", sink.url, "--host", LOOPBACK, "--port", "0", *poll)
    time.sleep(0.3)  # the relay has looked once and waits
    for n in range(3):
        started = time.monotonic()
        event_id = f"w-{n}"
        accept(capsys, url, event_id)
        wait_until(lambda: sent(pg_database).get(event_id) == 1, timeout_s=10)  # noqa: B023
        took = time.monotonic() - started
        assert took < WAKE_WITHIN_S, f"delivered after {took:.2f} s"


def test_a_second_serve_on_the_same_database_is_a_standby_worker_that_takes_over(
    pg_database: str,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    capsys: Capsys,
    tmp_path: Path,
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    serve = ("--sink", sink.url, "--host", LOOPBACK, "--port", "0", "--lease-ttl", "1")
    first = publisher_process("--db", pg_database, *serve, "--worker-id", "w1")
    accept(capsys, pg_database, "before")
    wait_until(lambda: sent(pg_database).get("before") == 1)
    second = publisher_process("--db", pg_database, *serve, "--worker-id", "w2")
    # On PostgreSQL a second serve is a worker: up, standing by while w1 holds the line.
    accept(capsys, pg_database, "beside")
    wait_until(lambda: sent(pg_database).get("beside") == 1)
    assert second.proc.poll() is None
    assert rows(pg_database, "SELECT line, owner, epoch FROM outbox_line_leases") == [
        ("*", "w1", 1)
    ]
    refused = run_publisher(capsys, "dispatch", "--db", pg_database, "--sink", sink.url)
    assert refused.status == 1
    assert refused.err.count("\n") == 1, refused.err
    assert "line '*' is being delivered by relay worker w1" in refused.err
    first.kill()  # SIGKILL: its lease runs out within a ttl, and w2 takes the line over
    accept(capsys, pg_database, "after")
    wait_until(lambda: sent(pg_database).get("after") == 1, timeout_s=10)
    assert rows(pg_database, "SELECT line, owner, epoch FROM outbox_line_leases") == [
        ("*", "w2", 2)
    ]
    second.stop()  # SIGTERM: releases the line and forgets the worker
    assert rows(pg_database, "SELECT owner FROM outbox_line_leases") == [(None,)]
    # w1, killed, is left until it is forgotten (not live: not seen within a ttl).
    assert rows(pg_database, "SELECT worker FROM outbox_relay_workers") == [("w1",)]
    out = publisher(capsys, "dispatch", "--db", pg_database, "--sink", sink.url)
    assert out == "delivered 0\n"
