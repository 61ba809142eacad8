"""`publisher serve` and the operations commands as real OS processes on loopback.

The sink and the publisher run as their own processes; outcomes are read from both
database files through independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import (
    LOOPBACK,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    placed,
    post_event,
    post_order,
    sent_flags,
    serve_args,
    wait_until,
)

from publisher.store import Outbox
from shared import payload_digest

if TYPE_CHECKING:
    from conftest import Query, RunCli, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

FAST_SERVE = (
    "--poll-interval",
    "0.2",
    "--retry-base",
    "0.05",
    "--retry-cap",
    "0.5",
    "--send-timeout",
    "2",
)


# ---------------------------------------------------------------- small helpers


def order(n: int, qty: int = 1, sku: str = "snack") -> dict[str, Any]:
    return {"id": f"order-{n:03d}", "sku": sku, "qty": qty}


def all_sent(db_rows: Query, db: Path, count: int) -> Callable[[], bool]:
    def check() -> bool:
        if not db.exists():
            return False
        states = sent_flags(db)
        return len(states) == count and all(states.values())

    return check


def cli_json(run_cli: RunCli, *args: str) -> Any:
    result = run_cli("publisher", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cli_lines(run_cli: RunCli, *args: str) -> list[dict[str, Any]]:
    result = run_cli("publisher", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


# ---------------------------------------------------------------- running the service


def test_posted_orders_are_delivered_logged_as_json_and_sigterm_exits_zero(
    tmp_path: Path, sink_process: StartSink, publisher_process: StartPublisher, db_rows: Query
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    # A 5 s poll: only the wake-up on intake can deliver this fast.
    args = serve_args(db, sink.url, "--poll-interval", "5", "--log-format", "json")
    publisher = publisher_process(*args)
    orders = [order(n, qty=n) for n in range(1, 6)]

    for item in orders:
        assert post_order(publisher.port, item) == (201, {"id": item["id"], "result": "accepted"})
    took = wait_until(all_sent(db_rows, db, 5))

    assert took < 3.0
    inbox = db_rows(sink.db, "SELECT id, deliveries FROM inbox_events ORDER BY rowid")
    assert inbox == [(item["id"], 1) for item in orders]
    assert db_rows(sink.db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(15,)]

    publisher.signal(signal.SIGTERM)
    assert publisher.wait() == 0

    lines = publisher.log_lines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    deliveries = [r for r in records if r.get("message") == "delivery"]
    # Batch delivery (the default) logs one line per request: its IDs, first and last seq.
    assert [i for r in deliveries for i in r["event_ids"]] == [item["id"] for item in orders]
    for r in deliveries:
        assert (r["event_id"], r["count"], r["outcome"]) == (
            r["event_ids"][0],
            len(r["event_ids"]),
            "delivered",
        )
        assert r["last_seq"] - r["seq"] == r["count"] - 1
        assert r["attempt"] == 1
    assert deliveries[0]["seq"] == 1 and deliveries[-1]["last_seq"] == len(orders)
    assert all(
        isinstance(r["latency_ms"], int | float) and r["latency_ms"] >= 0 for r in deliveries
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_intake_waits_for_the_send_in_flight_and_exits_zero(
    tmp_path: Path, publisher_process: StartPublisher, db_rows: Query, sig: signal.Signals
) -> None:
    # A sink that takes connections (the kernel's backlog) and never answers.
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind((LOOPBACK, 0))
    silent.listen(8)
    silent.settimeout(STARTUP_TIMEOUT_S)
    db = tmp_path / "source.db"
    url = f"http://{LOOPBACK}:{silent.getsockname()[1]}/events"
    try:
        publisher = publisher_process(*serve_args(db, url, "--send-timeout", "2"))
        assert post_order(publisher.port, order(1))[0] == 201
        conn, _ = silent.accept()  # the delivery is in flight now
        with conn:
            publisher.signal(sig)
            signalled = time.monotonic()
            time.sleep(0.4)
            with pytest.raises(OSError):
                post_order(publisher.port, order(2), timeout_s=1.0)
            status = publisher.wait(STOP_TIMEOUT_S + 2)
            took = time.monotonic() - signalled
    finally:
        silent.close()

    assert status == 0, publisher.log.read_text()
    assert 1.0 <= took < 4.5, "it should wait for the in-flight send to time out, then exit"
    [(sent, attempts, error)] = db_rows(db, "SELECT sent, attempts, last_error FROM outbox_entries")
    assert (sent, attempts) == (0, 1)
    assert "no reply in time" in error
    assert db_rows(db, "SELECT id FROM outbox_orders") == [("order-001",)]


def test_orders_accepted_by_another_process_are_picked_up_by_polling(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    publisher_process(*serve_args(db, sink.url, *FAST_SERVE))

    result = run_cli(
        "publisher", "accept", "--db", str(db), "--id", "cli-1", "--sku", "x", "--qty", "4"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "accepted cli-1"

    wait_until(all_sent(db_rows, db, 1), 5.0)
    assert db_rows(sink.db, "SELECT id, deliveries FROM inbox_events") == [("cli-1", 1)]
    assert db_rows(sink.db, "SELECT qty FROM inbox_inventory WHERE sku = 'x'") == [(4,)]


def test_env_variables_work_instead_of_flags(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    child_env: dict[str, str],
    db_rows: Query,
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    env = {
        "OUTBOX_DB": str(db),
        "OUTBOX_SINK": sink.url,
        "OUTBOX_HOST": LOOPBACK,
        "OUTBOX_PORT": "0",
        "OUTBOX_POLL_INTERVAL": "0.2",
        "OUTBOX_LOG_FORMAT": "json",
    }
    publisher = publisher_process(env=env)  # no flags at all

    assert post_order(publisher.port, order(1, qty=3))[0] == 201
    wait_until(all_sent(db_rows, db, 1))
    assert db_rows(sink.db, "SELECT qty FROM inbox_inventory") == [(3,)]
    status = subprocess.run(
        [sys.executable, "-m", "publisher", "status", "--json"],
        capture_output=True,
        text=True,
        env={**child_env, "OUTBOX_DB": str(db), "OUTBOX_JSON": "1"},
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pending"] == 0
    publisher.signal(signal.SIGTERM)
    assert publisher.wait() == 0
    assert any(json.loads(line).get("outcome") == "delivered" for line in publisher.log_lines())


def test_help_shows_the_env_variable_names(run_cli: RunCli) -> None:
    serve = run_cli("publisher", "serve", "--help")
    assert serve.returncode == 0
    text = " ".join(serve.stdout.split())
    for name in (
        "OUTBOX_DB",
        "OUTBOX_SINK",
        "OUTBOX_HOST",
        "OUTBOX_PORT",
        "OUTBOX_POLL_INTERVAL",
        "OUTBOX_RETRY_BASE",
        "OUTBOX_RETRY_CAP",
        "OUTBOX_QUARANTINE_AFTER",
        "OUTBOX_SEND_TIMEOUT",
        "OUTBOX_LOG_FORMAT",
    ):
        assert f"[env {name}]" in text, name
    sink = run_cli("sink", "--help")
    assert sink.returncode == 0
    assert "[env OUTBOX_DB]" in " ".join(sink.stdout.split())


# ---------------------------------------------------------------- SIGKILL at any moment


@dataclass
class Poster:
    """Posts orders one after another until told to stop or the intake goes away."""

    port: int
    orders: list[dict[str, Any]]
    accepted: list[str]
    unknown: list[str]

    def run(self, stop: threading.Event) -> None:
        for item in self.orders:
            if stop.is_set():
                return
            try:
                status, _ = post_order(self.port, item, timeout_s=3.0)
            except (OSError, http.client.HTTPException, ValueError):
                self.unknown.append(item["id"])  # committed or not: we cannot tell
                return
            assert status in (200, 201), status
            self.accepted.append(item["id"])


def test_sigkill_mid_stream_then_restart_delivers_every_order_exactly_once(
    tmp_path: Path, sink_process: StartSink, publisher_process: StartPublisher, db_rows: Query
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    orders = [order(n, qty=n % 7 + 1, sku=f"sku-{n % 3}") for n in range(120)]
    first = publisher_process(*serve_args(db, sink.url, *FAST_SERVE))
    poster = Poster(first.port, orders, [], [])
    stop = threading.Event()
    thread = threading.Thread(target=poster.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(poster.accepted) >= 30, 15.0)
        assert first.kill() == -signal.SIGKILL  # while orders and deliveries are in flight
    finally:
        stop.set()
        thread.join(10.0)
    assert not thread.is_alive()
    assert len(poster.accepted) < len(orders), "the kill came after the last order"

    second = publisher_process(*serve_args(db, sink.url, *FAST_SERVE))
    done = set(poster.accepted)
    for item in orders:
        if item["id"] not in done:
            status, body = post_order(second.port, item)
            assert status in (200, 201), body  # 200: it was committed before the kill
    wait_until(all_sent(db_rows, db, len(orders)), 15.0)

    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    source_orders = db_rows(db, "SELECT id, sku, qty FROM outbox_orders ORDER BY id")
    assert [r[0] for r in source_orders] == sorted(item["id"] for item in orders)
    assert set(sent_flags(db).values()) == {1}
    inbox = db_rows(sink.db, "SELECT id, payload FROM inbox_events ORDER BY id")
    assert [r[0] for r in inbox] == [r[0] for r in source_orders]  # each ID once
    for (event_id, payload), (_, sku, qty) in zip(inbox, source_orders, strict=True):
        assert json.loads(payload) == placed(event_id, sku, qty)
    expected: dict[str, int] = {}
    for item in orders:
        expected[item["sku"]] = expected.get(item["sku"], 0) + item["qty"]
    assert dict(db_rows(sink.db, "SELECT sku, qty FROM inbox_inventory")) == expected


# ---------------------------------------------------------------- operations commands


@pytest.fixture
def three_pending(tmp_path: Path) -> Path:
    """A source DB file holding pending orders a, b, c (qty 1, 2, 3)."""
    db = tmp_path / "source.db"

    async def fill() -> None:
        async with Outbox.open(db) as outbox:
            for event_id, qty in (("a", 1), ("b", 2), ("c", 3)):
                assert await outbox.accept({"id": event_id, "sku": "snack", "qty": qty})

    asyncio.run(fill())
    return db


def test_quarantine_list_redrive_and_status_from_the_command_line(
    tmp_path: Path,
    three_pending: Path,
    sink_process: StartSink,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    db = str(three_pending)
    sink = sink_process(tmp_path / "sink.db")

    quarantined = run_cli(
        "publisher", "quarantine", "a", "--db", db, "--reason", "bad sku", "--by", "alice"
    )
    assert quarantined.returncode == 0, quarantined.stderr
    again = run_cli("publisher", "quarantine", "a", "--db", db, "--reason", "again")
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "quarantined" in again.stderr
    pending_redrive = run_cli("publisher", "redrive", "b", "--db", db)
    assert pending_redrive.returncode == 1
    assert "pending" in pending_redrive.stderr
    assert db_rows(three_pending, "SELECT count(*) FROM outbox_quarantines") == [(1,)]

    [held] = cli_lines(run_cli, "list", "--db", db, "--state", "quarantined", "--json")
    assert (held["id"], held["seq"], held["state"]) == ("a", 1, "quarantined")
    assert [(q["reason"], q["quarantined_by"]) for q in held["quarantines"]] == [
        ("bad sku", "alice")
    ]
    pending = cli_lines(run_cli, "list", "--db", db, "--state", "pending", "--json")
    assert [(e["id"], e["seq"]) for e in pending] == [("b", 2), ("c", 3)]

    delivered = run_cli("publisher", "dispatch", "--db", db, "--sink", sink.url)
    assert delivered.returncode == 0, delivered.stderr
    assert db_rows(sink.db, "SELECT id FROM inbox_events ORDER BY rowid") == [("b",), ("c",)]

    redriven = run_cli("publisher", "redrive", "a", "--db", db, "--by", "bob")
    assert redriven.returncode == 0, redriven.stderr
    assert redriven.stdout.strip() == "redriven a; 2 delivered past it: b c"
    status = cli_json(run_cli, "status", "--db", db, "--json")
    assert (status["pending"], status["quarantined"], status["head"]["id"]) == (1, 0, "a")
    assert status["head"]["seq"] == 1
    [back] = cli_lines(run_cli, "list", "--db", db, "--state", "pending", "--json")
    [record] = back["quarantines"]
    assert (record["released_as"], record["released_by"]) == ("redriven", "bob")
    assert record["delivered_past"] == ["b", "c"]
    text = run_cli("publisher", "list", "--db", db, "--state", "pending")
    assert "redriven (2 delivered past it: b c)" in text.stdout

    assert run_cli("publisher", "dispatch", "--db", db, "--sink", sink.url).returncode == 0
    sent = cli_lines(run_cli, "list", "--db", db, "--state", "sent", "--json")
    assert [e["id"] for e in sent] == ["c", "b", "a"]  # newest first by seq
    assert db_rows(sink.db, "SELECT id FROM inbox_events ORDER BY rowid") == [
        ("b",),
        ("c",),
        ("a",),
    ]
    assert db_rows(sink.db, "SELECT qty FROM inbox_inventory") == [(6,)]


def test_blocked_head_from_a_running_service_in_status_and_trace(
    tmp_path: Path, publisher_process: StartPublisher, run_cli: RunCli, closed_port: int
) -> None:
    db = tmp_path / "source.db"
    url = f"http://{LOOPBACK}:{closed_port}/events"
    publisher = publisher_process(*serve_args(db, url, *FAST_SERVE))
    assert post_order(publisher.port, order(1))[0] == 201
    assert post_order(publisher.port, order(2))[0] == 201

    def blocked() -> bool:
        figures = cli_json(run_cli, "status", "--db", str(db), "--json")
        return bool(figures["head_blocked"]) and figures["head"]["attempts"] >= 2

    wait_until(blocked, 10.0)
    text = run_cli("publisher", "status", "--db", str(db))
    assert "BLOCKED" in text.stdout and "order-001" in text.stdout
    trace = cli_json(run_cli, "trace", "order-001", "--db", str(db), "--sink", url, "--json")
    assert [s["proof"] for s in trace["stages"]] == [
        "proven",
        "proven",
        "unknown",
        "not proven",
        "not proven",
    ]
    assert trace["attempts"] >= 2
    assert trace["last_error"]


def test_trace_and_prune_from_the_command_line(
    tmp_path: Path,
    three_pending: Path,
    sink_process: StartSink,
    run_cli: RunCli,
    closed_port: int,
    db_rows: Query,
) -> None:
    db = str(three_pending)
    sink = sink_process(tmp_path / "sink.db")
    assert (
        run_cli("publisher", "dispatch", "--db", db, "--sink", sink.url, "--limit", "2").returncode
        == 0
    )

    delivered = cli_json(run_cli, "trace", "a", "--db", db, "--sink", sink.url, "--json")
    assert [s["name"] for s in delivered["stages"]] == [
        "accepted",
        "queued",
        "received",
        "acknowledged",
        "marked",
    ]
    assert [s["proof"] for s in delivered["stages"]] == ["proven"] * 5
    assert payload_digest(placed("a", "snack", 1)) in delivered["stages"][3]["evidence"]

    pending = cli_json(run_cli, "trace", "c", "--db", db, "--sink", sink.url, "--json")
    assert [s["proof"] for s in pending["stages"]] == ["proven", "proven"] + ["not proven"] * 3

    closed = f"http://{LOOPBACK}:{closed_port}/events"
    unreachable = cli_json(run_cli, "trace", "a", "--db", db, "--sink", closed, "--json")
    assert [s["proof"] for s in unreachable["stages"]] == [
        "proven",
        "proven",
        "unknown",
        "proven",
        "proven",
    ]
    assert "could not be asked" in unreachable["stages"][2]["evidence"]

    table = run_cli("publisher", "trace", "a", "--db", db, "--sink", closed)
    assert table.returncode == 0
    assert re.search(r"3 received\s+unknown", table.stdout), table.stdout

    missing = run_cli("publisher", "trace", "zzz", "--db", db, "--json")
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["stages"][0]["proof"] == "not proven"

    kept = run_cli("publisher", "prune", "--db", db, "--older-than", "1h")
    assert (kept.returncode, kept.stdout.strip()) == (0, "pruned 0 sent entries")
    time.sleep(0.01)
    pruned = run_cli("publisher", "prune", "--db", db, "--older-than", "0s")
    assert (pruned.returncode, pruned.stdout.strip()) == (0, "pruned 2 sent entries")
    assert db_rows(three_pending, "SELECT id, sent FROM outbox_entries") == [("c", 0)]
    assert db_rows(three_pending, "SELECT count(*) FROM outbox_orders") == [(3,)]

    after = cli_json(run_cli, "trace", "a", "--db", db, "--sink", sink.url, "--json")
    assert [s["proof"] for s in after["stages"]] == [
        "proven",
        "unknown",
        "proven",
        "unknown",
        "unknown",
    ]
    bad = run_cli("publisher", "prune", "--db", db, "--older-than", "soon")
    assert bad.returncode == 2


def order_args(event: dict[str, Any]) -> tuple[str, ...]:
    return ("--id", event["id"], "--sku", event["sku"], "--qty", str(event["qty"]))


def post_to_sink(sink_url: str, event: dict[str, Any]) -> int:
    """POST one event straight to a sink on loopback; the status."""
    return post_event(int(sink_url.rsplit(":", 1)[1].split("/")[0]), event)


@pytest.mark.parametrize("ordering", ["global", "sku"])
@pytest.mark.parametrize("operator_action", ["quarantine", "redrive"])
def test_an_operator_unblocking_the_head_takes_effect_within_a_poll_interval(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
    ordering: str,
    operator_action: str,
) -> None:
    # The sink already holds order-002 with another payload: the publisher's order-002
    # is refused with 409 on every attempt, and the relay waits out the full retry cap
    # (15 to 30 s by default) between attempts. An operator acting from another process
    # must not have to wait for that: within one poll interval the relay sees that the
    # head has left the line (quarantine), or that an entry before it is back (redrive).
    db = tmp_path / "source.db"
    sink = sink_process(tmp_path / "sink.db")
    assert post_to_sink(sink.url, order(2, qty=99)) == 200
    first = "order-001"
    for n in (1, 2, 3):
        accepted = run_cli("publisher", "accept", "--db", str(db), *order_args(order(n)))
        assert accepted.returncode == 0, accepted.stderr
    if operator_action == "redrive":
        # Held back before the relay starts; redriven, it is the head again, ahead of
        # the blocked one.
        held = run_cli("publisher", "quarantine", first, "--db", str(db), "--reason", "hold")
        assert held.returncode == 0, held.stderr
    publisher_process(*serve_args(db, sink.url, "--poll-interval", "0.2", "--ordering", ordering))

    def blocked_on_2() -> bool:
        figures = cli_json(run_cli, "status", "--db", str(db), "--json")
        return (
            figures["head"] is not None
            and figures["head"]["id"] == "order-002"
            and (figures["head"]["attempts"] >= 1)
        )

    wait_until(blocked_on_2, 10.0)
    time.sleep(0.5)  # the relay is now in its long wait after a permanent failure
    if operator_action == "quarantine":
        args = ("quarantine", "order-002", "--reason", "known conflict", "--by", "alice")
    else:
        args = ("redrive", first, "--by", "alice")
    done = run_cli("publisher", *args, "--db", str(db))
    assert done.returncode == 0, done.stderr

    moved = "order-003" if operator_action == "quarantine" else first
    took_s = wait_until(lambda: sent_flags(db).get(moved) == 1, 5.0)
    assert took_s < 3.0  # one poll interval (0.2 s) and a delivery, not 15 to 30 s
    assert sent_flags(db)["order-002"] == 0
