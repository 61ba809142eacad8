"""The operators' commands: `status`, `list`, `quarantine`, `redrive`, `trace` and
`prune`, and how their answers read."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Final

from plumbing.cli import EXIT_OK, ArgumentParser, add_option, duration_with_unit_s, fail, int_in
from plumbing.net import load_token
from plumbing.storage import redacted
from publisher.cli.options import (
    PROG,
    AddCommand,
    Check,
    Command,
    add_token_option,
    event_id,
    lease_ttl,
    log_egress,
    operator,
    operator_name,
    reason,
    say,
)
from publisher.http import HttpSender
from publisher.lines_view import LinesView, describe_lease, describe_worker, lines_view
from publisher.notes import MAX_REASON_CHARS, OPERATOR_RULE
from publisher.settings import DEFAULT_LEASE_TTL_S
from publisher.store import MAX_PAGE, Entry, Outbox, QuarantineRecord, State
from publisher.trace import collect_trace, render_trace, when
from shared import GLOBAL_LINE, InvalidEvent
from shared.event import data_preview, validate_key, validate_type


def add_parsers(command: AddCommand) -> None:
    status = command("status", "backlog figures: pending, oldest age, quarantined, head")
    add_option(status, "--json", action="store_true", help="one JSON object")
    add_option(
        status,
        "--lease-ttl",
        type=lease_ttl,
        default=DEFAULT_LEASE_TTL_S,
        help="the workers' --lease-ttl: a worker not seen for this long is shown as gone",
    )

    listing = command("list", "entries in one state")
    add_option(
        listing,
        "--state",
        choices=[s.value for s in State],
        default="pending",
        help="which entries",
    )
    add_option(
        listing,
        "--limit",
        type=int_in(1, MAX_PAGE),
        default=100,
        help=f"at most this many, 1 to {MAX_PAGE}",
    )
    add_option(listing, "--type", type=event_type, help="only events of this type")
    add_option(
        listing, "--key", type=event_key, help="only events of this key (*: those without one)"
    )
    add_option(listing, "--json", action="store_true", help="one JSON object per line")

    quarantine = command("quarantine", "take a pending entry out of the line")
    quarantine.add_argument("id", type=event_id, help="event ID")
    add_option(
        quarantine,
        "--reason",
        required=True,
        type=reason,
        help=f"why (kept with the record): 1 to {MAX_REASON_CHARS} characters,"
        " no control character",
    )
    add_by_option(quarantine)

    redrive = command("redrive", "put a quarantined entry back at its own position")
    redrive.add_argument("id", type=event_id, help="event ID")
    add_by_option(redrive)

    trace = command("trace", "how far one event got: the five stages of evidence")
    trace.add_argument("id", type=event_id, help="event ID")
    add_option(trace, "--sink", help="sink URL, to read its inbox record")
    add_option(trace, "--allow-host", action="append", default=[], help="also allow this sink host")
    add_token_option(trace)
    add_option(trace, "--json", action="store_true", help="one JSON object")

    prune = command("prune", "delete sent entries older than a duration")
    add_option(
        prune,
        "--older-than",
        type=duration_with_unit_s,
        required=True,
        help="ASCII digits and a unit (s, m, h, d): 90s, 30m, 12h, 7d",
    )


def add_by_option(parser: ArgumentParser) -> None:
    add_option(
        parser,
        "--by",
        type=operator_name,
        default=operator(),
        help=f"who (kept with the record): {OPERATOR_RULE}",
    )


async def cmd_status(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db, create=False) as outbox:
        snapshot = await outbox.snapshot()
        lines = await lines_view(outbox, args.lease_ttl)
    if args.json:
        print(json.dumps({**snapshot.to_dict(), **lines.to_dict()}))  # JSON escapes
        return EXIT_OK
    say(f"pending      {snapshot.pending}")
    say(f"oldest age   {snapshot.oldest_pending_age_s:.1f} s")
    say(f"quarantined  {snapshot.quarantined}")
    head = snapshot.head
    if head is None:
        say("head         none")
    elif head.blocked:
        say(
            f"head         {head.id} (seq {head.seq}) BLOCKED since {when(head.blocked_since)}, "
            f"{head.attempts} attempts, last error: {head.last_error}"
        )
    else:
        say(f"head         {head.id} (seq {head.seq}), {head.attempts} attempts")
    for lane in snapshot.blocked_lanes:
        say(
            f"lane {lane.lane!r:<10} head {lane.id} BLOCKED since {when(lane.blocked_since)}, "
            f"{lane.attempts} attempts, last error: {lane.last_error}"
        )
    _print_lines(lines, args.lease_ttl)
    return EXIT_OK


def _print_lines(lines: LinesView, ttl_s: float) -> None:
    """The workers and the lines they hold; lines released or expired without an
    owner are counted, not listed (there is one per key ever delivered)."""
    workers = ", ".join(lines.workers) or "none"
    say(f"workers      {len(lines.workers)} holding leases: {workers}")
    for worker in lines.relay_workers:
        described = describe_worker(worker, lines.lines_of(worker.worker), ttl_s)
        say(f"worker {worker.worker!r:<8} {described}")
    shown = [lease for lease in lines.leases if lease.owner is not None]
    for lease in shown:
        say(f"line {lease.line!r:<10} {describe_lease(lease)}")
    if len(shown) < len(lines.leases):
        say(f"lines free   {len(lines.leases) - len(shown)} (released, any worker may take them)")


def event_type(text: str) -> str:
    """argparse type for --type: a well-formed event type."""
    return _field(validate_type, text)


def event_key(text: str) -> str:
    """argparse type for --key: a well-formed ordering key, or "*" (events without one)."""
    return text if text == GLOBAL_LINE else _field(validate_key, text)


def _field(validate: Callable[[object], str], text: str) -> str:
    try:
        return validate(text)
    except InvalidEvent as exc:
        raise argparse.ArgumentTypeError(exc.problem) from exc


async def cmd_list(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db, create=False) as outbox:
        entries = await outbox.entries(State(args.state), args.limit, key=args.key, type=args.type)
        history = await outbox.quarantine_history([e.id for e in entries])
        lines = await lines_view(outbox)
    for entry in entries:
        records = history.get(entry.id, [])
        if args.json:
            print(json.dumps(_entry_json(entry, records, lines)))
        else:
            say(_entry_line(entry, records, lines))
    if not entries and not args.json:
        say(_none_found(args))
    return EXIT_OK


def _none_found(args: argparse.Namespace) -> str:
    """The line `list` prints when nothing matches, naming what was asked for."""
    which = [f"{name} {value}" for name, value in (("type", args.type), ("key", args.key)) if value]
    return f"no {args.state} entries" + (f" of {' and '.join(which)}" if which else "")


def _delivered_by(entry: Entry, lines: LinesView) -> dict[str, object] | None:
    """The lease a pending entry is being delivered under: its lane's, or the global
    line's, whichever a worker holds (None: no worker holds either now)."""
    if entry.state is not State.PENDING:
        return None
    for line in (entry.lane or GLOBAL_LINE, GLOBAL_LINE):
        lease = lines.of(line)
        if lease is not None and lease.held:
            return lease.to_dict()
    return None


def _entry_json(
    entry: Entry, records: list[QuarantineRecord], lines: LinesView
) -> dict[str, object]:
    return {
        **entry.to_dict(),
        "quarantines": [vars(r) for r in records],
        "lease": _delivered_by(entry, lines),
    }


def _entry_line(entry: Entry, records: list[QuarantineRecord], lines: LinesView) -> str:
    line = (
        f"{entry.seq:>8} {entry.id} {entry.event['type']} key={entry.event.get('key', '*')} "
        f"{data_preview(entry.event['data'], 60)} {entry.state} attempts={entry.attempts}"
    )
    lease = _delivered_by(entry, lines)
    if lease is not None:
        line += f" line={lease['line']} owner={lease['owner']} epoch={lease['epoch']}"
    if entry.last_error and entry.state is not State.SENT:
        line += f" last_error={entry.last_error!r}"
    for record in records:
        line += f" | quarantined by {record.quarantined_by}: {record.reason!r}"
        if record.released_as is not None:
            line += f", {record.released_as} ({record.delivered_past_count} delivered past it"
            line += f": {' '.join(record.delivered_past)})" if record.delivered_past else ")"
    return line


async def cmd_quarantine(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db, create=False) as outbox:
        await outbox.quarantine(args.id, args.reason, args.by)
    say(f"quarantined {args.id}")
    return EXIT_OK


async def cmd_redrive(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db, create=False) as outbox:
        record = await outbox.redrive(args.id, args.by)
    passed = f": {' '.join(record.delivered_past)}" if record.delivered_past else ""
    say(f"redriven {args.id}; {record.delivered_past_count} delivered past it{passed}")
    return EXIT_OK


async def cmd_trace(args: argparse.Namespace) -> int:
    sender = None
    if args.sink is not None:
        token = load_token(args.token_file)
        sender = HttpSender(args.sink, allowed_hosts=args.allow_host, token=token)
        log_egress(args.sink, args.allow_host)
    async with Outbox.open(args.db, create=False) as outbox:
        if sender is None:
            trace = await collect_trace(outbox, args.id, None)
        else:
            async with sender:
                trace = await collect_trace(outbox, args.id, sender)
    if args.json:
        print(json.dumps(trace.to_dict()))
    else:
        print(render_trace(trace))  # escaped line by line
    if trace.stages[0].proof.value != "proven":
        return fail(PROG, f"no event with ID {args.id!r} in {redacted(args.db)}")
    return EXIT_OK


async def cmd_prune(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db, create=False) as outbox:
        deleted = await outbox.prune(args.older_than)
    say(f"pruned {deleted} sent entries")
    return EXIT_OK


COMMANDS: Final[dict[str, Command]] = {
    "status": cmd_status,
    "list": cmd_list,
    "quarantine": cmd_quarantine,
    "redrive": cmd_redrive,
    "trace": cmd_trace,
    "prune": cmd_prune,
}
CHECKS: Final[dict[str, Check]] = {}
