"""`python -m sink --chaos ...` keeps the production Host and Origin rules: chaos only
adds faults, it does not change who may talk to the sink."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK, wait_until

from shared import MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES

if TYPE_CHECKING:
    from conftest import Query, StartSink

pytestmark = pytest.mark.e2e


def post_with_host(port: int, host: str, event: dict[str, object]) -> int:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        headers = {"Host": host, "Content-Type": "application/json"}
        conn.request("POST", "/events", json.dumps(event), headers)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("chaos", [[], ["--chaos", "stall=0.01"]], ids=["plain", "chaos"])
def test_a_configured_host_name_is_allowed_and_others_are_not(
    tmp_path: Path, sink_process: StartSink, db_rows: Query, chaos: list[str]
) -> None:
    sink_db = tmp_path / "sink.db"
    sink = sink_process(sink_db, "--allow-host-header", "sink.internal", *chaos)
    port = int(sink.url.rsplit(":", 1)[1].split("/")[0])
    event = {"id": "order-1", "sku": "snack", "qty": 1}
    assert post_with_host(port, "evil.example", event) == 421
    assert post_with_host(port, f"sink.internal:{port}", event) == 200
    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [("order-1",)]


def test_a_stalled_request_whose_sender_is_gone_is_still_applied_once_its_body_is_in(
    tmp_path: Path, sink_process: StartSink, db_rows: Query
) -> None:
    # A slow sink has read the request it is busy with: the sender's death during the
    # stall does not take the event away (aiohttp loses a body still unread with its
    # connection). The pipelined-crash tests rely on this to see the requests that were
    # in flight behind the crashed one.
    sink_db = tmp_path / "sink.db"
    sink = sink_process(sink_db, "--chaos", "stall=2")
    port = int(sink.url.rsplit(":", 1)[1].split("/")[0])
    body = json.dumps({"id": "order-1", "sku": "snack", "qty": 2}).encode()
    head = (
        f"POST /events HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((LOOPBACK, port), timeout=5.0) as sock:
        sock.sendall(head + body)
        time.sleep(0.1)  # inside the stall
    # The connection is closed now, before the stall ends.

    wait_until(lambda: db_rows(sink_db, "SELECT id FROM inbox_events") == [("order-1",)], 8.0)
    assert db_rows(sink_db, "SELECT qty FROM inbox_inventory WHERE sku = 'snack'") == [(2,)]


def raw_reply(port: int, head: bytes, body: bytes, timeout_s: float = 10.0) -> tuple[int, Any]:
    """Send one request as given (the body may be short of its Content-Length); the
    status and the JSON body of the reply."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def request_head(port: int, length: int) -> bytes:
    return (
        f"POST /events HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("chaos", [[], ["--chaos", "stall=0.2"]], ids=["plain", "stall"])
def test_a_stall_leaves_the_size_and_time_checks_as_they_are(
    tmp_path: Path, sink_process: StartSink, db_rows: Query, chaos: list[str]
) -> None:
    sink_db = tmp_path / "sink.db"
    sink = sink_process(sink_db, "--body-timeout", "1", *chaos)
    port = int(sink.url.rsplit(":", 1)[1].split("/")[0])
    over_event = b'{"id": "order-1", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'  # one event's cap
    over_any = b'{"id": "order-2", "pad": "' + b"x" * MAX_BATCH_BODY_BYTES + b'"}'  # any request's

    for body in (over_event, over_any):
        status, reply = raw_reply(port, request_head(port, len(body)), body)
        assert status == 413, reply
        assert "error" in reply
    started = time.monotonic()
    status, reply = raw_reply(port, request_head(port, 100), b'{"id": "order-3"')
    assert status == 408, reply
    assert "did not arrive" in reply["error"]
    assert time.monotonic() - started < 5.0
    assert db_rows(sink_db, "SELECT count(*) FROM inbox_events") == [(0,)]
