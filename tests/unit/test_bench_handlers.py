"""The benchmark's handler of its own (bench.handlers) and how its cases tell the two
registries apart (bench.own_handler): no process; its statements run on SQLite
databases of the test's own."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from bench import handlers
from bench.events import order
from bench.own_handler import Registry, check_effects
from bench.procs import BenchError
from shared import Event, canonical_json, order_event
from sink.handlers import WAREHOUSE, NoHandler, load


def effects(n: int) -> list[tuple[str, dict[str, object]]]:
    placed = order_event(order(n, "x"))
    return [
        (sql, dict(params))
        for sql, params in handlers.ONE_ROW.effects(placed, canonical_json(placed))
    ]


def test_an_order_is_one_row_of_its_own_and_nothing_else() -> None:
    assert effects(7) == [
        (handlers.INSERT_ROW, {"event_id": "x-00000007", "sku": "sku-7", "qty": 3})
    ]
    assert handlers.ONE_ROW.types == {"order.placed"}
    other = Event(id="e-1", type="shipment.prepared", key=None, data={})
    with pytest.raises(NoHandler):
        handlers.ONE_ROW.effects(other, canonical_json(other))


def test_its_schema_and_statements_run_and_the_count_reads_them() -> None:
    conn = sqlite3.connect(":memory:")
    for statement in handlers.ONE_ROW.schema_statements:
        conn.execute(statement)
    for n in range(5):
        [(sql, params)] = effects(n)
        conn.execute(sql, params)
    assert conn.execute(handlers.COUNT_ROWS).fetchone() == (5,)
    with pytest.raises(sqlite3.IntegrityError):  # a second row for one event is refused
        conn.execute(*effects(0)[0])


def test_the_sink_loads_it_by_the_name_the_cases_give() -> None:
    assert load(handlers.SPEC) is handlers.ONE_ROW
    assert handlers.ONE_ROW.name != WAREHOUSE.name  # its schema is versioned apart
    assert Registry.BUILT_IN.sink_args == ()  # the sink's default: the warehouse
    assert Registry.OWN.sink_args == ("--handlers", handlers.SPEC)


def test_each_registry_says_what_its_effect_reads_after_some_orders() -> None:
    # The warehouse adds each order's quantity to its SKU's stock: their sum in all.
    assert (
        Registry.BUILT_IN.effect(7)
        == sum(order(n)["qty"] for n in range(7))
        == 1 + 2 + 3 + 4 + 5 + 1 + 2
    )
    assert Registry.OWN.effect(7) == 7
    assert Registry.BUILT_IN.effect(0) == Registry.OWN.effect(0) == 0


def test_a_sink_whose_effects_are_not_the_registrys_fails_the_round(tmp_path: Path) -> None:
    sink_db = tmp_path / "sink.db"
    with contextlib.closing(sqlite3.connect(sink_db)) as conn, conn:
        conn.execute("CREATE TABLE inbox_inventory (sku TEXT PRIMARY KEY, qty INTEGER)")
        conn.execute("INSERT INTO inbox_inventory VALUES ('sku-0', 4), ('sku-1', 2)")
    check_effects(Registry.BUILT_IN, 6)(sink_db)
    with pytest.raises(BenchError, match="the built_in handlers' effect reads 6, not 7"):
        check_effects(Registry.BUILT_IN, 7)(sink_db)
    # A sink that ran the warehouse where the own handler was asked for has no rows of it.
    with pytest.raises(sqlite3.OperationalError, match="no such table: bench_rows"):
        check_effects(Registry.OWN, 2)(sink_db)
