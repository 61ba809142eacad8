"""read_verdict over two real databases written by the real outbox and inbox, on both
backends (two SQLite files, or two PostgreSQL databases: the `databases` fixture)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import as_event

from chaos.dbs import is_postgres
from chaos.procs import ChaosError
from chaos.verdict import Ordering, Verdict, order_inversions, read_verdict
from publisher import Outbox
from shared import canonical_json
from sink import Inbox

if TYPE_CHECKING:
    from conftest import Databases

ORDERS: list[dict[str, Any]] = [
    {"id": "o-1", "sku": "snack", "qty": 7},
    {"id": "o-2", "sku": "juice", "qty": 2},
    {"id": "o-3", "sku": "snack", "qty": 1},
    {"id": "o-4", "sku": "bread", "qty": 5},
]


def expected_of(orders: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    return {o["id"]: (o["sku"], o["qty"]) for o in orders}


def change(db: Path | str, sql: str, params: tuple[object, ...] = ()) -> int:
    """One write through an independent connection; returns the rows it changed."""
    if is_postgres(db):
        import psycopg

        with psycopg.connect(str(db), autocommit=True) as pg:
            return pg.execute(sql.replace("?", "%s"), params).rowcount
    conn = sqlite3.connect(db, timeout=5)
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


def read(db: Path | str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows through an independent connection."""
    if is_postgres(db):
        import psycopg

        with psycopg.connect(str(db), autocommit=True) as pg:
            return [tuple(r) for r in pg.execute(sql.replace("?", "%s"), params).fetchall()]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


class Files:
    def __init__(self, databases: Databases) -> None:
        self.backend = databases.backend
        self.source = databases.source
        self.sink = databases.sink

    async def accept(self, *orders: dict[str, Any]) -> None:
        async with Outbox.open(self.source) as outbox:
            for order in orders:
                assert await outbox.accept(dict(order)) == "accepted"

    async def publish(self, *events: dict[str, Any]) -> None:
        async with Outbox.open(self.source) as outbox:
            for one in events:
                assert await outbox.publish(dict(one)) == "accepted"

    async def mark(self, *ids: str) -> None:
        async with Outbox.open(self.source) as outbox:
            for event_id in ids:
                await outbox.mark_sent(event_id)

    async def receive(self, *orders: dict[str, Any]) -> None:
        async with Inbox.open(self.sink) as inbox:
            for order in orders:
                await inbox.receive(as_event(order))

    async def deliver(self, *orders: dict[str, Any]) -> None:
        """Received by the sink, then marked sent: the normal path."""
        await self.receive(*orders)
        await self.mark(*(o["id"] for o in orders))

    def verdict(
        self,
        expected: dict[str, tuple[str, int]] | None = None,
        ordering: Ordering = "global",
        published: dict[str, str] | None = None,
    ) -> Verdict:
        return read_verdict(
            self.source,
            self.sink,
            expected_of(ORDERS) if expected is None else expected,
            ordering,
            published=published,
        )

    def inversions(self, ordering: Ordering) -> int:
        return order_inversions(self.source, self.sink, ordering)


@pytest.fixture
async def files(databases: Databases) -> Files:
    made = Files(databases)
    await made.accept(*ORDERS)
    async with Inbox.open(made.sink):
        pass  # the sink file exists with its schema even before any delivery
    return made


async def test_all_delivered_is_ok(files: Files) -> None:
    await files.deliver(*ORDERS)

    verdict = files.verdict()

    assert verdict == Verdict(
        accepted=4,
        delivered=4,
        resends=0,
        duplicates=0,
        lost=0,
        applied_twice=0,
        inventory_ok=True,
        pending=0,
        quarantined=0,
        order_inversions=0,
        ordering="global",
    )
    assert verdict.ok is True
    assert verdict.to_dict()["ok"] is True


async def test_an_empty_run_is_ok(databases: Databases) -> None:
    made = Files(databases)
    async with Outbox.open(made.source), Inbox.open(made.sink):
        pass
    verdict = made.verdict({})
    assert (verdict.accepted, verdict.delivered, verdict.lost, verdict.ok) == (0, 0, 0, True)


async def test_an_accepted_order_missing_from_the_sink_is_lost(files: Files) -> None:
    await files.deliver(*ORDERS[:3])
    await files.mark(ORDERS[3]["id"])  # marked, but the sink never got it

    verdict = files.verdict()

    assert verdict.lost == 1
    assert verdict.delivered == 4
    assert verdict.inventory_ok is False  # bread 0 instead of 5
    assert verdict.applied_twice == 0
    assert verdict.ok is False


async def test_an_entry_not_marked_is_lost(files: Files) -> None:
    await files.deliver(*ORDERS[:3])
    await files.receive(ORDERS[3])  # applied by the sink, never marked sent

    verdict = files.verdict()

    assert verdict.lost == 1
    assert verdict.delivered == 3
    assert verdict.pending == 1
    assert verdict.inventory_ok is True
    assert verdict.ok is False


async def test_a_quarantined_entry_is_not_a_success(files: Files) -> None:
    await files.deliver(*ORDERS[:3])
    async with Outbox.open(files.source) as outbox:
        await outbox.quarantine(ORDERS[3]["id"], "test", "tester")

    verdict = files.verdict()

    assert verdict.quarantined == 1
    assert verdict.pending == 0
    assert verdict.lost == 1
    assert verdict.ok is False


async def test_inventory_tampered_upward_is_applied_twice(files: Files) -> None:
    await files.deliver(*ORDERS)
    assert change(files.sink, "UPDATE inbox_inventory SET qty = qty + 1 WHERE sku = 'snack'") == 1

    verdict = files.verdict()

    assert verdict.applied_twice == 1
    assert verdict.inventory_ok is False
    assert verdict.lost == 0
    assert verdict.ok is False


async def test_inventory_tampered_downward_is_not_ok_but_not_applied_twice(files: Files) -> None:
    await files.deliver(*ORDERS)
    assert change(files.sink, "UPDATE inbox_inventory SET qty = qty - 1 WHERE sku = 'juice'") == 1

    verdict = files.verdict()

    assert verdict.applied_twice == 0
    assert verdict.inventory_ok is False
    assert verdict.ok is False


async def test_two_skus_over_count_as_two(files: Files) -> None:
    await files.deliver(*ORDERS)
    assert change(files.sink, "UPDATE inbox_inventory SET qty = qty + 3") == 3

    assert files.verdict().applied_twice == 3


async def test_stock_for_a_sku_nobody_ordered_is_applied_twice(files: Files) -> None:
    await files.deliver(*ORDERS)
    change(files.sink, "INSERT INTO inbox_inventory (sku, qty) VALUES ('soap', 4)")

    verdict = files.verdict()

    assert verdict.applied_twice == 1
    assert verdict.inventory_ok is False


async def test_an_order_the_runner_saw_but_the_source_file_lacks_is_lost(files: Files) -> None:
    await files.deliver(*ORDERS)
    expected = {**expected_of(ORDERS), "o-ghost": ("snack", 3)}

    verdict = files.verdict(expected)

    assert verdict.lost == 1
    assert verdict.accepted == 4  # what the file holds
    assert verdict.inventory_ok is False  # snack is short by the ghost's 3
    assert verdict.applied_twice == 0
    assert verdict.ok is False


async def test_an_order_deleted_from_the_source_file_is_lost(files: Files) -> None:
    await files.deliver(*ORDERS)
    change(files.source, "DELETE FROM outbox_entries WHERE id = 'o-2'")
    assert change(files.source, "DELETE FROM outbox_orders WHERE id = 'o-2'") == 1

    verdict = files.verdict()

    assert verdict.lost == 1
    assert verdict.accepted == 3
    assert verdict.ok is False


async def test_resends_and_duplicates_come_from_inbox_deliveries(files: Files) -> None:
    await files.deliver(*ORDERS)
    await files.receive(ORDERS[0], ORDERS[0], ORDERS[1])  # o-1 three times, o-2 twice

    verdict = files.verdict()

    assert verdict.resends == 3
    assert verdict.duplicates == 2
    assert verdict.lost == 0
    assert verdict.applied_twice == 0
    assert verdict.inventory_ok is True
    assert verdict.ok is True  # resends absorbed by the inbox are not a violation


async def test_resends_match_the_deliveries_column(files: Files) -> None:
    await files.deliver(*ORDERS)
    change(files.sink, "UPDATE inbox_events SET deliveries = 5 WHERE id = 'o-4'")

    verdict = files.verdict()

    assert (verdict.resends, verdict.duplicates) == (4, 1)


def contents(files: Files) -> object:
    """Everything both databases hold: their bytes (SQLite), or every row (PostgreSQL)."""
    if files.backend == "sqlite":
        assert isinstance(files.source, Path) and isinstance(files.sink, Path)
        return files.source.read_bytes(), files.sink.read_bytes()
    tables = {
        files.source: ("outbox_orders", "outbox_entries", "outbox_quarantines"),
        files.sink: ("inbox_events", "inbox_inventory"),
    }
    return [
        read(db, f"SELECT * FROM {t} ORDER BY 1") for db, names in tables.items() for t in names
    ]


async def test_reading_changes_neither_database(files: Files) -> None:
    await files.deliver(*ORDERS)
    before = contents(files)

    files.verdict()

    assert contents(files) == before


async def test_a_missing_database_is_an_error_not_a_verdict(files: Files, tmp_path: Path) -> None:
    if files.backend == "sqlite":
        missing: Path | str = tmp_path / "no-such-sink.db"
        error: type[Exception] = sqlite3.OperationalError
    else:
        missing, error = f"{str(files.sink).rpartition('/')[0]}/no_such_sink", ChaosError
    with pytest.raises(error):
        read_verdict(files.source, missing, expected_of(ORDERS))
    assert not (tmp_path / "no-such-sink.db").exists()


# ---------------------------------------------------------------- order
#
# ORDERS by seq: o-1 snack, o-2 juice, o-3 snack, o-4 bread. The sink's first
# application order is the order the inbox receives the IDs in (its applied_seq).

BY_ID = {o["id"]: o for o in ORDERS}


async def applied_in(files: Files, *ids: str) -> None:
    """The sink applies these IDs in this order; then every one is marked sent."""
    await files.receive(*(BY_ID[i] for i in ids))
    await files.mark(*ids)


def record(db: Path | str, event_id: str, past: list[str], count: int | None = None) -> None:
    """A closed quarantine record written directly, as the relay's release would."""
    ((seq,),) = read(db, "SELECT seq FROM outbox_entries WHERE id = ?", (event_id,))
    change(
        db,
        "INSERT INTO outbox_quarantines (id, seq, reason, quarantined_by, quarantined_at,"
        " released_by, released_at, released_as, delivered_past_count, delivered_past)"
        " VALUES (?, ?, 'test', 'tester', 1.0, 'tester', 2.0, 'redriven', ?, ?)",
        (event_id, seq, len(past) if count is None else count, json.dumps(past)),
    )


@pytest.mark.parametrize("ordering", ["global", "sku"])
async def test_seq_order_is_no_inversion(files: Files, ordering: Ordering) -> None:
    await applied_in(files, "o-1", "o-2", "o-3", "o-4")

    verdict = files.verdict(ordering=ordering)

    assert (verdict.order_inversions, verdict.ordering, verdict.ok) == (0, ordering, True)
    assert verdict.to_dict()["order_inversions"] == 0
    assert verdict.to_dict()["ordering"] == ordering


async def test_two_skus_swapped_are_an_inversion_in_global_order_only(files: Files) -> None:
    await applied_in(files, "o-2", "o-1", "o-3", "o-4")  # juice before the snack ahead of it

    in_global = files.verdict(ordering="global")
    per_sku = files.verdict(ordering="sku")

    assert in_global.order_inversions == 1
    assert in_global.ok is False
    assert (in_global.lost, in_global.applied_twice, in_global.inventory_ok) == (0, 0, True)
    assert per_sku.order_inversions == 0  # snack's own line is o-1, o-3: in order
    assert per_sku.ok is True


async def test_one_skus_own_entries_swapped_are_an_inversion_in_both(files: Files) -> None:
    await applied_in(files, "o-3", "o-1", "o-2", "o-4")  # snack o-3 before snack o-1

    assert files.inversions("sku") == 1  # (o-1, o-3)
    assert files.inversions("global") == 2  # (o-1, o-3) and (o-2, o-3)
    assert files.verdict(ordering="sku").ok is False


async def test_every_inverted_pair_counts(files: Files) -> None:
    await applied_in(files, "o-4", "o-3", "o-2", "o-1")  # all backwards

    assert files.inversions("global") == 6  # 4 * 3 / 2 pairs
    assert files.inversions("sku") == 1  # snack: o-3 before o-1; juice and bread alone


async def test_entries_the_sink_never_applied_are_lost_not_inverted(files: Files) -> None:
    await applied_in(files, "o-1", "o-3")

    verdict = files.verdict()

    assert verdict.order_inversions == 0
    assert verdict.lost == 2


async def test_a_quarantine_explains_the_entries_delivered_past_it(files: Files) -> None:
    async with Outbox.open(files.source) as outbox:
        await outbox.quarantine("o-1", "sink refuses it", "tester")
    await applied_in(files, "o-2", "o-3", "o-4")
    async with Outbox.open(files.source) as outbox:
        released = await outbox.redrive("o-1", "tester")
    assert released.delivered_past == ["o-2", "o-3", "o-4"]
    await applied_in(files, "o-1")

    orderings: tuple[Ordering, ...] = ("global", "sku")
    for ordering in orderings:
        verdict = files.verdict(ordering=ordering)
        assert (verdict.order_inversions, verdict.ok) == (0, True), ordering
    # The same files without the record: three pairs inverted in global order, one per SKU.
    change(files.source, "DELETE FROM outbox_quarantines")
    assert files.inversions("global") == 3
    assert files.inversions("sku") == 1


async def test_a_quarantine_explains_nothing_it_does_not_list(files: Files) -> None:
    async with Outbox.open(files.source) as outbox:
        await outbox.quarantine("o-1", "sink refuses it", "tester")
    await applied_in(files, "o-2")
    async with Outbox.open(files.source) as outbox:
        released = await outbox.redrive("o-1", "tester")
    assert released.delivered_past == ["o-2"]
    await applied_in(files, "o-3", "o-1", "o-4")  # o-3 went past o-1 with no record of it

    verdict = files.verdict()

    assert verdict.order_inversions == 1  # (o-1, o-3); (o-1, o-2) is explained
    assert verdict.ok is False
    assert files.inversions("sku") == 1  # snack: o-3 before o-1, unexplained


async def test_a_record_explains_only_its_own_entry(files: Files) -> None:
    await applied_in(files, "o-2", "o-1", "o-3", "o-4")
    record(files.source, "o-2", ["o-1"])  # o-2's record cannot excuse o-1 coming late
    record(files.source, "o-3", ["o-2"])  # nor can a later entry's

    assert files.inversions("global") == 1


async def test_passers_are_not_excused_among_themselves(files: Files) -> None:
    await applied_in(files, "o-3", "o-2", "o-1", "o-4")
    record(files.source, "o-1", ["o-2", "o-3"])

    assert files.inversions("global") == 1  # (o-2, o-3): both passed o-1, in the wrong order


async def test_a_cut_short_record_explains_its_count_after_the_last_listed(files: Files) -> None:
    await applied_in(files, "o-2", "o-3", "o-4", "o-1")
    record(files.source, "o-1", ["o-2"], count=3)  # o-3 and o-4 counted, not listed

    assert files.inversions("global") == 0


async def test_a_cut_short_record_explains_no_more_than_its_count(files: Files) -> None:
    await applied_in(files, "o-2", "o-3", "o-4", "o-1")
    record(files.source, "o-1", ["o-2"], count=2)  # one more passer than recorded

    assert files.inversions("global") == 1


async def test_a_cut_short_record_does_not_explain_a_passer_before_its_list(files: Files) -> None:
    await applied_in(files, "o-2", "o-3", "o-4", "o-1")
    record(files.source, "o-1", ["o-3"], count=3)  # o-2 comes before the first one listed

    assert files.inversions("global") == 1  # (o-1, o-2)


async def test_an_unknown_ordering_is_an_error(files: Files) -> None:
    with pytest.raises(ValueError, match="ordering"):
        files.inversions("lanes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- generic events
#
# Published after ORDERS: g-1 (key snack, seq 5), g-2 (no key: the line "*", seq 6).

GENERIC: list[dict[str, Any]] = [
    {"id": "g-1", "type": "payment.captured", "key": "snack", "data": {"amount": 3}},
    {"id": "g-2", "type": "audit.noted", "data": {"note": "x"}},
]


def published_of(events: list[dict[str, Any]]) -> dict[str, str]:
    """What the runner knows it published: each event's canonical form, by ID."""
    return {one["id"]: canonical_json(as_event(one)) for one in events}


@pytest.fixture
async def mixed(files: Files) -> Files:
    await files.publish(*GENERIC)
    return files


async def test_generic_events_delivered_are_ok_and_leave_inventory_alone(mixed: Files) -> None:
    await mixed.deliver(*ORDERS, *GENERIC)

    verdict = mixed.verdict(published=published_of(ORDERS + GENERIC))

    assert (verdict.accepted, verdict.generic, verdict.delivered) == (6, 2, 6)
    assert (verdict.lost, verdict.payload_mismatches, verdict.unknown) == (0, 0, 0)
    assert (verdict.inventory_ok, verdict.applied_twice, verdict.ok) == (True, 0, True)


async def test_a_generic_event_the_sink_never_applied_is_lost(mixed: Files) -> None:
    await mixed.deliver(*ORDERS, GENERIC[0])
    await mixed.mark(GENERIC[1]["id"])

    verdict = mixed.verdict()

    assert (verdict.lost, verdict.delivered, verdict.inventory_ok) == (1, 6, True)
    assert verdict.ok is False


async def test_a_payload_unlike_the_published_one_is_a_mismatch(mixed: Files) -> None:
    await mixed.deliver(*ORDERS, *GENERIC)
    published = published_of(ORDERS + GENERIC)
    published["g-1"] = canonical_json(as_event({**GENERIC[0], "data": {"amount": 4}}))

    verdict = mixed.verdict(published=published)

    assert (verdict.payload_mismatches, verdict.lost, verdict.ok) == (1, 0, False)


async def test_an_event_the_source_never_accepted_is_unknown(mixed: Files) -> None:
    await mixed.deliver(*ORDERS, *GENERIC)
    await mixed.receive({"id": "g-ghost", "type": "audit.noted", "data": {}})

    verdict = mixed.verdict()

    assert (verdict.unknown, verdict.lost, verdict.ok) == (1, 0, False)


async def test_a_generic_event_is_in_its_keys_line_and_a_keyless_one_in_the_global_line(
    mixed: Files,
) -> None:
    await mixed.receive(BY_ID["o-1"], GENERIC[1], GENERIC[0], *(BY_ID[i] for i in ("o-2", "o-3")))
    await mixed.deliver(BY_ID["o-4"])
    await mixed.mark("o-1", "o-2", "o-3", "g-1", "g-2")

    # Global: g-2 and g-1 both before o-2, o-3, o-4 (6 pairs), g-2 before g-1 (1).
    assert mixed.inversions("global") == 7
    # By key: snack is o-1, g-1, o-3 (one pair); "*" holds g-2 alone.
    assert mixed.inversions("key") == 1
    assert mixed.verdict(ordering="key").ok is False
