"""The command lines run to completion on real files, `main(argv)` called in this
process: exit codes, one-line errors, and nothing changed on disk (read back through
sqlite3). Running a command as its own process is left to tests/e2e, for what only a
process shows: signals, crashes, ports held by another process, a service serving.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_support import Ran, assert_one_line_error, run_publisher, run_sink

from publisher.store import Outbox
from shared import MAX_BODY_BYTES

if TYPE_CHECKING:
    from conftest import AcceptOrders, PgSchemas, Query

ORDER: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}
SourceState = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]
Capsys = pytest.CaptureFixture[str]

pytestmark = pytest.mark.usefixtures("like_a_child_process")


@pytest.fixture
def source(tmp_path: Path, accept_orders: AcceptOrders) -> Path:
    """A source DB holding one accepted, pending order."""
    db = tmp_path / "source.db"
    accept_orders(db, ORDER)
    return db


def state(db_rows: Query, db: Path) -> SourceState:
    return (
        db_rows(db, "SELECT * FROM outbox_orders ORDER BY id"),
        db_rows(db, "SELECT * FROM outbox_entries ORDER BY seq"),
    )


def accept(capsys: Capsys, db: Path, *args: str) -> Ran:
    return run_publisher(capsys, "accept", "--db", str(db), *args)


def dispatch(capsys: Capsys, db: Path, url: str, *args: str) -> Ran:
    return run_publisher(capsys, "dispatch", "--db", str(db), "--sink", url, *args)


# ---------------------------------------------------------------- publisher accept


def test_accept_prints_accepted_then_duplicate(
    tmp_path: Path, capsys: Capsys, db_rows: Query
) -> None:
    db = tmp_path / "source.db"
    args = ("--id", "order-1", "--sku", "snack", "--qty", "7")

    first = accept(capsys, db, *args)
    assert (first.status, first.out.strip(), first.err) == (0, "accepted order-1", "")
    after_first = state(db_rows, db)

    second = accept(capsys, db, *args)
    assert (second.status, second.out.strip()) == (0, "duplicate order-1")

    assert state(db_rows, db) == after_first
    assert db_rows(db, "SELECT id, sku, qty FROM outbox_orders") == [("order-1", "snack", 7)]
    assert db_rows(db, "SELECT id, sent FROM outbox_entries") == [("order-1", 0)]


def test_accept_conflict_exits_1_with_one_line_and_changes_nothing(
    source: Path, capsys: Capsys, db_rows: Query
) -> None:
    before = state(db_rows, source)

    ran = accept(capsys, source, "--id", "order-1", "--sku", "snack", "--qty", "8")

    assert ran.status == 1
    assert_one_line_error(ran)
    assert "order-1" in ran.err
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
    source: Path, capsys: Capsys, db_rows: Query, args: list[str]
) -> None:
    before = state(db_rows, source)

    ran = accept(capsys, source, *args)

    assert ran.status == 2
    assert_one_line_error(ran)
    assert state(db_rows, source) == before


# ---------------------------------------------------------------- publisher accept --file


def jsonl(*lines: object) -> str:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


def test_accept_file_records_the_good_lines_and_reports_each_bad_one_by_its_number(
    source: Path, tmp_path: Path, capsys: Capsys, db_rows: Query
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
            '{"id": "f", "type": "t.x", "data": {"a": ' + "[" * 300 + "]" * 300 + "}}",
            "x" * (MAX_BODY_BYTES + 1),  # longer than any event may be
            {"id": "e", "sku": "juice", "qty": 5},
        )
    )

    ran = accept(capsys, source, "--file", str(orders))

    assert "Traceback" not in ran.err
    assert ran.status == 1
    assert ran.out == "accepted 2, duplicate 2, failed 6\n"
    assert ran.err.splitlines() == [
        f"{orders}:3: invalid order: qty: must be between 1 and 1,000,000, got 0",
        f"{orders}:4: line is not valid JSON: Expecting property name enclosed in double"
        " quotes at column 26",
        f"{orders}:5: conflict: event 'order-1' was already recorded with a different payload",
        f"{orders}:8: duplicate key 'id' in a JSON object at /id",
        f"{orders}:9: invalid event: /data/a{'/0' * 31}: is nested over 32 deep",
        f"{orders}:10: line is over {MAX_BODY_BYTES} bytes",
    ]
    assert db_rows(source, "SELECT id, sku, qty FROM outbox_orders ORDER BY id") == [
        ("a", "tea", 1),
        ("e", "juice", 5),
        ("order-1", "snack", 7),
    ]
    assert [r[0] for r in db_rows(source, "SELECT id FROM outbox_entries ORDER BY seq")] == [
        "order-1",
        "a",
        "e",
    ]


TUTORIAL_SCHEMAS = Path(__file__).parents[2] / "examples" / "tutorial" / "schemas"


def payment(event_id: str, event_type: str = "payment.captured", **data: object) -> str:
    return json.dumps({"id": event_id, "type": event_type, "key": "c-9", "data": data})


def test_accept_file_holds_events_to_the_schemas_as_serve_does(
    tmp_path: Path, capsys: Capsys, db_rows: Query
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(
        "\n".join(
            (
                payment("p-1", amount_cents=1999, currency="EUR"),
                payment("p-2", amount_cents="1999", currency="EUR"),
                payment("p-3", "payment.refunded", amount_cents=5),
                json.dumps(ORDER),  # an order: no schema applies
            )
        )
        + "\n"
    )
    db = tmp_path / "source.db"

    ran = accept(capsys, db, "--file", str(events), "--schemas", str(TUTORIAL_SCHEMAS))

    assert ran.status == 1
    assert ran.out == "accepted 3, duplicate 0, failed 1\n"
    assert ran.err.splitlines() == [
        f"{events}:2: invalid event: /data/amount_cents: does not match the schema of"
        " 'payment.captured': type: '1999' is not of type 'integer'",
    ]

    strict = tmp_path / "strict.db"
    ran = accept(
        capsys, strict, "--file", str(events), "--schemas", str(TUTORIAL_SCHEMAS), "--strict-types"
    )
    assert ran.out == "accepted 2, duplicate 0, failed 2\n"
    assert ran.err.splitlines()[1] == (
        f"{events}:3: invalid event: /type: has no schema (strict types): 'payment.refunded'"
    )
    assert [r[0] for r in db_rows(strict, "SELECT id FROM outbox_entries ORDER BY seq")] == [
        "p-1",
        "order-1",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--strict-types",), "--strict-types needs --schemas DIR"),
        (("--schemas", "no-such-dir"), "cannot read the schema directory"),
    ],
)
@pytest.mark.parametrize("given", ["file", "order"])
def test_accept_with_schemas_it_cannot_use_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: Capsys, args: tuple[str, ...], said: str, given: str
) -> None:
    # An order given by --id is held to the order's own rules, not to schemas; a
    # mistaken schema option is still an error rather than silently unused.
    events = tmp_path / "events.jsonl"
    events.write_text(payment("p-1", amount_cents=1, currency="EUR") + "\n")
    db = tmp_path / "source.db"
    what = (
        ("--file", str(events)) if given == "file" else ("--id", "o-1", "--sku", "a", "--qty", "1")
    )

    ran = accept(capsys, db, *what, *args)

    assert_one_line_error(ran)
    assert ran.status == 2
    assert said in ran.err
    assert not db.exists()


def test_accept_file_reads_stdin_and_feeds_many_batches_in_line_order(
    tmp_path: Path, capsys: Capsys, db_rows: Query, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "source.db"
    ids = [f"o{n:04d}" for n in range(1234)][::-1]  # line order, not ID order
    lines = jsonl(*({"id": i, "sku": "tea", "qty": 1} for i in ids))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))

    ran = accept(capsys, db, "--file", "-")

    assert (ran.status, ran.err) == (0, "")
    assert ran.out == "accepted 1234, duplicate 0, failed 0\n"
    assert [r[0] for r in db_rows(db, "SELECT id FROM outbox_entries ORDER BY seq")] == ids


def test_accept_file_stops_at_a_batch_the_database_refuses_and_writes_none_of_it(
    tmp_path: Path, capsys: Capsys, db_rows: Query, accept_orders: AcceptOrders
) -> None:
    db = tmp_path / "source.db"
    accept_orders(db, ORDER)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox_entries WHEN NEW.id = 'o0550'"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
    finally:
        conn.close()
    orders = tmp_path / "orders.jsonl"
    orders.write_text(jsonl(*({"id": f"o{n:04d}", "sku": "tea", "qty": 1} for n in range(1200))))

    ran = accept(capsys, db, "--file", str(orders))

    assert "Traceback" not in ran.err
    assert ran.status == 1
    assert ran.out == "accepted 500, duplicate 0, failed 0\n"
    [line] = ran.err.splitlines()
    assert line.startswith(f"{orders}:501-1000: not written (nor any line after it): ")
    assert "disk trouble" in line
    written = [r[0] for r in db_rows(db, "SELECT id FROM outbox_orders ORDER BY id")]
    assert written == [*(f"o{n:04d}" for n in range(500)), "order-1"]


@pytest.mark.parametrize("name", ["missing.jsonl", "a-directory"])
def test_accept_file_that_cannot_be_read_exits_2_with_one_line_and_opens_nothing(
    tmp_path: Path, capsys: Capsys, name: str
) -> None:
    (tmp_path / "a-directory").mkdir()
    db = tmp_path / "source.db"

    ran = accept(capsys, db, "--file", str(tmp_path / name))

    assert ran.status == 2
    assert_one_line_error(ran)
    assert ran.err.startswith(f"outbox-publisher: cannot read {tmp_path / name}: ")
    assert not db.exists()


# ---------------------------------------------------------------- publisher dispatch


@pytest.mark.parametrize("limit", ["0", "17"])
def test_dispatch_with_a_bad_limit_exits_2_and_changes_nothing(
    source: Path, capsys: Capsys, db_rows: Query, closed_port: int, limit: str
) -> None:
    before = state(db_rows, source)
    url = f"http://127.0.0.1:{closed_port}/events"

    ran = dispatch(capsys, source, url, "--limit", limit)

    assert ran.status == 2
    assert_one_line_error(ran)
    assert state(db_rows, source) == before


# Another host is refused before anything resolves it; were that check to regress,
# this process's name resolution is loopback only too (conftest.loopback_only).
@pytest.mark.parametrize(
    "url",
    ["http://example.com/events", "http://127.0.0.1:1/events/"],
)
def test_dispatch_to_a_refused_url_exits_2_and_changes_nothing(
    source: Path, capsys: Capsys, db_rows: Query, url: str
) -> None:
    before = state(db_rows, source)

    ran = dispatch(capsys, source, url)

    assert ran.status == 2
    assert_one_line_error(ran)
    assert "refused" in ran.err
    assert state(db_rows, source) == before


def test_dispatch_to_a_closed_port_exits_1_with_one_line(
    source: Path, capsys: Capsys, db_rows: Query, closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/events"

    ran = dispatch(capsys, source, url)

    assert ran.status == 1
    assert_one_line_error(ran)
    assert "order-1" in ran.err
    assert db_rows(source, "SELECT id, sent FROM outbox_entries") == [("order-1", 0)]


async def create_outbox(db: Path) -> None:
    async with Outbox.open(str(db)):
        pass


def test_dispatch_of_an_empty_outbox_exits_0_without_connecting(
    tmp_path: Path, capsys: Capsys, closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/events"
    empty = tmp_path / "empty.db"
    asyncio.run(create_outbox(empty))

    ran = dispatch(capsys, empty, url)

    assert (ran.status, ran.out.strip(), ran.err) == (0, "delivered 0", "")


@pytest.mark.parametrize(
    "command",
    [
        ("dispatch", "--sink", "http://127.0.0.1:9/events"),
        ("status",),
        ("list", "--state", "pending"),
        ("quarantine", "order-1", "--reason", "r", "--by", "alice"),
        ("redrive", "order-1", "--by", "alice"),
        ("trace", "order-1", "--sink", "http://127.0.0.1:9/events"),
        ("prune", "--older-than", "1d"),
    ],
    ids=lambda command: command[0],
)
def test_a_command_on_an_outbox_refuses_a_file_that_is_not_there(
    tmp_path: Path, capsys: Capsys, command: tuple[str, ...]
) -> None:
    """A mistyped --db is one line, not an empty outbox made at that path."""
    missing = tmp_path / "typo.db"

    ran = run_publisher(capsys, command[0], "--db", str(missing), *command[1:])

    assert_one_line_error(ran)
    assert ran.status == 2
    assert "no such database file" in ran.err
    assert not missing.exists()


def test_a_postgres_uri_with_an_empty_host_and_a_schema_opens_the_database(
    pg_schemas: PgSchemas, capsys: Capsys
) -> None:
    """postgresql:///DB?host=...: the host given as a parameter, as libpq's local-socket
    form is written; --schema added to it keeps the URI libpq reads."""
    from urllib.parse import urlsplit

    parts = urlsplit(pg_schemas.database_url)
    url = f"postgresql://{parts.path}?host={parts.hostname}&port={parts.port}&user={parts.username}"
    order = ("--id", "o-1", "--sku", "a", "--qty", "1")
    assert (
        run_publisher(capsys, "accept", "--db", url, "--schema", "socket_form", *order).status == 0
    )
    ran = run_publisher(
        capsys, "list", "--db", url, "--schema", "socket_form", "--state", "pending"
    )
    assert ran.status == 0 and "o-1" in ran.out, ran


@pytest.mark.parametrize(
    "command",
    [("status",), ("list", "--state", "sent"), ("prune", "--older-than", "1d")],
    ids=lambda command: command[0],
)
def test_a_command_on_an_outbox_refuses_a_postgres_schema_without_one(
    pg_schemas: PgSchemas, capsys: Capsys, command: tuple[str, ...]
) -> None:
    """A mistyped --schema is one line, not a schema and an empty outbox made there;
    a database where the outbox is (its schema named) is read as before."""
    from pg_faults import PgAccess

    url = pg_schemas.database_url

    ran = run_publisher(capsys, command[0], "--db", url, "--schema", "relya", *command[1:])

    assert_one_line_error(ran)
    assert ran.status == 2
    assert "the publisher's tables are not in schema 'relya'" in ran.err
    access = PgAccess(url, "outbox_health")
    assert access.query("SELECT to_regnamespace('relya')") == [(None,)]
    assert (
        run_publisher(
            capsys,
            "accept",
            "--db",
            url,
            "--schema",
            "relay",
            "--id",
            "o-1",
            "--sku",
            "a",
            "--qty",
            "1",
        ).status
        == 0
    )
    assert (
        run_publisher(capsys, command[0], "--db", url, "--schema", "relay", *command[1:]).status
        == 0
    )


# ---------------------------------------------------------------- publisher serve


@pytest.mark.parametrize("kind", ["missing", "directory", "short"])
def test_a_console_token_file_that_cannot_be_used_is_one_line_and_exit_2(
    tmp_path: Path, capsys: Capsys, kind: str
) -> None:
    path = tmp_path / "console-token"
    if kind == "directory":
        path.mkdir()
    elif kind == "short":
        path.write_text("short")
    db = tmp_path / "source.db"

    ran = run_publisher(
        capsys, "serve", "--db", str(db), "--sink", "http://127.0.0.1:9/events",
        "--host", "127.0.0.1", "--port", "0", "--console-token-file", str(path),
    )  # fmt: skip

    assert ran.status == 2, ran.err
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.err, ran.err
    assert "console-token" in lines[0]
    assert not db.exists()


# ---------------------------------------------------------------- sink


def test_sink_with_a_garbage_db_file_exits_with_one_line_and_leaves_it_alone(
    tmp_path: Path, capsys: Capsys
) -> None:
    db = tmp_path / "garbage.db"
    garbage = bytes(range(256)) * 16
    db.write_bytes(garbage)
    threads = set(threading.enumerate())

    ran = run_sink(capsys, "--db", str(db), "--port", "0")

    assert ran.status != 0
    assert_one_line_error(ran)
    assert db.read_bytes() == garbage
    # A database thread still running once main() returns is what, in a process of
    # its own, would print a thread's traceback after the one line.
    assert set(threading.enumerate()) <= threads


# ---------------------------------------------------------------- events of any type

EVENTS: list[dict[str, Any]] = [
    {"id": "pay-1", "type": "payment.captured", "key": "cust-1", "data": {"amount": 1250}},
    {"id": "tick-1", "type": "clock.tick", "data": {"n": 1}},
    {"id": "pay-2", "type": "payment.captured", "key": "cust-2", "data": {"amount": 99}},
    {"id": "note-1", "type": "note.added", "key": "cust-1", "data": {"text": "<b>\u0007\u00e9"}},
]


def publish(db: Path, *events: dict[str, Any]) -> None:
    async def run() -> None:
        async with Outbox.open(db) as outbox:
            for event in events:
                assert await outbox.publish(dict(event)) == "accepted"

    asyncio.run(run())


def listed(capsys: Capsys, db: Path, *args: str) -> list[str]:
    """The event IDs `publisher list` prints, in its order."""
    ran = run_publisher(capsys, "list", "--db", str(db), *args)
    assert ran.status == 0 and ran.err == ""
    if ran.out.startswith("no "):  # nothing matched: `list` says so in one line
        assert len(ran.out.splitlines()) == 1, ran.out
        return []
    return [line.split()[1] for line in ran.out.splitlines()]


def test_list_shows_type_key_and_escaped_data_and_filters_by_type_and_key(
    source: Path, capsys: Capsys
) -> None:
    publish(source, *EVENTS)

    ran = run_publisher(capsys, "list", "--db", str(source))
    lines = ran.out.splitlines()
    assert lines[0].split()[1:5] == [
        "order-1",
        "order.placed",
        "key=snack",
        '{"qty":7,"sku":"snack"}',
    ]
    assert lines[1].split()[1:5] == ["pay-1", "payment.captured", "key=cust-1", '{"amount":1250}']
    assert lines[2].split()[1:4] == ["tick-1", "clock.tick", "key=*"]
    assert '{"text":"<b>\\u0007\\u00e9"}' in lines[4]
    assert ran.out.isascii() and "\x07" not in ran.out

    assert listed(capsys, source, "--type", "payment.captured") == ["pay-1", "pay-2"]
    assert listed(capsys, source, "--key", "cust-1") == ["pay-1", "note-1"]
    assert listed(capsys, source, "--type", "note.added", "--key", "cust-1") == ["note-1"]
    assert listed(capsys, source, "--key", "*") == ["tick-1"]
    assert listed(capsys, source, "--type", "order.placed") == ["order-1"]
    assert listed(capsys, source, "--type", "no.such.type") == []


def test_trace_of_a_generic_event_is_accepted_by_its_entry(source: Path, capsys: Capsys) -> None:
    publish(source, *EVENTS)

    ran = run_publisher(capsys, "trace", "--db", str(source), "note-1")

    assert ran.status == 0, ran.err
    [accepted] = [line for line in ran.out.splitlines() if " accepted " in line]
    assert "proven" in accepted and "not proven" not in accepted
    assert 'event note.added key cust-1 data {"text":"<b>\\u0007\\u00e9"}, ' in accepted
    queued = next(line for line in ran.out.splitlines() if " queued " in line)
    assert "proven" in queued and "outbox seq 5" in queued

    keyless = run_publisher(capsys, "trace", "--db", str(source), "tick-1", "--json")
    stages = json.loads(keyless.out)["stages"]
    assert stages[0]["proof"] == "proven"
    assert stages[0]["evidence"].startswith('event clock.tick data {"n":1}, ')

    unknown = run_publisher(capsys, "trace", "--db", str(source), "nope-1")
    assert unknown.status == 1


# ---------------------------------------------------------------- --version


def test_version_names_the_release_and_the_schema_versions_each_program_writes(
    capsys: Capsys,
) -> None:
    """What decides whether a program opens a database: the upgrade how-to asks for it."""
    from importlib import metadata

    from publisher.backends import postgres_sql as publisher_pg
    from publisher.backends import sqlite_sql as publisher_sqlite
    from sink.backends import postgres_sql as sink_pg
    from sink.backends import sqlite_sql as sink_sqlite

    release = metadata.version("outbox-relay")
    for run, side, sqlite, postgres in [
        (run_publisher, "publisher", publisher_sqlite, publisher_pg),
        (run_sink, "sink", sink_sqlite, sink_pg),
    ]:
        ran = run(capsys, "--version")
        assert (ran.status, ran.err) == (0, "")
        assert ran.out.splitlines() == [
            f"outbox-{side} {release}: {side} schema version {sqlite.SCHEMA.version} on SQLite,"
            f" {postgres.SCHEMA.version} on PostgreSQL"
        ]
