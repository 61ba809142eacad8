"""A handler of one's own for the benchmark's sinks: `python -m sink --handlers
bench.handlers:ONE_ROW`.

For an `order.placed` event it writes one row of its own, the order's SKU and
quantity under the event's ID, and nothing else (no inventory, and no `otherwise`:
a sink with it answers any other type 422). It is what a consumer's first handler
looks like, and bench.own_handler measures it against the built-in warehouse
(sink.handlers.WAREHOUSE) on the same orders. This module imports nothing of the
bench, so the sink that loads it stays a sink.
"""

from __future__ import annotations

from typing import Final

from sink.handlers import HandledEvent, Handlers, Statement

SPEC: Final = "bench.handlers:ONE_ROW"  # what `--handlers` names it by
ROWS_TABLE: Final = "bench_rows"
INSERT_ROW: Final = f"INSERT INTO {ROWS_TABLE} (event_id, sku, qty) VALUES (:event_id, :sku, :qty)"
COUNT_ROWS: Final = f"SELECT count(*) FROM {ROWS_TABLE}"

ONE_ROW: Final = Handlers("bench")
ONE_ROW.schema(
    f"CREATE TABLE {ROWS_TABLE} (event_id TEXT PRIMARY KEY, sku TEXT NOT NULL,"
    " qty INTEGER NOT NULL)"
)


@ONE_ROW.on("order.placed")
def placed(event: HandledEvent) -> list[Statement]:
    """The order's row. Its data is taken as the intake checked it: a handler of
    one's own trusts its producer, where the built-in one checks the order again."""
    data = event.data
    return [(INSERT_ROW, {"event_id": event.id, "sku": data["sku"], "qty": data["qty"]})]
