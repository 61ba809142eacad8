"""The command lines as an operator runs them: exit codes, one-line errors, no changes."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import AcceptOrders, Query, RunCli, StartSink

pytestmark = pytest.mark.e2e

ORDER: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
STARTS = 3
SourceState = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]


@pytest.fixture
def source(tmp_path: Path, accept_orders: AcceptOrders) -> Path:
    """A source DB holding one accepted, pending order."""
    db = tmp_path / "source.db"
    accept_orders(db, ORDER)
    return db


def state(db_rows: Query, db: Path) -> SourceState:
    return (
        db_rows(db, "SELECT * FROM orders ORDER BY id"),
        db_rows(db, "SELECT * FROM outbox ORDER BY seq"),
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stdout == ""


def accept(run_cli: RunCli, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("publisher", "accept", "--db", str(db), *args)


# ---------------------------------------------------------------- publisher accept


def test_accept_prints_accepted_then_duplicate(
    tmp_path: Path, run_cli: RunCli, db_rows: Query
) -> None:
    db = tmp_path / "source.db"
    args = ("--id", "order-1", "--sku", "snack", "--qty", "7")

    first = accept(run_cli, db, *args)
    assert (first.returncode, first.stdout.strip(), first.stderr) == (0, "accepted order-1", "")
    after_first = state(db_rows, db)

    second = accept(run_cli, db, *args)
    assert (second.returncode, second.stdout.strip()) == (0, "duplicate order-1")

    assert state(db_rows, db) == after_first
    assert db_rows(db, "SELECT id, sku, qty FROM orders") == [("order-1", "snack", 7)]
    assert db_rows(db, "SELECT id, sent FROM outbox") == [("order-1", 0)]


def test_accept_conflict_exits_1_with_one_line_and_changes_nothing(
    source: Path, run_cli: RunCli, db_rows: Query
) -> None:
    before = state(db_rows, source)

    result = accept(run_cli, source, "--id", "order-1", "--sku", "snack", "--qty", "8")

    assert result.returncode == 1
    assert_one_line_error(result)
    assert "order-1" in result.stderr
    assert state(db_rows, source) == before


@pytest.mark.parametrize(
    "args",
    [
        ["--id", "order-2", "--sku", "snack", "--qty", "0"],
        ["--id", "order-2", "--sku", "snack", "--qty", "abc"],
        ["--id", "-x", "--sku", "snack", "--qty", "7"],
        ["--id=-x", "--sku", "snack", "--qty", "7"],
        ["--id", "order-2", "--sku", "bad sku", "--qty", "7"],
        ["--id", "order-2", "--sku", "snack"],
        ["--file", "orders.jsonl", "--id", "x"],
        ["--sku", "tea", "--qty", "1"],
    ],
    ids=[
        "qty-zero",
        "qty-text",
        "id-dash",
        "id-dash-attached",
        "bad-sku",
        "missing-qty",
        "file-and-order",
        "neither-file-nor-order",
    ],
)
def test_accept_with_bad_input_exits_2_with_one_line_and_changes_nothing(
    source: Path, run_cli: RunCli, db_rows: Query, args: list[str]
) -> None:
    before = state(db_rows, source)

    result = accept(run_cli, source, *args)

    assert result.returncode == 2
    assert_one_line_error(result)
    assert state(db_rows, source) == before


def test_publisher_without_a_command_exits_2(run_cli: RunCli) -> None:
    result = run_cli("publisher")

    assert result.returncode == 2
    assert_one_line_error(result)


# ---------------------------------------------------------------- publisher dispatch


@pytest.mark.parametrize("limit", ["0", "17"])
def test_dispatch_with_a_bad_limit_exits_2_and_changes_nothing(
    source: Path, run_cli: RunCli, db_rows: Query, closed_port: int, limit: str
) -> None:
    before = state(db_rows, source)
    url = f"http://127.0.0.1:{closed_port}/events"

    result = run_cli("publisher", "dispatch", "--db", str(source), "--sink", url, "--limit", limit)

    assert result.returncode == 2
    assert_one_line_error(result)
    assert state(db_rows, source) == before


@pytest.mark.parametrize(
    "url",
    ["http://example.com/events", "http://127.0.0.1:1/other"],
)
def test_dispatch_to_a_refused_url_exits_2_and_changes_nothing(
    source: Path, run_cli: RunCli, db_rows: Query, url: str
) -> None:
    before = state(db_rows, source)

    result = run_cli("publisher", "dispatch", "--db", str(source), "--sink", url)

    assert result.returncode == 2
    assert_one_line_error(result)
    assert "refused" in result.stderr
    assert state(db_rows, source) == before


def test_dispatch_to_a_closed_port_exits_1_with_one_line(
    source: Path, run_cli: RunCli, db_rows: Query, closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/events"

    result = run_cli("publisher", "dispatch", "--db", str(source), "--sink", url)

    assert result.returncode == 1
    assert_one_line_error(result)
    assert "order-1" in result.stderr
    assert db_rows(source, "SELECT id, sent FROM outbox") == [("order-1", 0)]


def test_dispatch_of_an_empty_outbox_exits_0_without_connecting(
    tmp_path: Path, run_cli: RunCli, closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/events"

    result = run_cli("publisher", "dispatch", "--db", str(tmp_path / "empty.db"), "--sink", url)

    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "delivered 0", "")


def test_dispatch_with_limit_sends_only_that_many_in_order(
    tmp_path: Path,
    run_cli: RunCli,
    sink_process: StartSink,
    accept_orders: AcceptOrders,
    db_rows: Query,
) -> None:
    source = tmp_path / "source.db"
    accept_orders(
        source,
        {"id": "z-first", "sku": "snack", "qty": 1},
        {"id": "a-second", "sku": "snack", "qty": 2},
        {"id": "m-third", "sku": "snack", "qty": 4},
    )
    sink = sink_process(tmp_path / "sink.db")

    result = run_cli(
        "publisher", "dispatch", "--db", str(source), "--sink", sink.url, "--limit", "2"
    )

    assert (result.returncode, result.stdout.strip()) == (0, "delivered 2: z-first a-second")
    assert db_rows(source, "SELECT id, sent FROM outbox ORDER BY seq") == [
        ("z-first", 1),
        ("a-second", 1),
        ("m-third", 0),
    ]
    assert db_rows(tmp_path / "sink.db", "SELECT qty FROM inventory") == [(3,)]


# ---------------------------------------------------------------- sink


@pytest.mark.parametrize("chaos", ["drop-after-commit=0", "explode=1"])
def test_sink_with_a_bad_chaos_value_exits_2_with_one_line(
    tmp_path: Path, run_cli: RunCli, chaos: str
) -> None:
    db = tmp_path / "sink.db"

    result = run_cli("sink", "--db", str(db), "--port", "0", "--chaos", chaos)

    assert result.returncode == 2
    assert_one_line_error(result)


@pytest.mark.parametrize("where", ["directory", "missing-parent"])
def test_sink_with_an_unopenable_db_path_exits_with_one_line(
    tmp_path: Path, run_cli: RunCli, where: str
) -> None:
    db = tmp_path if where == "directory" else tmp_path / "missing" / "sink.db"

    # A few at once: the failure path is also checked under some load.
    with ThreadPoolExecutor(max_workers=STARTS) as pool:
        results = list(
            pool.map(lambda _: run_cli("sink", "--db", str(db), "--port", "0"), range(STARTS))
        )

    for result in results:
        assert result.returncode != 0
        assert_one_line_error(result)
        assert "unable to open" in result.stderr


def test_sink_with_a_garbage_db_file_exits_with_one_line_and_leaves_it_alone(
    tmp_path: Path, run_cli: RunCli
) -> None:
    db = tmp_path / "garbage.db"
    garbage = bytes(range(256)) * 16
    db.write_bytes(garbage)

    result = run_cli("sink", "--db", str(db), "--port", "0")

    assert result.returncode != 0
    assert_one_line_error(result)
    assert db.read_bytes() == garbage


def test_sink_on_a_port_in_use_exits_1_with_one_line(tmp_path: Path, run_cli: RunCli) -> None:
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


# ---------------------------------------------------------------- publisher accept --file


def jsonl(*lines: object) -> str:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


def test_accept_file_records_the_good_lines_and_reports_each_bad_one_by_its_number(
    source: Path, tmp_path: Path, run_cli: RunCli, db_rows: Query
) -> None:
    orders = tmp_path / "orders.jsonl"
    orders.write_text(
        jsonl(
            {"id": "a", "sku": "tea", "qty": 1},
            "",  # blank lines are skipped
            {"id": "b", "sku": "tea", "qty": 0},
            '{"id": "c", "sku": "tea",',
            {**ORDER, "qty": 8},  # known with another payload
            ORDER,  # known as it is
            {"id": "a", "sku": "tea", "qty": 1},  # again in the file
            '{"id": "d", "id": "d", "sku": "tea", "qty": 1}',
            "x" * (16 * 1024 + 1),
            {"id": "e", "sku": "juice", "qty": 5},
        )
    )

    result = accept(run_cli, source, "--file", str(orders))

    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stdout == "accepted 2, duplicate 2, failed 5\n"
    assert result.stderr.splitlines() == [
        f"{orders}:3: invalid order: qty: must be between 1 and 1,000,000, got 0",
        f"{orders}:4: line is not valid JSON: Expecting property name enclosed in double"
        " quotes at column 26",
        f"{orders}:5: conflict: event 'order-1' was already recorded with a different payload",
        f"{orders}:8: duplicate key 'id' in a JSON object",
        f"{orders}:9: line is over 16384 bytes",
    ]
    assert db_rows(source, "SELECT id, sku, qty FROM orders ORDER BY id") == [
        ("a", "tea", 1),
        ("e", "juice", 5),
        ("order-1", "snack", 7),
    ]
    assert [r[0] for r in db_rows(source, "SELECT id FROM outbox ORDER BY seq")] == [
        "order-1",
        "a",
        "e",
    ]


def test_accept_file_reads_stdin_and_feeds_many_batches_in_line_order(
    tmp_path: Path, child_env: dict[str, str], db_rows: Query
) -> None:
    db = tmp_path / "source.db"
    ids = [f"o{n:04d}" for n in range(1234)][::-1]  # line order, not ID order
    result = subprocess.run(
        [sys.executable, "-m", "publisher", "accept", "--db", str(db), "--file", "-"],
        input=jsonl(*({"id": i, "sku": "tea", "qty": 1} for i in ids)),
        capture_output=True,
        text=True,
        env=child_env,
        cwd=tmp_path,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "accepted 1234, duplicate 0, failed 0\n"
    assert [r[0] for r in db_rows(db, "SELECT id FROM outbox ORDER BY seq")] == ids


def test_accept_file_stops_at_a_batch_the_database_refuses_and_writes_none_of_it(
    tmp_path: Path, run_cli: RunCli, db_rows: Query, accept_orders: AcceptOrders
) -> None:
    db = tmp_path / "source.db"
    accept_orders(db, ORDER)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox WHEN NEW.id = 'o0550'"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
    finally:
        conn.close()
    orders = tmp_path / "orders.jsonl"
    orders.write_text(jsonl(*({"id": f"o{n:04d}", "sku": "tea", "qty": 1} for n in range(1200))))

    result = accept(run_cli, db, "--file", str(orders))

    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stdout == "accepted 500, duplicate 0, failed 0\n"
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{orders}:501-1000: not written (nor any line after it): ")
    assert "disk trouble" in line
    written = [r[0] for r in db_rows(db, "SELECT id FROM orders ORDER BY id")]
    assert written == [*(f"o{n:04d}" for n in range(500)), "order-1"]


@pytest.mark.parametrize("name", ["missing.jsonl", "a-directory"])
def test_accept_file_that_cannot_be_read_exits_2_with_one_line_and_opens_nothing(
    tmp_path: Path, run_cli: RunCli, name: str
) -> None:
    (tmp_path / "a-directory").mkdir()
    db = tmp_path / "source.db"

    result = accept(run_cli, db, "--file", str(tmp_path / name))

    assert result.returncode == 2
    assert_one_line_error(result)
    assert result.stderr.startswith(f"publisher: cannot read {tmp_path / name}: ")
    assert not db.exists()
