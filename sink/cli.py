"""`python -m sink`: serve the inbox over HTTP."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Final

from shared.cli import ArgumentParser, add_option, fail, setup_logging
from shared.web import serve_app
from sink.app import create_app
from sqlite_tx import StorageError

PROG: Final = "sink"
DROP_AFTER_COMMIT: Final = "drop-after-commit"
DEFAULT_PORT: Final = 8080


def chaos_setting(text: str) -> int:
    """argparse type for --chaos: drop-after-commit=N with N >= 1."""
    name, _, count = text.partition("=")
    if name != DROP_AFTER_COMMIT or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected {DROP_AFTER_COMMIT}=N with N >= 1")
    return int(count)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Idempotent inbox sink over HTTP.")
    add_option(parser, "--db", required=True, help="sink database file")
    add_option(parser, "--host", default="127.0.0.1", help="address to listen on")
    add_option(parser, "--port", type=int, default=DEFAULT_PORT, help="port (0: any free port)")
    add_option(parser, "--log-format", choices=["text", "json"], default="text", help="log lines")
    add_option(
        parser,
        "--chaos",
        type=chaos_setting,
        default=0,
        metavar=f"{DROP_AFTER_COMMIT}=N",
        help="close the connection with no reply after each of the first N commits",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format)
    app = create_app(args.db, drop_after_commit=args.chaos)
    try:
        asyncio.run(serve_app(app, args.host, args.port, PROG, "/events"))
    except StorageError as exc:
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    return 0
