"""The sink's HTTP API: POST /events answers with an ACK only after the commit.

The forms an event arrives in (CloudEvents, plain events, orders of the previous
release) are read in `sink.wire`; this module is the routes around it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web

from plumbing.bodies import read_json
from plumbing.cli import utc_text
from plumbing.collector import collector_paused
from plumbing.host_guard import HttpGuard, http_guard
from plumbing.http_errors import BadRequest, Handler, error, json_errors
from plumbing.logs import Throttled
from plumbing.net import bearer_matches
from plumbing.openapi import add_openapi_route
from plumbing.probes import WriteHealth, healthz, metrics_response, readiness
from shared import (
    LEASE_HEADER,
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
    PREDECESSOR_CHECK_ENFORCED,
    PREDECESSOR_CHECK_HEADER,
    PREDECESSOR_HEADER,
    Conflict,
    InvalidEvent,
    Lease,
    PredecessorMissing,
    Receipt,
    StaleLease,
    make_ack,
    parse_lease,
    validate_event_id,
    validate_sku,
)
from sink import wire
from sink.handlers import HandlerFailed, Handlers, NotApplied
from sink.metrics import SinkMetrics
from sink.predecessor import PredecessorWaits
from sink.store import Inbox, Incoming, Received
from sink.wire import Taken

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """Why the sink will not take an event it could apply: a 400 naming the field."""

    error: str
    field: str
    detail: str


# Given each valid event before it is applied: None takes it, a Refusal refuses it
# (and, in a batch, stops the batch there as an invalid item would).
Admit = Callable[[Incoming], Refusal | None]


@dataclass(frozen=True)
class SinkSettings:
    """How the app was built; fixed for its life."""

    token: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_batch_body_bytes: int = MAX_BATCH_BODY_BYTES
    admit: Admit | None = None


INBOX: Final = web.AppKey("inbox", Inbox)
SETTINGS: Final = web.AppKey("settings", SinkSettings)
PREDECESSORS: Final = web.AppKey("predecessors", PredecessorWaits)
METRICS: Final = web.AppKey("metrics", SinkMetrics)
# What the real writes last said of the inbox: /readyz believes them (plumbing.probes).
WRITES: Final = web.AppKey("writes", WriteHealth)
# A stale worker keeps sending until it learns it lost the line: one log line per
# source and line per interval, with a count.
STALE_LOG: Final = web.AppKey("stale_log", Throttled)
# A failing handler fails every event of its type alike until it is fixed: one log
# line (with the traceback) per type and error per interval.
HANDLER_LOG: Final = web.AppKey("handler_log", Throttled)
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
WRITE_PATHS: Final = frozenset({"/events", "/events/batch"})
# The routes of those paths, found once the app is built: the middlewares judge a
# request by its route, so that they hold where the app is mounted under a prefix
# of a user's own (add_subapp), whose requests' paths carry the prefix.
OPEN_ROUTES: Final = web.AppKey("open_routes", frozenset)
WRITE_ROUTES: Final = web.AppKey("write_routes", frozenset)


def create_app(
    db: str | Path,
    *,
    handlers: Handlers | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    admit: Admit | None = None,
    guard: HttpGuard | None = None,
) -> web.Application:
    """The sink as an aiohttp application over the inbox at `db` (a --db value),
    applying each event with `handlers` (sink.Handlers; the built-in warehouse by
    default): an event whose type has no handler, or that its handler rejects, is
    answered 422; one whose handler fails, 503; either way nothing of it is recorded.

    With `token`, every route but /healthz, /readyz and /metrics needs
    `Authorization: Bearer <token>`. With `admit`, each valid event is offered to it
    before it is applied, and one it refuses is answered 400 (an order of a SKU this
    warehouse does not know, say). `guard` says which Host names and Origins are allowed
    besides the service's own addresses (none by default).
    BadLocation, raised here before anything is opened, for a `db` no backend can
    open; the inbox itself opens on startup.
    """
    opening = Inbox.open(db, handlers)
    # The per-route caps (one event, one batch) are checked where the body is read.
    app = web.Application(
        client_max_size=max(max_body_bytes, MAX_BATCH_BODY_BYTES),
        middlewares=[json_errors, http_guard(guard or HttpGuard()), require_token, report_writes],
    )
    app[SETTINGS] = SinkSettings(token=token, max_body_bytes=max_body_bytes, admit=admit)
    app[PREDECESSORS] = PredecessorWaits()
    app[METRICS] = SinkMetrics()
    app[WRITES] = WriteHealth()
    app[STALE_LOG] = Throttled(log)
    app[HANDLER_LOG] = Throttled(log)

    async def inbox_ctx(app: web.Application) -> AsyncIterator[None]:
        async with opening as inbox:
            app[INBOX] = inbox
            yield

    app.cleanup_ctx.append(inbox_ctx)
    app.on_response_prepare.append(say_predecessor_check)
    app.router.add_post("/events", post_event)
    app.router.add_post("/events/batch", post_batch)
    app.router.add_get("/events/{id}", get_event)
    app.router.add_get("/inventory/{sku}", get_inventory)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", get_readyz)
    add_openapi_route(app, "sink")
    paths = {r: r.resource.canonical for r in app.router.routes() if r.resource is not None}
    app[OPEN_ROUTES] = frozenset(r for r, path in paths.items() if path in OPEN_PATHS)
    app[WRITE_ROUTES] = frozenset(
        r for r, path in paths.items() if r.method == hdrs.METH_POST and path in WRITE_PATHS
    )
    return app


def is_write(request: web.Request) -> bool:
    """Whether the request is to one of the sink's write routes (POST /events,
    POST /events/batch), wherever the app is mounted."""
    return request.match_info.route in request.app[WRITE_ROUTES]


async def say_predecessor_check(request: web.Request, response: web.StreamResponse) -> None:
    """Every reply says that this sink enforces the predecessor check (Outbox-After):
    a publisher pipelines requests only after it has read this."""
    response.headers[PREDECESSOR_CHECK_HEADER] = PREDECESSOR_CHECK_ENFORCED


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 for a missing or wrong bearer token, before anything is read or applied."""
    token = request.app[SETTINGS].token
    if token is None or request.match_info.route in request.app[OPEN_ROUTES]:
        return await handler(request)
    if not bearer_matches(request.headers.get(hdrs.AUTHORIZATION), token):
        request.app[METRICS].unauthorized.inc()
        reply = error(401, "missing or wrong bearer token")
        reply.headers[hdrs.WWW_AUTHENTICATE] = "Bearer"
        return reply
    return await handler(request)


@web.middleware
async def report_writes(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the inbox that a write request is in progress, from its arrival to its
    reply (after the token check): how it commits is the inbox's own choice. A
    storage failure of the write is told to the app's WriteHealth (readiness); the
    routes tell a write the inbox took."""
    if not is_write(request):
        return await handler(request)
    with request.app[INBOX].arriving(), request.app[WRITES].watching():
        return await handler(request)


async def post_event(request: web.Request) -> web.StreamResponse:
    """Apply one event; the ACK is sent only once it is committed."""
    received = request.app[METRICS].received
    settings, waits, inbox = request.app[SETTINGS], request.app[PREDECESSORS], request.app[INBOX]
    headers = request.headers
    try:
        after = read_predecessor(request)
        lease = read_lease(request)
        media = wire.media_of(headers.get(hdrs.CONTENT_TYPE), wire.EVENT_MEDIA)
        body = await read_json(request, settings.max_body_bytes)
        # Whatever becomes of this event, a request waiting for it is woken at the end.
        with waits.waking(wire.event_ids(media, headers, body)):
            taken = wire.read_event(media, headers, body)
            check_admitted(settings.admit, taken.incoming)
            check_predecessor_outside(after, [taken.event_id])
            if after is not None:
                await waits.wait(after, inbox.knows)
            waits.handed([taken.event_id])
            result = await inbox.receive_with_digest(taken.incoming, after=after, lease=lease)
            request.app[WRITES].succeeded()
    except BadRequest as exc:
        received.labels("invalid").inc()
        return exc.response()
    except Conflict as exc:
        received.labels("conflict").inc()
        raise conflict(exc) from exc
    except NotApplied as exc:
        received.labels(_RESULT_OF[exc.status]).inc()
        return not_applied(request, exc).response()
    except PredecessorMissing as exc:
        return predecessor_missing(request, exc)
    except StaleLease as exc:
        return stale_lease(request, exc)
    count_received(request.app[METRICS], [taken], [result])
    return web.json_response(ack_of(taken, result))


async def post_batch(request: web.Request) -> web.StreamResponse:
    """Apply 1 to 16 events in order in one transaction; one ACK per applied item.

    An item that is rejected (invalid, refused, conflict) stops the batch there: the
    items before it are committed and acknowledged, it and those after it change
    nothing, and `rejected` says which and why.
    """
    received = request.app[METRICS].received
    settings, waits, inbox = request.app[SETTINGS], request.app[PREDECESSORS], request.app[INBOX]
    try:
        after = read_predecessor(request)
        lease = read_lease(request)
        media = wire.media_of(request.headers.get(hdrs.CONTENT_TYPE), wire.BATCH_MEDIA)
        body = await read_json(request, settings.max_batch_body_bytes)
        items = wire.batch_items(media, body)
        check_predecessor_outside(after, wire.item_ids(items))
    except BadRequest as exc:
        received.labels("invalid").inc()
        return exc.response()
    with collector_paused():  # a batch's events are many containers at once
        taken, rejected = valid_prefix(settings.admit, media, items)
    try:
        with waits.waking(wire.item_ids(items)):
            if after is not None and taken:
                await waits.wait(after, inbox.knows)
            waits.handed(one.event_id for one in taken)
            incoming = [one.incoming for one in taken]
            receipt = await inbox.receive_batch(incoming, after=after, lease=lease)
            if incoming:
                request.app[WRITES].succeeded()
    except PredecessorMissing as exc:
        return predecessor_missing(request, exc)
    except StaleLease as exc:
        return stale_lease(request, exc)
    count_received(request.app[METRICS], taken, receipt.received)
    stopped = receipt.stopped
    if stopped is not None:
        refusal = (
            conflict(stopped) if isinstance(stopped, Conflict) else not_applied(request, stopped)
        )
        rejected = {"index": len(receipt.received), **refusal.body, "status": refusal.status}
    if rejected is not None:
        received.labels(_RESULT_OF.get(rejected["status"], "invalid")).inc()
    acks = [ack_of(one, done) for one, done in zip(taken, receipt.received, strict=False)]
    return web.json_response({"acks": acks, "rejected": rejected})


def ack_of(taken: Taken, done: Received) -> dict[str, str]:
    """The ACK of an event the inbox took, in the terms of the format it came in."""
    return make_ack(taken.event_id, done.receipt, taken.ack_digest(done))


def count_received(metrics: SinkMetrics, taken: list[Taken], done: list[Received]) -> None:
    """Count the results of the events the inbox took (`done`: those of a prefix of
    `taken`), and the applied ones by type."""
    results: dict[str, int] = {}  # a Receipt is its value (a StrEnum)
    applied: dict[str, int] = {}  # by type
    applied_receipt = Receipt.APPLIED  # read once: an enum member's lookup is slow
    for one, result in zip(taken, done, strict=False):
        receipt = result.receipt
        results[receipt] = results.get(receipt, 0) + 1
        if receipt is applied_receipt:
            event_type = one.incoming.event["type"]
            applied[event_type] = applied.get(event_type, 0) + 1
    for kind, count in results.items():
        metrics.count_received(kind, count)
    for event_type, count in applied.items():
        metrics.count_applied(event_type, count)


def read_predecessor(request: web.Request) -> str | None:
    """The event ID in the Outbox-After header (the predecessor to check), None
    without one; BadRequest 400 if it is not a well-formed ID."""
    after = request.headers.get(PREDECESSOR_HEADER)
    return None if after is None else _checked(validate_event_id, after, PREDECESSOR_HEADER)


def read_lease(request: web.Request) -> Lease | None:
    """The lease in the Outbox-Lease header, None without one; BadRequest 400 naming
    the problem if it is malformed."""
    value = request.headers.get(LEASE_HEADER)
    if value is None:
        return None
    try:
        return parse_lease(value)
    except ValueError as exc:
        raise BadRequest(
            400, "invalid", f"invalid {LEASE_HEADER}", field=LEASE_HEADER, detail=str(exc)
        ) from exc


def check_predecessor_outside(after: str | None, event_ids: list[str]) -> None:
    """BadRequest 400 if Outbox-After names an event of the request itself: it can
    never be in the inbox before the request is applied, so waiting is pointless."""
    if after is not None and after in event_ids:
        raise BadRequest(
            400,
            "invalid",
            f"{PREDECESSOR_HEADER} names an event of this request: it must name the one before",
            field=PREDECESSOR_HEADER,
            after=after,
        )


def predecessor_missing(request: web.Request, exc: PredecessorMissing) -> web.Response:
    """412: the predecessor check failed (the event the request names as its
    predecessor is not in the inbox), so nothing of the request was applied. The
    sender resends it after that event."""
    request.app[METRICS].predecessor_missing.inc()
    return error(
        412,
        f"the event named in {PREDECESSOR_HEADER} is not in the inbox: nothing was applied",
        after=exc.after,
    )


def stale_lease(request: web.Request, exc: StaleLease) -> web.Response:
    """409: the request's lease epoch is below one seen for its line, so its sender
    lost the line; nothing of the request was applied, a duplicate not even counted."""
    request.app[METRICS].fenced.inc()
    fenced = {"source": exc.source, "line": exc.line, "epoch": exc.epoch, "seen": exc.seen}
    request.app[STALE_LOG].log(
        logging.WARNING,
        ("stale lease", exc.source, exc.line),
        "refused a request of a stale lease: %s",
        exc,
        extra={"fenced": fenced},
    )
    return error(409, f"{exc}: nothing was applied", fenced=fenced)


def valid_prefix(
    admit: Admit | None, media: str, items: list[object]
) -> tuple[list[Taken], dict[str, Any] | None]:
    """The events before the first invalid or refused item, and that item's
    rejection if any."""
    taken: list[Taken] = []
    for index, item in enumerate(items):
        try:
            one = wire.read_item(media, item, index)
            check_admitted(admit, one.incoming)
        except BadRequest as exc:
            return taken, {"index": index, **exc.body, "status": exc.status}
        taken.append(one)
    return taken, None


def conflict(exc: Conflict) -> BadRequest:
    return BadRequest(409, "conflict", "conflict", id=exc.event_id, detail=str(exc))


# The received counter's result for a refusal's status.
_RESULT_OF: Final = {409: "conflict", 422: "rejected", 503: "failed"}


def not_applied(request: web.Request, exc: NotApplied) -> BadRequest:
    """The reply to an event its handler did not take: 422 (no handler, or rejected
    with a reason) or 503 (the handler failed; its traceback goes to the log, once
    per type and error per interval, never over the wire)."""
    if isinstance(exc, HandlerFailed):
        cause = exc.__cause__
        request.app[HANDLER_LOG].log(
            logging.ERROR,
            ("handler failed", exc.event_type, type(cause).__name__),
            "the handler of %s failed on %s: %s",
            exc.event_type,
            exc.event_id,
            exc.detail,
            exc_info=cause if cause is not None else False,
            extra={"event_type": exc.event_type, "event_id": exc.event_id},
        )
    return BadRequest(
        exc.status, exc.error, exc.error, id=exc.event_id, type=exc.event_type, detail=exc.detail
    )


def check_admitted(admit: Admit | None, item: Incoming) -> None:
    """BadRequest 400 if `admit` refuses the event."""
    refusal = None if admit is None else admit(item)
    if refusal is not None:
        raise BadRequest(400, "invalid", refusal.error, field=refusal.field, detail=refusal.detail)


async def get_event(request: web.Request) -> web.Response:
    """The inbox record of one event: the event as stored and the digest of its
    canonical form, received when, delivered how many times, and where it came in
    the order of first application."""
    event_id = _checked(validate_event_id, request.match_info["id"], "id")
    record = await request.app[INBOX].record(event_id)
    if record is None:
        raise BadRequest(404, "unknown", "this sink has not received the event", id=event_id)
    return web.json_response(
        {
            "id": record.id,
            "sha256": record.digest,
            "received_at": utc_text(record.received_at),
            "deliveries": record.deliveries,
            "last_delivery_at": utc_text(record.last_delivery_at),
            "applied_seq": record.applied_seq,
            "event": record.event,
        }
    )


async def get_inventory(request: web.Request) -> web.Response:
    sku = _checked(validate_sku, request.match_info["sku"], "sku")
    return web.json_response({"sku": sku, "qty": await request.app[INBOX].inventory(sku)})


async def get_metrics(request: web.Request) -> web.Response:
    metrics, inbox = request.app[METRICS], request.app[INBOX]
    await readiness(
        inbox.check_writable, metrics.ready, request.app[WRITES], inbox.check_real_writes
    )
    metrics.events.set(await inbox.count())
    return metrics_response(metrics.registry)


async def get_readyz(request: web.Request) -> web.Response:
    """200 while the inbox can be written, 503 with the reason while it cannot: its
    probe row cannot be written, or a real write failed since one last succeeded
    and the inbox's own writes, tried, still fail."""
    inbox = request.app[INBOX]
    return await readiness(
        inbox.check_writable,
        request.app[METRICS].ready,
        request.app[WRITES],
        inbox.check_real_writes,
    )


def _checked(validate: Callable[[object], str], value: str, field: str) -> str:
    try:
        return validate(value)
    except InvalidEvent as exc:
        raise BadRequest(
            400, "invalid", f"invalid {field}", field=field, detail=exc.problem
        ) from exc
