"""`publisher serve`'s console options as a real process: the operator token from
OUTBOX_CONSOLE_TOKEN, and --no-console. A token file that cannot be read (one line,
exit 2, nothing opened) needs no process: tests/integration/test_cli_commands.py."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK

if TYPE_CHECKING:
    from conftest import StartPublisher

pytestmark = pytest.mark.e2e

TOKEN = "console-operator-token-0123"


def request(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5.0)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, data, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def serve_args(tmp_path: Path, *extra: str) -> tuple[str, ...]:
    db = tmp_path / "source.db"
    sink = "http://127.0.0.1:9/events"
    return ("--db", str(db), "--sink", sink, "--host", LOOPBACK, "--port", "0", *extra)


def test_the_token_from_the_environment_signs_in(
    tmp_path: Path, publisher_process: StartPublisher
) -> None:
    publisher = publisher_process(*serve_args(tmp_path), env={"OUTBOX_CONSOLE_TOKEN": TOKEN})
    status, body = request(publisher.port, "GET", "/console/api/session")
    assert status == 200 and json.loads(body)["actions_enabled"] is True
    status, _ = request(publisher.port, "POST", "/console/api/sign-in", {"token": TOKEN})
    assert status == 200
    status, _ = request(publisher.port, "POST", "/console/api/sign-in", {"token": TOKEN + "x"})
    assert status == 403


def test_no_console_serves_no_console(tmp_path: Path, publisher_process: StartPublisher) -> None:
    publisher = publisher_process(*serve_args(tmp_path, "--no-console"))
    assert request(publisher.port, "GET", "/console")[0] == 404
    assert request(publisher.port, "GET", "/status")[0] == 200
