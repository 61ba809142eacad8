"""`publisher serve`: the intake API, the relay and the console in one process,
until SIGTERM."""

from __future__ import annotations

import argparse
from typing import Final

from aiohttp import web

from plumbing.cli import (
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    add_option,
    fail,
    port,
    positive_int,
    positive_s,
    setup_logging,
)
from plumbing.http_options import add_http_options, http_guard_of, http_limits_of
from plumbing.net import INTAKE_TOKEN_ENV, is_loopback, load_token
from plumbing.serving import serve_app
from publisher.app import ServiceSettings, create_app
from publisher.chaos import exit_after_ack
from publisher.cli.options import (
    PROG,
    AddCommand,
    Check,
    Command,
    add_chaos_option,
    add_event_rules,
    add_sink_options,
    batch_limit,
    lease_ttl,
    log_egress,
    pipeline_depth,
    say_schemas,
    schemas_of,
    worker_id,
)
from publisher.console import ConsoleSettings
from publisher.http import DEFAULT_SOURCE, TIMEOUT_S
from publisher.retry import RetryPolicy
from publisher.settings import (
    DEFAULT_DEPTH,
    DEFAULT_LEASE_TTL_S,
    MAX_LANES,
    POLL_INTERVAL_S,
    RelaySettings,
    WorkerSettings,
    worker_id_for,
)
from shared import MAX_BATCH
from shared.cloudevents import SOURCE_MAX_CHARS, is_source
from shared.schemas import SchemaError

DEFAULT_PORT: Final = 8000
CONSOLE_TOKEN_ENV: Final = "OUTBOX_CONSOLE_TOKEN"


def add_parsers(command: AddCommand) -> None:
    serve = command("serve", "run the intake API and the relay until SIGTERM")
    add_sink_options(
        serve,
        "sink URL, e.g. http://127.0.0.1:8080/events; repeat it for the nodes of one sink"
        " cluster (one inbox): a request goes to the next when one cannot be reached",
        repeat=True,
    )
    _add_worker_options(serve)
    add_option(serve, "--host", default="127.0.0.1", help="intake address to listen on")
    add_option(serve, "--port", type=port, default=DEFAULT_PORT, help="intake port (0: any)")
    _add_delivery_options(serve)
    _add_service_options(serve)
    add_chaos_option(serve)


def _add_worker_options(serve: ArgumentParser) -> None:
    """Who this relay worker is among others on one outbox."""
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


def _add_delivery_options(serve: ArgumentParser) -> None:
    """How the relay delivers (RelaySettings, and the sender's timeout)."""
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
        help="quarantine the head after N consecutive permanent failures (400/409/413/422);"
        " by default never",
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
        choices=["global", "key", "sku"],
        default="global",
        help="global: one line for all entries; key: order per event key, keys in parallel"
        " (events without a key share one lane); sku: the same as key",
    )
    add_option(
        serve,
        "--lanes",
        type=positive_int,
        default=MAX_LANES,
        help="with --ordering key: at most this many keys in flight at once",
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


def source(text: str) -> str:
    """argparse type for --source: a source the sink takes (shared.cloudevents)."""
    if not is_source(text):
        raise argparse.ArgumentTypeError(
            f"must be 1 to {SOURCE_MAX_CHARS} characters, got {len(text)}"
        )
    return text


def _add_event_options(serve: ArgumentParser) -> None:
    """What intake takes as an event, and how the events are named on the wire."""
    add_event_rules(serve)
    add_option(
        serve,
        "--source",
        type=source,
        default=DEFAULT_SOURCE,
        help="the CloudEvents source attribute of the events sent (a URI reference,"
        f" 1 to {SOURCE_MAX_CHARS} characters)",
    )


def _add_service_options(serve: ArgumentParser) -> None:
    """What the service takes: tokens, the console, the HTTP side, its logs."""
    _add_event_options(serve)
    add_option(
        serve,
        "--intake-token-file",
        help="file holding the bearer token intake (POST /orders, POST /events) needs"
        f" (or {INTAKE_TOKEN_ENV})",
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
        "--cookie-secure",
        action="store_true",
        help="mark the console's session cookie Secure (the console is reached over TLS,"
        " through a proxy in front)",
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


def check_args(parser: ArgumentParser, args: argparse.Namespace) -> None:
    if args.retry_base > args.retry_cap:
        parser.error(
            f"--retry-base ({args.retry_base}) must not be above --retry-cap ({args.retry_cap})"
        )


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
    try:
        schemas = schemas_of(args)
    except SchemaError as exc:
        return fail(PROG, str(exc), EXIT_USAGE)
    setup_logging(args.log_format)
    say_schemas(schemas)
    settings = ServiceSettings(
        db=args.db,
        sink=tuple(args.sink),
        allowed_hosts=tuple(args.allow_host),
        token=load_token(args.token_file),
        send_timeout_s=args.send_timeout,
        intake_token=intake_token,
        max_data_bytes=args.max_data_bytes,
        schemas=schemas,
        source=args.source,
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
        console=None
        if args.no_console
        else ConsoleSettings(token=console_token, cookie_secure=args.cookie_secure),
    )
    hook = exit_after_ack(args.chaos) if args.chaos else None
    app = create_app(settings, after_delivery=hook)

    async def say_egress(app: web.Application) -> None:
        # Once the outbox has opened: a usage error (a bad --db, say) stays one line.
        log_egress(", ".join(args.sink), args.allow_host, always=True)

    app.on_startup.append(say_egress)
    limits = http_limits_of(args)
    await serve_app(app, args.host, args.port, "publisher", "/orders", args.access_log, limits)
    return EXIT_OK


COMMANDS: Final[dict[str, Command]] = {"serve": cmd_serve}
CHECKS: Final[dict[str, Check]] = {"serve": check_args}
