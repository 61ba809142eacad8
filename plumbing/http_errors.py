"""JSON error replies, and the middleware that turns every error into one.

Errors on the wire are part of the contract: always JSON with an "error" field that
says what was wrong, with the right status, never a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Final, Protocol

from aiohttp import hdrs, web

from plumbing.logs import HTTP_LOG, Throttled
from plumbing.storage import StorageError
from shared.errors import InvalidEvent

log = HTTP_LOG

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_TYPE: Final = "application/json"


class Middleware(Protocol):
    """What `web.Application(middlewares=...)` takes (aiohttp's own name for it is in
    a module it does not document)."""

    def __call__(self, request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]: ...


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


def invalid_event(exc: InvalidEvent) -> BadRequest:
    return BadRequest(400, "invalid", "invalid event", field=exc.field, detail=exc.problem)


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
        if exc.reason is not None:  # one a client may be told: a deadline, read-only...
            return error(503, "storage unavailable, try again", reason=exc.reason)
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
