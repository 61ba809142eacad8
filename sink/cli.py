"""`python -m sink`: serve the inbox over HTTP."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, Final

from plumbing.cli import EXIT_USAGE, ArgumentParser, add_option, fail, setup_logging
from plumbing.net import TOKEN_ENV, TokenError, is_loopback, load_token
from plumbing.storage import StorageError
from plumbing.web import serve_app
from shared import validate_sku
from sink.app import create_app

PROG: Final = "sink"
DEFAULT_PORT: Final = 8080
CHAOS_COUNTS: Final = ("drop-after-commit", "exit-after-commit")
CHAOS_HELP: Final = (
    "comma-separated: drop-after-commit=N closes the connection with no reply after each "
    "of the first N commits; exit-after-commit=N ends the process with status 73 right "
    "after the Nth commit; stall=SECONDS waits that long before handling each event; "
    "reject-sku=SKU answers 400 for that SKU"
)


def chaos_settings(text: str) -> dict[str, Any]:
    """argparse type for --chaos, e.g. 'drop-after-commit=1,stall=0.5'."""
    settings: dict[str, Any] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if name in CHAOS_COUNTS and value.isdigit() and int(value) >= 1:
            settings[name] = int(value)
        elif name == "stall" and _seconds(value) is not None:
            settings[name] = float(value)
        elif name == "reject-sku" and value:
            settings.setdefault(name, set()).add(validate_sku(value))
        else:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r}: expected drop-after-commit=N, exit-after-commit=N (N >= 1),"
                " stall=SECONDS or reject-sku=SKU"
            )
    return settings


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 3600 else None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Idempotent inbox sink over HTTP.",
        epilog=f"The bearer token comes from --token-file or the {TOKEN_ENV} variable.",
    )
    add_option(parser, "--db", required=True, help="sink database file")
    add_option(parser, "--host", default="127.0.0.1", help="address to listen on")
    add_option(parser, "--port", type=int, default=DEFAULT_PORT, help="port (0: any free port)")
    add_option(
        parser, "--token-file", help=f"file holding the shared bearer token (or {TOKEN_ENV})"
    )
    add_option(
        parser,
        "--insecure",
        action="store_true",
        help="allow a non-loopback address without a token",
    )
    add_option(parser, "--access-log", action="store_true", help="log one line per request")
    add_option(parser, "--log-format", choices=["text", "json"], default="text", help="log lines")
    add_option(parser, "--chaos", type=chaos_settings, default={}, help=CHAOS_HELP)
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
    setup_logging(args.log_format)
    app = create_app(
        args.db,
        token=token,
        drop_after_commit=int(args.chaos.get("drop-after-commit", 0)),
        exit_after_commit=int(args.chaos.get("exit-after-commit", 0)),
        stall_s=args.chaos.get("stall", 0.0),
        reject_skus=frozenset(args.chaos.get("reject-sku", ())),
    )
    try:
        asyncio.run(serve_app(app, args.host, args.port, PROG, "/events", args.access_log))
    except StorageError as exc:
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    return 0
