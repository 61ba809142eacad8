"""What the inbox backends share: the count of write requests in progress
(plumbing.group_commit.Arrivals), a call waiting for a shared commit (the group commit
itself is plumbing.group_commit), and the handlers' statements of a batch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from plumbing.group_commit import Arrivals as Arrivals  # re-exported: the backends use it
from shared import Lease
from sink.handlers import Handlers, NotApplied
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
    handler that writes one row per event makes one run of a whole batch)."""
    out: list[tuple[str, list[Mapping[str, Any]]]] = []
    for statements in effects:
        for text, params in statements:
            if out and out[-1][0] == text:
                out[-1][1].append(params)
            else:
                out.append((text, [params]))
    return out
