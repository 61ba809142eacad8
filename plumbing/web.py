"""How both services speak HTTP: JSON error bodies, event bodies, metrics.

Errors on the wire are part of the contract: always JSON with an "error" field that
says what was wrong, with the right status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import resource
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, cast

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_request import BaseRequest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from plumbing import event_loop
from plumbing.cli import add_option, positive_int, positive_s
from plumbing.logs import Throttled
from plumbing.net import is_loopback
from plumbing.storage import StorageError
from shared.errors import InvalidEvent
from shared.event import BigInteger, Event, validate_event

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_TYPE: Final = "application/json"


class BadRequest(Exception):
    """A request the service refuses as it is; carries the JSON reply."""

    def __init__(self, status: int, kind: str, message: str, **details: object) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.body = {"error": message, **details}

    def response(self) -> web.Response:
        reply = web.json_response(self.body, status=self.status)
        if self.status == HTTPStatus.REQUEST_TIMEOUT:
            reply.force_close()  # the rest of the body may never come: do not wait for it
        return reply


def error(status: int, message: str, **details: object) -> web.Response:
    """A JSON error body that says what was wrong."""
    return web.json_response({"error": message, **details}, status=status)


# ---------------------------------------------------------------- strict JSON bodies

# No field of a body is an integer this long; anything longer is kept as a marker
# instead of converted (Python refuses over 4,300 digits with a plain ValueError).
MAX_INT_DIGITS: Final = 100


class DuplicateKey(ValueError):
    """A JSON object names the same key twice: which value was meant is unknowable."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r} in a JSON object")
        self.key = key


def _parse_int(text: str) -> int | BigInteger:
    return int(text) if len(text) <= MAX_INT_DIGITS else BigInteger(len(text.lstrip("-")))


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


_DECODER: Final = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=_parse_int)


def loads_strict(body: bytes) -> object:
    """`json.loads`, but a repeated key is DuplicateKey and an integer of more than
    MAX_INT_DIGITS digits becomes a BigInteger marker that no field accepts."""
    return _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


BODY_TIMEOUT_S: Final = 10.0  # a body still arriving after this is refused with 408


@dataclass(frozen=True)
class HttpLimits:
    """How long a connection may take and how many there may be (see serve_app)."""

    idle_timeout_s: float = 30.0  # no request under way (idle, or its headers still coming)
    body_timeout_s: float = BODY_TIMEOUT_S
    max_connections: int = 1000  # lowered to fit the descriptor limit, see connection_cap
    backlog: int = 128


LIMITS: Final = web.AppKey("http_limits", HttpLimits)


async def read_json(request: web.Request, max_body_bytes: int) -> object:
    """The parsed JSON body, or BadRequest: 413 over `max_body_bytes`, 400 if not JSON
    (or a key repeated in an object), 408 if the body does not arrive in time."""
    body = await _read_body(request)
    if body is None or len(body) > max_body_bytes:
        raise BadRequest(413, "too_large", f"body is over {max_body_bytes} bytes")
    return parse_json(body)


def parse_json(text: bytes, what: str = "body") -> object:
    """`text` parsed as strict JSON (loads_strict), or BadRequest 400 saying why not,
    naming the text `what` (the body; a line of a file)."""
    try:
        return loads_strict(text)
    except DuplicateKey as exc:
        raise BadRequest(400, "invalid", str(exc), field=exc.key) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, "invalid", f"{what} is not valid JSON", detail=str(exc)) from exc
    except RecursionError as exc:
        raise BadRequest(
            400, "invalid", f"{what} is not valid JSON", detail="nested too deeply"
        ) from exc


async def _read_body(request: web.Request) -> bytes | None:
    """The body, None if it is over the app's cap; BadRequest 408 if it is too slow."""
    timeout_s = BODY_TIMEOUT_S
    try:
        if request.content.is_eof():  # all here already (the usual case): no timer
            return await request.read()
        timeout_s = request.app.get(LIMITS, HttpLimits()).body_timeout_s
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None
    except TimeoutError as exc:
        raise BadRequest(408, "timeout", f"the body did not arrive within {timeout_s:g} s") from exc


def invalid_event(exc: InvalidEvent) -> BadRequest:
    return BadRequest(400, "invalid", "invalid event", field=exc.field, detail=exc.problem)


async def read_event(request: web.Request, max_body_bytes: int) -> Event:
    """The validated event in the request body, or BadRequest (400, 408, 413)."""
    return checked_event(await read_json(request, max_body_bytes))


def checked_event(parsed: object) -> Event:
    """The validated event, or BadRequest 400 naming the field."""
    try:
        return validate_event(parsed)
    except InvalidEvent as exc:
        raise invalid_event(exc) from exc


# ---------------------------------------------------------------- middlewares

_storage_log: Final = Throttled(log)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON with the right status; never a traceback."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return exc.response()
    except StorageError as exc:
        # The database is the service's problem, not the request's: retry later. A
        # broken disk fails every request the same way: one line per interval.
        _storage_log.error(("storage", str(exc)), "storage failed: %s", exc)
        return error(503, "storage unavailable, try again")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reply = error(exc.status, exc.reason)
        if hdrs.ALLOW in exc.headers:  # a 405 says which methods the route takes
            reply.headers[hdrs.ALLOW] = exc.headers[hdrs.ALLOW]
        return reply
    except ConnectionResetError:
        # The client went away before its body was read (a killed publisher, say):
        # nothing was applied, and there is nobody to answer.
        log.info("client closed the connection on %s %s", request.method, request.path)
        return error(400, "connection closed before the request was read")
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error(500, "internal error")


@dataclass(frozen=True)
class HttpGuard:
    """Who may talk to a service from a browser's point of view.

    `host_names`: names a Host header may carry besides the address a connection came
    in on (and, on loopback, `localhost`): a DNS name the service is reached by.
    `origins`: values of an Origin header that are allowed (none by default: a
    browser page of any site is refused).
    `own_page_paths`: path prefixes under which the service's own origin is allowed
    too (an Origin of `http://` plus the Host, which the Host check has found to name
    this service): where the service serves a page of its own that calls it.
    """

    host_names: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    own_page_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, host_names: Iterable[str] = (), origins: Iterable[str] = ()) -> HttpGuard:
        return cls(
            frozenset(name.strip().lower().rstrip(".") for name in host_names if name.strip()),
            frozenset(origin.strip().lower().rstrip("/") for origin in origins if origin.strip()),
        )


def _local_host_values(sockname: object) -> frozenset[str]:
    """The Host values that name the local address a connection came in on."""
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return frozenset()
    address, port = str(sockname[0]).lower(), int(sockname[1])
    names = [f"[{address}]" if ":" in address else address]
    if is_loopback(address):
        names += ["localhost", "127.0.0.1", "[::1]"]
    values = {f"{name}:{port}" for name in names}
    if port == 80:
        values.update(names)
    return frozenset(values)


def _host_name(value: str) -> str:
    """`name` of a Host value `name[:port]` (an IPv6 literal keeps its brackets)."""
    if value.startswith("["):
        return value.partition("]")[0] + "]"
    return value.partition(":")[0].rstrip(".")


def http_guard(guard: HttpGuard) -> Middleware:
    """Refuse what only a browser tricked by another site (or a confused client) sends:
    421 for a Host that names no address of this service (DNS rebinding), 403 for an
    Origin that is not allowed, and on POST 415 for a body that is not plain JSON
    (a cross-site "simple" request cannot send `Content-Type: application/json`)."""
    by_sockname: dict[object, frozenset[str]] = {}

    def host_allowed(request: web.Request, host: str) -> bool:
        transport = request.transport
        sockname = None if transport is None else transport.get_extra_info("sockname")
        allowed = by_sockname.get(sockname)
        if allowed is None:
            if len(by_sockname) > 64:  # a handful of local addresses: never grows
                by_sockname.clear()
            allowed = by_sockname[sockname] = _local_host_values(sockname)
        value = host.lower()
        return value in allowed or _host_name(value) in guard.host_names

    def origin_allowed(request: web.Request, origin: str, host: str | None) -> bool:
        value = origin.lower().rstrip("/")
        if value in guard.origins:
            return True
        own = host is not None and value == f"http://{host.lower()}"
        return own and request.path.startswith(guard.own_page_paths)

    @web.middleware
    async def guard_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        host = headers.get(hdrs.HOST)
        if host is not None and not host_allowed(request, host):
            return error(421, "the Host header names no address of this service", host=host)
        origin = headers.get(hdrs.ORIGIN)
        if origin is not None and not origin_allowed(request, origin, host):
            return error(403, "requests from this Origin are not allowed", origin=origin)
        # A POST the router will refuse anyway (404, 405 with Allow) gets that answer:
        # the body rules are for the routes that take one.
        if request.method == hdrs.METH_POST and request.match_info.http_exception is None:
            refusal = _body_refusal(request)
            if refusal is not None:
                return refusal
        return await handler(request)

    return guard_requests


def _body_refusal(request: web.Request) -> web.Response | None:
    """415 unless the body is declared plain JSON: `application/json`, no encoding."""
    headers = request.headers
    encoding = headers.get(hdrs.CONTENT_ENCODING)
    if encoding is not None and encoding.strip().lower() != "identity":
        return error(
            415,
            "Content-Encoding is not accepted: send the body unencoded",
            content_encoding=encoding,
        )
    if headers.get(hdrs.CONTENT_TYPE) != JSON_TYPE and request.content_type != JSON_TYPE:
        return error(
            415,
            f"the body must be sent as Content-Type: {JSON_TYPE}",
            content_type=headers.get(hdrs.CONTENT_TYPE),
        )
    return None


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus text format."""
    response = web.Response(body=generate_latest(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readiness(check_writable: Callable[[], Awaitable[None]], gauge: Gauge) -> web.Response:
    """200 {"status": "ready"} while the database takes a write, else 503 with the
    reason; `gauge` is set to 1 or 0 either way (a liveness check is /healthz)."""
    try:
        await check_writable()
    except StorageError as exc:
        gauge.set(0)
        return error(503, "not ready: the database cannot be written", reason=str(exc))
    gauge.set(1)
    return web.json_response({"status": "ready"})


# ---------------------------------------------------------------- serving

# Descriptors kept free under the process limit for the database files, logs and
# pipes. Besides, twice the backlog: asyncio's loop accepts up to `backlog`
# connections per turn before any of them reaches the cap check (uvloop, as many as
# are waiting), and the idle connections closed to make room for them release their
# descriptors only a turn later. Out of descriptors all the same, asyncio's loop
# leaves new connections waiting in the backlog and retries a second later (logged
# by quiet_accept_errors); uvloop (libuv) accepts and closes each at once, and logs
# nothing. Either way the service serves again once descriptors are free.
RESERVED_FDS: Final = 64
_REFUSED_BODY: Final = b'{"error": "too many open connections, try again"}'
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)
MAX_LINGERING: Final = 32  # refused sockets that may wait for the client's close at once
REFUSED_LINGER_S: Final = 1.0
# After an error reply, the rest of an unread body is read (and dropped) for at most
# this long so that the client sees the reply; then the connection is closed.
LINGERING_S: Final = 2.0
_PARSE_ERRORS: Final = {
    "BadHttpMethod": "unknown HTTP method",
    "LineTooLong": "request line or header too long",
    "InvalidHeader": "invalid header",
    "BadStatusLine": "malformed request line",
    "ContentEncodingError": "Content-Encoding is not accepted: send the body unencoded",
    "TransferEncodingError": "malformed chunked body",
    "ContentLengthError": "body does not match Content-Length",
}
_parse_log: Final = Throttled(log)
_connection_log: Final = Throttled(log)


def connection_cap(limits: HttpLimits) -> int:
    """The connections a service keeps open at once: `max_connections`, lowered to
    fit the soft descriptor limit less twice the backlog and a reserve (704 under a
    limit of 1,024 with the default backlog of 128)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    room = soft - 2 * limits.backlog - RESERVED_FDS
    return max(1, min(limits.max_connections, room))


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's loop logs a traceback for every failed accept() (out of descriptors,
    say): log those once per interval instead; anything else as asyncio would.
    (uvloop reports no failed accept: see RESERVED_FDS.)"""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            _connection_log.error(
                ("accept", str(context.get("exception"))), "%s: %s", message,
                context.get("exception"),
            )  # fmt: skip
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


_DETAIL_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9 '\-]{2,80}")


def parser_detail(message: str | None) -> str | None:
    """The parser's own phrase from its message ("Duplicate Content-Length"), never
    what follows it: aiohttp quotes the offending request bytes after the colon."""
    phrase = (message or "").split(":", 1)[0].strip()
    return phrase if _DETAIL_RE.fullmatch(phrase) else None


class JsonErrorHandler(web.RequestHandler):
    """aiohttp's connection handler, with its own error replies (a request its parser
    refused: bad Content-Length, header too long, NUL in a header, unknown method) as
    JSON instead of text echoing the request, and logged once per interval."""

    __slots__ = ("_pool",)
    _pool: _Connections | None

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        pool: _Connections | None = getattr(self, "_pool", None)
        if pool is not None:
            self._pool = None
            pool.open -= 1

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("a reply was already under way: nothing more can be sent")
        kind = type(exc).__name__ if exc is not None else "none"
        if status >= 500:
            _parse_log.error(("handler", kind), "unexpected error on a request", exc_info=True)
            text = "internal error"
        else:
            _parse_log.log(logging.INFO, ("parse", kind), "refused a malformed request: %s", kind)
            text = _PARSE_ERRORS.get(kind, "malformed HTTP request")
        body = {"error": text}
        detail = parser_detail(message)
        if detail and detail.lower() != text.lower():
            body["detail"] = detail
        reply = web.json_response(body, status=status)
        reply.force_close()
        return reply

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's own error lines, once per interval; the unread rest of a body
        that could not be decoded (after its request was already answered) without
        a traceback."""
        exc = kwargs.get("exc_info")
        kind = type(exc).__name__
        if isinstance(exc, RequestPayloadError):
            _parse_log.log(logging.INFO, ("payload", kind), "dropped an undecodable body: %s", exc)
        else:
            _parse_log.error(("aiohttp", kind), *args, exc_info=bool(exc))


class _Refused(asyncio.Protocol):
    """A connection beyond the cap with no idle one to close: a 503, then closed.

    Closing a socket with unread input makes the kernel send a reset, which can
    destroy the 503 before the client reads it: so the write side is shut first,
    and the socket closed when the client closes its side (or after a second).
    At most MAX_LINGERING such sockets wait at once; beyond, they close at once."""

    lingering = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is one without subclassing asyncio.Transport).
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.write(_REFUSED)
        if _Refused.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        _Refused.lingering += 1
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # read and dropped, so that no reset follows

    def eof_received(self) -> bool:
        self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            _Refused.lingering -= 1


class _Connections:
    """The protocol factory of a capped site: a JsonErrorHandler per connection while
    fewer than `cap` are open; at the cap the oldest idle connection (no request
    under way: idle keep-alive, or headers still trickling in) is closed to make
    room, and with none idle the new one gets a 503.

    Connections are counted from here, not from aiohttp's list: a connection joins
    that list a loop turn after this factory made its handler, and a burst of
    accepts would all see the same, too small, number."""

    def __init__(self, server: web.Server, options: dict[str, Any], cap: int) -> None:
        self._server = server
        self._options = options
        self._cap = cap
        self._loop = asyncio.get_running_loop()
        self.open = 0  # handlers made here whose connection is not lost yet

    def __call__(self) -> asyncio.Protocol:
        server = self._server
        if self.open >= self._cap and not self._close_idle():
            _connection_log.warning(
                "cap", "connection cap of %d reached, all busy: refused with 503", self._cap
            )
            return _Refused()
        handler = JsonErrorHandler(server, loop=self._loop, **self._options)
        handler._pool = self
        self.open += 1
        return handler

    def _close_idle(self) -> bool:
        for handler in self._server.connections:  # oldest first
            # aiohttp keeps no public flag for "a request is under way".
            if handler.transport is not None and not handler._request_in_progress:
                handler.force_close()
                _connection_log.warning(
                    "idle", "connection cap of %d reached: closed the oldest idle", self._cap
                )
                return True
        return False


class CappedSite(web.BaseSite):
    """A TCP site whose connections are JsonErrorHandlers, at most `cap` at once."""

    __slots__ = ("_cap", "_host", "_options", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        options: dict[str, Any],
        cap: int,
        backlog: int,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._options, self._cap = host, port, options, cap

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            _Connections(server, self._options, self._cap),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )


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
    """Listen on host:port with the connection cap and JSON parser errors."""
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
    and counts (HttpLimits() by default).
    """
    limits = limits or HttpLimits()
    app[LIMITS] = limits
    # Handlers first: a SIGTERM that arrives as soon as the line below is read must
    # already mean an orderly stop, not the default instant death.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    quiet_accept_errors(loop)
    options = handler_options(limits, access_log)
    runner = web.AppRunner(app, handle_signals=False, **options)
    await runner.setup()  # runs the startup contexts: a bad database fails before listening
    try:
        await start_site(runner, host, port, limits, options)
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


# ---------------------------------------------------------------- command line


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
        help="also answer requests whose Host header is NAME (a DNS name this service is "
        "reached by; repeatable); its own addresses (and localhost on loopback) always",
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
