"""`python -m publisher`: intake, delivery and operations from the command line.

Exit status: 0 done, 1 failed (delivery, conflict, storage), 2 bad input or usage.
Every option also reads an OUTBOX_* environment variable (shown in --help).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from aiohttp import web

from plumbing import event_loop
from plumbing.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    add_option,
    duration_s,
    fail,
    int_in,
    non_empty,
    port,
    positive_int,
    positive_s,
    setup_logging,
    strict_int,
)
from plumbing.http_options import add_http_options, http_guard_of, http_limits_of
from plumbing.net import INTAKE_TOKEN_ENV, TOKEN_ENV, TokenError, is_loopback, load_token
from plumbing.serving import serve_app
from plumbing.storage import BadLocation, StorageError, redacted
from publisher.chaos import exit_after_ack
from publisher.console import ConsoleSettings
from publisher.dispatch import deliver_pending
from publisher.errors import DeliveryError, LeaseLost, OutboxError, TargetNotAllowed
from publisher.http import TIMEOUT_S, HttpSender
from publisher.lines_view import LinesView, describe_lease, describe_worker, lines_view
from publisher.orders_file import feed, numbered_lines
from publisher.retry import RetryPolicy
from publisher.service import ServiceSettings, create_app
from publisher.settings import (
    DEFAULT_DEPTH,
    DEFAULT_LEASE_TTL_S,
    MAX_DEPTH,
    MAX_LANES,
    POLL_INTERVAL_S,
    RelaySettings,
    WorkerSettings,
    check_lease_ttl,
    check_worker_id,
    worker_id_for,
)
from publisher.store import MAX_ACCEPT, Entry, Outbox, QuarantineRecord, State
from publisher.trace import collect_trace, render_trace, when
from shared import GLOBAL_LINE, MAX_BATCH, Conflict, InvalidEvent, validate_event_id

PROG: Final = "publisher"
DEFAULT_PORT: Final = 8000
EXIT_AFTER_ACK: Final = "exit-after-ack"
CONSOLE_TOKEN_ENV: Final = "OUTBOX_CONSOLE_TOKEN"
Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

log = logging.getLogger(__name__)


batch_limit = int_in(1, MAX_BATCH)  # argparse type for --limit
pipeline_depth = int_in(1, MAX_DEPTH)  # argparse type for --pipeline


def chaos_exit(text: str) -> int:
    """argparse type for --chaos: exit-after-ack (the first verified ACK) or
    exit-after-ack=N (the Nth); returns N."""
    name, sep, count = text.partition("=")
    if name == EXIT_AFTER_ACK and not sep:
        return 1
    if name == EXIT_AFTER_ACK and count.isdigit() and count.isascii() and int(count) >= 1:
        return int(count)
    raise argparse.ArgumentTypeError(
        f"expected {EXIT_AFTER_ACK} or {EXIT_AFTER_ACK}=N with N from 1, got {text!r}"
    )


def lease_ttl(text: str) -> float:
    """argparse type for --lease-ttl: seconds, within the bounds a lease may have."""
    seconds = positive_s(text)
    try:
        return check_lease_ttl(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def worker_id(text: str) -> str:
    """argparse type for --worker-id."""
    try:
        return check_worker_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def event_id(text: str) -> str:
    try:
        return validate_event_id(text)
    except InvalidEvent as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Order intake with a transactional outbox.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def command(name: str, help: str) -> ArgumentParser:
        sub: ArgumentParser = commands.add_parser(name, help=help, description=help)
        add_option(
            sub,
            "--db",
            required=True,
            help="source database: a file path, a sqlite: URL or a postgresql:// URI"
            " (its password from PGPASSWORD or a .pgpass file, never in the URI)",
        )
        return sub

    accept = command(
        "accept",
        "record orders and their outbox entries: one given by --id, --sku and --qty,"
        " or one per line of a --file",
    )
    add_option(accept, "--id", help="business ID of the order")
    add_option(accept, "--sku", help="stock keeping unit")
    add_option(accept, "--qty", type=strict_int, help="quantity, 1 to 1,000,000")
    add_option(
        accept,
        "--file",
        metavar="PATH",
        help="JSON Lines, one order (a JSON object) per line, - for stdin: recorded"
        f" {MAX_ACCEPT} lines per transaction, a line that fails reported as PATH:LINE",
    )

    send = command("dispatch", "deliver one batch of pending entries, in order")
    _sink_options(send, "sink URL, e.g. http://127.0.0.1:8080/events")
    add_option(send, "--limit", type=batch_limit, default=MAX_BATCH, help="batch size, 1 to 16")
    add_option(
        send,
        "--delivery",
        choices=["single", "batch"],
        default="single",
        help="single: one request per entry; batch: the whole batch in one request",
    )
    _chaos_option(send)

    serve = command("serve", "run the intake API and the relay until SIGTERM")
    _sink_options(
        serve,
        "sink URL, e.g. http://127.0.0.1:8080/events; repeat it for the nodes of one sink"
        " cluster (one inbox): a request goes to the next when one cannot be reached",
        repeat=True,
    )
    add_option(
        serve,
        "--worker-id",
        type=worker_id,
        default=None,
        help="this relay worker's name in the leases it holds (default HOST:PID; on SQLite,"
        " where one relay delivers at a time, HOST:relay-lock)",
    )
    add_option(
        serve,
        "--lease-ttl",
        type=lease_ttl,
        default=DEFAULT_LEASE_TTL_S,
        help="seconds a worker's lease of a line lasts unrenewed (renewed every third of"
        " it): how long a killed worker's lines wait before another takes them over",
    )
    add_option(serve, "--host", default="127.0.0.1", help="intake address to listen on")
    add_option(serve, "--port", type=port, default=DEFAULT_PORT, help="intake port (0: any)")
    add_option(serve, "--limit", type=batch_limit, default=MAX_BATCH, help="batch size, 1 to 16")
    add_option(
        serve,
        "--poll-interval",
        type=positive_s,
        default=POLL_INTERVAL_S,
        help="seconds between checks for entries written by other processes",
    )
    defaults = RetryPolicy()
    add_option(
        serve,
        "--retry-base",
        type=positive_s,
        default=defaults.base_s,
        help="first retry wait ceiling, seconds",
    )
    add_option(
        serve,
        "--retry-cap",
        type=positive_s,
        default=defaults.cap_s,
        help="longest retry wait, seconds (also the wait after a permanent failure)",
    )
    add_option(
        serve,
        "--quarantine-after",
        type=positive_int,
        default=None,
        help="quarantine the head after N consecutive permanent failures (400/409/413)",
    )
    add_option(
        serve,
        "--send-timeout",
        type=positive_s,
        default=TIMEOUT_S,
        help="seconds one delivery may take in all",
    )
    add_option(
        serve,
        "--ordering",
        choices=["global", "sku"],
        default="global",
        help="global: one line for all entries; sku: order per SKU, SKUs in parallel",
    )
    add_option(
        serve,
        "--lanes",
        type=positive_int,
        default=MAX_LANES,
        help="with --ordering sku: at most this many SKUs in flight at once",
    )
    add_option(
        serve,
        "--delivery",
        choices=["batch", "single"],
        default="batch",
        help="batch: one request per batch, one ACK per entry; single: one request per entry",
    )
    add_option(
        serve,
        "--pipeline",
        type=pipeline_depth,
        default=DEFAULT_DEPTH,
        help="requests in flight per line, each naming the one before (Outbox-After); "
        "used only once the sink's replies say it enforces that header, one at a time "
        "until then; 1 turns pipelining off",
    )
    add_option(
        serve,
        "--intake-token-file",
        help=f"file holding the bearer token POST /orders needs (or {INTAKE_TOKEN_ENV})",
    )
    add_option(
        serve,
        "--console-token-file",
        help="file holding the operator token that signs in to the console at /console"
        f" (or {CONSOLE_TOKEN_ENV}); without one the console is read-only",
    )
    add_option(
        serve, "--no-console", action="store_true", help="do not serve the console at /console"
    )
    add_option(
        serve,
        "--insecure",
        action="store_true",
        help="allow a non-loopback intake address without an intake token",
    )
    add_http_options(serve)
    add_option(serve, "--access-log", action="store_true", help="log one line per request")
    add_option(serve, "--log-format", choices=["text", "json"], default="text", help="log lines")
    _chaos_option(serve)

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
    add_option(listing, "--limit", type=positive_int, default=100, help="at most this many")
    add_option(listing, "--json", action="store_true", help="one JSON object per line")

    quarantine = command("quarantine", "take a pending entry out of the line")
    quarantine.add_argument("id", type=event_id, help="event ID")
    add_option(
        quarantine, "--reason", required=True, type=non_empty, help="why (kept with the record)"
    )
    add_option(quarantine, "--by", default=_operator(), help="who (kept with the record)")

    redrive = command("redrive", "put a quarantined entry back at its own position")
    redrive.add_argument("id", type=event_id, help="event ID")
    add_option(redrive, "--by", default=_operator(), help="who (kept with the record)")

    trace = command("trace", "how far one event got: the five stages of evidence")
    trace.add_argument("id", type=event_id, help="event ID")
    add_option(trace, "--sink", help="sink URL, to read its inbox record")
    add_option(trace, "--allow-host", action="append", default=[], help="also allow this sink host")
    _token_option(trace)
    add_option(trace, "--json", action="store_true", help="one JSON object")

    prune = command("prune", "delete sent entries older than a duration")
    add_option(prune, "--older-than", type=duration_s, required=True, help="e.g. 7d, 12h, 30m")
    return parser


def _sink_options(parser: ArgumentParser, help: str, *, repeat: bool = False) -> None:
    if repeat:
        add_option(parser, "--sink", required=True, action="append", help=help)
    else:
        add_option(parser, "--sink", required=True, help=help)
    add_option(
        parser,
        "--allow-host",
        action="append",
        default=[],
        help="also allow this sink host (repeatable); loopback is always allowed",
    )
    _token_option(parser)


def _token_option(parser: ArgumentParser) -> None:
    add_option(
        parser, "--token-file", help=f"file holding the sink's bearer token (or {TOKEN_ENV})"
    )


def _chaos_option(parser: ArgumentParser) -> None:
    add_option(
        parser,
        "--chaos",
        type=chaos_exit,
        metavar="exit-after-ack[=N]",
        help="end the process with status 73 right after the first (or the Nth) "
        "verified ACK, before that entry is marked sent",
    )


def _operator() -> str:
    return os.environ.get("USER") or "operator"


def check_accept_args(parser: ArgumentParser, args: argparse.Namespace) -> None:
    """Either --file or all of --id, --sku and --qty (a usage error otherwise)."""
    given = [flag for flag in ("id", "sku", "qty") if getattr(args, flag) is not None]
    if args.file is not None and given:
        parser.error(f"--file and --{given[0]} do not go together")
    missing = [f"--{flag}" for flag in ("id", "sku", "qty") if getattr(args, flag) is None]
    if args.file is None and missing:
        parser.error(f"the following arguments are required: {', '.join(missing)} (or --file)")


async def cmd_accept(args: argparse.Namespace) -> int:
    if args.file is not None:
        return await accept_file(args.db, args.file)
    event = {"id": args.id, "sku": args.sku, "qty": args.qty}
    async with Outbox.open(args.db) as outbox:
        result = await outbox.accept(event)
    print(f"{result} {args.id}")
    return EXIT_OK


async def accept_file(db: str, path: str) -> int:
    """Every line's order (publisher.orders_file); the counts on stdout, each failed
    line on stderr. Exit status 1 if a line failed, 2 if the file cannot be read."""
    name = "stdin" if path == "-" else path
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as exc:
        return fail(PROG, f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE)
    with stream:
        async with Outbox.open(db) as outbox:
            try:
                tally = await feed(outbox, numbered_lines(stream), name, _say_failed)
            except OSError as exc:
                return fail(PROG, f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE)
    print(tally.summary())
    return EXIT_FAILED if tally.failed or tally.stopped else EXIT_OK


def _say_failed(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def cmd_dispatch(args: argparse.Namespace) -> int:
    delivered: list[str] = []
    crash = exit_after_ack(args.chaos) if args.chaos else None

    def after_delivery(event_id: str) -> None:
        if crash is not None:
            crash(event_id)
        delivered.append(event_id)

    sender = HttpSender(args.sink, allowed_hosts=args.allow_host, token=load_token(args.token_file))
    log_egress(args.sink, args.allow_host)
    # A one-shot relay: it delivers, so it takes the relay lock like publisher serve
    # (on SQLite that refuses it beside one), and the leases of the lines it delivers
    # (LineHeld, nothing sent, while a relay worker holds one).
    worker = WorkerSettings(worker_id_for(args.db, None, dispatch=True))
    settings = RelaySettings(
        limit=args.limit, batch=args.delivery == "batch", pipeline=1, worker=worker
    )
    async with sender, Outbox.open(args.db) as outbox, outbox.relay_lock("publisher dispatch"):
        try:
            marked = await deliver_pending(outbox, sender, settings, after_delivery)
        except (DeliveryError, LeaseLost) as exc:
            done = f"{len(delivered)} delivered ({', '.join(delivered) or 'none'}), then"
            return fail(PROG, f"dispatch stopped: {done} {exc}")
    print(f"delivered {len(marked)}" + (f": {' '.join(marked)}" if marked else ""))
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace) -> int:
    intake_token = load_token(args.intake_token_file, INTAKE_TOKEN_ENV)
    console_token = (
        None if args.no_console else load_token(args.console_token_file, CONSOLE_TOKEN_ENV)
    )
    if intake_token is None and not is_loopback(args.host) and not args.insecure:
        message = (
            f"refusing to listen on {args.host} without an intake token: set "
            f"--intake-token-file or {INTAKE_TOKEN_ENV}, or say --insecure"
        )
        return fail(PROG, message, EXIT_USAGE)
    setup_logging(args.log_format)
    settings = ServiceSettings(
        db=args.db,
        sink=tuple(args.sink),
        allowed_hosts=tuple(args.allow_host),
        token=load_token(args.token_file),
        send_timeout_s=args.send_timeout,
        intake_token=intake_token,
        guard=http_guard_of(args),
        relay=RelaySettings(
            limit=args.limit,
            batch=args.delivery == "batch",
            pipeline=args.pipeline,
            ordering=args.ordering,
            max_lanes=args.lanes,
            poll_interval_s=args.poll_interval,
            retry=RetryPolicy(args.retry_base, args.retry_cap, args.quarantine_after),
            worker=WorkerSettings(worker_id_for(args.db, args.worker_id), args.lease_ttl),
        ),
        console=None if args.no_console else ConsoleSettings(token=console_token),
    )
    hook = exit_after_ack(args.chaos) if args.chaos else None
    app = create_app(settings, after_delivery=hook)

    async def say_egress(app: web.Application) -> None:
        # Once the outbox has opened: a usage error (a bad --db, say) stays one line.
        log_egress(", ".join(args.sink), args.allow_host, always=True)

    app.on_startup.append(say_egress)
    limits = http_limits_of(args)
    await serve_app(app, args.host, args.port, PROG, "/orders", args.access_log, limits)
    return EXIT_OK


def log_egress(sink: str, allow_host: Sequence[str], *, always: bool = False) -> None:
    """Say once where this process may send: a widened --allow-host list (or
    OUTBOX_ALLOW_HOST) must be visible in the log, not only in the environment."""
    hosts = ", ".join(allow_host)
    if allow_host:
        log.warning("sink hosts allowed beyond loopback: %s", hosts, extra={"allow_host": hosts})
    elif always:
        log.info("sink hosts allowed: loopback only", extra={"sink": sink})


async def cmd_status(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db) as outbox:
        snapshot = await outbox.snapshot()
        lines = await lines_view(outbox, args.lease_ttl)
    if args.json:
        print(json.dumps({**snapshot.to_dict(), **lines.to_dict()}))
        return EXIT_OK
    print(f"pending      {snapshot.pending}")
    print(f"oldest age   {snapshot.oldest_pending_age_s:.1f} s")
    print(f"quarantined  {snapshot.quarantined}")
    head = snapshot.head
    if head is None:
        print("head         none")
    elif head.blocked:
        print(
            f"head         {head.id} (seq {head.seq}) BLOCKED since {when(head.blocked_since)}, "
            f"{head.attempts} attempts, last error: {head.last_error}"
        )
    else:
        print(f"head         {head.id} (seq {head.seq}), {head.attempts} attempts")
    for lane in snapshot.blocked_lanes:
        print(
            f"lane {lane.lane!r:<10} head {lane.id} BLOCKED since {when(lane.blocked_since)}, "
            f"{lane.attempts} attempts, last error: {lane.last_error}"
        )
    _print_lines(lines, args.lease_ttl)
    return EXIT_OK


def _print_lines(lines: LinesView, ttl_s: float) -> None:
    """The workers and the lines they hold; lines released or expired without an
    owner are counted, not listed (there is one per SKU ever delivered)."""
    workers = ", ".join(lines.workers) or "none"
    print(f"workers      {len(lines.workers)} holding leases: {workers}")
    for worker in lines.relay_workers:
        described = describe_worker(worker, lines.lines_of(worker.worker), ttl_s)
        print(f"worker {worker.worker!r:<8} {described}")
    shown = [lease for lease in lines.leases if lease.owner is not None]
    for lease in shown:
        print(f"line {lease.line!r:<10} {describe_lease(lease)}")
    if len(shown) < len(lines.leases):
        print(f"lines free   {len(lines.leases) - len(shown)} (released, any worker may take them)")


async def cmd_list(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db) as outbox:
        entries = await outbox.entries(State(args.state), args.limit)
        history = await outbox.quarantine_history([e.id for e in entries])
        lines = await lines_view(outbox)
    for entry in entries:
        records = history.get(entry.id, [])
        if args.json:
            print(json.dumps(_entry_json(entry, records, lines)))
        else:
            print(_entry_line(entry, records, lines))
    return EXIT_OK


def _delivered_by(entry: Entry, lines: LinesView) -> dict[str, object] | None:
    """The lease a pending entry is being delivered under: its lane's, or the global
    line's, whichever a worker holds (None: no worker holds either now)."""
    if entry.state is not State.PENDING:
        return None
    for line in (entry.event["sku"], GLOBAL_LINE):
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
        f"{entry.seq:>8} {entry.id} {entry.event['sku']} x{entry.event['qty']} "
        f"{entry.state} attempts={entry.attempts}"
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
    async with Outbox.open(args.db) as outbox:
        await outbox.quarantine(args.id, args.reason, args.by)
    print(f"quarantined {args.id}")
    return EXIT_OK


async def cmd_redrive(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db) as outbox:
        record = await outbox.redrive(args.id, args.by)
    passed = f": {' '.join(record.delivered_past)}" if record.delivered_past else ""
    print(f"redriven {args.id}; {record.delivered_past_count} delivered past it{passed}")
    return EXIT_OK


async def cmd_trace(args: argparse.Namespace) -> int:
    sender = None
    if args.sink is not None:
        token = load_token(args.token_file)
        sender = HttpSender(args.sink, allowed_hosts=args.allow_host, token=token)
        log_egress(args.sink, args.allow_host)
    async with Outbox.open(args.db) as outbox:
        if sender is None:
            trace = await collect_trace(outbox, args.id, None)
        else:
            async with sender:
                trace = await collect_trace(outbox, args.id, sender)
    print(json.dumps(trace.to_dict()) if args.json else render_trace(trace))
    if trace.stages[0].proof.value != "proven":
        return fail(PROG, f"no order with ID {args.id!r} in {redacted(args.db)}")
    return EXIT_OK


async def cmd_prune(args: argparse.Namespace) -> int:
    async with Outbox.open(args.db) as outbox:
        deleted = await outbox.prune(args.older_than)
    print(f"pruned {deleted} sent entries")
    return EXIT_OK


COMMANDS: Final[dict[str, Command]] = {
    "accept": cmd_accept,
    "dispatch": cmd_dispatch,
    "serve": cmd_serve,
    "status": cmd_status,
    "list": cmd_list,
    "quarantine": cmd_quarantine,
    "redrive": cmd_redrive,
    "trace": cmd_trace,
    "prune": cmd_prune,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "accept":
        check_accept_args(parser, args)
    if args.command == "serve" and args.retry_base > args.retry_cap:
        parser.error(
            f"--retry-base ({args.retry_base}) must not be above --retry-cap ({args.retry_cap})"
        )
    try:
        # `serve` takes --event-loop; the one-shot commands run on asyncio's own loop.
        loop = args.event_loop if args.command == "serve" else event_loop.ASYNCIO
        return event_loop.run(COMMANDS[args.command](args), loop)
    except event_loop.LoopUnavailable as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except InvalidEvent as exc:
        return fail(PROG, f"invalid order: {exc}", EXIT_USAGE)
    except TargetNotAllowed as exc:
        return fail(PROG, f"refused sink URL: {exc}", EXIT_USAGE)
    except (TokenError, BadLocation) as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except (Conflict, DeliveryError, StorageError, OutboxError, LeaseLost) as exc:
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, f"cannot listen: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return fail(PROG, "interrupted", EXIT_FAILED)
