"""The operator console: a page at /console on the intake port, and the JSON routes
it reads and acts through, under /console/api.

Everything it shows comes from the `Outbox` interface and `publisher.trace` (the
evidence table exactly as `publisher trace` builds it); quarantine and redrive are
the store operations the CLI calls, recorded with the signed-in operator's name.
Security: read-only until sign-in (publisher.console.sessions); every POST but the
sign-in needs the session cookie and its CSRF token in X-CSRF-Token, else 403 and
nothing changes; failed sign-ins slow their client down; the cookie is Secure when
the console is served over TLS (`cookie_secure`); the sink's inbox record is shown
to signed-in operators only; every answer under /console carries a strict Content-Security-Policy
(no inline script or style), nosniff and DENY framing. The page builds its DOM with
textContent only, so whatever a record holds shows as text.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from publisher.console import api
from publisher.console.overview import OverviewCache
from publisher.console.sessions import SESSION_TTL_S, Sessions
from publisher.console.stream import Streams, serve_stream
from publisher.console.throttle import FIRST_WAIT_S, SignInThrottle

CONSOLE_PATH: Final = "/console"
STREAM_INTERVAL_S: Final = 1.0
STREAM_MAX_S: Final = 600.0
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# The page and its assets: fixed names, read from the package once (no file system
# path is ever built from a request).
ASSETS: Final = {
    "console.js": "text/javascript",
    "console.css": "text/css",
}


@dataclass(frozen=True)
class ConsoleSettings:
    """The operator token (None: read-only, actions off), the live view's pace, whether
    the session cookie is marked Secure (the console is reached over HTTPS: a TLS
    proxy in front of it), and the first wait after too many wrong tokens."""

    token: str | None = None
    stream_interval_s: float = STREAM_INTERVAL_S
    stream_max_s: float = STREAM_MAX_S
    session_ttl_s: float = SESSION_TTL_S
    cookie_secure: bool = False
    sign_in_wait_s: float = FIRST_WAIT_S


STREAMS: Final = web.AppKey("console_streams", Streams)
OVERVIEWS: Final = web.AppKey("console_overviews", OverviewCache)


def add_console(app: web.Application, settings: ConsoleSettings, source: api.Source) -> None:
    """Serve the console from `app`, reading the outbox and asking the sink through
    `source` (the service's, once its relay has started)."""
    app[api.SOURCE] = source
    app[api.SESSIONS] = Sessions(settings.token, settings.session_ttl_s)
    app[api.THROTTLE] = SignInThrottle(settings.sign_in_wait_s)
    app[api.COOKIE_SECURE] = settings.cookie_secure
    app[STREAMS] = Streams(settings.stream_interval_s, settings.stream_max_s)
    app[OVERVIEWS] = OverviewCache(source.outbox, settings.stream_interval_s / 2)
    app.on_response_prepare.append(_security_headers)
    app.on_shutdown.append(_end_streams)
    page = functools.partial(_static, _asset("index.html"), "text/html")
    app.router.add_get(CONSOLE_PATH, page)
    for name, content_type in ASSETS.items():
        asset = functools.partial(_static, _asset(name), content_type)
        app.router.add_get(f"{CONSOLE_PATH}/static/{name}", asset)
    app.router.add_get(f"{CONSOLE_PATH}/api/stream", _stream)
    api.add_routes(app, f"{CONSOLE_PATH}/api")


def _asset(name: str) -> bytes:
    return (importlib.resources.files("publisher.console") / "static" / name).read_bytes()


async def _static(body: bytes, content_type: str, request: web.Request) -> web.Response:
    return web.Response(body=body, content_type=content_type, charset="utf-8")


async def _security_headers(request: web.Request, reply: web.StreamResponse) -> None:
    if request.path == CONSOLE_PATH or request.path.startswith(CONSOLE_PATH + "/"):
        reply.headers.update(SECURITY_HEADERS)


async def _end_streams(app: web.Application) -> None:
    app[STREAMS].stopping.set()


async def _stream(request: web.Request) -> web.StreamResponse:
    app = request.app
    signed_in = api.session_of(request) is not None
    return await serve_stream(request, app[STREAMS], app[OVERVIEWS].get, signed_in)
