"""The command-line options both services take for their HTTP side, and the settings
they come to (each option also reads OUTBOX_<FLAG>)."""

from __future__ import annotations

import argparse

from plumbing import event_loop
from plumbing.cli import add_option, positive_int, positive_s
from plumbing.host_guard import HttpGuard
from plumbing.http_limits import HttpLimits


def add_http_options(parser: argparse.ArgumentParser) -> None:
    """The options both services take for their HTTP side (each also OUTBOX_<FLAG>)."""
    defaults = HttpLimits()
    add_option(
        parser,
        "--event-loop",
        choices=event_loop.CHOICES,
        default=event_loop.default_loop(),
        help="the event loop to serve on: uvloop (the default where it is installed) or "
        "asyncio's own",
    )
    add_option(
        parser,
        "--allow-host-header",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header names NAME (a DNS name this service is"
        " reached by; repeatable), with any port, as behind a port mapping; its own"
        " addresses and the loopback names always",
    )
    add_option(
        parser,
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="answer requests carrying this Origin header, e.g. https://ops.example "
        "(repeatable); by default any request with an Origin is refused",
    )
    add_option(
        parser,
        "--idle-timeout",
        type=positive_s,
        default=defaults.idle_timeout_s,
        help="close a connection on which no request has started for this long "
        "(idle, or headers still arriving), seconds",
    )
    add_option(
        parser,
        "--body-timeout",
        type=positive_s,
        default=defaults.body_timeout_s,
        help="answer 408 and close if a request body takes longer than this, seconds",
    )
    add_option(
        parser,
        "--max-connections",
        type=positive_int,
        default=defaults.max_connections,
        help="open connections at most (lowered to fit the descriptor limit); beyond it "
        "the oldest idle one is closed, or the new one gets 503",
    )


def http_guard_of(args: argparse.Namespace) -> HttpGuard:
    return HttpGuard.of(args.allow_host_header, args.allow_origin)


def http_limits_of(args: argparse.Namespace) -> HttpLimits:
    return HttpLimits(
        idle_timeout_s=args.idle_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
    )
