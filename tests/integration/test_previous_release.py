"""A database written by the previous release opens with this one and loses nothing.

The fixtures in tests/fixtures/previous_release were written by that release's own
code (make_fixtures.py there says how, and what each entry went through): an entry
delivered and pruned, one delivered and marked, one quarantined, one applied at the
sink but never marked, two never sent, a released lease. Here both sides are opened
with this release, on each backend, and everything is read back with connections of
the test's own: the rows are all there, a known ID is judged against what the old
release stored (a duplicate, not a conflict), the pending entries are delivered to
the old inbox over HTTP, the one applied before is answered as a duplicate, and the
inventory counts each order once.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from support import deliveries, entry_payload, inventory, query, sent_ids

from publisher import HttpSender, Outbox
from publisher.cli.dispatch import deliver_pending
from publisher.settings import RelaySettings
from publisher.store import State
from shared import Conflict, Receipt, digest_of, order_canonical, order_event, validate_order
from shared.event import canonical_parts, envelope_of
from sink import HandledEvent, Handlers, Inbox, Statement, create_app

if TYPE_CHECKING:
    from conftest import PgSchemas, Serve

FIXTURES = Path(__file__).parents[1] / "fixtures" / "previous_release"
ONCE = RelaySettings(batch=True, pipeline=1, worker=None)  # one read, no leases


@dataclass(frozen=True)
class Written:
    """The two databases the previous release wrote, as --db takes them."""

    source: Path | str
    sink: Path | str


@pytest.fixture(params=["sqlite", "postgres"])
def written(request: pytest.FixtureRequest, tmp_path: Path) -> Written:
    """Copies of the SQLite files, or the PostgreSQL dump loaded into this test's
    database (schema `release`, dropped with the test's schemas afterwards)."""
    if request.param == "sqlite":
        source, sink = tmp_path / "source.db", tmp_path / "sink.db"
        shutil.copyfile(FIXTURES / "source.sqlite", source)
        shutil.copyfile(FIXTURES / "sink.sqlite", sink)
        return Written(source, sink)
    schemas: PgSchemas = request.getfixturevalue("pg_schemas")
    with psycopg.connect(schemas.database_url, autocommit=True) as conn:
        conn.execute((FIXTURES / "postgres.sql").read_bytes())
    url = f"{schemas.database_url}?options=-csearch_path%3Drelease"
    return Written(url, url)


async def test_both_sides_open_and_every_row_is_there(written: Written) -> None:
    async with Outbox.open(written.source) as outbox, Inbox.open(written.sink) as inbox:
        pending = await outbox.entries(State.PENDING)
        sent = await outbox.entries(State.SENT)
        quarantined = await outbox.entries(State.QUARANTINED)
        assert [(e.id, e.lane, e.attempts) for e in pending] == [
            ("o-4", "snack", 0),
            ("o-5", "juice", 0),
            ("o-6", "tea", 0),
        ]
        assert [(e.id, e.lane, (e.ack or {}).get("status")) for e in sent] == [
            ("o-2", "juice", "applied")
        ]
        assert [(e.id, e.attempts, e.last_error) for e in quarantined] == [
            ("o-3", 1, "sink answered 503")
        ]
        assert [r.reason for r in await outbox.quarantines("o-3")] == ["looked stuck"]
        pruned = await outbox.order("o-1")  # its entry pruned, its order row kept
        assert pruned is not None and (pruned.sku, pruned.qty) == ("snack", 1)
        assert (await outbox.lease_of("snack")) is not None
        assert await outbox.take_lease("snack", "w2", 60.0) == 2  # the epoch goes on

        assert await inbox.count() == 3
        assert await inbox.inventory("snack") == 5
        record = await inbox.record("o-4")
        assert record is not None and record.deliveries == 1


async def test_a_command_that_creates_nothing_finds_the_previous_outbox_and_upgrades_it(
    written: Written,
) -> None:
    # status, list, trace and the others open with create=False: the previous release's
    # outbox (its versions kept elsewhere, its tables of other names) is an outbox there,
    # upgraded in place, not refused as a location without one.
    async with Outbox.open(written.source, create=False) as outbox:
        assert [e.id for e in await outbox.entries(State.PENDING)] == ["o-4", "o-5", "o-6"]
        assert [e.id for e in await outbox.entries(State.SENT)] == ["o-2"]
        assert [e.id for e in await outbox.entries(State.QUARANTINED)] == ["o-3"]


async def test_its_entries_become_order_placed_events_in_their_canonical_form(
    written: Written,
) -> None:
    async with Outbox.open(written.source) as outbox:
        assert await outbox.pending() == [
            order_event(validate_order({"id": "o-4", "sku": "snack", "qty": 4})),
            order_event(validate_order({"id": "o-5", "sku": "juice", "qty": 5})),
            order_event(validate_order({"id": "o-6", "sku": "tea", "qty": 6})),
        ]
    rows = query(
        written.source,
        "SELECT o.id, o.sku, o.qty, e.type, e.payload, e.lane"
        " FROM outbox_entries AS e JOIN outbox_orders AS o ON o.id = e.id ORDER BY e.seq",
    )
    assert len(rows) == 5
    for event_id, sku, qty, event_type, payload, lane in rows:
        order = validate_order({"id": event_id, "sku": sku, "qty": qty})
        assert (event_type, payload, lane) == ("order.placed", order_canonical(order), sku)
        # The relay reads such an entry as any other: its envelope, the data unparsed.
        assert envelope_of(payload) == (
            {"id": event_id, "key": sku, "type": "order.placed"},
            canonical_parts(order_event(order))[0],
        )
    pruned = query(written.source, "SELECT id, digest FROM outbox_pruned")
    o1 = order_canonical(validate_order({"id": "o-1", "sku": "snack", "qty": 1}))
    assert pruned == [("o-1", digest_of(o1))]


async def test_a_known_id_is_judged_against_what_the_previous_release_stored(
    written: Written,
) -> None:
    # The previous release's table, under its name then; this release's afterwards.
    entries = "SELECT id, sent, quarantined FROM {} ORDER BY seq"
    before = query(written.source, entries.format("outbox"))
    async with Outbox.open(written.source) as outbox:
        assert await outbox.accept({"id": "o-1", "sku": "snack", "qty": 1}) == "duplicate"
        assert await outbox.accept({"id": "o-2", "sku": "juice", "qty": 2}) == "duplicate"
        assert await outbox.accept({"id": "o-5", "sku": "juice", "qty": 5}) == "duplicate"
        for changed in (
            {"id": "o-1", "sku": "snack", "qty": 9},  # pruned: judged by the digest kept
            {"id": "o-2", "sku": "tea", "qty": 2},
            {"id": "o-5", "sku": "juice", "qty": 6},
        ):
            with pytest.raises(Conflict):
                await outbox.accept(changed)
    assert query(written.source, entries.format("outbox_entries")) == before
    assert query(written.source, "SELECT count(*) FROM outbox_orders") == [(6,)]


async def test_the_pending_entries_are_delivered_and_the_one_applied_before_is_a_duplicate(
    written: Written, serve: Serve
) -> None:
    url = f"{await serve(create_app(written.sink))}/events"
    async with Outbox.open(written.source) as outbox, HttpSender(url) as sender:
        assert await deliver_pending(outbox, sender, ONCE) == ["o-4", "o-5", "o-6"]
        await outbox.redrive("o-3", "alice")
        assert await deliver_pending(outbox, sender, ONCE) == ["o-3"]
        acks = {e.id: (e.ack or {}).get("status") for e in await outbox.entries(State.SENT)}

    assert sent_ids(written.source) == ["o-2", "o-3", "o-4", "o-5", "o-6"]
    assert acks == {
        "o-2": "applied",
        "o-3": "applied",
        "o-4": "duplicate",
        "o-5": "applied",
        "o-6": "applied",
    }
    assert deliveries(written.sink) == {"o-1": 1, "o-2": 1, "o-3": 1, "o-4": 2, "o-5": 1, "o-6": 1}
    assert inventory(written.sink) == {"snack": 5, "juice": 7, "tea": 9}  # each order once


async def test_new_events_written_in_groups_follow_the_old_entries_and_all_are_delivered(
    written: Written, serve: Serve
) -> None:
    # A group of new IDs takes intake's all-new path (one read, rows bound in bulk):
    # on the upgraded database its entries come after the old ones, the old rows are
    # untouched, and everything reaches the old inbox once.
    payload = entry_payload(written.source)
    entries = f"SELECT seq, id, type, {payload}, lane, sent FROM outbox_entries ORDER BY seq"
    url = f"{await serve(create_app(written.sink))}/events"
    async with Outbox.open(written.source) as outbox, HttpSender(url) as sender:
        before = query(written.source, entries)
        orders = [{"id": "o-7", "sku": "snack", "qty": 7}, {"id": "o-8", "sku": "tea", "qty": 8}]
        assert await outbox.accept_many(orders) == ["accepted", "accepted"]
        payments = [
            {"id": f"p-{n}", "type": "payment.captured", "key": "c-9", "data": {"cents": n}}
            for n in (1, 2)
        ]
        assert await outbox.publish_many(payments) == ["accepted", "accepted"]
        after = query(written.source, entries)
        assert after[: len(before)] == before
        assert [row[1] for row in after[len(before) :]] == ["o-7", "o-8", "p-1", "p-2"]
        assert min(row[0] for row in after[len(before) :]) > max(row[0] for row in before)

        sent = await deliver_pending(outbox, sender, ONCE)

    assert sent == ["o-4", "o-5", "o-6", "o-7", "o-8", "p-1", "p-2"]
    assert deliveries(written.sink) == {
        **{"o-1": 1, "o-2": 1, "o-4": 2, "o-5": 1, "o-6": 1},
        **{"o-7": 1, "o-8": 1, "p-1": 1, "p-2": 1},
    }
    assert inventory(written.sink) == {"snack": 12, "juice": 7, "tea": 14}


async def test_a_large_event_after_the_upgrade_is_stored_whole_and_delivered_once(
    written: Written, serve: Serve
) -> None:
    # Large enough that the upgraded SQLite file keeps it apart from its entry's row
    # (outbox_payloads, made by the upgrade); PostgreSQL keeps it in the row.
    large = {
        "id": "doc-1",
        "type": "document.stored",
        "key": "c-9",
        "data": {"pages": [f"page {n}: " + "x" * 200 for n in range(20)]},
    }
    canonical = canonical_parts(large)[1]  # type: ignore[arg-type]
    assert len(canonical) >= 4096
    url = f"{await serve(create_app(written.sink))}/events"
    async with Outbox.open(written.source) as outbox, HttpSender(url) as sender:
        assert await outbox.publish(large) == "accepted"
        assert await outbox.publish(large) == "duplicate"
        sent = await deliver_pending(outbox, sender, ONCE)

    assert sent == ["o-4", "o-5", "o-6", "doc-1"]
    payload = entry_payload(written.source)
    assert query(written.source, f"SELECT {payload} FROM outbox_entries WHERE id = 'doc-1'") == [
        (canonical,)
    ]
    assert query(written.sink, "SELECT payload FROM inbox_events WHERE id = 'doc-1'") == [
        (canonical,)
    ]
    assert deliveries(written.sink) == {
        "o-1": 1,
        "o-2": 1,
        "o-4": 2,
        "o-5": 1,
        "o-6": 1,
        "doc-1": 1,
    }
    assert inventory(written.sink) == {"snack": 5, "juice": 7, "tea": 6}  # o-3 still held


async def test_the_previous_inbox_opens_with_handlers_of_ones_own_and_loses_nothing(
    written: Written,
) -> None:
    # The old inbox, opened with a registry of a consumer's own: its schema runs once
    # beside the old tables, an order the old release applied comes again as a
    # duplicate (its handler's statements not run, the old stock untouched), new
    # events run them, once (the ledger has no key: a second run would add a row).
    handlers = Handlers("ledger")
    handlers.schema("CREATE TABLE ledger (event_id TEXT NOT NULL, qty INTEGER NOT NULL)")

    @handlers.on("order.placed")
    def placed(event: HandledEvent) -> list[Statement]:
        add = "INSERT INTO ledger (event_id, qty) VALUES (:id, :qty)"
        return [(add, {"id": event.id, "qty": event.data["qty"]})]

    old = validate_order({"id": "o-1", "sku": "snack", "qty": 1})
    new = validate_order({"id": "n-1", "sku": "tea", "qty": 3})
    for _ in range(2):  # opened twice: the schema statement runs once
        async with Inbox.open(written.sink, handlers) as inbox:
            assert await inbox.receive(order_event(old)) is Receipt.DUPLICATE
            assert await inbox.receive(order_event(new)) in (Receipt.APPLIED, Receipt.DUPLICATE)

    assert query(written.sink, "SELECT event_id, qty FROM ledger") == [("n-1", 3)]
    # As the previous release left it: this registry is not the warehouse.
    assert inventory(written.sink) == {"snack": 5, "juice": 2}
    assert deliveries(written.sink)["o-1"] == 3 and deliveries(written.sink)["n-1"] == 2
