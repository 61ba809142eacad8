"""Handler registries as plain Python: a handler is tested without a database, the
registry refuses what it cannot use, and `:name` statements become psycopg's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from shared import Event, InvalidEvent, canonical_json
from sink.backends.postgres import _pyformat
from sink.backends.sharing import runs
from sink.handlers import (
    ADD_TO_INVENTORY,
    WAREHOUSE,
    HandledEvent,
    HandlerFailed,
    HandlerRejected,
    Handlers,
    NoHandler,
    Reject,
    Statement,
    load,
)


def effects(handlers: Handlers, event: Event) -> list[tuple[str, Any]]:
    """What the inbox would run for `event`, as `statements` says (params as dicts)."""
    got = [(sql, dict(params)) for sql, params in handlers.statements(event)]
    assert got == [(sql, dict(p)) for sql, p in handlers.effects(event, canonical_json(event))]
    return got


def test_statements_validates_the_event_as_the_inbox_does() -> None:
    with pytest.raises(InvalidEvent, match="/data"):
        ledger().statements({"id": "p-1", "type": "payment.captured", "data": [1]})


def payment(cents: int) -> Event:
    return {"id": "p-1", "type": "payment.captured", "key": "c-9", "data": {"amount_cents": cents}}


def ledger() -> Handlers:
    handlers = Handlers("payments")

    @handlers.on("payment.captured")
    def captured(event: HandledEvent) -> list[Statement]:
        if event.data["amount_cents"] <= 0:
            raise Reject("amount must be positive")
        return [("INSERT INTO ledger VALUES (:id, :cents)", {"id": event.id, "cents": 5})]

    return handlers


def test_a_handler_is_a_function_of_the_event_tested_without_a_database() -> None:
    assert effects(ledger(), payment(5)) == [
        ("INSERT INTO ledger VALUES (:id, :cents)", {"id": "p-1", "cents": 5})
    ]
    with pytest.raises(HandlerRejected, match="amount must be positive") as rejected:
        effects(ledger(), payment(0))
    assert (rejected.value.status, rejected.value.event_id) == (422, "p-1")


def test_the_warehouse_adds_an_orders_quantity_and_records_anything_else() -> None:
    order: Event = {
        "id": "o-1",
        "type": "order.placed",
        "key": "tea",
        "data": {"sku": "tea", "qty": 2},
    }

    assert effects(WAREHOUSE, order) == [(ADD_TO_INVENTORY, {"sku": "tea", "qty": 2})]
    assert effects(WAREHOUSE, payment(5)) == []
    not_an_order: Event = {"id": "o-2", "type": "order.placed", "data": {"sku": "tea"}}
    assert effects(WAREHOUSE, not_an_order) == []


def test_a_type_without_a_handler_is_no_handler_unless_the_registry_has_otherwise() -> None:
    handlers = ledger()
    refund: Event = {"id": "r-1", "type": "refund.issued", "data": {}}

    with pytest.raises(NoHandler) as missing:
        effects(handlers, refund)
    assert (missing.value.status, missing.value.event_type) == (422, "refund.issued")

    handlers.otherwise(lambda event: ["SELECT 1"])
    assert effects(handlers, refund) == [("SELECT 1", {})]


@pytest.mark.parametrize(
    "returned",
    ["INSERT INTO x VALUES (1)", 7, [("sql",)], [("sql", [1])], [(1, {})], [b"sql"]],
    ids=["bare-string", "int", "one-tuple", "positional", "not-text", "bytes"],
)
def test_a_handler_returning_no_statements_has_failed(returned: object) -> None:
    handlers = Handlers()
    handlers.on("t")(lambda event: returned)

    with pytest.raises(HandlerFailed) as failed:
        effects(handlers, {"id": "x", "type": "t", "data": {}})

    assert failed.value.status == 503


@pytest.mark.parametrize(
    "statement",
    [
        *("COMMIT", "  rollback", "-- why\nBEGIN", "/* x */ SAVEPOINT s", "RELEASE s", "END"),
        *("SET search_path TO elsewhere", "RESET ALL", "VACUUM", "PRAGMA foreign_keys = OFF"),
        *("ATTACH DATABASE 'x' AS y", "(COMMIT)"),
    ],
)
def test_a_statement_that_would_end_or_change_the_inbox_transaction_is_refused(
    statement: str,
) -> None:
    handlers = Handlers()
    handlers.on("t")(lambda event: [statement])

    with pytest.raises(HandlerFailed, match="would end or change the inbox's transaction"):
        effects(handlers, {"id": "x", "type": "t", "data": {}})


@pytest.mark.parametrize(
    "statement", ["SET LOCAL lock_timeout = '1s'", "SET CONSTRAINTS ALL IMMEDIATE"]
)
def test_settings_of_the_transaction_alone_are_allowed(statement: str) -> None:
    handlers = Handlers()
    handlers.on("t")(lambda event: [statement])

    assert effects(handlers, {"id": "x", "type": "t", "data": {}}) == [(statement, {})]


def test_a_generator_handler_that_rejects_or_fails_while_yielding_is_judged_so() -> None:
    handlers = Handlers()

    @handlers.on("refused")
    def refused(event: HandledEvent) -> Any:
        yield "INSERT INTO x VALUES (1)"
        raise Reject("no thanks")

    @handlers.on("broken")
    def broken(event: HandledEvent) -> Any:
        yield "INSERT INTO x VALUES (1)"
        raise KeyError("bug")

    with pytest.raises(HandlerRejected, match="no thanks"):
        effects(handlers, {"id": "x", "type": "refused", "data": {}})
    with pytest.raises(HandlerFailed, match="KeyError"):
        effects(handlers, {"id": "x", "type": "broken", "data": {}})


def test_a_handler_that_raises_has_failed_with_its_exception_as_the_cause() -> None:
    handlers = Handlers()

    @handlers.on("t")
    def broken(event: HandledEvent) -> list[Statement]:
        raise LookupError("secret")

    with pytest.raises(HandlerFailed) as failed:
        effects(handlers, {"id": "x", "type": "t", "data": {}})

    assert isinstance(failed.value.__cause__, LookupError)
    assert failed.value.detail == "LookupError"  # the message stays in the log


def test_the_handler_gets_the_event_with_a_fresh_copy_of_its_data() -> None:
    seen: list[HandledEvent] = []
    handlers = Handlers()
    handlers.on("payment.captured")(lambda event: seen.append(event) or [])
    event = payment(5)

    effects(handlers, event)

    copy = seen[0].data
    copy["amount_cents"] = 0
    assert seen[0].data == {"amount_cents": 5} and event["data"] == {"amount_cents": 5}
    assert (seen[0].id, seen[0].type, seen[0].key) == ("p-1", "payment.captured", "c-9")


def test_the_registry_refuses_what_it_cannot_use() -> None:
    handlers = ledger()
    with pytest.raises(ValueError, match="has a handler already"):
        handlers.on("payment.captured")
    with pytest.raises(ValueError, match="not an event type"):
        handlers.on("payment captured")
    with pytest.raises(TypeError, match="callable"):
        handlers.on("x")(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty SQL"):
        handlers.schema("  ")
    with pytest.raises(ValueError, match="a registry's name"):
        Handlers("no spaces")
    handlers.otherwise(lambda event: [])
    with pytest.raises(ValueError, match="`otherwise` handler already"):
        handlers.otherwise(lambda event: [])
    assert handlers.types == frozenset({"payment.captured"})
    assert handlers.handles("anything")


def test_load_finds_a_registry_by_module_and_attribute() -> None:
    assert load("sink.handlers:WAREHOUSE") is WAREHOUSE
    with pytest.raises(ValueError, match="wants MODULE:ATTR"):
        load("sink.handlers")
    with pytest.raises(ValueError, match=r"is a function, not a sink\.Handlers"):
        load("sink.handlers:warehouse")


def test_load_finds_a_module_of_the_current_directory_as_the_console_script_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `outbox-sink` starts with the script's folder first on sys.path, not the
    # current directory (as `python -m sink` has it): the user's module is there.
    (tmp_path / "my_consumer_handlers.py").write_text(
        "from sink import Handlers\nhandlers = Handlers('mine')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_consumer_handlers", raising=False)
    assert load("my_consumer_handlers:handlers").name == "mine"


@pytest.mark.parametrize(
    ("given", "psycopg"),
    [
        ("VALUES (:a, :b_2)", "VALUES (%(a)s, %(b_2)s)"),
        ("SELECT :n::bigint", "SELECT %(n)s::bigint"),
        ("SELECT '50% off: :not', \"col:x\"", "SELECT '50%% off: :not', \"col:x\""),
        ("SELECT 1 -- :no\n, :yes", "SELECT 1 -- :no\n, %(yes)s"),
        ("SELECT /* :no % */ :yes % 2", "SELECT /* :no %% */ %(yes)s %% 2"),
        ("SELECT $$ :no $$, $q$ :no $q$, :yes", "SELECT $$ :no $$, $q$ :no $q$, %(yes)s"),
        ("SELECT 'it''s :no', :yes", "SELECT 'it''s :no', %(yes)s"),
        ("SELECT E'it\\'s :no' || :x", "SELECT E'it\\'s :no' || %(x)s"),
        ("SELECT E'\\'' || :x || 'y'", "SELECT E'\\'' || %(x)s || 'y'"),
        ("SELECT arr[lo:hi], arr[1:2], :p", "SELECT arr[lo:hi], arr[1:2], %(p)s"),
        ("SELECT x := :v", "SELECT x := %(v)s"),
    ],
)
def test_named_parameters_become_psycopgs_outside_literals_and_comments(
    given: str, psycopg: str
) -> None:
    assert _pyformat(given) == psycopg


def test_runs_group_consecutive_statements_and_sum_the_warehouses_upserts_per_sku() -> None:
    order = [(ADD_TO_INVENTORY, {"sku": s, "qty": q}) for s, q in (("tea", 2), ("jam", 1))]
    other = ("INSERT INTO audit (id) VALUES (:id)", {"id": "o-9"})

    got = runs(
        [
            order[:1],
            [(ADD_TO_INVENTORY, {"sku": "jam", "qty": 4})],
            order,
            [other],
            [(ADD_TO_INVENTORY, {"sku": "tea", "qty": 5})],
        ]
    )

    # One upsert per SKU of a run, in SKU order (two groups lock rows in one order);
    # a statement in between ends the run, and a run of one is left as it is.
    assert got == [
        (ADD_TO_INVENTORY, [{"sku": "jam", "qty": 5}, {"sku": "tea", "qty": 4}]),
        (other[0], [other[1]]),
        (ADD_TO_INVENTORY, [{"sku": "tea", "qty": 5}]),
    ]
