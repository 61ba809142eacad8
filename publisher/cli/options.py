"""What the publisher's subcommands share: the program's name, argparse types, and
the options several subcommands take (`--db` and `--schema`, the sink's, `--chaos`,
the rules events are held to at intake)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from plumbing.cli import ArgumentParser, add_option, escaped, int_in, positive_int, positive_s
from plumbing.net import TOKEN_ENV
from publisher.notes import BadNote, check_operator, check_reason
from publisher.settings import MAX_DEPTH, check_lease_ttl, check_worker_id
from shared import MAX_BATCH, InvalidEvent, validate_event_id
from shared.event import MAX_DATA_BYTES, MAX_DATA_BYTES_LIMIT
from shared.schemas import SchemaError, Schemas

PROG: Final = "outbox-publisher"  # the console script; python -m publisher says the same
EXIT_AFTER_ACK: Final = "exit-after-ack"

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
# A subcommand's own check of its parsed arguments: parser.error for a usage error.
Check = Callable[[ArgumentParser, argparse.Namespace], None]
# Adds a subcommand on the source database (--db) and returns its parser.
AddCommand = Callable[[str, str], ArgumentParser]

batch_limit = int_in(1, MAX_BATCH)  # argparse type for --limit
pipeline_depth = int_in(1, MAX_DEPTH)  # argparse type for --pipeline


def data_bytes(text: str) -> int:
    """argparse type for --max-data-bytes."""
    value = positive_int(text)
    if value > MAX_DATA_BYTES_LIMIT:
        raise argparse.ArgumentTypeError(f"at most {MAX_DATA_BYTES_LIMIT:,}")
    return value


def add_event_rules(parser: ArgumentParser) -> None:
    """The rules intake holds an event to beyond its own (serve, accept): the data's
    size, and the JSON Schemas of event types."""
    add_option(
        parser,
        "--max-data-bytes",
        type=data_bytes,
        default=MAX_DATA_BYTES,
        help=f"the most an event's data may take, encoded (1 to {MAX_DATA_BYTES_LIMIT:,})",
    )
    add_option(
        parser,
        "--schemas",
        metavar="DIR",
        help="a directory of JSON Schemas (2020-12), one TYPE.json per event type:"
        " an event of a type that has one must match it",
    )
    add_option(
        parser,
        "--strict-types",
        action="store_true",
        help="with --schemas: refuse an event whose type has no schema",
    )


def schemas_of(args: argparse.Namespace) -> Schemas | None:
    """The schemas --schemas names (strict with --strict-types), None without it;
    SchemaError for a directory that cannot be used or --strict-types alone."""
    if args.schemas is None:
        if args.strict_types:
            raise SchemaError("--strict-types needs --schemas DIR")
        return None
    return Schemas.load(args.schemas, strict=args.strict_types)


def say_schemas(schemas: Schemas | None) -> None:
    """Log which event types have a schema (a misnamed file shows as a type missing)."""
    if schemas is None:
        return
    types = sorted(schemas.types)
    logging.getLogger("publisher.intake").info(
        "event types with a schema: %s%s",
        ", ".join(types) or "none",
        " (strict: any other type is refused)" if schemas.strict else "",
    )


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
