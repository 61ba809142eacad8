"""Serving an app: the handler settings both services run with, the capped site, and
`serve_app`, which listens until SIGTERM or SIGINT and then shuts down in order."""

from __future__ import annotations

import asyncio
import signal
from typing import Any, Final

from aiohttp import web

from plumbing import event_loop
from plumbing.aiohttp_internals import check_internals
from plumbing.capped_site import CappedSite, quiet_accept_errors
from plumbing.collector import service_collector
from plumbing.http_limits import LIMITS, HttpLimits, connection_cap
from plumbing.logs import HTTP_LOG

log = HTTP_LOG

# After an error reply, the rest of an unread body is read (and dropped) for at most
# this long so that the client sees the reply; then the connection is closed.
LINGERING_S: Final = 2.0


def handler_options(limits: HttpLimits, access_log: bool) -> dict[str, Any]:
    """The RequestHandler settings both services run with."""
    return {
        # The access log costs a formatted line per request on the hot path (a sixth
        # of the sink's time in the benchmark); it is opt-in.
        "access_log": log if access_log else None,
        # aiohttp arms this at connection start and after each reply, and closes the
        # connection if no request has started by then: idle and slow headers alike.
        "keepalive_timeout": limits.idle_timeout_s,
        "lingering_time": LINGERING_S,
    }


async def start_site(
    runner: web.AppRunner, host: str, port: int, limits: HttpLimits, options: dict[str, Any]
) -> CappedSite:
    """Listen on host:port with the connection cap and JSON parser errors;
    AiohttpChanged, before listening, if the installed aiohttp cannot serve them."""
    await check_internals(options)
    return await _listen(runner, host, port, limits, options)


async def _listen(
    runner: web.AppRunner, host: str, port: int, limits: HttpLimits, options: dict[str, Any]
) -> CappedSite:
    site = CappedSite(
        runner, host, port, options=options, cap=connection_cap(limits), backlog=limits.backlog
    )
    await site.start()
    return site


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    name: str,
    path: str,
    access_log: bool = False,
    limits: HttpLimits | None = None,
) -> None:
    """Serve `app` until SIGTERM or SIGINT, then shut down in order.

    Prints `<name> listening on http://host:port<path>` on stdout once bound (with
    port 0 the OS picks a free port: scripts read it from this line). With
    `access_log`, one line per request is logged. `limits` bound connection times
    and counts (HttpLimits() by default). AiohttpChanged if the installed aiohttp
    cannot serve with them, before the app starts or anything listens.
    """
    limits = limits or HttpLimits()
    options = handler_options(limits, access_log)
    await check_internals(options)
    app[LIMITS] = limits
    # Handlers first: a SIGTERM that arrives as soon as the line below is read must
    # already mean an orderly stop, not the default instant death.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    quiet_accept_errors(loop)
    runner = web.AppRunner(app, handle_signals=False, **options)
    await runner.setup()  # runs the startup contexts: a bad database fails before listening
    try:
        # What startup made is frozen out of collections, and the events of a
        # request are answered before the collector looks at them (plumbing.collector).
        with service_collector():
            await _listen(runner, host, port, limits, options)
            log.info(
                "listening",
                extra={
                    "service": name,
                    "max_connections": connection_cap(limits),
                    "idle_timeout_s": limits.idle_timeout_s,
                    "body_timeout_s": limits.body_timeout_s,
                    "event_loop": event_loop.loop_name(loop),
                },
            )
            for address in runner.addresses:
                bound_host, bound_port = address[0], address[1]
                shown = f"[{bound_host}]" if ":" in bound_host else bound_host
                print(f"{name} listening on http://{shown}:{bound_port}{path}", flush=True)
            await stop.wait()
            log.info("stopping", extra={"service": name})
    finally:
        await runner.cleanup()
