"""Usage errors of both command lines, `main(argv)` called in this process: exit
status 2 and one line on stderr, before anything is opened, created or started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_support import Ran, assert_one_line_error, run_publisher, run_sink

Capsys = pytest.CaptureFixture[str]
SINK_URL = "http://127.0.0.1:9/events"

pytestmark = pytest.mark.usefixtures("like_a_child_process")


def test_publisher_without_a_command_exits_2(capsys: Capsys) -> None:
    ran = run_publisher(capsys)

    assert ran.status == 2
    assert_one_line_error(ran)


@pytest.mark.parametrize("chaos", ["drop-after-commit=0", "explode=1"])
def test_sink_with_a_bad_chaos_value_exits_2_with_one_line(
    tmp_path: Path, capsys: Capsys, chaos: str
) -> None:
    db = tmp_path / "sink.db"

    ran = run_sink(capsys, "--db", str(db), "--port", "0", "--chaos", chaos)

    assert ran.status == 2
    assert_one_line_error(ran)


# ---------------------------------------------------------------- relay worker options


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--lease-ttl", "0", "must be greater than 0"),
        ("--lease-ttl", "-1", "not a number of seconds"),
        ("--lease-ttl", "0.01", "lease ttl must be from 0.1 to 3600 s"),
        ("--lease-ttl", "86400", "lease ttl must be from 0.1 to 3600 s"),
        ("--lease-ttl", "nan", "not a number of seconds"),
        ("--worker-id", "two words", "is not 1-128 of A-Z a-z 0-9 . _ : @ -"),
        ("--worker-id", "", "is not 1-128"),
        ("--worker-id", "w" * 129, "is not 1-128"),
    ],
)
def test_bad_worker_options_are_one_line_and_exit_status_2(
    capsys: Capsys, tmp_path: Path, option: str, value: str, says: str
) -> None:
    db = tmp_path / "source.db"

    ran = run_publisher(capsys, "serve", "--db", str(db), "--sink", SINK_URL, option, value)

    assert ran.status == 2, ran.err
    assert ran.err.count("\n") == 1, ran.err
    assert f"argument {option}" in ran.err and says in ran.err
    assert not db.exists()  # refused before anything opened


# ---------------------------------------------------------------- the event loop

SERVE_ARGS = {"sink": (), "publisher": ("serve", "--sink", SINK_URL)}


def serve(capsys: Capsys, module: str, db: Path, *extra: str) -> Ran:
    """`python -m <module>` serving on `db`, in this process."""
    run = run_sink if module == "sink" else run_publisher
    return run(capsys, *SERVE_ARGS[module], "--db", str(db), "--port", "0", *extra)


def assert_usage_error(ran: Ran, starts: str) -> None:
    assert ran.status == 2, ran
    assert ran.out == ""
    assert ran.err.startswith(starts), ran.err
    assert len(ran.err.splitlines()) == 1, ran.err
    assert "Traceback" not in ran.err


@pytest.mark.parametrize("module", ["sink", "publisher"])
def test_asking_for_uvloop_where_it_cannot_be_imported_is_a_usage_error(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    db = tmp_path / "service.db"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` fails, as without it

    refused = serve(capsys, module, db, "--event-loop", "uvloop")

    assert_usage_error(refused, f"outbox-{module}: uvloop cannot be imported here")
    assert "--event-loop asyncio" in refused.err
    assert not db.exists(), "nothing may be created before the loop is settled"


@pytest.mark.parametrize("module", ["sink", "publisher"])
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_an_unknown_event_loop_is_a_usage_error(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, module: str, how: str
) -> None:
    db = tmp_path / "service.db"
    extra: tuple[str, ...] = ()
    if how == "flag":
        extra = ("--event-loop", "trio")
    else:
        monkeypatch.setenv("OUTBOX_EVENT_LOOP", "trio")

    refused = serve(capsys, module, db, *extra)

    prog = "outbox-sink" if module == "sink" else "outbox-publisher serve"
    assert_usage_error(refused, f"{prog}: error: argument --event-loop")
    assert "trio" in refused.err
    assert not db.exists()


# ---------------------------------------------------------------- help


def test_help_names_the_console_options(capsys: Capsys) -> None:
    done = run_publisher(capsys, "serve", "--help")

    assert done.status == 0
    assert "--console-token-file" in done.out and "OUTBOX_CONSOLE_TOKEN" in done.out
    assert "--no-console" in done.out
