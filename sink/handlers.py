"""What a consumer's events do: handlers that return their effects as SQL statements.

A handler is a plain function of one event (`HandledEvent`: id, type, key, data)
that returns the statements its effect takes, as data: `(sql, params)` pairs with
named parameters (`:name`), or bare SQL. The inbox runs them in its own transaction,
right after it records the event, so the effect and the record commit together or
not at all; a duplicate's or a conflict's statements never run (a handler may be
called for one, on PostgreSQL, before the inbox knows it). Statements rather than
a callback given the connection: SQLite transactions run as one call on the database
thread while PostgreSQL's are async, so a callback would need a sync and an async
twin; statements run the same on both, and a handler can be tested without any
database.

A handler may refuse an event with `Reject(reason)` (answered 422, nothing
recorded); any other exception, or a statement the database refuses, is a failure of
the handler (answered 503, nothing recorded, and sent again by the relay until a
fixed handler takes it).

`Handlers.schema()` names statements that create what the handlers write to. They
run when the inbox opens its database, each once, in the order given, versioned
apart from the inbox's own tables: add a statement to change the schema, never edit
one that has run.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import orjson

from shared.event import MAX_DATA_BYTES_LIMIT, TYPE_MAX_CHARS, Event, checked_event, placed_order

# One statement of an effect: SQL with named parameters (`:name`) and their values,
# or SQL alone.
Statement: TypeAlias = "tuple[str, Mapping[str, Any]] | str"
Handler: TypeAlias = "Callable[[HandledEvent], Iterable[Statement] | None]"

_TYPE_RE: Final = re.compile(rf"[A-Za-z0-9._-]{{1,{TYPE_MAX_CHARS}}}")
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
WAREHOUSE_NAME: Final = "warehouse"


class Reject(Exception):
    """Raised by a handler that refuses its event: the sink answers 422 with
    `reason` and records nothing (the relay treats it as a permanent failure)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotApplied(Exception):
    """An event the inbox did not record because of its handler: `status` is what
    the sink answers (422: refused, 503: failed), `error` the word for why."""

    status = 422
    error = ""

    def __init__(self, event_id: str, event_type: str, detail: str) -> None:
        super().__init__(f"{event_id} ({event_type}): {detail}")
        self.event_id = event_id
        self.event_type = event_type
        self.detail = detail


class NoHandler(NotApplied):
    """No handler takes this event's type (and the registry has no `otherwise`)."""

    error = "no handler"


class HandlerRejected(NotApplied):
    """The handler raised Reject: `detail` is its reason."""

    error = "rejected"


class HandlerFailed(NotApplied):
    """The handler raised, returned something that is not statements (or one that
    would end the inbox's transaction), or the database refused one of its
    statements (a constraint, a missing table). The original exception is the
    `__cause__`; `detail` names an exception's class only (its message may hold
    anything), and a refused statement's database error."""

    status = 503
    error = "handler failed"


@dataclass(frozen=True, slots=True)
class HandledEvent:
    """The event a handler is given: `data` is parsed from the stored canonical form
    at each read, so it is the handler's own copy."""

    id: str
    type: str
    key: str | None
    canonical: str

    @property
    def data(self) -> dict[str, Any]:
        data = orjson.loads(self.canonical)["data"]
        assert isinstance(data, dict)
        return data

    @classmethod
    def of(cls, event: Event, canonical: str) -> HandledEvent:
        return cls(event["id"], event["type"], event.get("key"), canonical)


class Handlers:
    """A registry of handlers, one per event type, and the schema they write to.

    `@handlers.on("payment.captured")` registers a handler; `@handlers.otherwise`
    one for every type without its own (without it, such an event is answered 422);
    `handlers.schema(sql, ...)` adds statements run once when the inbox opens. `name`
    keeps the schema's version apart from other registries' in one database."""

    def __init__(self, name: str = "handlers") -> None:
        if _NAME_RE.fullmatch(name) is None:
            raise ValueError(f"a registry's name is 1 to 64 of A-Z a-z 0-9 . _ -, not {name!r}")
        self.name = name
        self._handlers: dict[str, Handler] = {}
        self._otherwise: Handler | None = None
        self._schema: list[str] = []

    def on(self, event_type: str) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of `event_type`."""
        if not isinstance(event_type, str) or _TYPE_RE.fullmatch(event_type) is None:
            raise ValueError(f"not an event type: {event_type!r}")
        if event_type in self._handlers:
            raise ValueError(f"{event_type!r} has a handler already")

        def register(handler: Handler) -> Handler:
            if not callable(handler):
                raise TypeError(f"a handler must be callable, not {type(handler).__name__}")
            self._handlers[event_type] = handler
            return handler

        return register

    def otherwise(self, handler: Handler) -> Handler:
        """Register the decorated function for every type that has no handler."""
        if self._otherwise is not None:
            raise ValueError("the registry has an `otherwise` handler already")
        if not callable(handler):
            raise TypeError(f"a handler must be callable, not {type(handler).__name__}")
        self._otherwise = handler
        return handler

    def schema(self, *statements: str) -> None:
        """Add statements (one SQL statement each) that create what the handlers
        write to. Each runs once, in order, when an inbox opens with this registry;
        the number run so far is kept in the database under this registry's name."""
        for statement in statements:
            if not isinstance(statement, str) or not statement.strip():
                raise ValueError("a schema statement must be non-empty SQL text")
            self._schema.append(statement)

    @property
    def schema_statements(self) -> tuple[str, ...]:
        return tuple(self._schema)

    @property
    def types(self) -> frozenset[str]:
        """The types with a handler of their own."""
        return frozenset(self._handlers)

    def handles(self, event_type: str) -> bool:
        """Whether an event of `event_type` would reach a handler."""
        return event_type in self._handlers or self._otherwise is not None

    def statements(self, event: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
        """The statements the inbox would run for `event` (`{id, type, key?, data}`,
        validated as the inbox validates it: InvalidEvent otherwise), or why it would
        not take it (NoHandler, HandlerRejected, HandlerFailed): a registry's test
        needs no database."""
        checked, canonical = checked_event(event, max_data_bytes=MAX_DATA_BYTES_LIMIT)
        return self.effects(checked, canonical)

    def effects(self, event: Event, canonical: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The statements of the event's effect, checked: NoHandler, HandlerRejected
        or HandlerFailed (the handler's exception as its cause) otherwise."""
        handler = self._handlers.get(event["type"], self._otherwise)
        if handler is None:
            raise NoHandler(event["id"], event["type"], f"no handler for type {event['type']}")
        try:
            # Read whole here: a generator's Reject or bug is the handler's too.
            returned = _statements(handler(HandledEvent.of(event, canonical)))
        except Reject as exc:
            raise HandlerRejected(event["id"], event["type"], str(exc.reason)) from exc
        except NotAStatement as exc:
            raise HandlerFailed(event["id"], event["type"], str(exc)) from exc
        except Exception as exc:
            failed = HandlerFailed(event["id"], event["type"], type(exc).__name__)
            raise failed from exc
        return returned


class NotAStatement(TypeError):
    """A handler returned something that is not statements its effect may run."""


# What a statement of an effect may not begin with: it would end or change the
# inbox's transaction (or the session of a pooled connection) under it.
_TRANSACTION_WORDS: Final = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"}
    | {"PREPARE", "RESET", "DISCARD", "VACUUM", "ATTACH", "DETACH", "PRAGMA"}
)
_FIRST_WORDS: Final = re.compile(
    r"(?:\s|--[^\n]*\n?|/\*.*?\*/|\()*([A-Za-z]+)(?:\s+([A-Za-z]+))?", re.S
)


@functools.lru_cache(maxsize=1024)
def _runnable(sql: str) -> str:
    """`sql`, if an effect may run it; NotAStatement naming what it would do else."""
    found = _FIRST_WORDS.match(sql)
    if found is None:
        raise NotAStatement(f"not SQL: {sql[:40]!r}")
    first, second = found.group(1).upper(), (found.group(2) or "").upper()
    if first in _TRANSACTION_WORDS or (first == "SET" and second not in ("LOCAL", "CONSTRAINTS")):
        raise NotAStatement(f"{first} would end or change the inbox's transaction or session")
    return sql


def _statements(returned: object) -> list[tuple[str, Mapping[str, Any]]]:
    """A handler's return value as (sql, params) pairs; TypeError saying what is wrong."""
    if returned is None:
        return []
    if isinstance(returned, (str, bytes)) or not isinstance(returned, Iterable):
        raise NotAStatement("a handler returns a list of (sql, params) pairs or SQL strings")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for statement in returned:
        if isinstance(statement, str):
            out.append((_runnable(statement), {}))
            continue
        if (
            isinstance(statement, Sequence)
            and len(statement) == 2
            and isinstance(statement[0], str)
            and isinstance(statement[1], Mapping)
        ):
            out.append((_runnable(statement[0]), statement[1]))
            continue
        kind = type(statement).__name__
        raise NotAStatement(f"not a statement: {kind} (want (sql, params) or sql)")
    return out


def load(spec: str) -> Handlers:
    """The registry `MODULE:ATTR` names (`outbox-sink --handlers`); ValueError
    saying what is wrong, in one line. A module in the current directory is found
    whether the sink runs as `python -m sink` (which puts that directory first on
    the import path) or as the `outbox-sink` script (which does not)."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"--handlers wants MODULE:ATTR, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error it raises on import
        raise ValueError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    found: object = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"{module_name} has no attribute {attr}") from None
    if not isinstance(found, Handlers):
        raise ValueError(f"{spec} is a {type(found).__name__}, not a sink.Handlers registry")
    return found


# ---------------------------------------------------------------- the warehouse

# The built-in example's effect: an order's quantity added to its SKU's stock.
ADD_TO_INVENTORY: Final = (
    "INSERT INTO inbox_inventory (sku, qty) VALUES (:sku, :qty)"
    " ON CONFLICT (sku) DO UPDATE SET qty = inbox_inventory.qty + excluded.qty"
)


def summed_stock(params: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """ADD_TO_INVENTORY's parameter sets of events that all go in together, as one
    set per SKU with the quantities added up, in SKU order: the same stock in fewer
    upserts, and two transactions lock the SKUs' rows in the same order."""
    totals: dict[str, int] = {}
    for one in params:
        totals[one["sku"]] = totals.get(one["sku"], 0) + one["qty"]
    return [{"sku": sku, "qty": totals[sku]} for sku in sorted(totals)]


def warehouse() -> Handlers:
    """The built-in warehouse: an `order.placed` event whose data is an order adds
    its quantity to its SKU's inventory (the inbox's own `inbox_inventory` table);
    every other event, and an `order.placed` event whose data is not an order, is
    recorded with no effect."""
    handlers = Handlers(WAREHOUSE_NAME)

    @handlers.on("order.placed")
    def placed(event: HandledEvent) -> list[Statement]:
        data = event.data
        order = placed_order({"id": event.id, "type": event.type, "data": data})
        if order is None:
            return []
        return [(ADD_TO_INVENTORY, {"sku": order["sku"], "qty": order["qty"]})]

    @handlers.otherwise
    def recorded(event: HandledEvent) -> list[Statement]:
        return []

    return handlers


WAREHOUSE: Final = warehouse()
__all__ = [
    "WAREHOUSE",
    "HandledEvent",
    "HandlerFailed",
    "HandlerRejected",
    "Handlers",
    "NoHandler",
    "NotApplied",
    "Reject",
    "Statement",
    "load",
    "warehouse",
]
