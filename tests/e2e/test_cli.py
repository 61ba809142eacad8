"""The command lines where a process of their own is the point: exit codes and
one-line errors as an operator sees them when a service cannot start (its database
thread as the process ends, a port another process holds), the clean stop on
SIGTERM. The cases that need no process of their own call main() in the test
process: tests/integration/test_cli_commands.py and tests/unit/test_cli_usage.py."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_support import as_a_child_process, run_publisher
from support import LOOPBACK, http_request, serve_args

if TYPE_CHECKING:
    from conftest import AcceptOrders, Query, RunCli, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

STARTS = 3


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------- publisher dispatch


# The sink is a real process; the dispatch, run to completion, needs none of its own.
def test_dispatch_with_limit_sends_only_that_many_in_order(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    sink_process: StartSink,
    accept_orders: AcceptOrders,
    db_rows: Query,
) -> None:
    as_a_child_process(monkeypatch, tmp_path)
    source = tmp_path / "source.db"
    accept_orders(
        source,
        {"id": "z-first", "sku": "snack", "qty": 1},
        {"id": "a-second", "sku": "snack", "qty": 2},
        {"id": "m-third", "sku": "snack", "qty": 4},
    )
    sink = sink_process(tmp_path / "sink.db")

    ran = run_publisher(capsys, "dispatch", "--db", str(source), "--sink", sink.url, "--limit", "2")

    assert (ran.status, ran.out.strip()) == (0, "delivered 2: z-first a-second")
    assert db_rows(source, "SELECT id, sent FROM outbox_entries ORDER BY seq") == [
        ("z-first", 1),
        ("a-second", 1),
        ("m-third", 0),
    ]
    assert db_rows(tmp_path / "sink.db", "SELECT qty FROM inbox_inventory") == [(3,)]


# ---------------------------------------------------------------- events of any type


# Recorded by a real `publisher serve` (POST /events), read by real `list` and `trace`.
def test_list_and_trace_read_events_of_any_type_by_type_and_key(
    tmp_path: Path, publisher_process: StartPublisher, run_cli: RunCli
) -> None:
    source = str(tmp_path / "source.db")
    publisher = publisher_process(*serve_args(source, f"http://{LOOPBACK}:9/events"))
    events = [
        {"id": "pay-1", "type": "payment.captured", "key": "cust-1", "data": {"amount": 5}},
        {"id": "tick-1", "type": "clock.tick", "data": {"at": "\u001b[2J"}},
        {"id": "pay-2", "type": "payment.captured", "key": "cust-2", "data": {"amount": 7}},
    ]
    for event in events:
        assert http_request(publisher.port, "POST", "/events", event)[0] == 201

    def listed(*args: str) -> list[str]:
        result = run_cli("publisher", "list", "--db", source, *args)
        assert (result.returncode, result.stderr) == (0, "")
        return [line.split()[1] for line in result.stdout.splitlines()]

    assert listed("--type", "payment.captured") == ["pay-1", "pay-2"]
    assert listed("--key", "*") == ["tick-1"]
    whole = run_cli("publisher", "list", "--db", source).stdout
    assert "\x1b" not in whole and '{"at":"\\u001b[2J"}' in whole

    traced = run_cli("publisher", "trace", "--db", source, "tick-1")
    assert traced.returncode == 0, traced.stderr
    assert "event clock.tick data" in traced.stdout and "\x1b" not in traced.stdout

    refused = run_cli("publisher", "list", "--db", source, "--type", "no type")
    assert refused.returncode == 2 and "--type" in refused.stderr
    assert_one_line_error(refused)


# ---------------------------------------------------------------- sink


@pytest.mark.parametrize("where", ["directory", "missing-parent"])
def test_sink_with_an_unopenable_db_path_exits_with_one_line(
    tmp_path: Path, run_cli: RunCli, where: str
) -> None:
    db = tmp_path if where == "directory" else tmp_path / "missing" / "sink.db"

    # Processes, a few at once: the one line must also be the last thing each writes as
    # it ends, with no traceback from its database thread after it, under some load.
    with ThreadPoolExecutor(max_workers=STARTS) as pool:
        results = list(
            pool.map(lambda _: run_cli("sink", "--db", str(db), "--port", "0"), range(STARTS))
        )

    for result in results:
        assert result.returncode != 0
        assert_one_line_error(result)
        assert "unable to open" in result.stderr


def test_sink_on_a_port_in_use_exits_1_with_one_line(tmp_path: Path, run_cli: RunCli) -> None:
    # The port is held by another process (this one), as an operator meets it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        result = run_cli("sink", "--db", str(tmp_path / "sink.db"), "--port", str(port))

    assert result.returncode == 1
    assert_one_line_error(result)


def test_sink_stops_cleanly_on_sigterm(tmp_path: Path, sink_process: StartSink) -> None:
    sink = sink_process(tmp_path / "sink.db")
    time.sleep(0.3)

    assert sink.stop() == 0


def fill(pipe_write_end: int) -> None:
    """Fill a pipe so that the next write to it blocks."""
    os.set_blocking(pipe_write_end, False)
    for size in (4096, 1):
        with contextlib.suppress(BlockingIOError):
            for _ in range(4096):
                os.write(pipe_write_end, b"." * size)
    os.set_blocking(pipe_write_end, True)


def wait_until_accepting(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    for _ in range(300):
        assert proc.poll() is None, f"sink exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    raise TimeoutError(f"sink is not accepting on port {port}")


def drain_until_eof(pipe_read_end: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(pipe_read_end, selectors.EVENT_READ)
        for _ in range(10_000):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if selector.select(left) and not os.read(pipe_read_end, 65536):
                return


def test_sink_stops_cleanly_on_sigterm_as_soon_as_it_is_listening(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    # The sink's stdout is a full pipe, so it cannot get past printing its
    # listening line until it is read: a SIGTERM sent while it is listening but
    # still printing must lead to the same clean stop as one sent later.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    read_end, write_end = os.pipe()
    try:
        fill(write_end)
        with (tmp_path / "sink.log").open("wb") as log:
            command = [sys.executable, "-m", "sink", "--db", str(tmp_path / "sink.db")]
            proc = subprocess.Popen(
                [*command, "--host", "127.0.0.1", "--port", str(port)],
                stdout=write_end,
                stderr=log,
                env=child_env,
                cwd=tmp_path,
            )
        os.close(write_end)
        write_end = -1
        try:
            wait_until_accepting(port, proc)
            proc.send_signal(signal.SIGTERM)
            drain_until_eof(read_end, timeout_s=10)
            status = proc.wait(timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)

    assert status == 0, (tmp_path / "sink.log").read_text()
