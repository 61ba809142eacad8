"""`python -m publisher`: intake, delivery and operations from the command line.

Exit status: 0 done, 1 failed (delivery, conflict, storage), 2 bad input or usage.
Every option also reads an OUTBOX_* environment variable (shown in --help).

One module per group of subcommands, each adding its parsers and naming the
commands it runs: `accept` (intake), `dispatch` (one batch delivered), `serve` (the
service) and `operate` (status, list, quarantine, redrive, trace, prune); what they
share is in `options`. This module puts them together and turns every error into
one line and an exit status.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Final

from plumbing import event_loop
from plumbing.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    add_version,
    fail,
    setup_command_logging,
)
from plumbing.net import TokenError
from plumbing.storage import BadLocation, StorageError, with_schema
from publisher.cli import accept, dispatch, operate, serve
from publisher.cli.options import PROG, Check, Command, add_db_option
from publisher.errors import DeliveryError, LeaseLost, OutboxError, TargetNotAllowed
from publisher.notes import BadNote
from shared import Conflict, InvalidEvent

GROUPS: Final = (accept, dispatch, serve, operate)  # in the order --help lists them
COMMANDS: Final[dict[str, Command]] = {
    name: run for group in GROUPS for name, run in group.COMMANDS.items()
}
CHECKS: Final[dict[str, Check]] = {
    name: check for group in GROUPS for name, check in group.CHECKS.items()
}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Order intake with a transactional outbox.")
    add_version(
        parser,
        "publisher",
        ("publisher.backends.sqlite_sql", "publisher.backends.postgres_sql"),
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def command(name: str, help: str) -> ArgumentParser:
        sub: ArgumentParser = commands.add_parser(name, help=help, description=help)
        add_db_option(sub)
        return sub

    for group in GROUPS:
        group.add_parsers(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.db = with_schema(args.db, args.schema)  # --schema: the URI's schema=NAME
    except BadLocation as exc:
        return fail(PROG, exc, EXIT_USAGE)
    check = CHECKS.get(args.command)
    if check is not None:
        check(parser, args)
    try:
        # `serve` takes --event-loop; the one-shot commands run on asyncio's own loop.
        loop = args.event_loop if args.command == "serve" else event_loop.ASYNCIO
        if args.command != "serve":  # serve sets up its own logs (--log-format)
            setup_command_logging(PROG)
        return event_loop.run(COMMANDS[args.command](args), loop)
    except event_loop.LoopUnavailable as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except InvalidEvent as exc:
        return fail(PROG, f"invalid order: {exc}", EXIT_USAGE)
    except TargetNotAllowed as exc:
        return fail(PROG, f"refused sink URL: {exc}", EXIT_USAGE)
    except (TokenError, BadLocation, BadNote) as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except (Conflict, DeliveryError, StorageError, OutboxError, LeaseLost) as exc:
        return fail(PROG, exc)
    except BrokenPipeError:
        # The reader went away (`status | head -1`): what it did not read is not
        # wanted. Nothing more reaches stdout, the interpreter's flush at exit included.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        if args.command == "serve":
            return fail(PROG, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return fail(PROG, f"{args.command}: {exc.strerror or exc}")  # its output, say
    except KeyboardInterrupt:
        return fail(PROG, "interrupted", EXIT_FAILED)


__all__ = ["COMMANDS", "build_parser", "main"]
