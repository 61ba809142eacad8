"""`publisher accept`: record orders and events and their outbox entries, one order
from the options or one order or event per line of a file."""

from __future__ import annotations

import argparse
import sys
from typing import Final

from plumbing.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    add_option,
    escaped,
    fail,
    strict_int,
)
from publisher.cli.options import (
    PROG,
    AddCommand,
    Check,
    Command,
    add_event_rules,
    say,
    schemas_of,
)
from publisher.intake import event_check
from publisher.orders_file import feed, numbered_lines
from publisher.store import MAX_ACCEPT, EventCheck, Outbox
from shared import validate_order
from shared.schemas import SchemaError

FIELDS: Final = ("id", "sku", "qty")


def add_parsers(command: AddCommand) -> None:
    accept = command(
        "accept",
        "record orders and their outbox entries: one given by --id, --sku and --qty,"
        " or orders and events, one per line of a --file",
    )
    add_option(accept, "--id", help="business ID of the order")
    add_option(accept, "--sku", help="stock keeping unit")
    add_option(accept, "--qty", type=strict_int, help="quantity, 1 to 1,000,000")
    add_option(
        accept,
        "--file",
        metavar="PATH",
        help="JSON Lines, one order {id, sku, qty} or event {id, type, key, data} per line,"
        f" - for stdin: recorded {MAX_ACCEPT} lines per transaction, a line that fails"
        " reported as PATH:LINE",
    )
    add_event_rules(accept)  # as serve holds events to them


def check_args(parser: ArgumentParser, args: argparse.Namespace) -> None:
    """Either --file or all of --id, --sku and --qty (a usage error otherwise)."""
    given = [flag for flag in FIELDS if getattr(args, flag) is not None]
    if args.file is not None and given:
        parser.error(f"--file and --{given[0]} do not go together")
    missing = [f"--{flag}" for flag in FIELDS if getattr(args, flag) is None]
    if args.file is None and missing:
        parser.error(f"the following arguments are required: {', '.join(missing)} (or --file)")


async def cmd_accept(args: argparse.Namespace) -> int:
    try:  # an order given by --id is held to the order's rules, yet no option goes unread
        schemas = schemas_of(args)
    except SchemaError as exc:
        return fail(PROG, str(exc), EXIT_USAGE)
    if args.file is not None:
        check = event_check(args.max_data_bytes, schemas, parsed=True)
        return await accept_file(args.db, args.file, check)
    event = {"id": args.id, "sku": args.sku, "qty": args.qty}
    validate_order(event)  # InvalidEvent before the database is opened (or created)
    async with Outbox.open(args.db) as outbox:
        result = await outbox.accept(event)
    say(f"{result} {args.id}")
    return EXIT_OK


async def accept_file(db: str, path: str, check: EventCheck) -> int:
    """Every line's order or event (publisher.orders_file; an event held to `check`);
    the counts on stdout, each failed line on stderr. Exit status 1 if a line failed,
    2 if the file cannot be read."""
    name = "stdin" if path == "-" else path
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as exc:
        return fail(PROG, f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE)
    with stream:
        async with Outbox.open(db) as outbox:
            try:
                tally = await feed(outbox, numbered_lines(stream), name, _say_failed, check)
            except OSError as exc:
                return fail(PROG, f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE)
    print(tally.summary())
    return EXIT_FAILED if tally.failed or tally.stopped else EXIT_OK


def _say_failed(message: str) -> None:
    print(escaped(message), file=sys.stderr, flush=True)  # it may quote the line


COMMANDS: Final[dict[str, Command]] = {"accept": cmd_accept}
CHECKS: Final[dict[str, Check]] = {"accept": check_args}
