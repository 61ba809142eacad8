"""Batch marks that overlap the next send: never lost, never sent twice meanwhile.

The relay's driver of the global line, in batch mode with one request in flight.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from support import Callables, accept_numbered, sent_ids

from publisher import Outbox
from publisher.driver import Driver, OutboxLine
from publisher.settings import RelaySettings
from shared import Event, Receipt, make_ack, payload_digest
from sqlite_tx import StorageError


class Recorder:
    """An in-process batch sender that ACKs everything and remembers what it saw."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    async def deliver(self, event: Event) -> dict[str, object]:
        raise AssertionError("only batches here")

    async def deliver_batch(self, events: Sequence[Event]) -> list[dict[str, str]]:
        self.sent.append([e["id"] for e in events])
        return [make_ack(e["id"], Receipt.APPLIED, payload_digest(e)) for e in events]


def batch_driver(outbox: Outbox, sink: Recorder) -> Driver:
    settings = RelaySettings(limit=16, batch=True, pipeline=1, worker=None)
    return Driver(OutboxLine(outbox), Callables(sink.deliver, sink.deliver_batch), settings)


async def test_the_next_batch_leaves_out_entries_whose_mark_is_in_flight(tmp_path: Path) -> None:
    db = tmp_path / "source.db"
    async with Outbox.open(db) as outbox:
        ids = await accept_numbered(outbox, 20)
        sink = Recorder()
        assert await batch_driver(outbox, sink).run() == 20

    assert sink.sent == [ids[:16], ids[16:]]  # nothing sent twice while its mark committed
    assert sent_ids(db) == ids
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_entries WHERE ack IS NULL").fetchone() == (
            0,
        )


async def test_a_failed_overlapping_mark_surfaces_and_its_entries_stay_pending(
    tmp_path: Path,
) -> None:
    db = tmp_path / "source.db"
    async with Outbox.open(db) as outbox:
        ids = await accept_numbered(outbox, 3)
        sink = Recorder()
        driver = batch_driver(outbox, sink)
        with sqlite3.connect(db) as conn:
            conn.execute(
                "CREATE TRIGGER no_marks BEFORE UPDATE OF sent ON outbox_entries"
                " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
            )

        with pytest.raises(StorageError, match="disk says no"):
            await driver.run()
        assert driver.failed_entry is None  # not a delivery failure
        assert sent_ids(db) == []

        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER no_marks")
        assert await driver.run() == 3

    assert sink.sent == [ids, ids]  # resent (the sink's inbox absorbs it), then marked
    assert sent_ids(db) == ids
