"""What the inbox backends share: the count of write requests in progress
(plumbing.group_commit.Arrivals), a call waiting for a shared commit (the group commit
itself is plumbing.group_commit), and the handlers' statements of a batch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from plumbing.group_commit import Arrivals as Arrivals  # re-exported: the backends use it
from plumbing.storage import StorageError
from shared import Lease
from sink.handlers import ADD_TO_INVENTORY, Handlers, NotApplied, summed_stock
from sink.store import Incoming

Effect: TypeAlias = tuple[str, Mapping[str, Any]]  # one statement of a handler's effect


class Call(NamedTuple):
    """One receive_batch call waiting for a group commit."""

    items: list[Incoming]
    after: str | None  # the predecessor: the event the sender delivered before these
    lease: Lease | None = None  # the sender's line and epoch, checked before anything


def effects_of(
    handlers: Handlers, items: Sequence[Incoming]
) -> tuple[list[list[Effect]], NotApplied | None]:
    """The handlers' statements for each event, in order, up to the first event its
    handler does not take (whose NotApplied is returned with them): what the first
    len(list) events do, and why the next one stops the batch."""
    effects: list[list[Effect]] = []
    for item in items:
        try:
            effects.append(handlers.effects(item.event, item.canonical))
        except NotApplied as exc:
            return effects, exc
    return effects, None


def runs(effects: Iterable[list[Effect]]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The events' statements in order, each run of one SQL text over consecutive
    statements given as that text and its parameter sets (one executemany each: a
    handler that writes one row per event makes one run of a whole batch). For
    events that go in together only: a run of the built-in warehouse's upsert is
    summed per SKU (summed_stock), one upsert per SKU, not per event."""
    out: list[tuple[str, list[Mapping[str, Any]]]] = []
    for statements in effects:
        for text, params in statements:
            if out and out[-1][0] == text:
                out[-1][1].append(params)
            else:
                out.append((text, [params]))
    return [
        (text, summed_stock(params) if text == ADD_TO_INVENTORY and len(params) > 1 else params)
        for text, params in out
    ]


def schema_to_run(handlers: Handlers, done: int) -> list[tuple[int, str]]:
    """The registry's schema statements a database that has run `done` of them must
    run still, numbered from 1; StorageError if it ran more than the registry names
    (statements are only ever added)."""
    statements = handlers.schema_statements
    if done > len(statements):
        raise StorageError(
            f"{done} schema statements of the handlers {handlers.name!r} ran in this"
            f" database, but the registry names {len(statements)}: statements are only"
            " ever added"
        )
    return list(enumerate(statements[done:], done + 1))


def schema_failed(handlers: Handlers, number: int, why: str) -> StorageError:
    """The error of a registry's schema statement the database refused."""
    return StorageError(
        f"schema statement {number} of the handlers {handlers.name!r} failed: {why}"
    )


def schema_side(handlers: Handlers) -> str:
    """The versions table's row of a registry's schema, apart from the inbox's own."""
    return f"handlers:{handlers.name}"
