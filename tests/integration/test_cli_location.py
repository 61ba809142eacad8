"""Every publisher command picks its backend from --db (or OUTBOX_DB) through the one
factory: a SQLite path or URL opens that file, a PostgreSQL URL (reserved for a later
version) and any other URL get one line on stderr and exit status 2, creating nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from publisher.cli import main

SINK = "http://127.0.0.1:9/events"
POSTGRES = "postgresql://outbox@127.0.0.1:5432/orders"
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
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OUTBOX_DB", raising=False)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("location", [POSTGRES, "postgres://h/db", "mysql://h/db"])
def test_a_location_no_backend_here_opens_is_a_usage_error(
    command: str, location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([command, "--db", location, *COMMANDS[command]])

    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("publisher: ")
    assert "Traceback" not in err
    assert ("PostgreSQL" in err) if location.startswith("postgres") else ("mysql" in err)
    assert os.listdir(tmp_path) == []  # nothing was created


def test_the_location_comes_from_outbox_db_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OUTBOX_DB", POSTGRES)
    assert main(["status"]) == 2
    assert "PostgreSQL" in capsys.readouterr().err
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
