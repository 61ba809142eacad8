"""What the publisher's subcommands share: the program's name, argparse types, and
the options several subcommands take (`--db` and `--schema`, the sink's, `--chaos`)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from plumbing.cli import ArgumentParser, add_option, escaped, int_in, positive_s
from plumbing.net import TOKEN_ENV
from publisher.notes import BadNote, check_operator, check_reason
from publisher.settings import MAX_DEPTH, check_lease_ttl, check_worker_id
from shared import MAX_BATCH, InvalidEvent, validate_event_id

PROG: Final = "outbox-publisher"  # the console script; python -m publisher says the same
EXIT_AFTER_ACK: Final = "exit-after-ack"

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
# A subcommand's own check of its parsed arguments: parser.error for a usage error.
Check = Callable[[ArgumentParser, argparse.Namespace], None]
# Adds a subcommand on the source database (--db) and returns its parser.
AddCommand = Callable[[str, str], ArgumentParser]

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


def reason(text: str) -> str:
    """argparse type for --reason: what the console takes (publisher.notes)."""
    return _note(check_reason, text)


def operator_name(text: str) -> str:
    """argparse type for --by: what the console takes (publisher.notes)."""
    return _note(check_operator, text)


def _note(check: Callable[[object], str], text: str) -> str:
    try:
        return check(text)
    except BadNote as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def say(line: str) -> None:
    """Print one line of a command's answer for a person: escaped, since it may hold
    text from outside (a sink's reply, a reason, a name, an ID read from a record)."""
    print(escaped(line))


def add_db_option(sub: ArgumentParser) -> None:
    add_option(
        sub,
        "--db",
        required=True,
        help="source database: a file path, a sqlite: URL or a postgresql:// URI"
        " (its password from PGPASSWORD or a .pgpass file, never in the URI)",
    )
    add_option(
        sub,
        "--schema",
        help="PostgreSQL only: the schema the outbox's tables are in, named in every"
        " statement (created if missing; the same as schema=NAME in the URI)",
    )


def add_sink_options(parser: ArgumentParser, help: str, *, repeat: bool = False) -> None:
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
    add_token_option(parser)


def add_token_option(parser: ArgumentParser) -> None:
    add_option(
        parser, "--token-file", help=f"file holding the sink's bearer token (or {TOKEN_ENV})"
    )


def add_chaos_option(parser: ArgumentParser) -> None:
    add_option(
        parser,
        "--chaos",
        type=chaos_exit,
        metavar="exit-after-ack[=N]",
        help="end the process with status 73 right after the first (or the Nth) "
        "verified ACK, before that entry is marked sent",
    )


def operator() -> str:
    """Who an operator's command is recorded as, by default: $USER, or "operator"
    when that is unset or not a name a record may carry (--by is checked as given)."""
    try:
        return check_operator(os.environ.get("USER") or "operator")
    except BadNote:
        return "operator"


# The logger the command line has always written under, whichever module writes.
log = logging.getLogger("publisher.cli")


def log_egress(sink: str, allow_host: Sequence[str], *, always: bool = False) -> None:
    """Say once where this process may send: a widened --allow-host list (or
    OUTBOX_ALLOW_HOST) must be visible in the log, not only in the environment."""
    hosts = ", ".join(allow_host)
    if allow_host:
        log.warning("sink hosts allowed beyond loopback: %s", hosts, extra={"allow_host": hosts})
    elif always:
        log.info("sink hosts allowed: loopback only", extra={"sink": sink})
