"""`python -m sink`: serve the inbox over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence
from typing import Final

from aiohttp import web

from shared.cli import EXIT_OK, ArgumentParser, fail, setup_logging
from sink.app import create_app
from sqlite_tx import StorageError

PROG: Final = "sink"
DROP_AFTER_COMMIT: Final = "drop-after-commit"


def chaos_setting(text: str) -> int:
    """argparse type for --chaos: drop-after-commit=N with N >= 1."""
    name, _, count = text.partition("=")
    if name != DROP_AFTER_COMMIT or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected {DROP_AFTER_COMMIT}=N with N >= 1")
    return int(count)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Idempotent inbox sink over HTTP.")
    parser.add_argument("--db", required=True, help="sink database file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", required=True, type=int, help="port (0 picks a free one)")
    parser.add_argument(
        "--chaos",
        type=chaos_setting,
        default=0,
        metavar=f"{DROP_AFTER_COMMIT}=N",
        help="close the connection with no reply after the first N commits",
    )
    return parser


async def serve(args: argparse.Namespace) -> int:
    app = create_app(args.db, drop_after_commit=args.chaos)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()  # opens the inbox: a bad DB fails here, before listening
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        for address in runner.addresses:
            host, port = address[0], address[1]
            shown = f"[{host}]" if ":" in host else host
            print(f"sink listening on http://{shown}:{port}/events", flush=True)
        await wait_for_signal()
    finally:
        await runner.cleanup()
    return EXIT_OK


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        return asyncio.run(serve(args))
    except StorageError as exc:
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
