"""Operations on the outbox: quarantine, redrive, list, prune, snapshot, on real files.

Every state change is also checked through an independent sqlite3 connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from publisher.errors import InvalidTransition, UnknownEntry
from publisher.store import Outbox, State

if TYPE_CHECKING:
    from conftest import Query

ACK = {"ack": "x", "status": "applied"}
# sent_at and quarantined_at come from time.time(); a short pause keeps them apart.
TICK_S = 0.01


async def accept(outbox: Outbox, *ids: str, qty: int = 1) -> None:
    for event_id in ids:
        assert await outbox.accept({"id": event_id, "sku": "snack", "qty": qty}) == "accepted"


def states(db_rows: Query, db: Path) -> dict[str, tuple[int, int]]:
    """id -> (sent, quarantined), read through a fresh connection."""
    return {i: (s, q) for i, s, q in db_rows(db, "SELECT id, sent, quarantined FROM outbox")}


def seqs(db_rows: Query, db: Path) -> dict[str, int]:
    return dict(db_rows(db, "SELECT id, seq FROM outbox"))


async def pending_ids(outbox: Outbox) -> list[str]:
    return [event["id"] for event in await outbox.pending(16)]


# ---------------------------------------------------------------- quarantine


async def test_quarantined_entry_is_neither_pending_nor_sent(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a", "b", "c")

    await outbox.quarantine("a", "sku retired", "alice")

    assert await pending_ids(outbox) == ["b", "c"]
    assert [e.id for e in await outbox.entries(State.PENDING)] == ["b", "c"]
    assert await outbox.entries(State.SENT) == []
    [held] = await outbox.entries(State.QUARANTINED)
    assert (held.id, held.state, held.sent_at) == ("a", State.QUARANTINED, None)
    assert states(db_rows, db) == {"a": (0, 1), "b": (0, 0), "c": (0, 0)}
    [(reason, by, at, released)] = db_rows(
        db,
        "SELECT reason, quarantined_by, quarantined_at, released_at FROM quarantines"
        " WHERE id = 'a'",
    )
    assert (reason, by, released) == ("sku retired", "alice", None)
    assert abs(at - time.time()) < 60
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined) == (2, 1)
    assert snapshot.head is not None and snapshot.head.id == "b"


async def test_quarantine_of_a_sent_entry_is_refused_and_changes_nothing(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = db_rows(db, "SELECT * FROM outbox")

    with pytest.raises(InvalidTransition, match="sent"):
        await outbox.quarantine("a", "too late", "alice")

    assert db_rows(db, "SELECT * FROM outbox") == before
    assert db_rows(db, "SELECT count(*) FROM quarantines") == [(0,)]


async def test_quarantine_of_an_unknown_entry_is_refused(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a")
    with pytest.raises(UnknownEntry, match="nope"):
        await outbox.quarantine("nope", "typo", "alice")
    assert db_rows(db, "SELECT count(*) FROM quarantines") == [(0,)]


async def test_quarantine_twice_is_refused_and_keeps_one_record(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a")
    await outbox.quarantine("a", "first", "alice")
    with pytest.raises(InvalidTransition, match="quarantined"):
        await outbox.quarantine("a", "second", "bob")
    assert db_rows(db, "SELECT reason FROM quarantines") == [("first",)]


# ---------------------------------------------------------------- redrive


async def test_redrive_of_a_pending_entry_is_refused(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a")
    before = db_rows(db, "SELECT * FROM outbox")
    with pytest.raises(InvalidTransition, match="pending"):
        await outbox.redrive("a", "alice")
    assert db_rows(db, "SELECT * FROM outbox") == before


async def test_redrive_of_a_sent_or_unknown_entry_is_refused(outbox: Outbox) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    with pytest.raises(InvalidTransition, match="sent"):
        await outbox.redrive("a", "alice")
    with pytest.raises(UnknownEntry):
        await outbox.redrive("nope", "alice")


async def test_redrive_puts_the_entry_back_at_its_own_seq_so_it_goes_next(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a", "b", "c")
    original = seqs(db_rows, db)
    await outbox.quarantine("b", "bad sku", "alice")
    await accept(outbox, "d")
    assert await pending_ids(outbox) == ["a", "c", "d"]

    await outbox.redrive("b", "bob")

    assert await pending_ids(outbox) == ["a", "b", "c", "d"]
    after = seqs(db_rows, db)
    assert {k: after[k] for k in original} == original
    assert after["d"] > original["c"]
    assert states(db_rows, db)["b"] == (0, 0)
    await outbox.mark_sent("a", ACK)
    head = (await outbox.snapshot()).head
    assert head is not None and (head.id, head.seq) == ("b", original["b"])


async def test_redrive_records_what_was_delivered_past_it(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a", "b", "c", "d", "e")
    await outbox.mark_sent("a", ACK)  # before b: not "past" it
    await outbox.mark_sent("d", ACK)  # after b in seq, but sent before the quarantine
    await asyncio.sleep(TICK_S)
    await outbox.quarantine("b", "sku retired", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("c", ACK)
    await outbox.mark_sent("e", ACK)

    record = await outbox.redrive("b", "bob")

    assert record.delivered_past == ["c", "e"]
    assert record.delivered_past_count == 2
    assert (record.reason, record.quarantined_by) == ("sku retired", "alice")
    assert (record.released_by, record.released_as) == ("bob", "redriven")
    assert record.released_at is not None and record.released_at >= record.quarantined_at
    [row] = db_rows(
        db,
        "SELECT released_by, released_as, delivered_past_count, delivered_past"
        " FROM quarantines WHERE id = 'b'",
    )
    assert row == ("bob", "redriven", 2, '["c", "e"]')
    assert await outbox.quarantines("b") == [record]


async def test_each_stay_in_quarantine_is_its_own_record(outbox: Outbox) -> None:
    await accept(outbox, "a", "b", "c")
    await outbox.quarantine("a", "first", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("b", ACK)
    await outbox.redrive("a", "bob")
    await asyncio.sleep(TICK_S)
    await outbox.quarantine("a", "second", "carol")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("c", ACK)
    await outbox.redrive("a", "dave")

    first, second = await outbox.quarantines("a")

    assert (first.reason, first.quarantined_by, first.delivered_past) == ("first", "alice", ["b"])
    assert (second.reason, second.quarantined_by, second.delivered_past) == (
        "second",
        "carol",
        ["c"],
    )
    history = await outbox.quarantine_history(["a", "b", "zzz"])
    assert list(history) == ["a"]
    assert history["a"] == [first, second]


async def test_redrive_starts_a_fresh_failure_streak(outbox: Outbox) -> None:
    await accept(outbox, "a")
    await outbox.record_failure("a", "sink rejected it with 409")
    head = (await outbox.snapshot()).head
    assert head is not None and head.blocked
    await outbox.quarantine("a", "bad", "alice")
    await outbox.redrive("a", "alice")

    head = (await outbox.snapshot()).head

    assert head is not None and head.id == "a"
    assert head.blocked is False
    assert head.attempts == 1  # the count of attempts is history and is kept


async def test_mark_sent_of_an_entry_quarantined_in_flight_closes_it_as_delivered(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    # The relay read "a" and is sending it; an operator quarantines it; the ACK arrives.
    await accept(outbox, "a", "b")
    [(seq, _, _)] = await outbox.pending_batch(1)
    await outbox.quarantine("a", "looked stuck", "alice")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("b", ACK)
    ack = {"ack": "a", "status": "applied"}

    await outbox.mark_sent("a", ack)

    entry = await outbox.entry("a")
    assert entry is not None
    assert (entry.state, entry.seq, entry.ack) == (State.SENT, seq, ack)
    assert states(db_rows, db)["a"] == (1, 0)
    [record] = await outbox.quarantines("a")
    assert (record.released_as, record.released_by) == ("delivered", "relay")
    assert record.delivered_past == ["b"]
    assert (await outbox.snapshot()).quarantined == 0
    assert await outbox.entries(State.QUARANTINED) == []


# ---------------------------------------------------------------- attempts and marks


async def test_failures_are_recorded_on_the_entry(outbox: Outbox, db: Path, db_rows: Query) -> None:
    await accept(outbox, "a")
    await outbox.record_failure("a", "connection refused")
    [(first_fail, first_last)] = db_rows(
        db, "SELECT first_failure_at, last_attempt_at FROM outbox WHERE id = 'a'"
    )
    await asyncio.sleep(TICK_S)
    await outbox.record_failure("a", "sink answered 503")

    [(attempts, error, last_at, first_at)] = db_rows(
        db, "SELECT attempts, last_error, last_attempt_at, first_failure_at FROM outbox"
    )
    assert (attempts, error) == (2, "sink answered 503")
    assert first_at == first_fail == first_last
    assert last_at > first_at
    await outbox.mark_sent("a", ACK)
    entry = await outbox.entry("a")
    assert entry is not None and entry.attempts == 3 and entry.state is State.SENT


async def test_failure_on_a_sent_entry_changes_nothing(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = db_rows(db, "SELECT * FROM outbox")
    await outbox.record_failure("a", "late error")
    assert db_rows(db, "SELECT * FROM outbox") == before


async def test_mark_sent_is_idempotent(outbox: Outbox, db: Path, db_rows: Query) -> None:
    await accept(outbox, "a")
    await outbox.mark_sent("a", ACK)
    before = db_rows(db, "SELECT * FROM outbox")
    await asyncio.sleep(TICK_S)
    await outbox.mark_sent("a", {"ack": "a", "status": "duplicate"})
    assert db_rows(db, "SELECT * FROM outbox") == before


async def test_list_orders_pending_and_quarantined_oldest_first_sent_newest_first(
    outbox: Outbox,
) -> None:
    await accept(outbox, "z", "m", "a", "q", "b")
    await outbox.quarantine("q", "x", "alice")
    await outbox.quarantine("m", "x", "alice")
    await outbox.mark_sent("z", ACK)
    await outbox.mark_sent("a", ACK)

    assert [e.id for e in await outbox.entries(State.PENDING)] == ["b"]
    assert [e.id for e in await outbox.entries(State.QUARANTINED)] == ["m", "q"]
    assert [e.id for e in await outbox.entries(State.SENT)] == ["a", "z"]
    assert [e.id for e in await outbox.entries(State.SENT, limit=1)] == ["a"]
    sent = await outbox.entries(State.SENT)
    assert all(e.state is State.SENT and e.ack == ACK and e.sent_at for e in sent)


# ---------------------------------------------------------------- prune


async def test_prune_deletes_only_sent_entries_older_than_the_cutoff(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    ids = [f"o{n}" for n in range(10)]
    await accept(outbox, *ids)
    for event_id in ids[:6]:
        await outbox.mark_sent(event_id, ACK)
    await outbox.quarantine("o6", "x", "alice")
    # o0-o3 were sent two hours ago; o4, o5 just now. Every row was queued long ago.
    _write(db, "UPDATE outbox SET sent_at = sent_at - 7200 WHERE id IN ('o0','o1','o2','o3')")
    _write(db, "UPDATE outbox SET queued_at = queued_at - 86400")

    deleted = await outbox.prune(older_than_s=3600, batch=3)

    assert deleted == 4
    assert sorted(states(db_rows, db)) == ["o4", "o5", "o6", "o7", "o8", "o9"]
    assert states(db_rows, db)["o6"] == (0, 1)
    assert db_rows(db, "SELECT count(*) FROM orders") == [(10,)]
    assert await pending_ids(outbox) == ["o7", "o8", "o9"]
    assert await outbox.prune(older_than_s=3600, batch=3) == 0


@pytest.mark.parametrize(("count", "batch"), [(7, 3), (6, 3), (5, 1), (4, 500)])
async def test_prune_works_through_any_number_of_batches(
    outbox: Outbox, db: Path, db_rows: Query, count: int, batch: int
) -> None:
    ids = [f"s{n}" for n in range(count)]
    await accept(outbox, *ids, "pending-1")
    for event_id in ids:
        await outbox.mark_sent(event_id, ACK)
    await asyncio.sleep(TICK_S)

    assert await outbox.prune(older_than_s=0, batch=batch) == count

    assert db_rows(db, "SELECT id FROM outbox") == [("pending-1",)]


async def test_prune_never_touches_pending_or_quarantined_however_old(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "p", "q")
    await outbox.quarantine("q", "x", "alice")
    _write(db, "UPDATE outbox SET queued_at = queued_at - 10 * 86400")
    before = db_rows(db, "SELECT * FROM outbox ORDER BY seq")

    assert await outbox.prune(older_than_s=0) == 0

    assert db_rows(db, "SELECT * FROM outbox ORDER BY seq") == before


async def test_prune_keeps_the_seq_of_what_remains(
    outbox: Outbox, db: Path, db_rows: Query
) -> None:
    await accept(outbox, "a", "b", "c")
    await outbox.mark_sent("a", ACK)
    await asyncio.sleep(TICK_S)
    await outbox.prune(older_than_s=0)
    await accept(outbox, "d")
    assert seqs(db_rows, db) == {"b": 2, "c": 3, "d": 4}


# ---------------------------------------------------------------- snapshot


async def test_snapshot_of_an_empty_outbox(outbox: Outbox) -> None:
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined, snapshot.head) == (0, 0, None)
    assert snapshot.oldest_pending_age_s == 0.0
    assert snapshot.to_dict() == {
        "pending": 0,
        "oldest_pending_age_seconds": 0.0,
        "quarantined": 0,
        "head_blocked": False,
        "head": None,
        "blocked_lanes": [],
    }


async def test_snapshot_counts_and_oldest_age(outbox: Outbox, db: Path) -> None:
    await accept(outbox, "a", "b", "c", "d")
    await outbox.mark_sent("a", ACK)
    await outbox.quarantine("c", "x", "alice")
    _write(db, "UPDATE outbox SET queued_at = queued_at - 100 WHERE id = 'b'")
    _write(db, "UPDATE outbox SET queued_at = queued_at - 500 WHERE id IN ('a', 'c')")

    snapshot = await outbox.snapshot()

    assert (snapshot.pending, snapshot.quarantined) == (2, 1)
    assert snapshot.head is not None
    assert (snapshot.head.id, snapshot.head.seq, snapshot.head.blocked) == ("b", 2, False)
    # The oldest pending entry is b: sent and quarantined entries do not count.
    assert 100 <= snapshot.oldest_pending_age_s < 130
    figures = snapshot.to_dict()
    assert figures["head_blocked"] is False
    assert figures["head"]["id"] == "b"


async def test_snapshot_reports_a_failing_head_as_blocked(outbox: Outbox) -> None:
    await accept(outbox, "a", "b")
    await outbox.record_failure("a", "sink rejected it with 409")
    await outbox.record_failure("a", "sink rejected it with 409 again")

    snapshot = await outbox.snapshot()

    head = snapshot.head
    assert head is not None
    assert (head.id, head.attempts, head.last_error) == ("a", 2, "sink rejected it with 409 again")
    assert head.blocked and head.blocked_since is not None
    figures = snapshot.to_dict()
    assert figures["head_blocked"] is True
    assert figures["head"]["blocked_since"] == head.blocked_since
    await outbox.quarantine("a", "poison", "alice")
    after = await outbox.snapshot()
    assert after.head is not None and after.head.id == "b" and not after.head.blocked
    assert after.to_dict()["head_blocked"] is False


async def test_failure_behind_the_head_does_not_block_it(outbox: Outbox) -> None:
    await accept(outbox, "a", "b")
    await outbox.record_failure("b", "earlier run")
    head = (await outbox.snapshot()).head
    assert head is not None and head.id == "a" and not head.blocked


async def test_other_connections_see_the_same_figures(outbox: Outbox, db: Path) -> None:
    await accept(outbox, "a", "b")
    async with Outbox.open(db) as other:
        await other.quarantine("a", "x", "alice")
        await accept(other, "c")
    snapshot = await outbox.snapshot()
    assert (snapshot.pending, snapshot.quarantined) == (2, 1)


def _write(db: Path, statement: str) -> None:
    """Age rows through an independent connection (what time would do)."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        with conn:
            conn.execute(statement)
    finally:
        conn.close()
