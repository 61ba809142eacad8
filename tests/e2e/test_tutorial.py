"""The tutorial's commands, as real processes: the first event applied once (the
duplicate and the conflict), then the tutorial's own handler and schema (the effect
rows, a schema's 400, a handler's 422 blocking the line, the quarantine that unblocks
it). The handler shown in docs/tutorial/own-event-type.md is the file the sink runs."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import http_request, listening, stop_process, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial" / "own-event-type.md"
HANDLERS_FILE = ROOT / "examples" / "tutorial" / "handlers.py"
HANDLERS = "examples.tutorial.handlers:handlers"
SCHEMAS = "examples/tutorial/schemas"
CLI_TIMEOUT_S = 30.0
SINK_LISTENING = re.compile(r"sink listening on http://127\.0\.0\.1:(\d+)/events")
PUBLISHER_LISTENING = re.compile(r"publisher listening on http://127\.0\.0\.1:(\d+)/orders")


def script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def payment(event_id: str, key: str, cents: int, currency: str) -> dict[str, object]:
    return {
        "id": event_id,
        "type": "payment.captured",
        "key": key,
        "data": {"amount_cents": cents, "currency": currency},
    }


class Tutorial:
    """The two services of a tutorial page, started as the page starts them (with
    --port 0), and the commands it runs."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env["PYTHONPATH"]])}
        self.dir = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], pattern: re.Pattern[str]) -> int:
        log = self.dir / f"{name}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, env=self.env, cwd=ROOT
            )
        self.procs.append(proc)
        return int(listening(proc, log, pattern, name)[1])

    def services(self, *sink_args: str, publisher_args: tuple[str, ...] = ()) -> None:
        self.source, self.sink = self.dir / "source.db", self.dir / "sink.db"
        sink = [script("outbox-sink"), "--db", str(self.sink), "--port", "0", *sink_args]
        self.sink_port = self.start("sink", sink, SINK_LISTENING)
        self.sink_url = f"http://127.0.0.1:{self.sink_port}/events"
        serve = [script("outbox-publisher"), "serve", "--db", str(self.source)]
        serve += ["--sink", self.sink_url, "--port", "0", *publisher_args]
        self.port = self.start("publisher", serve, PUBLISHER_LISTENING)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [script("outbox-publisher"), *args, "--db", str(self.source)],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )

    def trace(self, event_id: str) -> str:
        done = self.cli("trace", event_id, "--sink", self.sink_url)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def sink_rows(self, sql: str) -> list[tuple[object, ...]]:
        with sqlite3.connect(self.sink) as conn:
            return conn.execute(sql).fetchall()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


@pytest.fixture
def tutorial(child_env: dict[str, str], tmp_path: Path) -> Iterator[Tutorial]:
    running = Tutorial(child_env, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_first_event_is_applied_once(tutorial: Tutorial) -> None:
    tutorial.services()
    p1 = payment("p-1", "c-9", 1999, "EUR")
    assert http_request(tutorial.port, "POST", "/events", p1) == (
        201,
        {"id": "p-1", "result": "accepted"},
    )
    wait_until(lambda: "5 marked         proven" in tutorial.trace("p-1"))
    trace = tutorial.trace("p-1")
    for stage in ("1 accepted", "2 queued", "3 received", "4 acknowledged", "5 marked"):
        assert re.search(rf"{stage} +proven ", trace), trace
    assert '"status": "applied"' in trace

    assert http_request(tutorial.port, "POST", "/events", p1) == (
        200,
        {"id": "p-1", "result": "duplicate"},
    )
    status, ack = http_request(tutorial.sink_port, "POST", "/events", p1)
    assert (status, ack["ack"], ack["status"]) == (200, "p-1", "duplicate")
    status, record = http_request(tutorial.sink_port, "GET", "/events/p-1")
    assert (status, record["deliveries"], record["applied_seq"]) == (200, 2, 1)

    other = payment("p-1", "c-9", 2500, "EUR")
    for port in (tutorial.port, tutorial.sink_port):
        status, body = http_request(port, "POST", "/events", other)
        assert (status, body["error"]) == (409, "conflict")
    listed = tutorial.cli("list", "--state", "sent")
    assert listed.returncode == 0 and " p-1 payment.captured key=c-9 " in listed.stdout


def test_own_handler_schema_reject_and_quarantine(tutorial: Tutorial) -> None:
    tutorial.services("--handlers", HANDLERS, publisher_args=("--schemas", SCHEMAS))
    said = (tutorial.dir / "publisher.log").read_text()
    assert "event types with a schema: payment.captured" in said, said
    for n, cents in ((1, 1999), (2, 500)):
        status, _ = http_request(
            tutorial.port, "POST", "/events", payment(f"p-{n}", "c-9", cents, "EUR")
        )
        assert status == 201
    totals = "SELECT customer, currency, total_cents FROM customer_totals"
    wait_until(lambda: tutorial.sink_rows(totals) == [("c-9", "EUR", 2499)])
    assert len(tutorial.sink_rows("SELECT * FROM captured_payments")) == 2
    status, ack = http_request(
        tutorial.sink_port, "POST", "/events", payment("p-1", "c-9", 1999, "EUR")
    )
    assert (status, ack["status"]) == (200, "duplicate")
    assert tutorial.sink_rows(totals) == [("c-9", "EUR", 2499)]

    status, body = http_request(tutorial.port, "POST", "/events", payment("p-3", "c-7", -5, "EUR"))
    assert (status, body["field"]) == (400, "/data/amount_cents")

    for event in (payment("p-3", "c-7", 1200, "GBP"), payment("p-4", "c-9", 300, "EUR")):
        assert http_request(tutorial.port, "POST", "/events", event)[0] == 201
    status, body = http_request(
        tutorial.sink_port, "POST", "/events", payment("p-3", "c-7", 1200, "GBP")
    )
    assert (status, body["detail"]) == (422, "currency GBP is not booked here")
    wait_until(lambda: "BLOCKED" in tutorial.cli("status").stdout)
    pending = tutorial.cli("list", "--state", "pending").stdout
    assert " p-3 " in pending and " p-4 " in pending

    done = tutorial.cli("quarantine", "p-3", "--reason", "GBP is not booked yet", "--by", "alice")
    assert (done.returncode, done.stdout) == (0, "quarantined p-3\n")
    wait_until(lambda: tutorial.sink_rows(totals) == [("c-9", "EUR", 2799)])
    quarantined = tutorial.cli("list", "--state", "quarantined").stdout
    assert "quarantined by alice: 'GBP is not booked yet'" in quarantined


def test_the_page_shows_the_handler_file() -> None:
    shown = re.search(r"```python notest\n(from __future__.*?)```", PAGE.read_text(), re.S)
    assert shown is not None, "the handler's code block is missing from the page"
    code = HANDLERS_FILE.read_text()
    assert shown[1] == code[code.index("from __future__") :]
