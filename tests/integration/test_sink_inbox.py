"""The SQLite inbox's own properties, and the factory that opens it from a location.

The behaviour every inbox backend shares (receive, duplicates, conflicts, batches,
fences, one transaction) is in tests/behaviour/test_inbox_store.py. Real files,
checked through independent connections.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from plumbing.storage import BadLocation
from sink import Inbox
from sink.backends.sqlite import SqliteInbox

if TYPE_CHECKING:
    from conftest import Query

EVENT: dict[str, Any] = {"id": "order-1", "sku": "snack", "qty": 7}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


async def test_database_is_in_wal_mode_seen_from_another_connection(
    db: Path, db_rows: Query
) -> None:
    async with Inbox.open(db) as inbox:
        await inbox.receive(dict(EVENT))
    assert db_rows(db, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize("form", ["PATH", "sqlite:PATH", "sqlite:///PATH"])
async def test_a_path_or_a_sqlite_url_opens_the_sqlite_inbox_on_that_file(
    db: Path, db_rows: Query, form: str
) -> None:
    location = form.replace("///PATH", f"//{db}").replace("PATH", str(db))

    async with Inbox.open(location) as inbox:
        assert isinstance(inbox, SqliteInbox)
        assert inbox.location == str(db)
        await inbox.receive(dict(EVENT))

    assert db_rows(db, "SELECT id, deliveries FROM inbox") == [("order-1", 1)]


async def test_a_relative_sqlite_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_rows: Query
) -> None:
    monkeypatch.chdir(tmp_path)

    async with Inbox.open("sqlite:rel.db") as inbox:
        await inbox.receive(dict(EVENT))

    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == ["rel.db"]
    assert db_rows(tmp_path / "rel.db", "SELECT sku, qty FROM inventory") == [("snack", 7)]


@pytest.mark.parametrize("location", ["postgresql://u@h/db", "postgres://u@h/db", "ftp://h/x"])
def test_a_location_no_backend_opens_is_refused_by_the_call_itself(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(BadLocation):
        Inbox.open(location)  # not awaited: refused before anything is opened

    assert list(tmp_path.iterdir()) == []
