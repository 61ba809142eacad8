"""Text from outside, as a person reads it: a sink's reply, a reason or a name kept in a
record, a time the sink reports. Real `publisher` processes against a hostile sink on
loopback (a thread of this test answering CR LF, a fake log timestamp, ESC and OSC
sequences, a BEL and a bidi override): the text log keeps one line per record and
`status`, `list`, `trace` and an error line write no control character raw."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, post_order, serve_args, wait_until

if TYPE_CHECKING:
    from conftest import AcceptOrders, RunCli, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

FORGED = "2026-01-01 00:00:00,000 INFO publisher.relay: delivery event_id=forged outcome=delivered"
# A reply that would, written raw, end the log line, start a forged one, clear the
# screen, retitle the terminal, ring its bell and reverse the text after it.
HOSTILE = f"sink down\r\n{FORGED}\r\n\x1b[2J\x1b]0;owned\x07 \u202eevil".encode()
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")  # all but the line break
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [\w.]+: ")
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
ORDER = {"id": "order-1", "sku": "snack", "qty": 2}


@dataclass
class HostileSink:
    """Answers every delivery 500 with HOSTILE, and GET /events/ID with `record`."""

    record: dict[str, Any] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{LOOPBACK}:{self.server.server_address[1]}/events"


@pytest.fixture
def hostile_sink() -> Iterator[HostileSink]:
    sink = HostileSink()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer(500, HOSTILE, "text/plain")

        def do_GET(self) -> None:
            event_id = self.path.rsplit("/", 1)[-1]
            body = json.dumps({"id": event_id, **sink.record}).encode()
            self._answer(200, body, "application/json")

        def _answer(self, status: int, body: bytes, media: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads what the publisher wrote, not this

    sink.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    thread = threading.Thread(target=sink.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield sink
    sink.server.shutdown()
    sink.server.server_close()
    thread.join(timeout=5)


def assert_shown_escaped(text: str) -> None:
    """No control character raw (line breaks apart), and the reply's own visible."""
    assert RAW_CONTROLS.search(text) is None, text
    assert "Traceback" not in text, text


def failed_once(run_cli: RunCli, source: Path, sink: HostileSink) -> None:
    """order-1 accepted and sent once to the hostile sink by `publisher dispatch`,
    which records the failure (the reply's text) on the entry."""
    accepted = run_cli("publisher", "accept", "--db", str(source), *order_options())
    assert accepted.returncode == 0, accepted.stderr
    sent = run_cli("publisher", "dispatch", "--db", str(source), "--sink", sink.url)
    assert sent.returncode == 1
    assert_shown_escaped(sent.stderr)
    assert len(sent.stderr.splitlines()) == 1, sent.stderr
    assert "\\r\\n2026-01-01 00:00:00,000" in sent.stderr and "\\x1b[2J" in sent.stderr


def order_options() -> list[str]:
    return ["--id", ORDER["id"], "--sku", ORDER["sku"], "--qty", str(ORDER["qty"])]


# ---------------------------------------------------------------- the text log


def test_a_sinks_reply_cannot_forge_lines_of_the_text_log(
    tmp_path: Path, publisher_process: StartPublisher, hostile_sink: HostileSink
) -> None:
    source = tmp_path / "source.db"
    publisher = publisher_process(
        *serve_args(source, hostile_sink.url, "--retry-base", "0.05", "--retry-cap", "0.1"),
        "--log-format",
        "text",
    )
    assert post_order(publisher.port, ORDER)[0] == 201

    def failed_twice() -> bool:
        return sum("outcome=transient" in line for line in publisher.log_lines()) >= 2

    wait_until(failed_twice)
    publisher.stop()
    raw = publisher.log.read_bytes()
    text = raw.decode()
    assert b"\r" not in raw and b"\x1b" not in raw and b"\x07" not in raw
    assert_shown_escaped(text)
    for line in text.splitlines():
        # A record starts with its own time; a traceback's lines are indented.
        assert LOG_LINE.match(line) or line.startswith(" ") or not line.strip(), line
        assert not line.startswith("2026-01-01"), line
    attempts = [line for line in text.splitlines() if "outcome=transient" in line]
    assert all(LOG_LINE.match(line) for line in attempts)
    assert all(f"\\r\\n{FORGED}\\r\\n\\x1b[2J\\x1b]0;owned\\x07" in line for line in attempts)


# ---------------------------------------------------------------- the terminal


def test_status_list_and_trace_show_the_sinks_reply_escaped(
    tmp_path: Path, run_cli: RunCli, hostile_sink: HostileSink
) -> None:
    source = tmp_path / "source.db"
    failed_once(run_cli, source, hostile_sink)

    for command in ("status", "list", "trace"):
        args = ["order-1"] if command == "trace" else []
        shown = run_cli("publisher", command, "--db", str(source), *args)
        assert shown.returncode == 0, shown.stderr
        assert_shown_escaped(shown.stdout + shown.stderr)
        assert "\\x1b[2J" in shown.stdout, (command, shown.stdout)
        assert not any(line.startswith("2026-01-01") for line in shown.stdout.splitlines())


def test_a_reason_and_a_name_kept_with_control_characters_are_shown_escaped(
    tmp_path: Path, run_cli: RunCli, accept_orders: AcceptOrders
) -> None:
    # A record from before the rule (or written around it): trace and list must
    # still show it as text, not act on it.
    source = tmp_path / "source.db"
    accept_orders(source, ORDER)
    taken = run_cli("publisher", "quarantine", "order-1", "--db", str(source), "--reason", "x")
    assert taken.returncode == 0, taken.stderr
    with sqlite3.connect(source) as db:
        db.execute(
            "UPDATE outbox_quarantines SET reason = ?, quarantined_by = ?",
            ("bad\r\nsku\x1b[31m", "ops\x1b]0;owned\x07"),
        )
    db.close()

    for command in ("trace", "list"):
        args = ["order-1"] if command == "trace" else ["--state", "quarantined"]
        shown = run_cli("publisher", command, "--db", str(source), *args)
        assert shown.returncode == 0, shown.stderr
        assert_shown_escaped(shown.stdout)
        assert "\\x1b[31m" in shown.stdout and "\\x1b]0;owned\\x07" in shown.stdout


@pytest.mark.parametrize(
    ("received_at", "shown"),
    [
        ("yesterday\x1b[31m", 'unreadable ("yesterday\\u001b[31m")'),
        (1e20, "unreadable (1e+20)"),
        (-1e20, "unreadable (-1e+20)"),
        (None, "unreadable (null)"),
        ("2026-12-05T19:00:00.123Z", "2026-12-05T19:00:00.123Z"),
        ("2026-12-05T20:00:00.123+01:00", "2026-12-05T19:00:00.123Z"),
        (1_796_497_200.5, "2026-12-05T19:00:00.500Z"),
    ],
)
def test_trace_shows_any_time_the_sink_reports_without_a_traceback(
    tmp_path: Path,
    run_cli: RunCli,
    accept_orders: AcceptOrders,
    hostile_sink: HostileSink,
    received_at: object,
    shown: str,
) -> None:
    source = tmp_path / "source.db"
    accept_orders(source, ORDER)
    hostile_sink.record = {"received_at": received_at, "deliveries": "\x1b[2J", "sha256": "0"}

    traced = run_cli(
        "publisher", "trace", "order-1", "--db", str(source), "--sink", hostile_sink.url
    )

    assert traced.returncode == 0, traced.stderr
    assert_shown_escaped(traced.stdout + traced.stderr)
    [received] = [line for line in traced.stdout.splitlines() if " received " in line]
    assert f"since {shown}," in received, received
    assert 'deliveries seen: unreadable ("\\u001b[2J")' in received, received


def test_every_time_the_cli_shows_is_iso_8601_utc(
    tmp_path: Path, run_cli: RunCli, sink_process: StartSink
) -> None:
    source = tmp_path / "source.db"
    accepted = run_cli("publisher", "accept", "--db", str(source), *order_options())
    assert accepted.returncode == 0, accepted.stderr
    sink = sink_process(tmp_path / "sink.db")
    sent = run_cli("publisher", "dispatch", "--db", str(source), "--sink", sink.url)
    assert sent.returncode == 0, sent.stderr
    taken = run_cli(
        "publisher", "accept", "--db", str(source), "--id", "o2", "--sku", "s", "--qty", "1"
    )
    assert taken.returncode == 0, taken.stderr
    held = run_cli("publisher", "quarantine", "o2", "--db", str(source), "--reason", "hold")
    assert held.returncode == 0, held.stderr

    sent_trace = run_cli("publisher", "trace", "order-1", "--db", str(source), "--sink", sink.url)
    held_trace = run_cli("publisher", "trace", "o2", "--db", str(source))

    for traced in (sent_trace, held_trace):
        assert traced.returncode == 0, traced.stderr
        assert "+00:00" not in traced.stdout, traced.stdout
    # accepted, queued, received (the sink's own time), marked
    assert len(ISO_UTC.findall(sent_trace.stdout)) == 4, sent_trace.stdout
    [quarantined] = [line for line in held_trace.stdout.splitlines() if "quarantined " in line]
    assert ISO_UTC.search(quarantined), quarantined
