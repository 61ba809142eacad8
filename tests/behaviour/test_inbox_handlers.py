"""Handlers of a consumer's own, as every inbox backend runs them.

Each test runs once per backend in `BACKENDS` (tests/behaviour/inbox_backends.py):
an inbox opened with a registry of the test's own (a ledger of payments), checked
through a connection of the test's own. What is checked: a handler's statements and
the inbox record commit together or not at all; a duplicate or a conflict never
runs a handler's statements, and is answered as such even by a handler that would
now refuse it; a type with no handler, a Reject and a failure record nothing and
stop a batch there, its prefix kept; a failing call of a group commit fails alone;
the registry's schema runs once per statement, versioned apart from the inbox's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from inbox_backends import BACKENDS, Backend
from support import in_progress

from plumbing.storage import StorageError
from shared import Conflict, Event, Receipt
from sink import Inbox
from sink.handlers import (
    HandledEvent,
    HandlerFailed,
    HandlerRejected,
    Handlers,
    NoHandler,
    Reject,
    Statement,
)
from sink.store import BatchReceipt, Incoming

LEDGER = (
    "CREATE TABLE IF NOT EXISTS ledger ("
    " payment_id TEXT PRIMARY KEY, customer TEXT NOT NULL, cents INTEGER NOT NULL)"
)
# Every payment is audited; the audit refuses amounts of 1,000,000 cents or more, so
# a handler's second statement can be made to fail.
AUDIT = (
    "CREATE TABLE IF NOT EXISTS audit ("
    " payment_id TEXT PRIMARY KEY, note TEXT NOT NULL, cents INTEGER NOT NULL"
    " CHECK (cents < 1000000))"
)
ADD = "INSERT INTO ledger (payment_id, customer, cents) VALUES (:payment_id, :customer, :cents)"
# A literal with a percent sign and a colon: not a parameter on either backend.
NOTE = "INSERT INTO audit (payment_id, note, cents) VALUES (:payment_id, '100% sure: yes', :cents)"


class Ledger:
    """A registry of the test's own, counting the calls of each handler."""

    def __init__(self, name: str = "payments") -> None:
        self.calls: list[str] = []
        self.handlers = handlers = Handlers(name)
        handlers.schema(LEDGER, AUDIT)

        @handlers.on("payment.captured")
        def captured(event: HandledEvent) -> list[Statement]:
            self.calls.append(event.id)
            cents = event.data["amount_cents"]
            if cents <= 0:
                raise Reject("amount must be positive")
            if event.data.get("explode"):
                raise RuntimeError("the handler's own bug")
            params = {"payment_id": event.id, "customer": event.key, "cents": cents}
            return [(ADD, params), (NOTE, {"payment_id": event.id, "cents": cents})]

        @handlers.on("payment.noted")
        def noted(event: HandledEvent) -> Any:
            self.calls.append(event.id)
            return event.data.get("returns")


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with BACKENDS[request.param](request) as opened:
        yield opened


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
async def inbox(backend: Backend, ledger: Ledger) -> AsyncIterator[Inbox]:
    async with Inbox.open(backend.location, ledger.handlers) as opened:
        yield opened


def payment(payment_id: str, cents: int = 1999, customer: str = "c-9", **more: object) -> Event:
    return {
        "id": payment_id,
        "type": "payment.captured",
        "key": customer,
        "data": {"amount_cents": cents, "currency": "EUR", **more},
    }


def taken(*events: Event) -> list[Incoming]:
    return [Incoming.checked(one) for one in events]


def ledger_rows(backend: Backend) -> list[tuple[Any, ...]]:
    return backend.query("SELECT payment_id, customer, cents FROM ledger ORDER BY payment_id")


def inbox_ids(backend: Backend) -> list[str]:
    return [row[0] for row in backend.query("SELECT id FROM inbox_events ORDER BY id")]


def receipts(got: BatchReceipt) -> list[Receipt]:
    return [one.receipt for one in got.received]


# ---------------------------------------------------------------- one event


async def test_a_handlers_statements_commit_with_the_inbox_record(
    inbox: Inbox, backend: Backend, ledger: Ledger
) -> None:
    assert await inbox.receive(payment("p-1", 1999)) is Receipt.APPLIED

    assert ledger_rows(backend) == [("p-1", "c-9", 1999)]
    assert backend.query("SELECT payment_id, note, cents FROM audit") == [
        ("p-1", "100% sure: yes", 1999)
    ]
    assert inbox_ids(backend) == ["p-1"]
    assert ledger.calls == ["p-1"]


async def test_a_duplicate_and_a_conflict_never_run_the_handlers_statements(
    inbox: Inbox, backend: Backend, ledger: Ledger
) -> None:
    await inbox.receive(payment("p-1", 1999))

    # The handler's INSERTs, run a second time, would break the ledger's primary key.
    assert await inbox.receive(payment("p-1", 1999)) is Receipt.DUPLICATE
    with pytest.raises(Conflict):
        await inbox.receive(payment("p-1", 2500))
    got = await inbox.receive_batch(taken(payment("p-1", 1999), payment("p-1", 1999)))

    assert receipts(got) == [Receipt.DUPLICATE, Receipt.DUPLICATE]
    assert ledger_rows(backend) == [("p-1", "c-9", 1999)]
    assert backend.query("SELECT payment_id, cents FROM audit") == [("p-1", 1999)]
    assert backend.query("SELECT deliveries FROM inbox_events") == [(4,)]


async def test_a_known_event_its_handler_now_refuses_is_still_a_duplicate(
    inbox: Inbox, backend: Backend
) -> None:
    # Recorded while the handler took it; then a handler that refuses it, or fails
    # on it, is deployed: a redelivery is answered from the inbox all the same.
    await inbox.receive(payment("p-1", 1999))

    def refuses(event: HandledEvent) -> list[Statement]:
        raise Reject("no longer taken")

    def fails(event: HandledEvent) -> list[Statement]:
        raise RuntimeError("a bug of the new release")

    for handler in (refuses, fails):
        registry = Handlers("payments")
        registry.schema(LEDGER, AUDIT)
        registry.on("payment.captured")(handler)
        async with Inbox.open(backend.location, registry) as reopened:
            assert await reopened.receive(payment("p-1", 1999)) is Receipt.DUPLICATE
            got = await reopened.receive_batch(taken(payment("p-1", 1999)))
            assert receipts(got) == [Receipt.DUPLICATE] and got.stopped is None

    assert ledger_rows(backend) == [("p-1", "c-9", 1999)]
    assert backend.query("SELECT deliveries FROM inbox_events") == [(5,)]


async def test_a_second_statement_refused_leaves_neither_the_first_nor_the_record(
    inbox: Inbox, backend: Backend
) -> None:
    with pytest.raises(HandlerFailed) as failed:
        await inbox.receive(payment("p-big", 1_000_000))

    assert failed.value.status == 503
    assert (failed.value.event_id, failed.value.event_type) == ("p-big", "payment.captured")
    assert failed.value.__cause__ is not None  # the database's own error, for the log
    assert ledger_rows(backend) == []
    assert backend.query("SELECT * FROM audit") == []
    assert inbox_ids(backend) == []
    assert await inbox.count() == 0
    # The inbox is fine afterwards, and the same ID can still come in.
    assert await inbox.receive(payment("p-big", 999_999)) is Receipt.APPLIED
    assert ledger_rows(backend) == [("p-big", "c-9", 999_999)]


@pytest.mark.parametrize(
    ("one", "refused", "status"),
    [
        (payment("p-0", 0), HandlerRejected, 422),
        ({"id": "s-1", "type": "shipment.sent", "data": {}}, NoHandler, 422),
        (payment("p-bug", 5, explode=True), HandlerFailed, 503),
        ({"id": "n-1", "type": "payment.noted", "data": {"returns": "DELETE"}}, HandlerFailed, 503),
    ],
    ids=["reject", "no-handler", "raises", "returns-no-statements"],
)
async def test_an_event_its_handler_does_not_take_records_nothing(
    inbox: Inbox, backend: Backend, one: Event, refused: type[Exception], status: int
) -> None:
    with pytest.raises(refused) as raised:
        await inbox.receive(one)

    assert raised.value.status == status  # type: ignore[attr-defined]
    assert inbox_ids(backend) == []
    assert ledger_rows(backend) == []
    assert await inbox.count() == 0


async def test_reject_carries_the_handlers_reason(inbox: Inbox) -> None:
    with pytest.raises(HandlerRejected) as rejected:
        await inbox.receive(payment("p-0", 0))

    assert rejected.value.detail == "amount must be positive"


@pytest.mark.parametrize("returns", [None, [], ["SELECT 1"]], ids=["none", "empty", "sql"])
async def test_a_handler_may_return_nothing_or_bare_sql(
    inbox: Inbox, backend: Backend, returns: object
) -> None:
    noted = {"id": "n-1", "type": "payment.noted", "data": {"returns": returns}}

    assert await inbox.receive(noted) is Receipt.APPLIED

    assert inbox_ids(backend) == ["n-1"]


async def test_the_handler_gets_a_copy_of_the_data(backend: Backend) -> None:
    handlers = Handlers()
    seen: list[HandledEvent] = []

    @handlers.on("payment.captured")
    def meddle(event: HandledEvent) -> list[Statement]:
        seen.append(event)
        event.data["amount_cents"] = -1  # changes the handler's copy only
        return []

    async with Inbox.open(backend.location, handlers) as inbox:
        await inbox.receive(payment("p-1", 1999))
        record = await inbox.record("p-1")

    assert record is not None and record.event["data"]["amount_cents"] == 1999
    assert (seen[0].id, seen[0].type, seen[0].key) == ("p-1", "payment.captured", "c-9")
    assert seen[0].data == {"amount_cents": 1999, "currency": "EUR"}


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize(
    ("third", "refused"),
    [
        (payment("p-2", 0), HandlerRejected),
        ({"id": "p-2", "type": "shipment.sent", "data": {}}, NoHandler),
        (payment("p-2", 5, explode=True), HandlerFailed),
        (payment("p-2", 1_000_000), HandlerFailed),
    ],
    ids=["reject", "no-handler", "raises", "statement-refused"],
)
async def test_a_batch_stops_at_the_event_its_handler_does_not_take_and_keeps_the_prefix(
    inbox: Inbox, backend: Backend, third: Event, refused: type[Exception]
) -> None:
    batch = [payment("p-0", 10), payment("p-1", 20), third, payment("p-3", 30)]

    got = await inbox.receive_batch(taken(*batch))

    assert receipts(got) == [Receipt.APPLIED, Receipt.APPLIED]
    assert isinstance(got.stopped, refused)
    assert got.stopped.event_id == "p-2"
    assert inbox_ids(backend) == ["p-0", "p-1"]
    assert ledger_rows(backend) == [("p-0", "c-9", 10), ("p-1", "c-9", 20)]
    # The stopped event and those after it come in once the cause is gone.
    rest = await inbox.receive_batch(taken(payment("p-2", 25), payment("p-3", 30)))
    assert receipts(rest) == [Receipt.APPLIED, Receipt.APPLIED] and rest.stopped is None
    assert [row[0] for row in ledger_rows(backend)] == ["p-0", "p-1", "p-2", "p-3"]


async def test_a_batch_with_duplicates_before_the_refused_event_counts_them(
    inbox: Inbox, backend: Backend, ledger: Ledger
) -> None:
    await inbox.receive(payment("p-0", 10))

    got = await inbox.receive_batch(
        taken(payment("p-0", 10), payment("p-1", 20), payment("p-2", 0))
    )

    assert receipts(got) == [Receipt.DUPLICATE, Receipt.APPLIED]
    assert isinstance(got.stopped, HandlerRejected) and got.stopped.event_id == "p-2"
    assert inbox_ids(backend) == ["p-0", "p-1"]
    assert backend.query("SELECT id, deliveries FROM inbox_events ORDER BY id") == [
        ("p-0", 2),
        ("p-1", 1),
    ]


async def test_a_failing_call_of_a_group_commit_fails_alone(inbox: Inbox, backend: Backend) -> None:
    calls = [
        [payment("a-0", 1), payment("a-1", 2)],
        [payment("b-0", 3), payment("b-1", 1_000_000), payment("b-2", 4)],
        [payment("c-0", 5)],
    ]

    with in_progress(inbox, len(calls)):
        got = await asyncio.gather(*(inbox.receive_batch(taken(*call)) for call in calls))

    assert receipts(got[0]) == [Receipt.APPLIED] * 2 and got[0].stopped is None
    assert receipts(got[1]) == [Receipt.APPLIED] and isinstance(got[1].stopped, HandlerFailed)
    assert receipts(got[2]) == [Receipt.APPLIED] and got[2].stopped is None
    assert inbox_ids(backend) == ["a-0", "a-1", "b-0", "c-0"]
    assert [row[0] for row in ledger_rows(backend)] == ["a-0", "a-1", "b-0", "c-0"]
    assert await inbox.count() == 4


async def test_a_rejecting_call_of_a_group_commit_stops_alone(
    inbox: Inbox, backend: Backend
) -> None:
    calls = [[payment("a-0", 1)], [payment("b-0", 0), payment("b-1", 3)], [payment("c-0", 5)]]

    with in_progress(inbox, len(calls)):
        got = await asyncio.gather(*(inbox.receive_batch(taken(*call)) for call in calls))

    assert [receipts(one) for one in got] == [[Receipt.APPLIED], [], [Receipt.APPLIED]]
    assert isinstance(got[1].stopped, HandlerRejected)
    assert inbox_ids(backend) == ["a-0", "c-0"]


# ---------------------------------------------------------------- the schema


async def test_the_schema_runs_once_per_statement_and_a_new_statement_runs_alone(
    backend: Backend,
) -> None:
    first = Handlers("counted")
    first.schema("CREATE TABLE counted (n INTEGER NOT NULL)", "INSERT INTO counted (n) VALUES (1)")
    async with Inbox.open(backend.location, first):
        pass
    async with Inbox.open(backend.location, first):
        pass
    assert backend.query("SELECT n FROM counted") == [(1,)]

    grown = Handlers("counted")
    grown.schema(
        "CREATE TABLE counted (n INTEGER NOT NULL)",
        "INSERT INTO counted (n) VALUES (1)",
        "INSERT INTO counted (n) VALUES (2)",
    )
    async with Inbox.open(backend.location, grown):
        pass

    assert backend.query("SELECT n FROM counted ORDER BY n") == [(1,), (2,)]
    # Another registry's statements are counted apart, and the inbox's own too.
    other = Handlers("other")
    other.schema("INSERT INTO counted (n) VALUES (3)")
    other.otherwise(lambda event: [])
    async with Inbox.open(backend.location, other) as inbox:
        assert await inbox.receive({"id": "x", "type": "t", "data": {}}) is not None
    assert backend.query("SELECT n FROM counted ORDER BY n") == [(1,), (2,), (3,)]


async def test_a_registry_naming_fewer_statements_than_ran_is_refused(backend: Backend) -> None:
    grown = Handlers("shrinking")
    grown.schema("CREATE TABLE one (n INTEGER)", "CREATE TABLE two (n INTEGER)")
    async with Inbox.open(backend.location, grown):
        pass
    shrunk = Handlers("shrinking")
    shrunk.schema("CREATE TABLE one (n INTEGER)")

    with pytest.raises(StorageError, match="only ever added"):
        async with Inbox.open(backend.location, shrunk):
            pass


async def test_a_failing_schema_statement_is_named_and_nothing_of_the_registry_runs(
    backend: Backend,
) -> None:
    broken = Handlers("broken")
    broken.schema("CREATE TABLE fine (n INTEGER)", "CREATE TABLEX nope (n INTEGER)")

    with pytest.raises(StorageError, match="schema statement 2 of the handlers 'broken'"):
        async with Inbox.open(backend.location, broken):
            pass

    fixed = Handlers("broken")
    fixed.schema("CREATE TABLE fine (n INTEGER)", "CREATE TABLE nope (n INTEGER)")
    async with Inbox.open(backend.location, fixed):
        pass
    assert backend.query("SELECT count(*) FROM fine") == [(0,)]
    assert backend.query("SELECT count(*) FROM nope") == [(0,)]


async def test_the_warehouse_is_the_default_and_keeps_recording_other_types(
    backend: Backend,
) -> None:
    async with Inbox.open(backend.location) as inbox:
        order = {
            "id": "o-1",
            "type": "order.placed",
            "key": "tea",
            "data": {"sku": "tea", "qty": 3},
        }
        assert await inbox.receive(order) is Receipt.APPLIED
        assert await inbox.receive(payment("p-1")) is Receipt.APPLIED
        assert await inbox.inventory("tea") == 3

    assert inbox_ids(backend) == ["o-1", "p-1"]


# ---------------------------------------------------------------- the handler's parameters


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("INSERT INTO ledger (payment_id, customer, cents) VALUES (:id, 'c', :missing)", {}),
        ("INSERT INTO ledger (payment_id, customer, cents) VALUES (:id, 'c', :n)", {"n": 2**70}),
        ("INSERT INTO ledger (payment_id, customer, cents) VALUES (:id, 'c', :n)", {"n": {}}),
    ],
    ids=["missing", "too-large", "not-a-value"],
)
async def test_parameters_the_database_cannot_take_are_the_handlers_failure_and_keep_the_prefix(
    backend: Backend, sql: str, params: dict[str, Any]
) -> None:
    handlers = Ledger().handlers

    @handlers.on("payment.odd")
    def odd(event: HandledEvent) -> list[Statement]:
        return [(sql, {"id": event.id, **params})]

    odd_one = {"id": "odd-1", "type": "payment.odd", "data": {}}
    async with Inbox.open(backend.location, handlers) as inbox:
        got = await inbox.receive_batch(taken(payment("p-0", 10), odd_one, payment("p-2", 20)))
        again = await inbox.receive(payment("p-3", 30))  # the inbox goes on

    assert receipts(got) == [Receipt.APPLIED] and isinstance(got.stopped, HandlerFailed)
    assert got.stopped.event_id == "odd-1"
    assert again is Receipt.APPLIED
    assert inbox_ids(backend) == ["p-0", "p-3"]
