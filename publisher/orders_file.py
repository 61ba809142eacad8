"""`publisher accept --file`: orders and events from a JSON Lines file, fed to the
outbox in batches.

One order `{id, sku, qty}` or event `{id, type, key, data}` (a JSON object) per line;
blank lines are skipped. Up to MAX_ACCEPT lines go to `Outbox.record_many` at a time,
one transaction each. A line that fails (not JSON, longer than an event may be, not
a valid order or event, a conflict) fails alone and
changes nothing; it is reported as `NAME:LINE: what` and the other lines of its batch
are recorded. A batch the database cannot take is not written at all: it is reported
with its line range, and nothing after it is read.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from plumbing.bodies import parse_json
from plumbing.http_errors import BadRequest
from plumbing.storage import StorageError
from publisher.store import (
    MAX_ACCEPT,
    EventCheck,
    IntakeOutcome,
    Outbox,
    Publication,
    checked,
    checked_order,
)
from shared import MAX_BODY_BYTES, Conflict, InvalidEvent, checked_event

SKIP_CHUNK_BYTES: Final = 64 * 1024  # how much of an overlong line is read at a time


class TooLong(Exception):
    """The line is longer than an event may be (MAX_BODY_BYTES)."""


@dataclass
class Tally:
    """What became of the lines fed so far."""

    accepted: int = 0
    duplicate: int = 0
    failed: int = 0
    stopped: bool = False  # a batch the database could not take: nothing after it read

    def summary(self) -> str:
        return f"accepted {self.accepted}, duplicate {self.duplicate}, failed {self.failed}"


Line = tuple[int, bytes | TooLong]  # its number (from 1) and its text


def numbered_lines(stream: BinaryIO, most_bytes: int = MAX_BODY_BYTES) -> Iterator[Line]:
    """The non-blank lines of `stream` with their numbers; a line over `most_bytes`
    (line break left out) is read past in chunks and given as TooLong."""
    for number in itertools.count(1):
        raw = stream.readline(most_bytes + 2)  # room for CR LF: one byte more is too long
        if not raw:
            return
        if len(raw.rstrip(b"\r\n")) > most_bytes:
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(SKIP_CHUNK_BYTES)
            yield number, TooLong(f"line is over {most_bytes} bytes")
        elif raw.strip():
            yield number, raw


def parsed(text: bytes | TooLong) -> object:
    """The line's JSON value, or the BadRequest or TooLong that says why it has none
    (no JSON value is an exception, so the two cannot be mistaken)."""
    if isinstance(text, TooLong):
        return text
    try:
        return parse_json(text.rstrip(b"\r\n"), "line")
    except BadRequest as exc:
        return exc


def what_failed(exc: Exception) -> str:
    """One line's failure, as its error message says it."""
    if isinstance(exc, BadRequest):
        cause = exc.__cause__
        if isinstance(cause, json.JSONDecodeError):  # its own "line 1" would mislead
            # Some of its messages end in " at" themselves ("Invalid control character at").
            return f"{exc}: {cause.msg.removesuffix(' at')} at column {cause.colno}"
        detail = exc.body.get("detail")
        return f"{exc}: {detail}" if detail else str(exc)
    if isinstance(exc, InvalidEvent):
        if not exc.field:  # the line's value itself: neither an order nor an event
            return f"not an order or an event: {exc.problem}"
        return f"invalid {'event' if exc.field.startswith('/') else 'order'}: {exc}"
    if isinstance(exc, Conflict):
        return f"conflict: {exc}"
    return str(exc)


async def feed(
    outbox: Outbox,
    lines: Iterator[Line],
    name: str,
    report: Callable[[str], None],
    check: EventCheck = checked_event,
) -> Tally:
    """Record every line's order or event (`is_order` tells them apart; an event is
    validated by `check`), MAX_ACCEPT lines per transaction; `report` gets one
    `NAME:LINE: what` message per failed line, in line order. If the database fails
    a batch, one `NAME:FIRST-LAST: ...` message for its lines, and nothing more is
    read (`stopped`)."""
    tally = Tally()
    while batch := list(itertools.islice(lines, MAX_ACCEPT)):
        try:
            outcomes = await _accept_lines(outbox, batch, check)
        except StorageError as exc:
            first, last = batch[0][0], batch[-1][0]
            where = f"{first}-{last}" if last > first else str(first)
            report(f"{name}:{where}: not written (nor any line after it): {exc}")
            tally.stopped = True
            return tally
        for (number, _), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Exception):
                tally.failed += 1
                report(f"{name}:{number}: {what_failed(outcome)}")
            elif outcome == "accepted":
                tally.accepted += 1
            else:
                tally.duplicate += 1
    return tally


async def _accept_lines(
    outbox: Outbox, batch: list[Line], check: EventCheck
) -> list[IntakeOutcome | BadRequest | TooLong]:
    """Each line's outcome, the lines that hold JSON recorded in one transaction."""
    values = [parsed(text) for _, text in batch]
    items: list[Publication | InvalidEvent] = [
        checked_order(value) if is_order(value) else checked(value, check)
        for value in values
        if not isinstance(value, BadRequest | TooLong)
    ]
    recorded = iter(await outbox.record_many(items) if items else [])
    return [v if isinstance(v, BadRequest | TooLong) else next(recorded) for v in values]


def is_order(value: object) -> bool:
    """Whether a line holds an order of the example's intake (`{id, sku, qty}`, no
    `type`) rather than an event."""
    return isinstance(value, dict) and "type" not in value and ("sku" in value or "qty" in value)
