"""The `event_costs` case: what validating and canonicalising one event costs, in process.

The functions every event goes through, timed on one core in this process (no I/O),
for an order, its `order.placed` event and the two generic events of bench.events
(1 KiB of data, integers only and with floats):

- `order_intake_us`: what POST /orders does with each parsed order before it is
  stored (publisher.store.checked_order: validate_order, then the canonical event
  written directly);
- `checked_event_us`: shared.checked_event, validation and canonicalisation of a
  caller's objects, as Outbox.publish and publish_in run it (the checked path);
- `checked_parsed_us`: the same of the event as the strict parser reads it
  (`parsed=True`), as POST /events runs it on each event at intake and the sink on
  each event it receives (the fast path where it can vouch for the text);
- `checked_parsed_dated_us`: the same for the 1 KiB event with its time written as
  RFC 3339 text and a version string beside it, as many producers write them (text
  that looks like a float to a first glance of the canonical text);
- `canonical_parts_us`: shared.event.canonical_parts, the canonicalisation of an
  event alone (canonical_json), on the checked path;
- `json_loads_us`: json.loads of the event's canonical text, the standard library's
  figure for the same bytes;
- `stored_read_us`: orjson.loads of that text, as a sender that may change the
  events it is given gets each entry (the relay itself reads only the id, type and
  key at the end of the text);
- `envelope_read_us`: shared.event.envelope_of of that text, what the relay reads of
  each entry it sends (id, type and key, and where the data's text ends);
- `loads_strict_us`: the same text parsed as intake and the sink parse a request
  body (plumbing.bodies.loads_strict: a repeated key refused, long integers and
  numbers no double holds kept apart as markers);
- `schema_check_us`: shared.schemas.Schemas.check of the generic events' data against
  SCHEMA (about 1 KiB), as intake runs it for a type with a schema.

Each figure is the median over ROUNDS rounds of the mean time of one call in a round
of about ROUND_S seconds: the same on a quiet machine, and what a loaded one gives
the calls of a round, not its luckiest call.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from bench.cases import Context, Figures
from bench.events import DATA_BYTES, GENERIC_TYPE, Kind, order, stored
from plumbing.bodies import loads_strict
from publisher.store import checked_order
from shared import checked_event
from shared.event import canonical_parts, envelope_of

ROUNDS: Final = 7
ROUND_S: Final = 0.05
KINDS: Final = (Kind.ORDER, Kind.GENERIC, Kind.FLOATS)

_TEXT: Final = {"type": "string", "minLength": 1, "maxLength": 80}
_COUNT: Final = {"type": "integer", "minimum": 0}
_AMOUNT: Final = {"type": "number", "minimum": 0}
# The data of a `shipment.prepared` event (bench.events), as a user would describe it.
SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["shipment", "customer", "lines", "totals"],
    "properties": {
        "shipment": {
            "type": "object",
            "required": ["id", "carrier", "created_at"],
            "properties": {
                "id": {"type": "string", "pattern": "^shp-[0-9]{10}$"},
                "carrier": _TEXT,
                "created_at": _COUNT,
                "priority": {"enum": [0, 1, 2]},
                "insured": {"type": "boolean"},
            },
        },
        "customer": {
            "type": "object",
            "required": ["id", "name", "address"],
            "properties": {
                "id": {"type": "string", "pattern": "^cus-[0-9]{6}$"},
                "name": _TEXT,
                "address": {
                    "type": "object",
                    "required": ["street", "city", "country"],
                    "properties": {"country": {"type": "string", "pattern": "^[A-Z]{2}$"}},
                    "additionalProperties": _TEXT,
                },
                "loyalty": {"type": "object", "additionalProperties": _COUNT},
            },
        },
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "required": ["sku", "qty", "unit_price"],
                "properties": {
                    "sku": {"type": "string", "pattern": "^sku-[0-9]+$"},
                    "title": _TEXT,
                    "qty": {"type": "integer", "minimum": 1},
                    "unit_price": _AMOUNT,
                    "weight": _AMOUNT,
                    "tags": {"type": "array", "items": _TEXT, "uniqueItems": True},
                },
            },
        },
        "totals": {
            "type": "object",
            "required": ["items", "amount", "currency"],
            "properties": {
                "items": _COUNT,
                "amount": _AMOUNT,
                "tax_rate": _AMOUNT,
                "currency": {"enum": ["EUR", "USD", "GBP", "PLN", "NOK"]},
            },
        },
        "note": {"type": "string", "maxLength": 1024},
    },
}


def per_call_us(call: Callable[[], object]) -> float:
    """The median over ROUNDS rounds of one call's mean time in a round (microseconds)."""
    started = time.perf_counter()
    call()  # warm, and time one call to size the rounds
    number = max(1, int(ROUND_S / max(time.perf_counter() - started, 1e-7)))
    means = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(number):
            call()
        means.append((time.perf_counter() - started) / number * 1e6)
    return statistics.median(means)


def by_kind(call: Callable[[Any], object], args: dict[Kind, Any]) -> dict[str, float]:
    """per_call_us of `call` on each kind's argument."""
    return {kind.value: per_call_us(functools.partial(call, arg)) for kind, arg in args.items()}


async def event_costs(ctx: Context) -> Figures:
    """The per-event costs (module docstring) of each kind."""
    events = {kind: stored(kind, 7) for kind in KINDS}
    parsed = {kind: dict(event) for kind, (event, _) in events.items()}
    texts = {kind: text for kind, (_, text) in events.items()}
    figures: Figures = {
        "data_bytes": DATA_BYTES,
        "event_bytes": {kind.value: len(text.encode()) for kind, text in texts.items()},
        "order_intake_us": per_call_us(lambda: checked_order(dict(order(7)))),
        "checked_event_us": by_kind(checked_event, parsed),
        "checked_parsed_us": by_kind(
            functools.partial(checked_event, parsed=True),
            {kind: loads_strict(text.encode()) for kind, text in texts.items()},
        ),
        "checked_parsed_dated_us": per_call_us(
            functools.partial(checked_event, _dated(parsed[Kind.GENERIC]), parsed=True)
        ),
        "canonical_parts_us": by_kind(canonical_parts, parsed),
        "json_loads_us": by_kind(json.loads, texts),
        "stored_read_us": by_kind(orjson.loads, texts),
        "envelope_read_us": by_kind(envelope_of, texts),
        "loads_strict_us": by_kind(loads_strict, {k: t.encode() for k, t in texts.items()}),
        "rounds": ROUNDS,
        "measured": "median over rounds of one call's mean time in a round, in this process",
    }
    return {**figures, **_schema_costs(ctx.workdir, {k: parsed[k]["data"] for k in KINDS[1:]})}


def _dated(event: dict[str, Any]) -> object:
    """The event with its data's time as RFC 3339 text and a version beside it, as
    the strict parser reads it from a body."""
    data = event["data"]
    shipment = {**data["shipment"], "created_at": "2026-12-06T04:00:00.250Z"}
    dated = {**event, "data": {**data, "shipment": shipment, "schema_version": "1.4.2"}}
    return loads_strict(json.dumps(dated).encode())


def _schema_costs(workdir: Path, data: dict[Kind, Any]) -> Figures:
    """Schemas.check of each generic kind's data, or why it could not be timed."""
    try:
        from shared.schemas import Schemas

        folder = workdir / "schemas"
        folder.mkdir(exist_ok=True)
        text = json.dumps(SCHEMA, separators=(",", ":"))
        (folder / f"{GENERIC_TYPE}.json").write_text(text)
        schemas = Schemas.load(folder, strict=True)
        for value in data.values():
            schemas.check(GENERIC_TYPE, value)  # valid, or the schema is wrong
    except Exception as exc:  # the schemas are another change's work: report, go on
        return {"schema_check_us": None, "schema_unavailable": f"{type(exc).__name__}: {exc}"}
    return {
        "schema_bytes": len(text.encode()),
        "schema_check_us": by_kind(lambda value: schemas.check(GENERIC_TYPE, value), data),
    }
