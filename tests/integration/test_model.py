"""Model-based test of the whole relay on real SQLite files.

A Hypothesis state machine interleaves intake (new orders, duplicates, conflicts,
invalid input), dispatch batches whose sends fail in every way the contract names
(before the sink's commit, after it with the ACK lost, a reply that is not `True`, a
crash right after the verified ACK), restarts of either side, quarantine and redrive
by an operator, and reads that must change nothing. A plain-Python model predicts
every outcome; after every step the invariants read both database files through
connections of their own, so they judge what is on disk rather than what the objects
under test report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as record_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from support import SQLITE_ENTRY_PAYLOAD

from publisher import MAX_BATCH, NotAcknowledged, Outbox, dispatch
from publisher.errors import InvalidTransition, UnknownEntry
from publisher.store import State
from shared import (
    ORDER_PLACED,
    Conflict,
    Event,
    InvalidEvent,
    Order,
    Receipt,
    order_canonical,
    order_event,
    payload_digest,
)
from sink import Inbox
from sink.store import Incoming

T = TypeVar("T")

# A small pool of IDs and SKUs, so that duplicates, conflicts and shared SKUs are common.
ORDER_IDS: Final = tuple(f"order-{n}" for n in range(8))
SKUS: Final = ("snack", "tea", "rice")
QTY_MAX: Final = 5

TESTER: Final = "tester"
RELAY: Final = "relay"  # who releases an entry that was quarantined while its send succeeded
HELD_REASON: Final = "held by an operator for a fix"
IN_FLIGHT_REASON: Final = "quarantined while its send was in flight"

StateName = Literal["pending", "quarantined", "sent"]

# How one send behaves: half of the sends succeed, so batches get past their head.
SendMode = Literal[
    "ack",
    "fail_before_commit",
    "fail_after_commit",
    "not_true_before_commit",
    "not_true_after_commit",
    "quarantined_in_flight",
]
UNUSUAL_MODES: Final[tuple[SendMode, ...]] = (
    "fail_before_commit",
    "fail_after_commit",
    "not_true_before_commit",
    "not_true_after_commit",
    "quarantined_in_flight",
)
ACK_MODE: Final[tuple[SendMode, ...]] = ("ack",)
SEND_MODES: Final = st.one_of(st.sampled_from(ACK_MODE), st.sampled_from(UNUSUAL_MODES))
# Replies that are not a strict `True`: each must count as a failure, truthy or not.
NOT_TRUE: Final[tuple[object, ...]] = (False, None, 1, "ok", {"ack": "order-0"}, [True])

BAD_LIMITS: Final[tuple[object, ...]] = (0, -1, MAX_BATCH + 1, True, 2.0, None, "4")


def invalid_orders(order_id: str) -> list[tuple[object, str]]:
    """Orders that break the intake's contract, each with the field the error must name.

    They use a pool ID, so a validator that let one through would really record it.
    """
    return [
        ({"id": order_id, "sku": "snack", "qty": 0}, "qty"),
        ({"id": order_id, "sku": "snack", "qty": QTY_MAX + 1_000_000}, "qty"),
        ({"id": order_id, "sku": "snack", "qty": True}, "qty"),
        ({"id": order_id, "sku": "snack", "qty": 2.0}, "qty"),
        ({"id": order_id, "sku": "snack", "qty": "2"}, "qty"),
        ({"id": order_id, "sku": "snack"}, "qty"),
        ({"id": order_id, "sku": "snack", "qty": 2, "note": "x"}, "note"),
        ({"id": f"-{order_id}", "sku": "snack", "qty": 2}, "id"),
        ({"id": f"{order_id} ", "sku": "snack", "qty": 2}, "id"),
        ({"id": order_id + "x" * 128, "sku": "snack", "qty": 2}, "id"),
        ({"id": order_id, "sku": "", "qty": 2}, "sku"),
        ({"id": order_id, "sku": "sn ack", "qty": 2}, "sku"),
        ([order_id, "snack", 2], "event"),
        (None, "event"),
    ]


def invalid_events(order_id: str) -> list[tuple[object, str]]:
    """Events that break the contract, each with the place (a JSON pointer) the error
    must name: what the sink's inbox and the publisher's `publish` refuse.

    They use a pool ID, so a validator that let one through would really record it.
    """
    good = {"id": order_id, "type": ORDER_PLACED, "key": "snack"}
    data = {"sku": "snack", "qty": 2}
    return [
        (good, "/data"),
        ({**good, "data": [data]}, "/data"),
        ({"id": order_id, "key": "snack", "data": data}, "/type"),
        ({**good, "type": "order placed", "data": data}, "/type"),
        ({**good, "data": data, "note": "x"}, "/note"),
        ({**good, "id": f"-{order_id}", "data": data}, "/id"),
        ({**good, "id": f"{order_id} ", "data": data}, "/id"),
        ({**good, "id": order_id + "x" * 128, "data": data}, "/id"),
        ({**good, "key": "", "data": data}, "/key"),
        ({**good, "key": "sn ack", "data": data}, "/key"),
        ({**good, "data": {**data, "qty": 2**53}}, "/data/qty"),
        ({**good, "data": {**data, "qty": float("nan")}}, "/data/qty"),
        ([order_id, ORDER_PLACED, data], ""),
        (None, ""),
    ]


class SendFailed(Exception):
    """The send failed before the sink committed anything (connection refused, say)."""


class AckLost(Exception):
    """The sink committed, but its reply never arrived (connection closed)."""


class CrashAfterAck(Exception):
    """The publisher died after the verified ACK and before the mark."""


@dataclass
class ModelOrder:
    order: Order  # as accepted at the intake
    rank: int  # acceptance order: seq must sort the entries the same way
    state: StateName = "pending"

    @property
    def event(self) -> Event:
        """The order.placed event the order is recorded, relayed and applied as."""
        return order_event(self.order)


@dataclass
class ModelQuarantine:
    """One stay in quarantine, as the quarantines table must record it."""

    id: str
    reason: str
    by: str
    released_by: str | None = None
    released_as: str | None = None
    passed: list[str] = field(default_factory=list)  # IDs marked sent past it meanwhile


Rows = list[tuple[Any, ...]]


def read(db: Path, queries: dict[str, str]) -> dict[str, Rows]:
    """Rows through a connection of the test's own, closed afterwards.

    Nothing writes between steps, so the queries see one state of the file.
    """
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in queries.items()}


SOURCE_TABLES: Final = ("outbox_orders", "outbox_entries", "outbox_quarantines", "sqlite_sequence")
SINK_TABLES: Final = ("inbox_events", "inbox_inventory")

# What the invariants read after every step.
SOURCE_QUERIES: Final = {
    "orders": "SELECT id, sku, qty FROM outbox_orders",
    "outbox": (
        f"SELECT seq, id, {SQLITE_ENTRY_PAYLOAD}, sent, quarantined FROM outbox_entries"
        " ORDER BY seq"
    ),
    "quarantines": (
        "SELECT id, reason, quarantined_by, released_by, released_as,"
        " delivered_past_count, delivered_past FROM outbox_quarantines ORDER BY n"
    ),
}
SINK_QUERIES: Final = {
    "inbox": "SELECT id, payload FROM inbox_events ORDER BY rowid",
    "inventory": "SELECT sku, qty FROM inbox_inventory",
}


class OutboxRelayMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-model-"))
        self.source_db = self.dir / "source.db"
        self.sink_db = self.dir / "sink.db"
        # One loop per example: Hypothesis calls the rules synchronously.
        self.loop = asyncio.new_event_loop()
        self.outbox: Outbox | None = None
        self.inbox: Inbox | None = None
        self.orders: dict[str, ModelOrder] = {}
        self.applied: list[str] = []  # the sink's first applications, in order
        self.quarantine_log: list[ModelQuarantine] = []
        try:
            self.outbox = self.run(self._open_outbox())
            self.inbox = self.run(self._open_inbox())
        except BaseException:
            # Hypothesis only tears down a machine that was built.
            self.teardown()
            raise

    # ------------------------------------------------------------ plumbing

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _open_outbox(self) -> Outbox:
        return await Outbox.open(self.source_db)

    async def _open_inbox(self) -> Inbox:
        return await Inbox.open(self.sink_db)

    @property
    def ob(self) -> Outbox:
        assert self.outbox is not None
        return self.outbox

    @property
    def ib(self) -> Inbox:
        assert self.inbox is not None
        return self.inbox

    def teardown(self) -> None:
        try:
            for closable in (self.outbox, self.inbox):
                if closable is not None:
                    self.run(closable.close())
            self.outbox = None
            self.inbox = None
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def dump(self) -> dict[str, Rows]:
        """Every row of both databases, for "this changed nothing" checks."""
        everything = read(
            self.source_db, {t: f"SELECT * FROM {t} ORDER BY rowid" for t in SOURCE_TABLES}
        )
        everything |= read(
            self.sink_db, {t: f"SELECT * FROM {t} ORDER BY rowid" for t in SINK_TABLES}
        )
        return everything

    # ------------------------------------------------------------ model helpers

    def ids_in(self, state: StateName) -> list[str]:
        """IDs in one state, in acceptance (seq) order."""
        chosen = [o for o in self.orders.values() if o.state == state]
        return [o.event["id"] for o in sorted(chosen, key=lambda o: o.rank)]

    def has_pending(self) -> bool:
        return bool(self.ids_in("pending"))

    def has_quarantined(self) -> bool:
        return bool(self.ids_in("quarantined"))

    def open_stay(self, event_id: str) -> ModelQuarantine:
        stays = [q for q in self.quarantine_log if q.id == event_id and q.released_as is None]
        assert len(stays) == 1, f"model: {event_id} should have one open quarantine"
        return stays[0]

    def model_quarantine(self, event_id: str, reason: str) -> None:
        self.orders[event_id].state = "quarantined"
        self.quarantine_log.append(ModelQuarantine(event_id, reason, TESTER))

    def model_mark_sent(self, event_id: str) -> None:
        order = self.orders[event_id]
        if order.state == "quarantined":
            # The ACK proved delivery of an entry quarantined mid-send: released as delivered.
            stay = self.open_stay(event_id)
            stay.released_by, stay.released_as = RELAY, "delivered"
        for stay in self.quarantine_log:
            # A later entry marked sent while an earlier one waits in quarantine passed it.
            if stay.released_as is None and self.orders[stay.id].rank < order.rank:
                stay.passed.append(event_id)
        order.state = "sent"

    async def deliver(self, inbox: Inbox, event: Event) -> None:
        """Hand the event to the real sink and check its receipt against the model."""
        event_id = event["id"]
        first = event_id not in self.applied
        received = await inbox.receive_with_digest(Incoming.checked(dict(event)))
        assert received.receipt is (Receipt.APPLIED if first else Receipt.DUPLICATE)
        assert received.digest == payload_digest(self.orders[event_id].event)
        if first:
            self.applied.append(event_id)

    # ------------------------------------------------------------ intake

    @initialize(
        first=st.lists(
            st.tuples(st.sampled_from(ORDER_IDS), st.sampled_from(SKUS), st.integers(1, QTY_MAX)),
            max_size=len(ORDER_IDS),
            unique_by=lambda order: order[0],
        )
    )
    def accept_first_orders(self, first: list[tuple[str, str, int]]) -> None:
        # Start most runs with a backlog, so that steps are not spent waiting for intake.
        for order_id, sku, qty in first:
            self.intake(Order(id=order_id, sku=sku, qty=qty))

    @rule(
        order_id=st.sampled_from(ORDER_IDS),
        sku=st.sampled_from(SKUS),
        qty=st.integers(1, QTY_MAX),
        repeat=st.booleans(),
    )
    def accept(self, order_id: str, sku: str, qty: int, repeat: bool) -> None:
        known = self.orders.get(order_id)
        if known is not None and repeat:
            # Drawing the same payload by chance is rare; this makes duplicates common.
            self.intake(Order(**known.order))
        else:
            self.intake(Order(id=order_id, sku=sku, qty=qty))

    def intake(self, order: Order) -> None:
        order_id = order["id"]
        known = self.orders.get(order_id)
        if known is None:
            assert self.run(self.ob.accept(dict(order))) == "accepted"
            self.orders[order_id] = ModelOrder(order, rank=len(self.orders))
            return
        before = self.dump()
        if known.order == order:
            assert self.run(self.ob.accept(dict(order))) == "duplicate"
        else:
            with pytest.raises(Conflict) as caught:
                self.run(self.ob.accept(dict(order)))
            assert caught.value.event_id == order_id
        assert self.dump() == before, "a duplicate or a conflict changed the databases"

    # ------------------------------------------------------------ delivery

    @rule(data=st.data(), limit=st.integers(1, MAX_BATCH), hooked=st.booleans())
    def dispatch_with_failures(self, data: st.DataObject, limit: int, hooked: bool) -> None:
        outbox, inbox = self.ob, self.ib
        expected_batch = self.ids_in("pending")[:limit]
        offered: list[str] = []  # IDs handed to send, in order
        acked: list[str] = []  # IDs whose send returned True
        crashed: list[str] = []  # IDs whose after-delivery hook ended the "process"
        planted: list[Exception] = []  # errors raised here: dispatch must re-raise the same

        async def send(event: Event) -> object:
            event_id = event["id"]
            offered.append(event_id)
            assert event == self.orders[event_id].event, "send got another payload"
            mode: SendMode = data.draw(SEND_MODES, label=f"send {event_id}")
            record_event(f"send: {mode}")
            if mode == "fail_before_commit":
                planted.append(SendFailed(f"{event_id}: connection refused"))
                raise planted[-1]
            if mode == "quarantined_in_flight":
                # An operator quarantines the entry while the send is under way.
                await outbox.quarantine(event_id, IN_FLIGHT_REASON, TESTER)
                self.model_quarantine(event_id, IN_FLIGHT_REASON)
            if mode != "not_true_before_commit":
                await self.deliver(inbox, event)
            if mode == "fail_after_commit":
                planted.append(AckLost(f"{event_id}: connection closed without a reply"))
                raise planted[-1]
            if mode in ("not_true_before_commit", "not_true_after_commit"):
                return data.draw(st.sampled_from(NOT_TRUE), label=f"reply for {event_id}")
            if data.draw(st.booleans(), label=f"send mutates its copy of {event_id}"):
                # The callback's copy is its own: the mark must still use the selected ID.
                event["id"], event["data"]["qty"] = "mutated", QTY_MAX + 1
            acked.append(event_id)
            return True

        def after_delivery(event_id: str) -> None:
            assert acked and event_id == acked[-1], "hook ran for an entry that was not ACKed"
            if data.draw(st.booleans(), label=f"crash after the ACK of {event_id}"):
                record_event("send: crash after the ACK")
                crashed.append(event_id)
                planted.append(CrashAfterAck(event_id))
                raise planted[-1]

        marked: list[str] | None = None
        failure: Exception | None = None
        try:
            marked = self.run(dispatch(outbox, send, limit, after_delivery if hooked else None))
        except (SendFailed, AckLost, CrashAfterAck, NotAcknowledged) as exc:
            failure = exc

        expected_marked = [event_id for event_id in acked if event_id not in crashed]
        for event_id in expected_marked:
            self.model_mark_sent(event_id)

        # The batch is the oldest pending entries in seq order, offered one by one.
        assert offered == expected_batch[: len(offered)]
        if failure is None:
            assert offered == expected_batch
            assert marked == expected_marked == offered
            return
        # Stop on the first failure: the failed entry was the last one offered.
        assert offered, "dispatch failed before offering anything"
        assert expected_marked == offered[:-1]
        if planted:
            assert failure is planted[-1], "dispatch did not re-raise the original error"
        else:
            assert isinstance(failure, NotAcknowledged)

    # ------------------------------------------------------------ restarts

    @rule(side=st.sampled_from(("publisher", "sink", "both")))
    def restart(self, side: str) -> None:
        # A crash stand-in: the side's object is closed (aiosqlite warns about an abandoned
        # connection) and a new one opened on the same file; only what is on disk carries over.
        before = self.dump()
        if side in ("publisher", "both"):
            self.run(self.ob.close())
            self.outbox = None
            self.outbox = self.run(self._open_outbox())
        if side in ("sink", "both"):
            self.run(self.ib.close())
            self.inbox = None
            self.inbox = self.run(self._open_inbox())
        assert self.dump() == before, "closing and reopening changed the databases"

    # ------------------------------------------------------------ operator

    @precondition(lambda self: self.has_pending() or self.has_quarantined())
    @rule(data=st.data())
    def operator(self, data: st.DataObject) -> None:
        actions = []
        if self.has_pending():
            actions.append("quarantine")
        if self.has_quarantined():
            actions.append("redrive")
        if data.draw(st.sampled_from(actions), label="operator action") == "quarantine":
            self.quarantine(data)
        else:
            self.redrive(data)

    def quarantine(self, data: st.DataObject) -> None:
        order_id = data.draw(st.sampled_from(self.ids_in("pending")), label="pending entry")
        self.run(self.ob.quarantine(order_id, HELD_REASON, TESTER))
        self.model_quarantine(order_id, HELD_REASON)

    def redrive(self, data: st.DataObject) -> None:
        order_id = data.draw(st.sampled_from(self.ids_in("quarantined")), label="quarantined")
        stay = self.open_stay(order_id)
        record = self.run(self.ob.redrive(order_id, TESTER))
        stay.released_by, stay.released_as = TESTER, "redriven"
        self.orders[order_id].state = "pending"

        passed = sorted(stay.passed, key=lambda i: self.orders[i].rank)
        assert (record.reason, record.quarantined_by) == (stay.reason, TESTER)
        assert (record.released_by, record.released_as) == (TESTER, "redriven")
        assert record.delivered_past == passed
        assert record.delivered_past_count == len(passed)
        record_event(f"redrive: {'passed by others' if passed else 'nothing passed it'}")

    # ------------------------------------------------------------ reads and refusals

    @rule(data=st.data())
    def change_nothing(self, data: st.DataObject) -> None:
        # One rule for reads and refusals, so that they do not crowd out the steps that
        # move entries along; each check compares full dumps of both files before and after.
        checks = ["read_views", "refuse_invalid_event", "refuse_bad_limit", "refuse_transition"]
        if self.applied:
            checks.append("refuse_conflict_at_sink")
        check = data.draw(st.sampled_from(checks), label="check")
        getattr(self, check)(data)

    def read_views(self, data: st.DataObject) -> None:
        limit = data.draw(st.integers(1, MAX_BATCH), label="pending limit")
        order_id = data.draw(st.sampled_from(ORDER_IDS), label="quarantine history of")
        before = self.dump()

        batch = self.run(self.ob.pending_batch(limit))
        assert [row.event["id"] for row in batch] == self.ids_in("pending")[:limit]
        assert all(row.event == self.orders[row.event["id"]].event for row in batch)
        for state in State:
            listed = [entry.id for entry in self.run(self.ob.entries(state))]
            expected = self.ids_in(state.value)
            if state is State.SENT:
                expected.reverse()  # sent entries are listed newest (highest seq) first
            assert listed == expected, f"entries({state}) disagrees with the model"

        history = self.run(self.ob.quarantines(order_id))
        stays = [stay for stay in self.quarantine_log if stay.id == order_id]
        assert [(r.reason, r.quarantined_by, r.released_by, r.released_as) for r in history] == [
            (stay.reason, stay.by, stay.released_by, stay.released_as) for stay in stays
        ]
        assert self.dump() == before, "reading changed the databases"

    def refuse_invalid_event(self, data: st.DataObject) -> None:
        order_id = data.draw(st.sampled_from(ORDER_IDS), label="ID used")
        order, field = data.draw(st.sampled_from(invalid_orders(order_id)), label="invalid order")
        bad, pointer = data.draw(st.sampled_from(invalid_events(order_id)), label="invalid event")
        before = self.dump()
        with pytest.raises(InvalidEvent) as at_intake:
            self.run(self.ob.accept(order))
        with pytest.raises(InvalidEvent) as at_publish:
            self.run(self.ob.publish(bad))
        with pytest.raises(InvalidEvent) as at_sink:
            self.run(self.ib.receive(bad))
        assert at_intake.value.field == field
        assert at_publish.value.field == pointer
        assert at_sink.value.field == pointer
        assert self.dump() == before, "invalid input changed the databases"

    def refuse_conflict_at_sink(self, data: st.DataObject) -> None:
        order_id = data.draw(st.sampled_from(self.applied), label="applied order")
        held = self.orders[order_id].order
        changed = data.draw(
            st.sampled_from(
                [
                    Incoming.of_order({**held, "qty": held["qty"] % QTY_MAX + 1}),
                    Incoming.of_order(
                        {**held, "sku": SKUS[(SKUS.index(held["sku"]) + 1) % len(SKUS)]}
                    ),
                    # The same key and data under another type is another event.
                    Incoming.checked({**self.orders[order_id].event, "type": "order.cancelled"}),
                ]
            ),
            label="conflicting payload",
        )
        before = self.dump()
        with pytest.raises(Conflict) as caught:
            self.run(self.ib.receive_with_digest(changed))
        assert caught.value.event_id == order_id
        assert self.dump() == before, "a conflict at the sink changed the databases"

    def refuse_bad_limit(self, data: st.DataObject) -> None:
        limit = data.draw(st.sampled_from(BAD_LIMITS), label="limit")

        async def send(event: Event) -> object:
            raise AssertionError(f"send called despite limit {limit!r}")

        before = self.dump()
        with pytest.raises(ValueError, match="limit"):
            self.run(dispatch(self.ob, send, limit))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit"):
            self.run(self.ob.pending(limit))  # type: ignore[arg-type]
        assert self.dump() == before, "a refused limit changed the databases"

    def refuse_transition(self, data: st.DataObject) -> None:
        action = data.draw(st.sampled_from(("quarantine", "redrive")), label="action")
        allowed = "pending" if action == "quarantine" else "quarantined"
        refused = [i for i in ORDER_IDS if i not in self.orders or self.orders[i].state != allowed]
        if not refused:
            return
        order_id = data.draw(st.sampled_from(refused), label=f"cannot {action}")
        expected = InvalidTransition if order_id in self.orders else UnknownEntry
        before = self.dump()
        with pytest.raises(expected):
            if action == "quarantine":
                self.run(self.ob.quarantine(order_id, HELD_REASON, TESTER))
            else:
                self.run(self.ob.redrive(order_id, TESTER))
        assert self.dump() == before, f"a refused {action} changed the databases"

    # ------------------------------------------------------------ invariants (on disk)

    @invariant()
    def disk_keeps_the_contract(self) -> None:
        # One read of each file per step. The contract's own properties come first, so a
        # failure names the property; the exact comparison with the model follows.
        disk = read(self.source_db, SOURCE_QUERIES) | read(self.sink_db, SINK_QUERIES)
        self.no_accepted_order_is_lost(disk)
        self.sink_applied_each_id_once(disk)
        self.sent_implies_received(disk)
        self.sink_order_follows_seq_unless_quarantined(disk)
        self.disk_matches_model(disk)
        self.quarantine_records_match_model(disk)

    def no_accepted_order_is_lost(self, disk: dict[str, Rows]) -> None:
        orders = {event_id: (sku, qty) for event_id, sku, qty in disk["orders"]}
        rows_of = Counter(row[1] for row in disk["outbox"])
        for event_id in self.orders:
            assert event_id in orders, f"accepted {event_id} has no orders row"
            assert rows_of[event_id] == 1, f"accepted {event_id} has {rows_of[event_id]} rows"
        for _, event_id, _, sent, quarantined in disk["outbox"]:
            # Pending, quarantined or sent: never both flags.
            assert (sent, quarantined) in {(0, 0), (1, 0), (0, 1)}, (event_id, sent, quarantined)

    def sink_applied_each_id_once(self, disk: dict[str, Rows]) -> None:
        ids = [row[0] for row in disk["inbox"]]
        assert len(ids) == len(set(ids)), f"the inbox holds an ID twice: {ids}"
        expected: Counter[str] = Counter()
        for _, payload in disk["inbox"]:
            order = json.loads(payload)["data"]  # every event here is an order.placed
            expected[order["sku"]] += order["qty"]
        inventory = {sku: qty for sku, qty in disk["inventory"] if qty}
        assert inventory == dict(expected), "inventory is not the sum of the applied events"

    def sent_implies_received(self, disk: dict[str, Rows]) -> None:
        outbox = {event_id: payload for _, event_id, payload, _, _ in disk["outbox"]}
        inbox: dict[str, str] = dict(disk["inbox"])
        for _, event_id, payload, sent, _ in disk["outbox"]:
            if sent:
                assert inbox.get(event_id) == payload, f"{event_id} is marked sent, sink lacks it"
        # And the sink holds nothing the publisher did not queue, with the same content.
        for event_id, payload in inbox.items():
            assert outbox.get(event_id) == payload, f"sink holds {event_id} unlike the outbox"

    def sink_order_follows_seq_unless_quarantined(self, disk: dict[str, Rows]) -> None:
        seq_of = {event_id: seq for seq, event_id, *_ in disk["outbox"]}
        was_quarantined = {row[0] for row in disk["quarantines"]}
        applied = [row[0] for row in disk["inbox"]]
        for position, earlier in enumerate(applied):
            for later in applied[position + 1 :]:
                if seq_of[earlier] > seq_of[later]:
                    record_event("sink order: applied out of seq order")
                    # `later` has the lower seq yet was applied after `earlier`: it can
                    # only have been passed while it sat in quarantine.
                    assert later in was_quarantined, (
                        f"{earlier} (seq {seq_of[earlier]}) was applied before "
                        f"{later} (seq {seq_of[later]}) with no quarantine on record"
                    )

    def disk_matches_model(self, disk: dict[str, Rows]) -> None:
        orders = {event_id: (sku, qty) for event_id, sku, qty in disk["orders"]}
        assert orders == {i: (o.order["sku"], o.order["qty"]) for i, o in self.orders.items()}
        ids = [row[1] for row in disk["outbox"]]
        assert ids == sorted(self.orders, key=lambda i: self.orders[i].rank), (
            "outbox seq order is not acceptance order"
        )
        for _, event_id, payload, sent, quarantined in disk["outbox"]:
            assert json.loads(payload) == self.orders[event_id].event
            # Stored in its canonical form (RFC 8785), which the digests are over.
            assert payload == order_canonical(self.orders[event_id].order)
            state = "sent" if sent else "quarantined" if quarantined else "pending"
            assert state == self.orders[event_id].state, f"{event_id} is {state} on disk"
        applied = [row[0] for row in disk["inbox"]]
        assert applied == self.applied, "the sink's applications differ from the model"

    def quarantine_records_match_model(self, disk: dict[str, Rows]) -> None:
        actual = [
            (*row[:6], None if row[6] is None else json.loads(row[6]))
            for row in disk["quarantines"]
        ]
        expected = []
        for stay in self.quarantine_log:
            released = stay.released_as is not None
            passed = sorted(stay.passed, key=lambda i: self.orders[i].rank)
            expected.append(
                (
                    stay.id,
                    stay.reason,
                    stay.by,
                    stay.released_by,
                    stay.released_as,
                    len(passed) if released else None,
                    passed if released else None,
                )
            )
        assert actual == expected


TestOutboxRelayModel = OutboxRelayMachine.TestCase
TestOutboxRelayModel.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
