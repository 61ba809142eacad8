"""Every use of aiohttp's undocumented names, in one place.

Both services serve with three things aiohttp documents no way to do: a connection
cap that makes room by closing an idle connection, JSON replies to the requests its
parser refuses, and a listening site of their own. For those, plumbing uses these
names, here and nowhere else in the project:

- `RequestHandler._request_in_progress`: whether a request is under way on a
  connection; aiohttp keeps no public flag for it. The cap closes a connection only
  where none is (`close_if_idle`, with the handler's `transport` and `force_close()`,
  undocumented too).
- `RequestHandler(server, loop=..., **options)`: how `web.Server` makes the handler of
  a connection; a capped site makes its own (`HookedHandler.for_connection`). The
  options are those documented for `web.AppRunner`.
- `RequestHandler.handle_error(request, status, exc, message)`: what aiohttp calls to
  answer a request its parser refused (or one whose handler raised); its reply is
  text that echoes the request. `HookedHandler` sends `error_reply` instead, unless a
  reply has started (`BaseRequest.writer.output_size`).
- `RequestHandler.log_exception(*args, exc_info=...)`: where aiohttp logs its own
  errors, a traceback each; `HookedHandler` passes them to `log_error`.
  `web.RequestPayloadError`, exported but not in the reference, is the error of a
  body that could not be read or decoded (`is_payload_error`).
- `BaseSite._server`: a site's listening server, which `BaseRunner.addresses` reads
  and `BaseSite.stop` closes; a site of our own has no other way to hand it over
  (`attach_listener`).
- The class names of aiohttp's parser errors (`aiohttp.http_exceptions`): a request
  one of them refused is answered with the phrase `PARSER_ERRORS` gives its name.

`check_internals` checks they are there, in the shape relied on; `serve_app` and
`start_site` call it before listening. If it fails, aiohttp has changed: install a
release in `SUPPORTED`, or update this module for the new one. What the hooks do on
the wire is tested against real sockets (tests/integration/test_hostile_http.py).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Mapping
from typing import Any, Final, Self

import aiohttp
from aiohttp import abc as aiohttp_abc
from aiohttp import web

# The releases this module was written and tested against. The pin in pyproject.toml
# says the same (a test checks they agree).
SUPPORTED: Final = "aiohttp>=3.14,<3.15"

# aiohttp's parser errors by class name, with what a reply says for each.
PARSER_ERRORS: Final = {
    "BadHttpMethod": "unknown HTTP method",
    "LineTooLong": "request line or header too long",
    "InvalidHeader": "invalid header",
    "BadStatusLine": "malformed request line",
    "ContentEncodingError": "Content-Encoding is not accepted: send the body unencoded",
    "TransferEncodingError": "malformed chunked body",
    "ContentLengthError": "body does not match Content-Length",
}

_MISSING: Final = object()


class AiohttpChanged(OSError):
    """The installed aiohttp lacks the internals plumbing serves with, or they changed.

    An OSError, as a port already taken is: the service cannot listen, and each
    service's command line reports that as one line and exit status 1."""


def request_in_progress(handler: web.RequestHandler) -> bool:
    """Whether a request is under way on the connection (`_request_in_progress`)."""
    return handler._request_in_progress


def close_if_idle(handler: web.RequestHandler) -> bool:
    """Close the connection if it is open and no request is under way on it (idle
    keep-alive, or headers still arriving); whether it was closed."""
    if handler.transport is None or request_in_progress(handler):
        return False
    handler.force_close()
    return True


def is_payload_error(exc: object) -> bool:
    """Whether `exc` is aiohttp's error for a body that could not be read or decoded."""
    return isinstance(exc, web.RequestPayloadError)


def attach_listener(site: web.BaseSite, listener: asyncio.AbstractServer) -> None:
    """Make `listener` the server of `site`: the runner's addresses, closed on stop."""
    site._server = listener


class HookedHandler(web.RequestHandler):
    """aiohttp's connection handler, its two undocumented error hooks passed on to
    `error_reply` and `log_error`, which a subclass defines."""

    __slots__ = ()

    @classmethod
    def for_connection(
        cls, server: web.Server, loop: asyncio.AbstractEventLoop, options: Mapping[str, Any]
    ) -> Self:
        """The handler of a new connection to `server`, made as `web.Server` makes one."""
        return cls(server, loop=loop, **options)

    def error_reply(
        self, status: int, exc: BaseException | None, message: str | None
    ) -> web.StreamResponse:
        """The reply to a request aiohttp answers itself (its parser's `message`)."""
        raise NotImplementedError

    def log_error(self, args: tuple[Any, ...], exc: object) -> None:
        """Log one of aiohttp's error lines: its message and arguments, and its exception
        (or whatever aiohttp passed as `exc_info`)."""
        raise NotImplementedError

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # Called for a request the parser refused, and for one whose handler raised.
        if request.writer.output_size > 0:
            raise ConnectionError("a reply was already under way: nothing more can be sent")
        return self.error_reply(status, exc, message)

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        self.log_error(args, kwargs.get("exc_info"))


async def check_internals(options: Mapping[str, Any]) -> None:
    """Raise AiohttpChanged unless the installed aiohttp has the names used here, in
    the shape relied on, for handlers made with `options`. Opens no socket."""
    _check_parser_errors()
    _check_hooks()
    server = web.Server(_no_route)
    _check_handler(server, options)
    await _check_site(server)


def _changed(what: str) -> AiohttpChanged:
    """The error for an aiohttp whose internals differ: which release, what, and what to do."""
    return AiohttpChanged(
        f"aiohttp {aiohttp.__version__} is not supported by plumbing: {what}. "
        f"Install {SUPPORTED} (the pin in pyproject.toml), "
        "or update plumbing/aiohttp_internals.py for this release."
    )


def _shape(value: object) -> str:
    return "missing" if value is _MISSING else f"of type {type(value).__name__}"


def _check_parser_errors() -> None:
    try:
        module = importlib.import_module("aiohttp.http_exceptions")
    except ImportError as exc:
        raise _changed(f"aiohttp.http_exceptions cannot be imported: {exc}") from exc
    base = getattr(module, "HttpProcessingError", _MISSING)
    for name in PARSER_ERRORS:
        found = getattr(module, name, _MISSING)
        if not (isinstance(found, type) and isinstance(base, type) and issubclass(found, base)):
            raise _changed(
                f"aiohttp.http_exceptions.{name} is {_shape(found)}, "
                "expected a subclass of HttpProcessingError"
            )


_HOOK_CALLS: Final = {
    "handle_error": ((None, 400, None, "message"), {}, "(request, status, exc, message)"),
    "log_exception": (("message",), {"exc_info": None}, "(*args, exc_info=...)"),
}


def _check_hooks() -> None:
    for name, (args, kwargs, shown) in _HOOK_CALLS.items():
        method = getattr(web.RequestHandler, name, _MISSING)
        if not inspect.isfunction(method):
            raise _changed(f"RequestHandler.{name} is {_shape(method)}, expected a method")
        try:
            inspect.signature(method).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise _changed(f"RequestHandler.{name} no longer takes {shown}: {exc}") from exc
    writer = getattr(web.BaseRequest, "writer", _MISSING)
    if not isinstance(writer, property):
        raise _changed(f"BaseRequest.writer is {_shape(writer)}, expected a property")
    writer_class = getattr(aiohttp_abc, "AbstractStreamWriter", _MISSING)
    size = getattr(writer_class, "output_size", _MISSING)
    if not isinstance(size, int):
        raise _changed(f"AbstractStreamWriter.output_size is {_shape(size)}, expected an int")
    payload_error = getattr(web, "RequestPayloadError", _MISSING)
    if not (isinstance(payload_error, type) and issubclass(payload_error, Exception)):
        raise _changed(f"web.RequestPayloadError is {_shape(payload_error)}, expected an Exception")


def _check_handler(server: web.Server, options: Mapping[str, Any]) -> None:
    try:
        handler = HookedHandler.for_connection(server, asyncio.get_running_loop(), options)
    except TypeError as exc:
        given = ", ".join(f"{name}=..." for name in ("loop", *options))
        raise _changed(f"RequestHandler(server, {given}) failed: {exc}") from exc
    flag = getattr(handler, "_request_in_progress", _MISSING)
    if not isinstance(flag, bool):
        raise _changed(f"RequestHandler._request_in_progress is {_shape(flag)}, expected a bool")
    transport = getattr(handler, "transport", _MISSING)
    if transport is not None:
        raise _changed(f"RequestHandler.transport is {_shape(transport)}, expected None at first")
    if not callable(getattr(handler, "force_close", None)):
        raise _changed("RequestHandler.force_close is missing")


async def _check_site(server: web.Server) -> None:
    """A site of our own, on a runner of its own, with a stand-in for the listener."""
    runner = web.ServerRunner(server)
    await runner.setup()
    try:
        site = _ProbeSite(runner)
        found = getattr(site, "_server", _MISSING)
        if found is not None:
            raise _changed(f"BaseSite._server is {_shape(found)}, expected None before start")
        await site.start()
        listener = _ProbeListener()
        attach_listener(site, listener)  # type: ignore[arg-type]  # the part the runner uses
        if runner.addresses != [_ProbeListener.ADDRESS]:
            raise _changed("BaseRunner.addresses does not read BaseSite._server")
        await site.stop()
        if not listener.closed:
            raise _changed("BaseSite.stop does not close BaseSite._server")
    finally:
        await runner.cleanup()


async def _no_route(request: web.BaseRequest) -> web.StreamResponse:
    raise web.HTTPNotFound()  # never called: the check sends no request


class _ProbeSite(web.BaseSite):
    __slots__ = ()

    @property
    def name(self) -> str:
        return "check"

    async def start(self) -> None:
        await super().start()


class _ProbeListener:
    """What BaseRunner and BaseSite use of a listening asyncio server (and of its socket)."""

    ADDRESS: Final = ("192.0.2.1", 9)

    def __init__(self) -> None:
        self.sockets = (self,)
        self.closed = False

    def getsockname(self) -> tuple[str, int]:
        return self.ADDRESS

    def close(self) -> None:
        self.closed = True
