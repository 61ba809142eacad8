"""`python -m chaos`: real services killed for real, verdicts read from the databases.

Every run keeps its files under the test's own directory (--workdir), so the test
can read them back and can look for processes still using them afterwards. On
PostgreSQL (`--backend postgres --db-url` of the test process's database) the run makes
two schemas there, kept with --workdir, and the test reads them through the URIs
the report names.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import entry_payload, run_module

from chaos.run import plan_kills
from chaos.verdict import order_inversions, read_verdict

if TYPE_CHECKING:
    from conftest import Query

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 90.0
SCENARIO_TIMEOUT_S = 60.0
SETTLE_S = 2.0
VERDICT_KEYS = ("accepted", "delivered", "resends", "duplicates", "lost", "applied_twice")


# ---------------------------------------------------------------- processes


def processes_using(path: Path) -> list[int]:
    """PIDs (other than this one) whose command line mentions `path`."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def leftovers(path: Path) -> list[int]:
    """Processes still using `path` after a bounded grace period."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = processes_using(path)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture
def reaper(tmp_path: Path) -> Iterator[None]:
    """After the test, end any process a chaos run left behind in this test's directory."""
    yield
    for pid in processes_using(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def chaos(
    env: dict[str, str], cwd: Path, *args: str, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return run_module("chaos", *args, env=env, cwd=cwd, timeout=timeout)


def one_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    parsed = json.loads(lines[0])
    assert isinstance(parsed, dict)
    return parsed


def assert_clean_verdict(figures: dict[str, Any], events: int, kills: int) -> None:
    assert figures["accepted"] == events, figures
    assert figures["delivered"] == events, figures
    assert figures["lost"] == 0, figures
    assert figures["applied_twice"] == 0, figures
    assert figures["inventory_ok"] is True, figures
    assert figures["order_inversions"] == 0, figures
    assert figures["ok"] is True, figures
    assert figures["kills"] == kills, figures
    assert sum(figures["kills_by_kind"].values()) == kills, figures
    assert sorted(figures["kills_by_kind"]) == figures["kill_kinds"], figures
    sigkills, exits = figures["sigkills"], figures["chaos_exits_by_service"]
    assert sum(sigkills.values()) <= kills, figures  # a victim may be ending by itself
    statuses = figures["exit_statuses"]
    assert set(statuses) == {"publisher", "sink"}, figures
    for name in ("publisher", "sink"):  # SIGKILLs, chaos exits, then one orderly stop
        ended = statuses[name]
        assert set(ended) <= {"-9", "73", "0"}, figures
        assert (ended.get("-9", 0), ended.get("73", 0)) == (sigkills[name], exits[name])
        assert ended.get("0") == 1, figures
    # Every process started after the first was started because one ended by a fault.
    assert figures["restarts"] <= figures["faults"] <= figures["restarts"] + 2, figures
    assert sum(exits.values()) == figures["chaos_exits"], figures
    assert figures["faults"] == sum(sigkills.values()) + figures["chaos_exits"], figures
    armed = sum(n for kind, n in figures["kills_by_kind"].items() if "exit-after" in kind)
    assert figures["chaos_exits"] <= armed, figures
    for key in ("resends", "duplicates"):
        assert isinstance(figures[key], int) and not isinstance(figures[key], bool), figures
        assert figures[key] >= 0, figures
    assert figures["duplicates"] <= figures["resends"], figures


def write(db: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    """One write to a SQLite file through a connection of the test's own."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


def backend_args(backend: str, request: pytest.FixtureRequest) -> list[str]:
    """The chaos options for a backend: SQLite files, or schemas in the process's
    database on the session's PostgreSQL server (the pg_schemas fixture: chaos takes
    a URI without a search_path and makes its own schemas; they are dropped with the
    test's)."""
    if backend == "sqlite":
        return []
    return ["--backend", "postgres", "--db-url", request.getfixturevalue("pg_schemas").database_url]


def located(figures: dict[str, Any]) -> tuple[Path | str, Path | str]:
    """The source and sink database the run reports, as db_rows takes them."""
    source, sink = figures["databases"]["source"], figures["databases"]["sink"]
    if figures["backend"] == "sqlite":
        return Path(source), Path(sink)
    return source, sink


def files_agree(
    databases: tuple[Path | str, Path | str],
    db_rows: Query,
    events: int,
    ordering: str = "global",
    orders: int | None = None,
) -> None:
    """The verdict's numbers, checked against both databases with this process's own
    reads: `events` delivered, `orders` of them orders (default: all)."""
    source, sink = databases
    orders = events if orders is None else orders
    assert db_rows(source, "SELECT count(*) FROM outbox_orders") == [(orders,)]
    assert db_rows(source, "SELECT count(*) FROM outbox_entries WHERE sent = 1") == [(events,)]
    assert db_rows(sink, "SELECT count(*) FROM inbox_events") == [(events,)]
    # Each event's canonical form, one text on both sides.
    stored = dict(db_rows(source, f"SELECT id, {entry_payload(source)} FROM outbox_entries"))
    assert dict(db_rows(sink, "SELECT id, payload FROM inbox_events")) == stored
    want = db_rows(source, "SELECT sku, sum(qty) FROM outbox_orders GROUP BY sku ORDER BY sku")
    assert db_rows(sink, "SELECT sku, qty FROM inbox_inventory ORDER BY sku") == want
    # No quarantine in a run: the sink first applied each line exactly in seq order,
    # a line per event key ("*" for none) in order by key.
    assert db_rows(source, "SELECT count(*) FROM outbox_quarantines") == [(0,)]
    line = {
        i: (json.loads(payload).get("key", "*") if ordering != "global" else "")
        for i, payload in stored.items()
    }
    outbox = [
        (line[i], i) for (i,) in db_rows(source, "SELECT id FROM outbox_entries ORDER BY seq")
    ]
    inbox = [
        (line[i], i) for (i,) in db_rows(sink, "SELECT id FROM inbox_events ORDER BY applied_seq")
    ]
    assert inbox != [] and sorted(inbox) == sorted(outbox)
    for key in {k for k, _ in outbox}:
        assert [i for k, i in inbox if k == key] == [i for k, i in outbox if k == key], key


# ---------------------------------------------------------------- chaos run


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
@pytest.mark.parametrize(
    ("backend", "target", "events", "kills", "kinds", "ordering", "delivery", "mix"),
    [
        ("sqlite", "both", 60, 6, {"publisher", "sink"}, "global", "batch", "orders"),
        ("sqlite", "sink", 40, 4, {"sink"}, "global", "batch", "orders"),
        ("sqlite", "publisher", 40, 4, {"publisher"}, "global", "batch", "orders"),
        ("sqlite", "both", 40, 6, {"publisher", "sink"}, "sku", "single", "orders"),
        ("sqlite", "both", 60, 6, {"publisher", "sink"}, "key", "batch", "mixed"),
        ("sqlite", "both", 40, 6, {"publisher", "sink"}, "global", "single", "generic"),
        ("postgres", "both", 60, 6, {"publisher", "sink"}, "global", "batch", "orders"),
        ("postgres", "both", 60, 6, {"publisher", "sink"}, "key", "single", "mixed"),
    ],
)
def test_run_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path,
    child_env: dict[str, str],
    db_rows: Query,
    request: pytest.FixtureRequest,
    backend: str,
    target: str,
    events: int,
    kills: int,
    kinds: set[str],
    ordering: str,
    delivery: str,
    mix: str,
) -> None:
    workdir = tmp_path / "run"
    args = ["--events", str(events), "--kills", str(kills), "--seed", "7", "--target", target]
    args += ["--ordering", ordering, "--delivery", delivery, *backend_args(backend, request)]
    args += ["--events-mix", mix]

    done = chaos(child_env, tmp_path, "run", *args, "--json", "--workdir", str(workdir))

    assert done.returncode == 0, done.stderr
    figures = one_json(done.stdout)
    assert_clean_verdict(figures, events, kills)
    assert figures["backend"] == backend
    assert (figures["ordering"], figures["delivery"]) == (ordering, delivery)
    log = (workdir / "publisher.log").read_text().splitlines()
    started = [line for line in log if "relay started" in line]
    relay_ordering = "key" if ordering == "sku" else ordering  # sku: key's former name
    assert started and all(f"ordering={relay_ordering}" in line for line in started), started
    assert_the_mix(figures, mix, events)
    assert figures["drained"] is True
    assert figures["pending"] == 0
    assert {kind.partition(":")[0] for kind in figures["kill_kinds"]} <= kinds
    planned = plan_kills(random.Random(7), events, kills, target)  # type: ignore[arg-type]
    assert figures["kill_kinds"] == sorted(set(planned.values()))
    orders = figures["accepted"] - figures["generic"]
    files_agree(located(figures), db_rows, events, ordering, orders)
    assert leftovers(workdir) == []


def assert_the_mix(figures: dict[str, Any], mix: str, events: int) -> None:
    """What the run fed and through which intake routes, as its report says."""
    assert figures["events_mix"] == mix
    assert figures["payload_mismatches"] == figures["unknown"] == 0, figures
    types = figures["event_types"]
    assert sum(types.values()) == events, types
    generic = events - types.get("order.placed", 0)
    assert figures["generic"] == generic, figures
    posts = figures["intake_posts"]
    if mix == "orders":
        assert (set(types), set(posts)) == ({"order.placed"}, {"/orders"}), figures
        return
    assert generic > 0 and len(set(types) - {"order.placed"}) >= 2, types
    assert {"/events", "/events/batch"} <= set(posts), posts
    assert ("/orders" in posts) == (mix == "mixed"), posts
    if figures["ordering"] != "global":  # events without a key: their own line
        assert "*" in figures["lines"], figures["lines"]


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_same_seed_same_orders_and_same_plan(
    tmp_path: Path, child_env: dict[str, str], db_rows: Query
) -> None:
    results = []
    for name in ("first", "second"):
        workdir = tmp_path / name
        args = ["--events", "15", "--kills", "3", "--seed", "11", "--events-mix", "mixed"]
        done = chaos(child_env, tmp_path, "run", *args, "--json", "--workdir", str(workdir))
        assert done.returncode == 0, done.stderr
        figures = one_json(done.stdout)
        source = workdir / "source.db"
        fed = db_rows(source, f"SELECT id, {entry_payload(source)} FROM outbox_entries ORDER BY id")
        stock = db_rows(workdir / "sink.db", "SELECT sku, qty FROM inbox_inventory ORDER BY sku")
        results.append((figures["kills"], figures["kill_kinds"], fed, stock))

    assert results[0] == results[1]
    assert len(results[0][2]) == 15
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_human_output_ends_with_the_verdict_line(tmp_path: Path, child_env: dict[str, str]) -> None:
    args = ["--events", "10", "--kills", "1", "--seed", "5", "--workdir", str(tmp_path / "w")]

    done = chaos(child_env, tmp_path, "run", *args)

    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("OK: 10 accepted, 10 delivered, "), done.stdout
    assert last.endswith(
        "0 lost, 0 applied twice, 0 payloads differing, 0 unknown, "
        "0 order inversions (global order)"
    ), done.stdout
    assert "order_inversions       0" in done.stdout
    assert "[chaos] fed 10/10 orders" in done.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_the_verdict_fails_on_tampered_files(
    tmp_path: Path, child_env: dict[str, str], db_rows: Query
) -> None:
    workdir = tmp_path / "kept"
    args = ["--events", "20", "--kills", "2", "--seed", "3", "--events-mix", "mixed", "--json"]
    done = chaos(child_env, tmp_path, "run", *args, "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    source, sink = workdir / "source.db", workdir / "sink.db"
    assert read_verdict(source, sink, {}).ok is True
    generic = "SELECT id FROM outbox_entries WHERE type <> 'order.placed' ORDER BY seq DESC LIMIT 1"
    ((last,),) = db_rows(source, generic)
    # The same event, written as other JSON text: not its canonical form.
    write(sink, "UPDATE inbox_events SET payload = payload || ' ' WHERE id = ?", (last,))
    differing = read_verdict(source, sink, {})
    assert (differing.payload_mismatches, differing.lost, differing.ok) == (1, 0, False)

    ((sku,),) = db_rows(sink, "SELECT sku FROM inbox_inventory ORDER BY sku LIMIT 1")
    write(sink, "UPDATE inbox_inventory SET qty = qty + 1 WHERE sku = ?", (sku,))

    tampered = read_verdict(source, sink, {})
    assert tampered.ok is False
    assert tampered.applied_twice == 1
    assert tampered.inventory_ok is False
    assert tampered.lost == 0

    ((event_id,),) = db_rows(source, "SELECT id FROM outbox_entries ORDER BY seq LIMIT 1")
    assert event_id != last
    write(source, "UPDATE outbox_entries SET sent = 0, sent_at = NULL WHERE id = ?", (event_id,))

    unmarked = read_verdict(source, sink, {})
    assert unmarked.lost == 1
    assert unmarked.pending == 1
    assert unmarked.ok is False

    # A generic event the sink never applied: no inventory shows it.
    write(sink, "DELETE FROM inbox_events WHERE id = ?", (last,))

    missing = read_verdict(source, sink, {})
    assert (missing.lost, missing.payload_mismatches, missing.unknown) == (2, 0, 0)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_the_order_check_fails_on_a_reordered_inbox(
    tmp_path: Path, child_env: dict[str, str], db_rows: Query
) -> None:
    workdir = tmp_path / "kept"
    args = ["--events", "20", "--kills", "2", "--seed", "3", "--json"]
    done = chaos(child_env, tmp_path, "run", *args, "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    source, sink = workdir / "source.db", workdir / "sink.db"
    assert read_verdict(source, sink, {}).order_inversions == 0

    ((first,),) = db_rows(source, "SELECT id FROM outbox_entries ORDER BY seq LIMIT 1")
    # As if the sink had first applied the first order last.
    write(
        sink,
        "UPDATE inbox_events SET applied_seq = (SELECT max(applied_seq) + 1 FROM inbox_events)"
        " WHERE id = ?",
        (first,),
    )

    moved = read_verdict(source, sink, {})
    assert moved.order_inversions == 19  # it and each of the 19 that went before it
    assert (moved.lost, moved.applied_twice, moved.inventory_ok) == (0, 0, True)
    assert moved.ok is False


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.usefixtures("reaper")
def test_a_run_past_its_time_limit_stops(tmp_path: Path, child_env: dict[str, str]) -> None:
    workdir = tmp_path / "w"
    args = ["--events", "5000", "--kills", "0", "--time-limit", "1", "--json"]

    started = time.monotonic()
    done = chaos(child_env, tmp_path, "run", *args, "--workdir", str(workdir))

    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 20
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "time limit of 1 s" in done.stderr
    assert done.stdout == ""
    assert leftovers(workdir) == []


# ---------------------------------------------------------------- named scenarios

SCENARIO_FIGURES: dict[str, dict[str, Any]] = {
    "crash-after-ack": {"deliveries": 2, "inventory": 7, "first_exit": 73, "sent": 1},
    "drop-after-commit": {"deliveries": 2, "inventory": 7, "first_exit": 1, "sent": 1},
    "poison-head": {
        "delivered_past": ["ok-1", "ok-2"],
        "lost": 0,
        "delivered": 3,
        "order_inversions": 0,
    },
    "slow-sink": {
        "lost": 0,
        "delivered": 20,
        "applied_twice": 0,
        "inventory_ok": True,
        "order_inversions": 0,
    },
}


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
@pytest.mark.parametrize(
    ("name", "backend"),
    [
        *((name, "sqlite") for name in SCENARIO_FIGURES),
        ("crash-after-ack", "postgres"),
        ("drop-after-commit", "postgres"),
    ],
)
def test_scenario(
    tmp_path: Path,
    child_env: dict[str, str],
    db_rows: Query,
    request: pytest.FixtureRequest,
    name: str,
    backend: str,
) -> None:
    workdir = tmp_path / "w"

    done = chaos(
        child_env,
        tmp_path,
        "scenario",
        name,
        "--json",
        "--workdir",
        str(workdir),
        *backend_args(backend, request),
        timeout=SCENARIO_TIMEOUT_S,
    )

    assert done.returncode == 0, done.stderr
    outcome = one_json(done.stdout)
    assert outcome["scenario"] == name
    assert outcome["ok"] is True, outcome
    for key, value in SCENARIO_FIGURES[name].items():
        assert outcome[key] == value, (key, outcome)
    if name in ("crash-after-ack", "drop-after-commit"):
        assert outcome["result"] == "delivered 2 times, applied once"
    if name == "slow-sink":
        assert isinstance(outcome["intake_p99_ms"], float | int)
        assert 0 < outcome["intake_p99_ms"] < 500
    outcome["backend"] = backend
    source, sink = located(outcome)
    if backend == "sqlite":
        assert (source, sink) == (workdir / name / "source.db", workdir / name / "sink.db")
    if name in ("crash-after-ack", "drop-after-commit"):  # what the verdict says, read again
        assert db_rows(sink, "SELECT id, deliveries FROM inbox_events") == [("order-1", 2)]
        assert db_rows(sink, "SELECT sku, qty FROM inbox_inventory") == [("snack", 7)]
        assert db_rows(source, "SELECT id, sent FROM outbox_entries") == [("order-1", 1)]
    assert leftovers(workdir) == []
    if name == "poison-head":
        assert_the_quarantine_record_explains_the_order(workdir / name, tmp_path / "copy.db")


def assert_the_quarantine_record_explains_the_order(workdir: Path, copy: Path) -> None:
    """ok-1 and ok-2 went past poison-1: without its record, two pairs are inverted."""
    sink = workdir / "sink.db"
    assert order_inversions(workdir / "source.db", sink) == 0
    conn = sqlite3.connect(workdir / "source.db")
    try:
        conn.execute("VACUUM INTO ?", (str(copy),))
    finally:
        conn.close()
    conn = sqlite3.connect(copy)
    try:
        with conn:
            assert conn.execute("DELETE FROM outbox_quarantines").rowcount == 1
    finally:
        conn.close()
    assert order_inversions(copy, sink) == 2


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_crash_after_ack_tells_the_story(tmp_path: Path, child_env: dict[str, str]) -> None:
    workdir = tmp_path / "w"

    done = chaos(
        child_env,
        tmp_path,
        "scenario",
        "crash-after-ack",
        "--workdir",
        str(workdir),
        timeout=SCENARIO_TIMEOUT_S,
    )

    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = [line.strip() for line in out.splitlines()]
    accepted = [line for line in lines if line.startswith("1 accepted")]
    marked = [line for line in lines if line.startswith("5 marked")]
    assert len(accepted) == 2, out
    assert len(marked) == 2, out
    assert all("proven" in line and "not proven" not in line for line in accepted), out
    assert "not proven" in marked[0], "before the recovery the entry is not marked"
    assert "not proven" not in marked[1] and "proven" in marked[1], out
    assert out.index(marked[0]) < out.index("dispatch again") < out.rindex(marked[1])
    assert "exit status 73" in out
    assert out.rstrip().endswith("delivered 2 times, applied once"), out
    assert leftovers(workdir) == []


def test_unknown_scenario_is_usage_error(tmp_path: Path, child_env: dict[str, str]) -> None:
    workdir = tmp_path / "w"
    done = chaos(child_env, tmp_path, "scenario", "no-such-story", "--workdir", str(workdir))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not workdir.exists()


# ---------------------------------------------------------------- runs that cannot be carried out

BROKEN_MAIN = "import sys\nprint('broken on purpose', file=sys.stderr)\nsys.exit(3)\n"


def broken_env(child_env: dict[str, str], tmp_path: Path, module: str) -> dict[str, str]:
    """child_env where `python -m <module>` fails at once (the chaos runner itself is intact)."""
    fake = tmp_path / "broken" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(BROKEN_MAIN)
    path = os.pathsep.join(filter(None, [str(fake.parent), child_env.get("PYTHONPATH")]))
    return {**child_env, "PYTHONPATH": path}


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.usefixtures("reaper")
def test_a_failed_start_keeps_the_files_it_says_it_keeps(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**broken_env(child_env, tmp_path, "sink"), "TMPDIR": str(temp)}

    done = chaos(env, tmp_path, "run", "--events", "3", "--kills", "0", "--json")

    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "broken on purpose" in done.stderr
    kept = done.stderr.rstrip().rpartition("files and logs kept in ")[2].rstrip(")")
    assert kept.startswith(str(temp)), done.stderr
    assert Path(kept).is_dir(), f"the message says the files are kept in {kept}, but it is gone"
    assert (Path(kept) / "sink.log").is_file()


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.usefixtures("reaper")
@pytest.mark.parametrize(
    "command",
    [
        ["run", "--events", "3", "--kills", "0"],
        ["scenario", "poison-head"],
        ["scenario", "slow-sink"],
    ],
    ids=["run", "poison-head", "slow-sink"],
)
def test_a_publisher_that_cannot_start_leaves_no_sink_running(
    tmp_path: Path, child_env: dict[str, str], command: list[str]
) -> None:
    workdir = tmp_path / "w"
    env = broken_env(child_env, tmp_path, "publisher")

    done = chaos(env, tmp_path, *command, "--json", "--workdir", str(workdir))

    assert done.returncode == 2, done.stderr
    assert "publisher did not start" in done.stderr
    assert leftovers(workdir) == [], "the sink started for this run is still running"


# A registry of the user's own that keeps no inventory (the verdict cannot check one).
NO_INVENTORY = """
from sink import Handlers

handlers = Handlers("mine")
handlers.schema("CREATE TABLE mine (event_id TEXT NOT NULL)")

@handlers.otherwise
def seen(event):
    return [("INSERT INTO mine (event_id) VALUES (:id)", {"id": event.id})]
"""


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_run_with_handlers_that_count_effects_finds_each_effect_once(
    tmp_path: Path, child_env: dict[str, str], request: pytest.FixtureRequest, backend: str
) -> None:
    workdir = tmp_path / "counted"
    args = ["--events", "40", "--kills", "5", "--seed", "9", "--events-mix", "mixed"]
    args += ["--ordering", "key", "--handlers", "chaos.handlers:EFFECTS"]
    args += [*backend_args(backend, request), "--json", "--workdir", str(workdir)]

    done = chaos(child_env, tmp_path, "run", *args)

    assert done.returncode == 0, done.stderr
    figures = one_json(done.stdout)
    assert_clean_verdict(figures, 40, 5)
    assert (figures["effects_checked"], figures["inventory_checked"]) == (True, True), figures
    assert figures["handlers"] == "chaos.handlers:EFFECTS"
    if backend != "sqlite":
        return
    source, sink = workdir / "source.db", workdir / "sink.db"
    assert read_verdict(source, sink, {}, "key").ok is True
    ((first,), (second,)) = sqlite3.connect(sink).execute(
        "SELECT event_id FROM chaos_effects ORDER BY rowid LIMIT 2"
    )
    # An effect applied twice, and one missing, are each seen though the inbox agrees.
    write(sink, "INSERT INTO chaos_effects (event_id, type) VALUES (?, 'again')", (first,))
    doubled = read_verdict(source, sink, {}, "key")
    assert (doubled.applied_twice, doubled.lost, doubled.ok) == (1, 0, False)
    write(sink, "DELETE FROM chaos_effects WHERE event_id = ?", (second,))
    missing = read_verdict(source, sink, {}, "key")
    assert (missing.applied_twice, missing.lost, missing.ok) == (1, 1, False)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.usefixtures("reaper")
def test_a_run_with_a_registry_of_ones_own_checks_all_but_the_inventory(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    (tmp_path / "mine_handlers.py").write_text(NO_INVENTORY)  # the run's own directory
    env = {**child_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), child_env["PYTHONPATH"]])}
    workdir = tmp_path / "mine"
    args = ["--events", "20", "--kills", "2", "--seed", "2", "--events-mix", "mixed"]
    args += ["--handlers", "mine_handlers:handlers", "--json", "--workdir", str(workdir)]

    done = chaos(env, tmp_path, "run", *args)

    assert done.returncode == 0, done.stderr
    figures = one_json(done.stdout)
    assert figures["ok"] is True, figures
    assert (figures["effects_checked"], figures["inventory_checked"]) == (False, False)
    assert figures["inventory_ok"] is False  # orders were fed; this registry keeps no stock
    rows = sqlite3.connect(workdir / "sink.db").execute("SELECT count(*) FROM mine").fetchall()
    assert rows == [(20,)]
