"""One relay per SQLite outbox, with real processes: a second `publisher serve` on the
same file refuses to start, naming the first; a SIGKILLed relay never blocks its
successor, nor does one built in process through ServiceSettings; the operators'
commands work beside a running relay.

Outcomes are read from both database files through sqlite3 connections of our own.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import deliveries, listening, serve_args, spawn, stop_process, wait_until

from publisher.settings import DEFAULT_LEASE_TTL_S, worker_id_for
from shared import GLOBAL_LINE

if TYPE_CHECKING:
    from conftest import Query, RunCli, StartPublisher, StartSink

pytestmark = pytest.mark.e2e

FAST = ("--poll-interval", "0.2", "--retry-base", "0.05", "--retry-cap", "0.5")
REFUSED_WITHIN_S = 10.0  # a Python start-up and an open: nothing to wait for


def accept_by_cli(run_cli: RunCli, db: Path, *ids: str) -> None:
    for event_id in ids:
        done = run_cli(
            "publisher", "accept", "--db", str(db), "--id", event_id, "--sku", "snack", "--qty", "1"
        )
        assert done.returncode == 0, done.stderr


def unsent(db_rows: Query, db: Path) -> int:
    n: int = db_rows(db, "SELECT count(*) FROM outbox_entries WHERE sent = 0")[0][0]
    return n


def test_a_second_serve_on_the_same_file_exits_at_once_naming_the_first(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    db, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
    sink = sink_process(sink_db)
    accept_by_cli(run_cli, db, "a", "b", "c")
    first = publisher_process(*serve_args(db, sink.url, *FAST))
    wait_until(lambda: unsent(db_rows, db) == 0)

    started = time.monotonic()
    second = run_cli(
        "publisher", "serve", *serve_args(db, sink.url, *FAST), timeout=REFUSED_WITHIN_S
    )
    assert time.monotonic() - started < REFUSED_WITHIN_S
    assert second.returncode == 1, second.stderr
    assert "listening" not in second.stdout  # it never took intake
    refusals = [line for line in second.stderr.splitlines() if "another relay" in line]
    assert len(refusals) == 1, second.stderr
    assert f"process {first.proc.pid} on host " in refusals[0]
    assert str(db) in refusals[0]
    assert "Traceback" not in second.stderr

    # The first goes on alone: what arrives now is delivered, and nothing twice.
    accept_by_cli(run_cli, db, "d", "e")
    wait_until(lambda: unsent(db_rows, db) == 0)
    assert deliveries(sink_db) == {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    assert first.proc.poll() is None


def test_after_a_sigkill_of_the_relay_a_new_one_starts_at_once_and_delivers(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    db, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
    sink = sink_process(sink_db)
    first = publisher_process(*serve_args(db, sink.url, *FAST))
    accept_by_cli(run_cli, db, "a")
    wait_until(lambda: unsent(db_rows, db) == 0)
    first.kill()  # SIGKILL: no shutdown code, the lock file stays with its record

    accept_by_cli(run_cli, db, "b")
    publisher_process(*serve_args(db, sink.url, *FAST))  # fails unless it listens
    wait_until(lambda: unsent(db_rows, db) == 0)
    assert deliveries(sink_db) == {"a": 1, "b": 1}


# The service as a program embeds it: ServiceSettings with no worker given.
IN_PROCESS_RELAY = """
import asyncio, sys
from aiohttp import web
from publisher.app import ServiceSettings, create_app
from publisher.settings import RelaySettings

async def main() -> None:
    relay = RelaySettings(poll_interval_s=0.2)
    settings = ServiceSettings(db=sys.argv[1], sink=sys.argv[2], relay=relay)
    runner = web.AppRunner(create_app(settings))
    await runner.setup()  # the relay starts with the app
    print("relay started", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
_STARTED = re.compile("relay started")


@pytest.fixture
def in_process_relay(
    tmp_path: Path, child_env: dict[str, str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that build the relay in process (appended by the test); stopped at
    teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        stop_process(proc)


def test_an_in_process_relay_restarted_after_a_sigkill_takes_its_lines_back_at_once(
    tmp_path: Path,
    sink_process: StartSink,
    run_cli: RunCli,
    db_rows: Query,
    child_env: dict[str, str],
    in_process_relay: list[subprocess.Popen[bytes]],
) -> None:
    # Built through ServiceSettings, a relay takes the ID `publisher serve` takes on
    # SQLite: the next one, in another process, takes the dead one's lease of the
    # global line at once instead of waiting out its ttl (10 s).
    db, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
    sink = sink_process(sink_db)

    def start(n: int) -> None:
        log = tmp_path / f"in-process-{n}.log"
        proc = spawn(["-c", IN_PROCESS_RELAY, str(db), sink.url], log, child_env, tmp_path)
        in_process_relay.append(proc)
        listening(proc, log, _STARTED, f"in-process relay {n}")

    accept_by_cli(run_cli, db, "a")
    start(1)
    wait_until(lambda: unsent(db_rows, db) == 0)
    first = in_process_relay[0]
    first.send_signal(signal.SIGKILL)  # no shutdown code: its lease stays, unreleased
    first.wait(timeout=5)

    accept_by_cli(run_cli, db, "b")
    start(2)
    took_s = wait_until(lambda: unsent(db_rows, db) == 0, timeout_s=DEFAULT_LEASE_TTL_S * 0.8)
    assert took_s < DEFAULT_LEASE_TTL_S * 0.8
    assert deliveries(sink_db) == {"a": 1, "b": 1}
    lease = "SELECT owner, epoch FROM outbox_line_leases WHERE line = ?"
    assert db_rows(db, lease, (GLOBAL_LINE,)) == [(worker_id_for(str(db), None), 2)]


def test_operator_commands_work_beside_a_running_relay(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    db, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
    # The sink refuses SKU "bad": that entry blocks the head, so there is something
    # pending to quarantine and redrive while the relay runs.
    sink = sink_process(sink_db, "--chaos", "reject-sku=bad")
    publisher_process(*serve_args(db, sink.url, *FAST))
    done = run_cli(
        "publisher", "accept", "--db", str(db), "--id", "x", "--sku", "bad", "--qty", "1"
    )
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: db_rows(db, "SELECT attempts > 0 FROM outbox_entries WHERE id = 'x'") == [(1,)]
    )

    def ok(*args: str) -> str:
        result = run_cli("publisher", *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "another relay" not in result.stderr
        return result.stdout

    where = ("--db", str(db))
    ok("status", *where)
    ok("list", *where, "--state", "pending")
    ok("trace", "x", *where)
    ok("quarantine", "x", *where, "--reason", "refused by the sink")
    accept_by_cli(run_cli, db, "y")
    wait_until(lambda: db_rows(db, "SELECT sent FROM outbox_entries WHERE id = 'y'") == [(1,)])
    ok("redrive", "x", *where)
    ok("prune", *where, "--older-than", "7d")
    assert deliveries(sink_db) == {"y": 1}


def test_dispatch_beside_a_running_relay_is_refused_and_delivers_nothing(
    tmp_path: Path,
    sink_process: StartSink,
    publisher_process: StartPublisher,
    run_cli: RunCli,
    db_rows: Query,
) -> None:
    db, sink_db = tmp_path / "source.db", tmp_path / "sink.db"
    sink = sink_process(sink_db, "--chaos", "reject-sku=bad")
    first = publisher_process(*serve_args(db, sink.url, *FAST))
    done = run_cli(
        "publisher", "accept", "--db", str(db), "--id", "x", "--sku", "bad", "--qty", "1"
    )
    assert done.returncode == 0, done.stderr
    result = run_cli("publisher", "dispatch", "--db", str(db), "--sink", sink.url)
    assert result.returncode == 1
    assert f"process {first.proc.pid} " in result.stderr
    assert "another relay" in result.stderr
