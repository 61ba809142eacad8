"""How both services speak HTTP: JSON error bodies, event bodies, metrics.

Errors on the wire are part of the contract: always JSON with an "error" field that
says what was wrong, with the right status, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from plumbing.storage import StorageError
from shared.errors import InvalidEvent
from shared.event import Event, validate_event

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    """A request the service refuses as it is; carries the JSON reply."""

    def __init__(self, status: int, kind: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.body = {"error": message, **details}

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status)


def error(status: int, message: str, **details: object) -> web.Response:
    """A JSON error body that says what was wrong."""
    return web.json_response({"error": message, **details}, status=status)


async def read_json(request: web.Request, max_body_bytes: int) -> object:
    """The parsed JSON body, or BadRequest: 413 over `max_body_bytes`, 400 if not JSON."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        body = None
    if body is None or len(body) > max_body_bytes:
        raise BadRequest(413, "too_large", f"body is over {max_body_bytes} bytes")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, "invalid", "body is not valid JSON", detail=str(exc)) from exc
    except RecursionError as exc:
        raise BadRequest(
            400, "invalid", "body is not valid JSON", detail="nested too deeply"
        ) from exc


def invalid_event(exc: InvalidEvent) -> BadRequest:
    return BadRequest(400, "invalid", "invalid event", field=exc.field, detail=exc.problem)


async def read_event(request: web.Request, max_body_bytes: int) -> Event:
    """The validated event in the request body, or BadRequest (400, 413)."""
    return checked_event(await read_json(request, max_body_bytes))


def checked_event(parsed: object) -> Event:
    """The validated event, or BadRequest 400 naming the field."""
    try:
        return validate_event(parsed)
    except InvalidEvent as exc:
        raise invalid_event(exc) from exc


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON with the right status; never a traceback."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return exc.response()
    except StorageError as exc:
        # The database is the service's problem, not the request's: retry later.
        log.error("storage failed: %s", exc)
        return error(503, "storage unavailable, try again")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason)
    except ConnectionResetError:
        # The client went away before its body was read (a killed publisher, say):
        # nothing was applied, and there is nobody to answer.
        log.info("client closed the connection on %s %s", request.method, request.path)
        return error(400, "connection closed before the request was read")
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error(500, "internal error")


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus text format."""
    response = web.Response(body=generate_latest(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def serve_app(
    app: web.Application, host: str, port: int, name: str, path: str, access_log: bool = False
) -> None:
    """Serve `app` until SIGTERM or SIGINT, then shut down in order.

    Prints `<name> listening on http://host:port<path>` on stdout once bound (with
    port 0 the OS picks a free port: scripts read it from this line). With
    `access_log`, one line per request is logged.
    """
    # Handlers first: a SIGTERM that arrives as soon as the line below is read must
    # already mean an orderly stop, not the default instant death.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The access log costs a formatted line per request on the hot path (a sixth of
    # the sink's time in the benchmark); it is opt-in.
    runner = web.AppRunner(app, handle_signals=False, access_log=log if access_log else None)
    await runner.setup()  # runs the startup contexts: a bad database fails before listening
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        for address in runner.addresses:
            bound_host, bound_port = address[0], address[1]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            print(f"{name} listening on http://{shown}:{bound_port}{path}", flush=True)
        await stop.wait()
        log.info("stopping", extra={"service": name})
    finally:
        await runner.cleanup()
