"""The relay workers of `publisher serve` as real processes: --sink may be repeated
(a URL that cannot be reached is failed over), status, list, trace and /metrics show
the lines a worker holds, and status every worker, standby or gone. The operator's
commands (status, list, trace) read what the serving processes wrote, run to
completion in the test process; the usage errors of --worker-id and --lease-ttl are
in tests/unit/test_cli_usage.py."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_support import Ran, run_publisher
from support import LOOPBACK, post_order, wait_until

if TYPE_CHECKING:
    from conftest import PublisherProcess, Query, StartPublisher, StartSink

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("like_a_child_process")]
Capsys = pytest.CaptureFixture[str]


def sent(db_rows: Query, db: Path) -> dict[str, int]:
    return dict(db_rows(db, "SELECT id, sent FROM outbox_entries"))


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def test_a_sink_url_that_cannot_be_reached_is_failed_over_to_the_next(
    sink_process: StartSink,
    publisher_process: StartPublisher,
    tmp_path: Path,
    closed_port: int,
    db_rows: Query,
) -> None:
    sink = sink_process(tmp_path / "sink.db")
    db = tmp_path / "source.db"
    down = f"http://{LOOPBACK}:{closed_port}/events"
    serve = publisher_process(
        "--db", str(db), "--sink", down, "--sink", sink.url, "--host", LOOPBACK, "--port", "0",
        "--poll-interval", "0.1",
    )  # fmt: skip
    for n in range(3):
        status, _ = post_order(serve.port, {"id": f"o{n}", "sku": "snack", "qty": 1})
        assert status == 201
    wait_until(lambda: sent(db_rows, db) == {"o0": 1, "o1": 1, "o2": 1})
    assert db_rows(tmp_path / "sink.db", "SELECT count(*) FROM inbox_events") == [(3,)]
    assert metrics(serve.port)["publisher_sink_failovers_total"] >= 1


def test_status_list_trace_and_metrics_show_the_lines_a_worker_holds(
    sink_process: StartSink,
    publisher_process: StartPublisher,
    capsys: Capsys,
    tmp_path: Path,
    db_rows: Query,
) -> None:
    # The sink refuses SKU "bad": that lane keeps failing and backing off, and keeps its
    # lease meanwhile; "snack" is drained and its lease released.
    sink = sink_process(tmp_path / "sink.db", "--chaos", "reject-sku=bad")
    db = tmp_path / "source.db"
    serve = publisher_process(
        "--db", str(db), "--sink", sink.url, "--host", LOOPBACK, "--port", "0",
        "--ordering", "sku", "--worker-id", "w1", "--lease-ttl", "30", "--poll-interval", "0.1",
    )  # fmt: skip
    for event_id, sku in (("b1", "bad"), ("s1", "snack"), ("b2", "bad")):
        status, _ = post_order(serve.port, {"id": event_id, "sku": sku, "qty": 1})
        assert status == 201
    wait_until(lambda: sent(db_rows, db).get("s1") == 1)
    wait_until(lambda: metrics(serve.port)["publisher_lines_owned"] == 1)
    assert metrics(serve.port)["publisher_relay_workers_live"] == 1

    done = run_publisher(capsys, "status", "--db", str(db), "--json")
    assert done.status == 0, done.err
    figures = json.loads(done.out)
    assert figures["workers"] == ["w1"]
    lines = {line["line"]: line for line in figures["lines"]}
    assert (lines["bad"]["owner"], lines["bad"]["epoch"]) == ("w1", 1)
    assert 0 < lines["bad"]["expires_in_seconds"] <= 30
    assert (lines["snack"]["owner"], lines["snack"]["epoch"]) == (None, 1)

    text = run_publisher(capsys, "status", "--db", str(db)).out
    assert "workers      1 holding leases: w1" in text
    assert "line 'bad'      held by w1, epoch 1, expires in " in text
    assert "lines free   1 (released, any worker may take them)" in text

    listed = run_publisher(capsys, "list", "--db", str(db)).out.splitlines()
    assert len(listed) == 2 and all("line=bad owner=w1 epoch=1" in line for line in listed)
    listed_json = run_publisher(capsys, "list", "--db", str(db), "--json").out
    entries = [json.loads(line) for line in listed_json.splitlines()]
    assert {(e["id"], e["lease"]["owner"]) for e in entries} == {("b1", "w1"), ("b2", "w1")}

    trace = run_publisher(capsys, "trace", "b2", "--db", str(db)).out
    assert "line 'bad': held by w1, epoch 1, expires in " in trace
    traced = json.loads(run_publisher(capsys, "trace", "s1", "--db", str(db), "--json").out)
    assert [(line["line"], line["owner"]) for line in traced["lines"]] == [("snack", None)]

    serve.stop()  # SIGTERM: every lease released, the worker forgotten
    assert serve.proc.returncode == 0
    assert db_rows(db, "SELECT line, owner FROM outbox_line_leases ORDER BY line") == [
        ("bad", None),
        ("snack", None),
    ]
    assert db_rows(db, "SELECT count(*) FROM outbox_relay_workers") == [(0,)]


def test_status_lists_standby_and_gone_workers_with_the_lines_each_holds(
    pg_database: str,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    capsys: Capsys,
    tmp_path: Path,
    db_rows: Query,
) -> None:
    # Global order on PostgreSQL: w1 delivers, w2 stands by holding nothing. Both are
    # listed; once w2 is SIGKILLed it shows as gone, and w1 stopped with SIGTERM is
    # forgotten at once.
    sink = sink_process(tmp_path / "sink.db")

    def start(worker: str) -> PublisherProcess:
        return publisher_process(
            "--db", pg_database, "--sink", sink.url, "--host", LOOPBACK, "--port", "0",
            "--worker-id", worker, "--lease-ttl", "1", "--poll-interval", "0.1",
        )  # fmt: skip

    def run_status(*args: str) -> Ran:  # publisher status
        return run_publisher(capsys, "status", "--db", pg_database, *args)

    def status(*extra: str) -> dict[str, Any]:  # status --json
        done = run_status("--json", *extra)
        assert done.status == 0, done.err
        found: dict[str, Any] = json.loads(done.out)
        return found

    def listed(*extra: str) -> list[tuple[str, bool, list[str]]]:
        return [(w["worker"], w["live"], w["lines"]) for w in status(*extra)["relay_workers"]]

    def rows() -> list[tuple[Any, ...]]:  # each worker and how long ago it beat
        return db_rows(
            pg_database,
            "SELECT worker, extract(epoch FROM clock_timestamp()) - seen_at"
            " FROM outbox_relay_workers ORDER BY worker",
        )

    w1 = start("w1")
    wait_until(lambda: db_rows(pg_database, "SELECT owner FROM outbox_line_leases") == [("w1",)])
    w2 = start("w2")
    wait_until(lambda: len(rows()) == 2)
    figures = status()
    assert figures["workers"] == ["w1"]  # as before: the workers holding a lease
    assert [(w["worker"], w["live"], w["lines"]) for w in figures["relay_workers"]] == [
        ("w1", True, ["*"]),
        ("w2", True, []),
    ]
    with urllib.request.urlopen(f"http://{LOOPBACK}:{w1.port}/status", timeout=5) as reply:
        served = json.load(reply)["relay_workers"]
    assert [(w["worker"], w["lines"]) for w in served] == [("w1", ["*"]), ("w2", [])]

    w2.kill()
    wait_until(lambda: rows()[1][1] > 1.2)
    assert listed("--lease-ttl", "1") == [("w1", True, ["*"]), ("w2", False, [])]
    text = run_status("--lease-ttl", "1").out
    assert re.search(r"^worker 'w1'\s+live, up [\d.]+ s, seen [\d.]+ s ago, holds 1 line\(s\): \*$",
                     text, re.M), text  # fmt: skip
    assert re.search(r"^worker 'w2'\s+gone, not seen for [\d.]+ s \(ttl 1 s\), holds no line$",
                     text, re.M), text  # fmt: skip
    w1.stop()
    assert listed("--lease-ttl", "1") == [("w2", False, [])]

    done = run_status("--lease-ttl", "0")
    assert done.status == 2 and done.err.count("\n") == 1, done.err
    assert "argument --lease-ttl" in done.err
