"""`python -m publisher`: record orders and dispatch batches from the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Final

from publisher.errors import DeliveryError, TargetNotAllowed, UnknownEntry
from publisher.http import HttpSender
from publisher.outbox import MAX_BATCH, Outbox, check_limit
from publisher.relay import dispatch
from shared import Conflict, InvalidEvent
from shared.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArgumentParser, fail
from sqlite_tx import StorageError

PROG: Final = "publisher"
CHAOS_EXIT_STATUS: Final = 73


def batch_limit(text: str) -> int:
    """argparse type for --limit: an integer from 1 to 16."""
    try:
        return check_limit(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_BATCH}") from None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Order intake with an outbox.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    accept = commands.add_parser("accept", help="record one order and its outbox entry")
    accept.add_argument("--db", required=True, help="source database file")
    accept.add_argument("--id", required=True, help="business ID of the order")
    accept.add_argument("--sku", required=True)
    accept.add_argument("--qty", required=True, type=int)

    send = commands.add_parser("dispatch", help="deliver one batch of pending entries")
    send.add_argument("--db", required=True, help="source database file")
    send.add_argument("--sink", required=True, help="sink URL, e.g. http://127.0.0.1:8080/events")
    send.add_argument("--limit", type=batch_limit, default=MAX_BATCH, help="batch size, 1 to 16")
    send.add_argument(
        "--chaos",
        choices=["exit-after-ack"],
        help="exit-after-ack: end the process with status 73 right after the first verified "
        "ACK, before the entry is marked sent",
    )
    return parser


async def cmd_accept(args: argparse.Namespace) -> int:
    event = {"id": args.id, "sku": args.sku, "qty": args.qty}
    async with Outbox.open(args.db) as outbox:
        result = await outbox.accept(event)
    print(f"{result} {args.id}")
    return EXIT_OK


async def cmd_dispatch(args: argparse.Namespace) -> int:
    delivered: list[str] = []

    def after_delivery(event_id: str) -> None:
        if args.chaos == "exit-after-ack":
            print(f"chaos: ACK verified for {event_id}, exiting before the mark", file=sys.stderr)
            sys.stderr.flush()
            os._exit(CHAOS_EXIT_STATUS)  # no finally, no close: a crash at exactly this point
        delivered.append(event_id)

    async with HttpSender(args.sink) as send, Outbox.open(args.db) as outbox:
        try:
            marked = await dispatch(outbox, send, args.limit, after_delivery)
        except DeliveryError as exc:
            done = f"{len(delivered)} delivered ({', '.join(delivered) or 'none'}), then"
            return fail(PROG, f"dispatch stopped: {done} {exc}")
    print(f"delivered {len(marked)}" + (f": {' '.join(marked)}" if marked else ""))
    return EXIT_OK


COMMANDS: Final = {"accept": cmd_accept, "dispatch": cmd_dispatch}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except InvalidEvent as exc:
        return fail(PROG, f"invalid order: {exc}", EXIT_USAGE)
    except TargetNotAllowed as exc:
        return fail(PROG, f"refused sink URL: {exc}", EXIT_USAGE)
    except Conflict as exc:
        return fail(PROG, exc)
    except (DeliveryError, StorageError, UnknownEntry) as exc:
        return fail(PROG, exc)
    except KeyboardInterrupt:
        return fail(PROG, "interrupted", EXIT_FAILED)
