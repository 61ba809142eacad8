"""Rows as both outbox backends store them, turned into the interface's records,
and how both judge an order whose ID they already hold.

Both keep the same columns in the same order (ENTRY_COLUMNS, QUARANTINES_OF in each
backend's SQL), the payload, ACK and delivered-past lists as JSON text, and 0/1 flags.
"""

from __future__ import annotations

import json
from typing import Any

from publisher.errors import LeaseLost
from publisher.store import (
    Entry,
    Intake,
    LineLease,
    Pending,
    Publication,
    QuarantineRecord,
    RelayWorker,
    State,
)
from shared import Conflict, Lease, digest_of


def pending_of(row: tuple[Any, ...]) -> Pending:
    """A pending read's row (the backend's PENDING columns: seq, payload, attempts,
    lane, queued_at) as a Pending."""
    seq, payload, attempts, lane, queued_at = row
    return Pending.stored(seq, payload, attempts, lane, queued_at)


def entry_of(row: tuple[Any, ...]) -> Entry:
    """An outbox row (the backend's ENTRY_COLUMNS) as an Entry."""
    seq, lane, payload, queued_at, sent, sent_at, ack, attempts, error, last_at, first_fail, q = row
    state = State.SENT if sent else State.QUARANTINED if q else State.PENDING
    return Entry(
        seq=seq,
        event=json.loads(payload),
        lane=lane,
        state=state,
        queued_at=queued_at,
        sent_at=sent_at,
        ack=None if ack is None else json.loads(ack),
        attempts=attempts,
        last_error=error,
        last_attempt_at=last_at,
        first_failure_at=first_fail,
    )


def judged_again(item: Publication, stored: str | None, digest: str | None = None) -> Intake:
    """The outcome of an event whose ID the outbox already holds: "duplicate" if it
    is the same canonical event; else Conflict (also when nothing is known). What is
    known is the canonical form its entry stores (`stored`) or, once that entry was
    pruned, the digest kept of it (`digest`)."""
    if stored is not None:
        same = stored == item.canonical
    else:
        same = digest is not None and digest == digest_of(item.canonical)
    if not same:
        raise Conflict(item.event["id"])
    return "duplicate"


def quarantine_record_of(row: tuple[Any, ...]) -> QuarantineRecord:
    """A quarantines row (the backend's QUARANTINES_OF columns) as a QuarantineRecord."""
    reason, by, at, released_by, released_at, released_as, count, past = row
    return QuarantineRecord(
        reason=reason,
        quarantined_by=by,
        quarantined_at=at,
        released_by=released_by,
        released_at=released_at,
        released_as=released_as,
        delivered_past_count=count,
        delivered_past=[] if past is None else json.loads(past),
    )


def line_lease_of(row: tuple[Any, ...]) -> LineLease:
    """A line_leases row (the backend's LEASE_COLUMNS) as a LineLease."""
    line, owner, epoch, expires_at, expires_in_s, taken_at, renewed_at = row
    return LineLease(
        line=line,
        owner=owner,
        epoch=int(epoch),
        expires_at=float(expires_at),
        expires_in_s=float(expires_in_s),
        taken_at=taken_at,
        renewed_at=renewed_at,
    )


def relay_worker_of(row: tuple[Any, ...]) -> RelayWorker:
    """A relay_workers row (the backend's WORKERS columns) as a RelayWorker."""
    worker, started_at, seen_at, seen_ago_s, live = row
    return RelayWorker(worker, float(started_at), float(seen_at), float(seen_ago_s), bool(live))


def fence_error(lease: Lease, source: str, epoch_now: int | None) -> LeaseLost | None:
    """Why a write under `lease` must be refused, given the epoch its line's lease
    row has now (None: no row); None if it may be made."""
    if lease.source != source:
        return LeaseLost(lease.line, lease.epoch, f"the lease names outbox {lease.source!r}")
    if epoch_now is None:
        return LeaseLost(lease.line, lease.epoch, "the line was never leased")
    if epoch_now != lease.epoch:
        return LeaseLost(lease.line, lease.epoch, f"the line is now at epoch {epoch_now}")
    return None
