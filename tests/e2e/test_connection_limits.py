"""Connections cannot stop a service: idle, slow and too many, against real processes.

Each service runs as its own OS process under a descriptor limit of 1,024 (set in
the child before it starts). Everything is on loopback; every loop is bounded in
count and in time.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import LOOPBACK, listening, raw_get, stop_process

if TYPE_CHECKING:
    from conftest import Query

pytestmark = pytest.mark.e2e

FD_LIMIT = 1024
FLOOD = 1100
SOCKET_TIMEOUT_S = 5.0
LISTENING = {
    "sink": re.compile(r"sink listening on http://127\.0\.0\.1:(\d+)/events"),
    "publisher": re.compile(r"publisher listening on http://127\.0\.0\.1:(\d+)/orders"),
}
# The child sets its own descriptor limit, then runs the service's CLI as `-m` would.
LIMITED = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT})); "
    "sys.argv = [sys.argv[1], *sys.argv[2:]]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


@pytest.fixture
def start(tmp_path: Path, child_env: dict[str, str]) -> Iterator[object]:
    started: list[Service] = []

    def run(module: str, *args: str) -> Service:
        log = tmp_path / f"{module}-{len(started)}.log"
        db = tmp_path / f"{module}.db"
        command = [sys.executable, "-c", LIMITED, module, "--db", str(db), "--port", "0"]
        if module == "publisher":
            command[4:4] = ["serve"]
            command += ["--sink", "http://127.0.0.1:1/events"]
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [*command, *args], stdout=subprocess.PIPE, stderr=stderr, env=child_env,
                cwd=tmp_path,
            )  # fmt: skip
        service = Service(proc, 0, log)
        started.append(service)
        service.port = int(listening(proc, log, LISTENING[module], module)[1])
        return service

    yield run
    for service in reversed(started):
        stop_process(service.proc)


def connect(port: int) -> socket.socket:
    return socket.create_connection((LOOPBACK, port), timeout=SOCKET_TIMEOUT_S)


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """One request on a new connection that says close; status and body."""
    with connect(port) as sock:
        sock.sendall(request)
        return read_reply(sock)


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of one reply, read as far as its Content-Length."""
    reply = b""
    deadline = time.monotonic() + SOCKET_TIMEOUT_S
    while time.monotonic() < deadline:
        head, sep, body = reply.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        if sep and length is not None and len(body) >= int(length[1]):
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), reply[:200]
    return int(head.split()[1]), body


def raw_post(port: int, path: str, body: bytes, length: int | None = None) -> bytes:
    """The bytes of a POST request, its Content-Length `length` if given (a lie, say)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def closed_within(sock: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the server closed `sock` (reading whatever it sent), None if not."""
    sock.settimeout(timeout_s)
    started = time.monotonic()
    with contextlib.suppress(TimeoutError, ConnectionError):
        while sock.recv(65536):
            pass
        return time.monotonic() - started
    return None


@contextlib.contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(connect(port))
        yield opened
    finally:
        for sock in opened:
            sock.close()


EVENT = json.dumps({"id": "order-1", "sku": "snack", "qty": 7}).encode()


@pytest.mark.parametrize("module", ["sink", "publisher"])
def test_a_flood_of_idle_connections_does_not_stop_the_service(
    start: object, module: str, db_rows: Query, tmp_path: Path
) -> None:
    service = start(module)  # type: ignore[operator]
    path = "/events" if module == "sink" else "/orders"
    with idle_connections(service.port, FLOOD):
        started = time.monotonic()
        status, body = exchange(service.port, raw_get(f"{LOOPBACK}:{service.port}", "/healthz"))
        assert status == 200, body
        status, body = exchange(service.port, raw_post(service.port, path, EVENT))
        assert status in (200, 201), body
        assert time.monotonic() - started < 2 * SOCKET_TIMEOUT_S
    table = "inbox_events" if module == "sink" else "outbox_orders"
    assert db_rows(tmp_path / f"{module}.db", f"SELECT id FROM {table}") == [("order-1",)]
    assert service.proc.poll() is None, "the service died"
    lines = service.log_lines()
    assert len(lines) < 20, lines[:30]
    assert not any("Too many open files" in line for line in lines), lines[:30]


def test_idle_and_slow_header_connections_are_closed_after_the_idle_timeout(
    start: object,
) -> None:
    sink = start("sink", "--idle-timeout", "1")  # type: ignore[operator]
    with connect(sink.port) as idle, connect(sink.port) as slow:
        slow.sendall(f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}:{sink.port}\r\n".encode())
        for sock in (idle, slow):
            took = closed_within(sock, 5.0)
            assert took is not None, "still open after 5 s"
    with connect(sink.port) as kept:  # after a reply, the same timeout starts again
        kept.sendall(f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}:{sink.port}\r\n\r\n".encode())
        assert closed_within(kept, 5.0) is not None


def test_a_slow_body_is_answered_408_and_closed(
    start: object, db_rows: Query, tmp_path: Path
) -> None:
    sink = start("sink", "--body-timeout", "1")  # type: ignore[operator]
    with connect(sink.port) as sock:
        sock.sendall(raw_post(sink.port, "/events", EVENT[:10], length=len(EVENT)))
        started = time.monotonic()
        status, body = read_reply(sock)
        assert status == 408, body
        assert "did not arrive" in json.loads(body)["error"]
        assert time.monotonic() - started < 4.0
        assert closed_within(sock, 5.0) is not None, "kept open after the 408"
    assert db_rows(tmp_path / "sink.db", "SELECT count(*) FROM inbox_events") == [(0,)]


def test_beyond_the_cap_with_every_connection_busy_a_new_one_gets_503(start: object) -> None:
    sink = start("sink", "--max-connections", "4", "--body-timeout", "3")  # type: ignore[operator]
    with idle_connections(sink.port, 4) as busy:
        for sock in busy:  # each has a request under way: its body is still coming
            sock.sendall(raw_post(sink.port, "/events", EVENT[:10], length=len(EVENT)))
        time.sleep(0.3)
        status, body = exchange(sink.port, raw_get(f"{LOOPBACK}:{sink.port}", "/healthz"))
        assert status == 503, body
        assert "too many open connections" in json.loads(body)["error"]
    deadline = time.monotonic() + 5.0  # once they are gone, it serves again
    status = 0
    while time.monotonic() < deadline and status != 200:
        status, _ = exchange(sink.port, raw_get(f"{LOOPBACK}:{sink.port}", "/healthz"))
        time.sleep(0.1)
    assert status == 200
