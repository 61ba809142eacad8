"""`publisher serve`'s console options as a real process: the operator token from a
file or OUTBOX_CONSOLE_TOKEN, a file that cannot be read (one line, exit 2, nothing
opened), and --no-console."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import LOOPBACK

if TYPE_CHECKING:
    from conftest import RunCli, StartPublisher

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


@pytest.mark.parametrize("kind", ["missing", "directory", "short"])
def test_a_token_file_that_cannot_be_used_is_one_line_and_exit_2(
    tmp_path: Path, run_cli: RunCli, kind: str
) -> None:
    path = tmp_path / "console-token"
    if kind == "directory":
        path.mkdir()
    elif kind == "short":
        path.write_text("short")
    done = run_cli("publisher", "serve", *serve_args(tmp_path, "--console-token-file", str(path)))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "console-token" in lines[0]
    assert not (tmp_path / "source.db").exists()


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


def test_help_names_the_console_options(run_cli: RunCli) -> None:
    done = run_cli("publisher", "serve", "--help")
    assert "--console-token-file" in done.stdout and "OUTBOX_CONSOLE_TOKEN" in done.stdout
    assert "--no-console" in done.stdout
