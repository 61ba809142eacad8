"""`python -m sink`: serve the inbox over HTTP."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aiohttp import web

from plumbing import event_loop
from plumbing.cli import (
    EXIT_USAGE,
    ArgumentParser,
    add_option,
    add_version,
    fail,
    port,
    setup_logging,
)
from plumbing.host_guard import HttpGuard
from plumbing.http_options import add_http_options, http_guard_of, http_limits_of
from plumbing.net import TOKEN_ENV, TokenError, is_loopback, load_token
from plumbing.serving import serve_app
from plumbing.storage import BadLocation, StorageError, with_schema
from sink.app import create_app
from sink.chaos import CHAOS_HELP, Chaos, chaos_app, parse_chaos
from sink.handlers import Handlers
from sink.handlers import load as load_handlers

PROG: Final = "outbox-sink"  # the console script; python -m sink says the same
DEFAULT_PORT: Final = 8080


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Idempotent inbox sink over HTTP.",
        epilog=f"The bearer token comes from --token-file or the {TOKEN_ENV} variable.",
    )
    add_version(parser, "sink", ("sink.backends.sqlite_sql", "sink.backends.postgres_sql"))
    add_option(
        parser,
        "--db",
        required=True,
        help="sink database: a file path, a sqlite: URL or a postgresql:// URI",
    )
    add_option(
        parser,
        "--schema",
        help="PostgreSQL only: the schema the inbox's tables are in, named in every"
        " statement (created if missing; the same as schema=NAME in the URI)",
    )
    add_option(parser, "--host", default="127.0.0.1", help="address to listen on")
    add_option(parser, "--port", type=port, default=DEFAULT_PORT, help="port (0: any free port)")
    add_option(
        parser, "--token-file", help=f"file holding the shared bearer token (or {TOKEN_ENV})"
    )
    add_option(
        parser,
        "--insecure",
        action="store_true",
        help="allow a non-loopback address without a token",
    )
    add_http_options(parser)
    add_option(parser, "--access-log", action="store_true", help="log one line per request")
    add_option(parser, "--log-format", choices=["text", "json"], default="text", help="log lines")
    add_option(
        parser,
        "--handlers",
        metavar="MODULE:ATTR",
        help="the sink.Handlers registry that applies each event (imported from MODULE,"
        " found on the Python path); default: the built-in warehouse (order.placed adds"
        " to the inventory, any other type is recorded with no effect)",
    )
    add_option(parser, "--chaos", type=parse_chaos, default=Chaos(), help=CHAOS_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        token = load_token(args.token_file)
    except TokenError as exc:
        return fail(PROG, exc, EXIT_USAGE)
    if token is None and not is_loopback(args.host) and not args.insecure:
        message = (
            f"refusing to listen on {args.host} without a token: set --token-file or "
            f"{TOKEN_ENV}, or say --insecure"
        )
        return fail(PROG, message, EXIT_USAGE)
    try:
        handlers = None if args.handlers is None else load_handlers(args.handlers)
        db = with_schema(args.db, args.schema)
        app = build_app(db, token, args.chaos, http_guard_of(args), handlers)
    except (BadLocation, ValueError) as exc:  # before anything is opened or logged
        return fail(PROG, exc, EXIT_USAGE)
    setup_logging(args.log_format)
    try:
        serving = serve_app(
            app, args.host, args.port, "sink", "/events", args.access_log, http_limits_of(args)
        )
        event_loop.run(serving, args.event_loop)
    except event_loop.LoopUnavailable as exc:
        return fail(PROG, exc, EXIT_USAGE)
    except StorageError as exc:
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    return 0


def build_app(
    db: str | Path,
    token: str | None,
    chaos: Chaos,
    guard: HttpGuard | None = None,
    handlers: Handlers | None = None,
) -> web.Application:
    """The production app, or with `--chaos` the app with those faults installed."""
    if chaos == Chaos():
        return create_app(db, handlers=handlers, token=token, guard=guard)
    return chaos_app(db, chaos, handlers=handlers, token=token, guard=guard)
