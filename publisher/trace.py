"""The evidence trace: how far one event got, stage by stage, and nothing guessed.

Each stage is proven (the evidence is committed in a database, or in the sink's
reply), not proven (the place where the evidence would be was read and it is not
there) or unknown (that place could not be read).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from plumbing.cli import escaped, utc_text
from publisher.errors import DeliveryError
from publisher.http import HttpSender
from publisher.lines_view import LinesView, describe_lease, lines_view
from publisher.store import Entry, LineLease, Order, Outbox, QuarantineRecord, Snapshot, State
from shared import GLOBAL_LINE, payload_digest
from shared.event import data_preview


class Proof(StrEnum):
    PROVEN = "proven"
    NOT_PROVEN = "not proven"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Stage:
    name: str
    proof: Proof
    evidence: str


@dataclass(frozen=True)
class Trace:
    event_id: str
    stages: list[Stage]
    attempts: int | None
    last_error: str | None
    quarantines: list[QuarantineRecord]
    waiting_behind: list[str] = field(default_factory=list)
    lines: list[LineLease] = field(default_factory=list)  # its lane's and the global line's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SinkView:
    """What the sink said about the event: its inbox record, None, or why it is unknown."""

    record: dict[str, Any] | None = None
    unknown: str | None = None


PRUNED = "outbox row pruned (prune removes sent entries only)"
SINK_EXCERPT_CHARS: Final = 40  # of a value in the sink's reply that cannot be shown as meant


def when(timestamp: float | None) -> str:
    """A time as every view shows one: ISO 8601 in UTC, to the millisecond, with Z
    (as the console's and the CloudEvents times read); "-" for none."""
    return "-" if timestamp is None else utc_text(timestamp)


def sink_time(value: object) -> str:
    """A time from the sink's reply, as `when` shows one: Unix seconds (a number) or
    ISO 8601 text with its offset. Anything else (a time no calendar holds, text
    that is no time) is shown as "unreadable" with an excerpt, never raised: a
    sink's reply is text from outside."""
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return when(value)
        if isinstance(value, str):
            moment = datetime.fromisoformat(value)
            if moment.tzinfo is not None:
                return when(moment.timestamp())
    except (ValueError, OverflowError, OSError):
        pass
    return _unreadable(value)


def _unreadable(value: object) -> str:
    """A value of the sink's reply that cannot be shown as meant: an excerpt, escaped."""
    try:
        text = json.dumps(value, default=str)
    except ValueError:  # an integer of more digits than Python will convert
        text = type(value).__name__
    return f"unreadable ({escaped(text[:SINK_EXCERPT_CHARS])})"


def build_trace(
    event_id: str,
    order: Order | None,
    entry: Entry | None,
    quarantines: list[QuarantineRecord],
    sink: SinkView,
    snapshot: Snapshot | None = None,
    leases: LinesView | None = None,
    pruned: bool = False,
) -> Trace:
    """The five stages of SPEC's evidence table for one event. Pure.

    With a `snapshot`, a pending entry also says which failing heads it waits behind:
    the global head (global order) and the head of its own lane (ordering by key).
    With `leases`, the trace names who holds the event's lines: its lane and the
    global line, those that were ever leased. `pruned`: the outbox keeps the ID of
    an entry it pruned; an order's row says so as well.
    """
    gone = entry is None and (pruned or order is not None)  # pruned, once sent
    stages = [
        _accepted(order, entry, gone),
        _queued(entry, gone),
        _received(entry, sink),
        _acknowledged(entry, gone),
        _marked(entry, gone),
    ]
    attempts = None if entry is None else entry.attempts
    error = None if entry is None else entry.last_error
    waiting = [] if snapshot is None or entry is None else _waiting_behind(entry, snapshot)
    lines = [] if leases is None else _lines_of(order, entry, leases)
    return Trace(event_id, stages, attempts, error, quarantines, waiting, lines)


def _lines_of(order: Order | None, entry: Entry | None, leases: LinesView) -> list[LineLease]:
    # The entry's lane as the outbox stored it; once the entry is pruned, its order's
    # SKU (the lane an order's event had).
    lane = entry.lane if entry is not None else None if order is None else order.sku
    names = [GLOBAL_LINE] if lane is None else [lane, GLOBAL_LINE]
    return [lease for name in names if (lease := leases.of(name)) is not None]


def _waiting_behind(entry: Entry, snapshot: Snapshot) -> list[str]:
    if entry.state is not State.PENDING:
        return []
    lines = []
    head = snapshot.head
    if head is not None and head.blocked and head.id != entry.id:
        lines.append(
            f"global order: behind head {head.id}, blocked since {when(head.blocked_since)}"
        )
    for lane in snapshot.blocked_lanes:
        if lane.lane == entry.lane and lane.id != entry.id:
            lines.append(
                f"order by key: behind lane {lane.lane} head {lane.id}, "
                f"blocked since {when(lane.blocked_since)}"
            )
    return lines


def _accepted(order: Order | None, entry: Entry | None, gone: bool) -> Stage:
    """An order is accepted with its order row; any other event with its entry (the
    same transaction records both), or once pruned with the ID the outbox keeps."""
    if order is not None:
        detail = f"order row {order.sku} x{order.qty}, {when(order.accepted_at)}"
        return Stage("accepted", Proof.PROVEN, detail)
    if gone:
        return Stage("accepted", Proof.PROVEN, "the outbox keeps its ID and digest; " + PRUNED)
    if entry is None:
        return Stage("accepted", Proof.NOT_PROVEN, "no order row and no outbox row")
    event = entry.event
    key = event.get("key")
    detail = f"event {event['type']}" + ("" if key is None else f" key {key}")
    detail += f" data {data_preview(event['data'], 60)}, {when(entry.queued_at)}"
    return Stage("accepted", Proof.PROVEN, detail)


def _queued(entry: Entry | None, gone: bool) -> Stage:
    if entry is not None:
        return Stage("queued", Proof.PROVEN, f"outbox seq {entry.seq}, {when(entry.queued_at)}")
    if gone:
        return Stage("queued", Proof.UNKNOWN, PRUNED)
    return Stage("queued", Proof.NOT_PROVEN, "no outbox row")


def _received(entry: Entry | None, sink: SinkView) -> Stage:
    if sink.unknown is not None:
        return Stage("received", Proof.UNKNOWN, sink.unknown)
    record = sink.record
    if record is None:
        return Stage("received", Proof.NOT_PROVEN, "the sink's inbox has no row for this ID")
    seen = f"in the sink's inbox since {sink_time(record.get('received_at'))}"
    seen += f", deliveries seen: {_sink_count(record.get('deliveries'))}"
    if entry is not None and record.get("sha256") != payload_digest(entry.event):
        detail = f"the sink holds another payload for this ID ({seen})"
        return Stage("received", Proof.NOT_PROVEN, detail)
    return Stage("received", Proof.PROVEN, seen)


def _sink_count(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _unreadable(value)


def _acknowledged(entry: Entry | None, gone: bool) -> Stage:
    if entry is None:
        return Stage(
            "acknowledged",
            Proof.UNKNOWN if gone else Proof.NOT_PROVEN,
            PRUNED if gone else "no outbox row",
        )
    if entry.ack is None:
        return Stage(
            "acknowledged",
            Proof.NOT_PROVEN,
            "no verified ACK stored (one that arrived just before a crash leaves none)",
        )
    ack = json.dumps(entry.ack, sort_keys=True)
    return Stage("acknowledged", Proof.PROVEN, f"ACK {ack} stored with the mark")


def _marked(entry: Entry | None, gone: bool) -> Stage:
    if entry is None:
        return Stage(
            "marked",
            Proof.UNKNOWN if gone else Proof.NOT_PROVEN,
            PRUNED if gone else "no outbox row",
        )
    if entry.state is State.SENT:
        return Stage("marked", Proof.PROVEN, f"sent at {when(entry.sent_at)}")
    return Stage("marked", Proof.NOT_PROVEN, f"entry is {entry.state}")


async def collect_trace(outbox: Outbox, event_id: str, sender: HttpSender | None) -> Trace:
    """Read the outbox and, when a sender is given, ask the sink; then build the trace."""
    order, entry = await outbox.order(event_id), await outbox.entry(event_id)
    pruned = entry is None and await outbox.pruned(event_id)
    quarantines = await outbox.quarantines(event_id)
    if sender is None:
        sink = SinkView(unknown="the sink was not asked (no --sink)")
    else:
        try:
            sink = SinkView(record=await sender.lookup(event_id))
        except DeliveryError as exc:
            sink = SinkView(unknown=f"the sink could not be asked: {exc}")
    snapshot, leases = await outbox.snapshot(), await lines_view(outbox)
    return build_trace(event_id, order, entry, quarantines, sink, snapshot, leases, pruned)


def render_trace(trace: Trace) -> str:
    """The trace as a table for a person, each line escaped (`escaped`): the sink's
    reply, an error, a reason or a name kept in a record is text from outside."""
    lines = [f"evidence for {trace.event_id}", f"  {'stage':<16} {'proof':<11} evidence"]
    for number, stage in enumerate(trace.stages, start=1):
        lines.append(f"  {number} {stage.name:<14} {stage.proof.value:<11} {stage.evidence}")
        if stage.name == "queued" and trace.attempts is not None:
            error = f", last error: {trace.last_error}" if trace.last_error else ""
            lines.append(f"    {'attempts':<14} {'':<11} {trace.attempts}{error}")
    for line in trace.waiting_behind:
        lines.append(f"  waiting: {line}")
    for lease in trace.lines:
        lines.append(f"  line {lease.line!r}: {describe_lease(lease)}")
    for q in trace.quarantines:
        line = f"  quarantined {when(q.quarantined_at)} by {q.quarantined_by}: {q.reason}"
        if q.released_at is not None:
            line += f"; {q.released_as} {when(q.released_at)} by {q.released_by}"
            line += f"; {q.delivered_past_count} delivered past it"
            if q.delivered_past:
                line += f" ({', '.join(q.delivered_past)})"
        lines.append(line)
    return "\n".join(escaped(line) for line in lines)
