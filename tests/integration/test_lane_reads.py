"""A lane's read of its next entries costs the same however many entries of other
lanes are pending before them, with or without IDs to leave out (the read-ahead and
the pipelined reads pass those); finding the lanes to start costs the same however
many entries each lane holds.

The cost is counted in SQLite virtual machine steps (a progress handler on the
outbox's own connection), which does not depend on how fast or busy the machine is.
Rows go in through an independent sqlite3 connection, the way another writer would
add them.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from support import placed

from publisher.backends.sqlite import LANE_SCAN_ROWS, SqliteOutbox
from publisher.store import Outbox, lane_of
from shared import Event, canonical_json
from sqlite_tx.aiosqlite_internals import raw_connection

STEP_GRAIN = 10  # the progress handler runs every this many VM steps
OTHERS_FEW, OTHERS_MANY = 100, 20_000
MAX_GROWTH = 1.5  # VM steps with many others / with few
T = TypeVar("T")


def add_entries(db: Path, lane: str, count: int, start: int) -> list[str]:
    """`count` pending order.placed events of key `lane`, in one transaction;
    returns their IDs in seq order."""
    return add_events(db, [placed(f"{lane}-{n:06d}", lane) for n in range(start, start + count)])


def add_events(db: Path, events: list[Event]) -> list[str]:
    """Pending outbox entries of these events, in this order, in one transaction."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO outbox_entries (id, type, payload, queued_at, lane)"
            " VALUES (?, ?, ?, ?, ?)",
            [(e["id"], e["type"], canonical_json(e), now, lane_of(e)) for e in events],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return [e["id"] for e in events]


async def counted(outbox: Outbox, call: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """What `call()` returns, and the VM steps the outbox's own connection took."""
    assert isinstance(outbox, SqliteOutbox)
    conn = raw_connection(outbox._db._connection)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += STEP_GRAIN
        return 0  # go on

    conn.set_progress_handler(count, STEP_GRAIN)
    try:
        result = await call()
    finally:
        conn.set_progress_handler(None, STEP_GRAIN)
    return result, steps


async def counted_read(outbox: Outbox, lane: str | None, skip: list[str]) -> tuple[list[str], int]:
    """pending_batch(16, lane, skip): the IDs it returns and the VM steps it took."""
    rows, steps = await counted(outbox, lambda: outbox.pending_batch(16, lane, skip))
    return [row.event["id"] for row in rows], steps


@pytest.mark.parametrize("skipping", [False, True], ids=["plain", "skipping"])
async def test_a_lane_read_does_not_grow_with_other_lanes_pending_before_it(
    tmp_path: Path, skipping: bool
) -> None:
    costs = []
    for others in (OTHERS_FEW, OTHERS_MANY):
        db = tmp_path / f"outbox-{others}.db"
        async with Outbox.open(db) as outbox:
            add_entries(db, "busy", others, 0)
            mine = add_entries(db, "quiet", 40, 0)
            skip = mine[:8] if skipping else []
            ids, steps = await counted_read(outbox, "quiet", skip)
            # The lane's own entries only, in seq order, the skipped ones left out.
            assert ids == mine[len(skip) : len(skip) + 16]
            costs.append(steps)
    assert costs[0] > 0
    assert costs[1] <= costs[0] * MAX_GROWTH, costs


@pytest.mark.parametrize("where", ["head", "tail"])
async def test_finding_lanes_to_start_does_not_grow_with_the_entries_they_hold(
    tmp_path: Path, where: str
) -> None:
    # A few lanes, each holding many entries: with the lane left out holding the head
    # of the line, or the tail. (Both sizes are above the seq-order read's row cap, so
    # what is compared is the cost past it.)
    costs = []
    for each in (2 * LANE_SCAN_ROWS, OTHERS_MANY // 2):
        db = tmp_path / f"outbox-{where}-{each}.db"
        async with Outbox.open(db) as outbox:
            lanes = ("c", "d", "b", "a") if where == "head" else ("d", "b", "a", "c")
            for n, lane in enumerate(lanes):
                add_entries(db, lane, each, n * each)
            found, steps = await counted(outbox, lambda: outbox.pending_lanes(8, ["c"]))
            assert found == [lane for lane in lanes if lane != "c"]
            costs.append(steps)
    assert costs[0] > 0
    assert costs[1] <= costs[0] * MAX_GROWTH, costs


async def test_finding_lanes_to_start_does_not_grow_with_the_number_of_lanes(
    tmp_path: Path,
) -> None:
    # Thousands of SKUs, a few entries each: the supervisor asks for a few lanes at a
    # time, and that must not cost a walk over every lane.
    costs = []
    for count in (100, 5_000):
        db = tmp_path / f"outbox-{count}.db"
        async with Outbox.open(db) as outbox:
            add_events(
                db,
                [
                    placed(f"sku{lane:05d}-{n}", f"sku{lane:05d}")
                    for n in range(2)
                    for lane in range(count)
                ],
            )
            found, steps = await counted(outbox, lambda: outbox.pending_lanes(8, ["sku00001"]))
            assert found == [f"sku{lane:05d}" for lane in (0, *range(2, 9))]
            costs.append(steps)
    assert costs[0] > 0
    assert costs[1] <= costs[0] * MAX_GROWTH, costs
