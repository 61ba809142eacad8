"""Batch delivery and lanes across real OS processes that share the same disk.

The publisher ends itself right after a verified batch ACK, before the mark; the
rerun resends the batch and the inbox absorbs it. `publisher serve --ordering sku`
runs as a process of its own. Outcomes are read from both database files through
independent sqlite3 connections.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shared import payload_digest

if TYPE_CHECKING:
    from conftest import Query, RunCli, StartSink

pytestmark = pytest.mark.e2e

CHAOS_EXIT = 73
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
WAIT_S = 10.0
POLL_S = 0.05
MAX_READS = 1_000
LISTENING = re.compile(r"publisher listening on http://127\.0\.0\.1:(\d+)/orders")

ORDERS = [("order-1", "snack", 7), ("order-2", "juice", 3), ("order-3", "snack", 5)]


def dispatch(run_cli: RunCli, source: Path, url: str, *extra: str) -> tuple[int, str, str]:
    result = run_cli("publisher", "dispatch", "--db", str(source), "--sink", url, *extra)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


def test_crash_after_a_batch_ack_marks_nothing_and_the_rerun_is_absorbed(
    tmp_path: Path, run_cli: RunCli, sink_process: StartSink, db_rows: Query
) -> None:
    source, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
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
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox ORDER BY rowid") == [
        (event_id, 1) for event_id in ids
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inventory ORDER BY sku") == [
        ("juice", 3),
        ("snack", 12),
    ]
    # ...and not one of them is marked: the hook ran before the mark.
    assert db_rows(source, "SELECT id, sent, ack FROM outbox ORDER BY seq") == [
        (event_id, 0, None) for event_id in ids
    ]

    status, stdout, stderr = dispatch(run_cli, source, sink.url, "--delivery", "batch")

    assert status == 0, stderr
    assert stdout.strip() == "delivered 3: order-1 order-2 order-3"
    assert db_rows(sink_db, "SELECT id, deliveries FROM inbox ORDER BY rowid") == [
        (event_id, 2) for event_id in ids
    ]
    assert db_rows(sink_db, "SELECT sku, qty FROM inventory ORDER BY sku") == [
        ("juice", 3),
        ("snack", 12),
    ]
    marks = db_rows(source, "SELECT id, sent, ack FROM outbox ORDER BY seq")
    assert [(event_id, sent) for event_id, sent, _ in marks] == [(i, 1) for i in ids]
    assert [json.loads(ack) for _, _, ack in marks] == [
        {"ack": i, "status": "duplicate", "sha256": payload_digest({"id": i, "sku": s, "qty": q})}
        for i, s, q in ORDERS
    ]
    assert sink.proc.poll() is None, "the sink process should still be serving"


# ---------------------------------------------------------------- serve --ordering sku


def read_first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        for _ in range(MAX_READS):
            if b"\n" in buffer:
                return buffer.split(b"\n", 1)[0].decode()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"exited with {proc.wait(STOP_TIMEOUT_S)} before listening")
            buffer += chunk
    raise TimeoutError(f"no listening line within {timeout_s}s: {buffer!r}")


@pytest.fixture
def publisher_serve(child_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start `publisher serve` on port 0; returns (process, port). Stopped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> tuple[subprocess.Popen[bytes], int, Path]:
        log = tmp_path / f"publisher-{len(started)}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "publisher", "serve", *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=child_env,
                cwd=tmp_path,
            )
        started.append(proc)
        try:
            line = read_first_line(proc, STARTUP_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{exc}; log: {log.read_text()!r}") from None
        match = LISTENING.fullmatch(line)
        assert match is not None, f"unexpected first line: {line!r}"
        return proc, int(match[1]), log

    yield start
    for proc in reversed(started):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()


def post_order(port: int, order: dict[str, Any]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        conn.request("POST", "/orders", json.dumps(order), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def wait_until(check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    started = time.monotonic()
    for _ in range(int(timeout_s / POLL_S) + 10):
        if check():
            return
        if time.monotonic() - started >= timeout_s:
            break
        time.sleep(POLL_S)
    raise AssertionError(f"condition not met within {timeout_s}s")


def test_serve_with_sku_ordering_delivers_posted_orders_and_sigterm_exits_zero(
    tmp_path: Path, sink_process: StartSink, publisher_serve: Callable[..., Any], db_rows: Query
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    source = tmp_path / "source.db"
    proc, port, log = publisher_serve(
        "--db", str(source), "--sink", sink.url, "--host", LOOPBACK, "--port", "0",
        "--ordering", "sku", "--lanes", "3", "--poll-interval", "5", "--retry-base", "0.05",
        "--retry-cap", "0.5", "--send-timeout", "2", "--log-format", "json",
    )  # fmt: skip
    orders = [
        {"id": f"order-{n:02d}", "sku": ("snack", "juice", "tea", "soap")[n % 4], "qty": n}
        for n in range(1, 13)
    ]

    for order in orders:
        assert post_order(port, order) == (201, {"id": order["id"], "result": "accepted"})

    def all_sent() -> bool:
        states = dict(db_rows(source, "SELECT id, sent FROM outbox"))
        return len(states) == len(orders) and all(states.values())

    wait_until(all_sent)
    applied = [r[0] for r in db_rows(sink.db, "SELECT id FROM inbox ORDER BY rowid")]
    assert sorted(applied) == [o["id"] for o in orders]
    for sku in ("snack", "juice", "tea", "soap"):
        expected = [o["id"] for o in orders if o["sku"] == sku]
        assert [i for i in applied if i in expected] == expected, sku
    inventory = dict(db_rows(sink.db, "SELECT sku, qty FROM inventory"))
    assert inventory == {
        sku: sum(o["qty"] for o in orders if o["sku"] == sku)
        for sku in ("snack", "juice", "tea", "soap")
    }
    assert db_rows(sink.db, "SELECT max(deliveries) FROM inbox") == [(1,)]
    assert db_rows(source, "SELECT count(*) FROM outbox WHERE ack IS NULL") == [(0,)]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    started = [r for r in records if r.get("message") == "relay started"]
    assert [r.get("ordering") for r in started] == ["sku"]
    delivered = [r["event_id"] for r in records if r.get("outcome") == "delivered"]
    assert sorted(delivered) == [o["id"] for o in orders]
