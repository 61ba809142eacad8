"""The sink's HTTP API: POST /events answers with an ACK only after the commit."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from aiohttp import web

from shared import Conflict, InvalidEvent, make_ack, validate_event, validate_sku
from sink.inbox import Inbox
from sqlite_tx import StorageError

log = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 16 * 1024


@dataclass
class SinkState:
    """What the app counts and the chaos budget it has left."""

    max_body_bytes: int = MAX_BODY_BYTES
    drop_after_commit: int = 0
    received: Counter[str] = field(default_factory=Counter)


INBOX: Final = web.AppKey("inbox", Inbox)
STATE: Final = web.AppKey("state", SinkState)


def create_app(
    db_path: str | Path,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    drop_after_commit: int = 0,
) -> web.Application:
    """The sink as an aiohttp application; the inbox opens on startup.

    `drop_after_commit=N` is a chaos setting: the first N events that commit get
    their connection closed with no reply, as if the sink died right after COMMIT.
    """
    app = web.Application(client_max_size=max_body_bytes, middlewares=[json_errors])
    app[STATE] = SinkState(max_body_bytes=max_body_bytes, drop_after_commit=drop_after_commit)

    async def inbox_ctx(app: web.Application) -> AsyncIterator[None]:
        async with Inbox.open(db_path) as inbox:
            app[INBOX] = inbox
            yield

    app.cleanup_ctx.append(inbox_ctx)
    app.router.add_post("/events", post_event)
    app.router.add_get("/inventory/{sku}", get_inventory)
    app.router.add_get("/healthz", healthz)
    return app


def error(status: int, message: str, **details: object) -> web.Response:
    """A JSON error body that says what was wrong."""
    return web.json_response({"error": message, **details}, status=status)


async def post_event(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        state.received["invalid"] += 1
        return error(413, f"body is over {state.max_body_bytes} bytes")
    try:
        event = validate_event(json.loads(body))
        receipt = await request.app[INBOX].receive(event)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        state.received["invalid"] += 1
        return error(400, "body is not valid JSON", detail=str(exc))
    except InvalidEvent as exc:
        state.received["invalid"] += 1
        return error(400, "invalid event", field=exc.field, detail=exc.problem)
    except Conflict as exc:
        state.received["conflict"] += 1
        return error(409, "conflict", id=exc.event_id, detail=str(exc))
    state.received[receipt.value] += 1
    if state.drop_after_commit > 0:
        state.drop_after_commit -= 1
        return drop_connection(request, event["id"])
    return web.json_response(make_ack(event["id"], receipt))


def drop_connection(request: web.Request, event_id: str) -> web.StreamResponse:
    """Chaos: close the connection after the commit, with no reply."""
    log.warning("chaos: dropping the connection after commit", extra={"event_id": event_id})
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=200)


async def get_inventory(request: web.Request) -> web.Response:
    sku = request.match_info["sku"]
    try:
        validate_sku(sku)
    except InvalidEvent as exc:
        return error(400, "invalid sku", field="sku", detail=exc.problem)
    return web.json_response({"sku": sku, "qty": await request.app[INBOX].inventory(sku)})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON with the right status; never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason)
    except StorageError as exc:
        log.error("storage failed: %s", exc)
        return error(503, "storage unavailable, try again")
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error(500, "internal error")
