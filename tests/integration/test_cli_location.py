"""Every publisher command picks its backend from --db (or OUTBOX_DB) through the one
factory: a SQLite path or URL opens that file, a PostgreSQL URL that database. A
location no backend opens (another scheme, a malformed PostgreSQL URI) is one line on
stderr and exit status 2; a PostgreSQL server that cannot be reached is one line and
exit status 1, as for any storage error. Neither creates anything."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import as_a_child_process, process_state_kept

from publisher.cli import main

SINK = "http://127.0.0.1:9/events"
COMMANDS: dict[str, list[str]] = {
    "accept": ["--id", "o-1", "--sku", "snack", "--qty", "1"],
    "dispatch": ["--sink", SINK],
    "serve": ["--sink", SINK, "--port", "0"],
    "status": [],
    "list": [],
    "quarantine": ["o-1", "--reason", "r"],
    "redrive": ["o-1"],
    "trace": ["o-1"],
    "prune": ["--older-than", "1d"],
}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    as_a_child_process(monkeypatch, tmp_path)
    with process_state_kept():  # `serve` on uvloop leaves its signal handlers behind
        yield


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("outbox-publisher: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("location", "said"),
    [
        ("mysql://h/db", "mysql"),
        ("postgresql://outbox@127.0.0.1:9/db?prepare=maybe", "prepare must be on or off"),
        ("postgres://outbox@127.0.0.1:9/db?no_such_parameter=1", "not a valid PostgreSQL URI"),
    ],
)
def test_a_location_no_backend_here_opens_is_a_usage_error(
    command: str, location: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([command, "--db", location, *COMMANDS[command]])

    err = one_line(capsys.readouterr().err)
    assert status == 2
    assert said in err
    assert os.listdir(tmp_path) == []  # nothing was created


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unreachable_postgresql_server_is_one_line_and_a_storage_failure(
    command: str, closed_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = f"postgresql://outbox@127.0.0.1:{closed_port}/orders"
    status = main([command, "--db", location, *COMMANDS[command]])

    err = one_line(capsys.readouterr().err)
    assert status == 1
    assert "cannot connect" in err and f":{closed_port}/orders" in err
    assert os.listdir(tmp_path) == []


def test_the_location_comes_from_outbox_db_too(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_database: str,
) -> None:
    monkeypatch.setenv("OUTBOX_DB", "mysql://h/db")
    assert main(["status"]) == 2
    assert "mysql" in capsys.readouterr().err
    monkeypatch.setenv("OUTBOX_DB", pg_database)
    assert main(["accept", *COMMANDS["accept"]]) == 0
    assert main(["status", "--json"]) == 0
    assert '"pending": 1' in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("spelling", ["plain", "sqlite:rel", "sqlite:///abs"])
def test_a_sqlite_location_opens_that_file(
    spelling: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "orders.db"
    location = {
        "plain": "orders.db",
        "sqlite:rel": "sqlite:orders.db",
        "sqlite:///abs": f"sqlite://{target}",
    }[spelling]
    assert main(["accept", "--db", location, *COMMANDS["accept"]]) == 0
    assert main(["status", "--db", str(target), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"pending": 1' in out
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("orders.db-")) == [
        "orders.db"
    ]
