"""The sink's HTTP API: POST /events answers with an ACK only after the commit."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry, Counter, Gauge

from plumbing.net import bearer_matches
from plumbing.web import (
    BadRequest,
    Handler,
    checked_event,
    error,
    healthz,
    invalid_event,
    json_errors,
    metrics_response,
    read_json,
)
from shared import (
    FENCE_HEADER,
    FENCING_ENFORCED,
    FENCING_HEADER,
    MAX_BATCH,
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
    Conflict,
    Event,
    FenceNotMet,
    InvalidEvent,
    make_ack,
    validate_event,
    validate_event_id,
    validate_sku,
)
from sink.fence import Fences
from sink.store import Inbox

log = logging.getLogger(__name__)

RESULTS: Final = ("applied", "duplicate", "conflict", "invalid")


class SinkMetrics:
    """The sink's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.received = Counter(
            "sink_inbox_received",
            "Events received, by result.",
            ["result"],
            registry=self.registry,
        )
        for result in RESULTS:
            self.received.labels(result)  # every series exists from the start, at 0
        self.unauthorized = Counter(
            "sink_unauthorized_requests",
            "Requests refused for a missing or wrong bearer token.",
            registry=self.registry,
        )
        self.events = Gauge("sink_inbox_events", "Events in the inbox.", registry=self.registry)
        self.fenced = Counter(
            "sink_fenced_requests",
            f"Requests refused with 412: the event named in {FENCE_HEADER} was not in the inbox.",
            registry=self.registry,
        )


@dataclass
class SinkState:
    """Settings, and the chaos budgets left (counted down per commit)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_batch_body_bytes: int = MAX_BATCH_BODY_BYTES
    token: str | None = None
    drop_after_commit: int = 0
    exit_after_commit: int = 0
    stall_s: float = 0.0
    reject_skus: frozenset[str] = frozenset()
    fences: Fences = field(default_factory=Fences)


INBOX: Final = web.AppKey("inbox", Inbox)
STATE: Final = web.AppKey("state", SinkState)
METRICS: Final = web.AppKey("metrics", SinkMetrics)
OPEN_PATHS: Final = frozenset({"/healthz", "/metrics"})
CHAOS_EXIT_STATUS: Final = 73


def create_app(
    db_path: str | Path,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    drop_after_commit: int = 0,
    exit_after_commit: int = 0,
    stall_s: float = 0.0,
    reject_skus: frozenset[str] = frozenset(),
) -> web.Application:
    """The sink as an aiohttp application; the inbox opens on startup.

    With `token`, every route but /healthz and /metrics needs `Authorization: Bearer
    <token>`. Chaos settings: `drop_after_commit=N` closes the connection with no reply
    after each of the first N commits; `exit_after_commit=N` ends the process with
    status 73 right after the Nth commit; `stall_s` waits that long before each event;
    `reject_skus` answers 400 for events of those SKUs (a product this warehouse does
    not know yet: a poison entry until the sink is fixed).
    """
    # The per-route caps (one event, one batch) are checked where the body is read.
    app = web.Application(
        client_max_size=max(max_body_bytes, MAX_BATCH_BODY_BYTES),
        middlewares=[json_errors, require_token],
    )
    app[STATE] = SinkState(
        max_body_bytes=max_body_bytes,
        token=token,
        drop_after_commit=drop_after_commit,
        exit_after_commit=exit_after_commit,
        stall_s=stall_s,
        reject_skus=reject_skus,
    )
    app[METRICS] = SinkMetrics()

    async def inbox_ctx(app: web.Application) -> AsyncIterator[None]:
        async with Inbox.open(db_path) as inbox:
            app[INBOX] = inbox
            yield

    app.cleanup_ctx.append(inbox_ctx)
    app.on_response_prepare.append(say_fencing)
    app.router.add_post("/events", post_event)
    app.router.add_post("/events/batch", post_batch)
    app.router.add_get("/events/{id}", get_event)
    app.router.add_get("/inventory/{sku}", get_inventory)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def say_fencing(request: web.Request, response: web.StreamResponse) -> None:
    """Every reply says that this sink enforces Outbox-After: a publisher pipelines
    requests only after it has read this."""
    response.headers[FENCING_HEADER] = FENCING_ENFORCED


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 for a missing or wrong bearer token, before anything is read or applied."""
    token = request.app[STATE].token
    if token is None or request.path in OPEN_PATHS:
        return await handler(request)
    if not bearer_matches(request.headers.get(hdrs.AUTHORIZATION), token):
        request.app[METRICS].unauthorized.inc()
        reply = error(401, "missing or wrong bearer token")
        reply.headers[hdrs.WWW_AUTHENTICATE] = "Bearer"
        return reply
    return await handler(request)


WriteHandler = Callable[[web.Request, SinkState], Awaitable[web.StreamResponse]]


def counts_as_write(handler: WriteHandler) -> Handler:
    """Tell the inbox that a write request is in progress, from its arrival to its
    reply: how it commits is the inbox's own choice."""

    @functools.wraps(handler)
    async def counted(request: web.Request) -> web.StreamResponse:
        with request.app[INBOX].arriving():
            return await handler(request, request.app[STATE])

    return counted


@counts_as_write
async def post_event(request: web.Request, state: SinkState) -> web.StreamResponse:
    received = request.app[METRICS].received
    if state.stall_s > 0:
        await asyncio.sleep(state.stall_s)
    inbox = request.app[INBOX]
    try:
        after = read_fence(request)
        body = await read_json(request, state.max_body_bytes)
        # Whatever becomes of this event, a request waiting for it is woken at the end.
        with state.fences.waking(item_ids([body])):
            event = checked_event(body)
            check_chaos_reject(state, event)
            if after is not None:
                await state.fences.wait(after, inbox.knows)
            state.fences.handed([event["id"]])
            result = await inbox.receive_with_digest(event, after=after)
    except BadRequest as exc:
        received.labels("invalid").inc()
        return exc.response()
    except Conflict as exc:
        received.labels("conflict").inc()
        raise conflict(exc) from exc
    except FenceNotMet as exc:
        return fence_not_met(request, exc)
    received.labels(result.receipt.value).inc()
    if chaos_after_commit(state, event["id"]):
        return drop_connection(request, event["id"])
    return web.json_response(make_ack(event["id"], result.receipt, result.digest))


@counts_as_write
async def post_batch(request: web.Request, state: SinkState) -> web.StreamResponse:
    """Apply 1 to 16 events in order in one transaction; one ACK per applied item.

    An item that is rejected (invalid, conflict) stops the batch there: the items
    before it are committed and acknowledged, it and those after it change nothing,
    and `rejected` says which and why.
    """
    received = request.app[METRICS].received
    if state.stall_s > 0:
        await asyncio.sleep(state.stall_s)
    inbox = request.app[INBOX]
    try:
        after = read_fence(request)
        items = batch_items(await read_json(request, state.max_batch_body_bytes))
    except BadRequest as exc:
        received.labels("invalid").inc()
        return exc.response()
    events, rejected = valid_prefix(state, items)
    try:
        with state.fences.waking(item_ids(items)):
            if after is not None and events:
                await state.fences.wait(after, inbox.knows)
            state.fences.handed(event["id"] for event in events)
            receipt = await inbox.receive_batch(events, after=after)
    except FenceNotMet as exc:
        return fence_not_met(request, exc)
    for kind, count in collections.Counter(done.receipt.value for done in receipt.received).items():
        received.labels(kind).inc(count)
    if receipt.conflict is not None:
        index = len(receipt.received)
        rejected = {"index": index, **conflict(receipt.conflict).body, "status": 409}
    if rejected is not None:
        received.labels("conflict" if rejected["status"] == 409 else "invalid").inc()
    acks = [
        make_ack(event["id"], done.receipt, done.digest)
        for event, done in zip(events, receipt.received, strict=False)
    ]
    if acks and chaos_after_commit(state, acks[-1]["ack"]):
        return drop_connection(request, acks[-1]["ack"])
    return web.json_response({"acks": acks, "rejected": rejected})


def read_fence(request: web.Request) -> str | None:
    """The event ID in the Outbox-After header, None without one; BadRequest 400 if
    it is not a well-formed ID."""
    after = request.headers.get(FENCE_HEADER)
    return None if after is None else _checked(validate_event_id, after, FENCE_HEADER)


def fence_not_met(request: web.Request, exc: FenceNotMet) -> web.Response:
    """412: the event the request names as its predecessor is not in the inbox, so
    nothing of the request was applied. The sender resends it after that event."""
    request.app[METRICS].fenced.inc()
    return error(
        412,
        f"the event named in {FENCE_HEADER} is not in the inbox: nothing was applied",
        after=exc.after,
    )


def batch_items(body: object) -> list[object]:
    """The `events` list of a batch body: 1 to MAX_BATCH items, else BadRequest 400."""
    if not isinstance(body, dict) or set(body) != {"events"}:
        raise BadRequest(400, "invalid", 'a batch is a JSON object {"events": [...]}')
    items = body["events"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise BadRequest(400, "invalid", f"events must be a list of 1 to {MAX_BATCH} events")
    return items


def item_ids(items: list[object]) -> list[str]:
    """The string IDs of a batch's items, valid or not (a later request may name one)."""
    ids = (item.get("id") if isinstance(item, dict) else None for item in items)
    return [event_id for event_id in ids if isinstance(event_id, str)]


def valid_prefix(
    state: SinkState, items: list[object]
) -> tuple[list[Event], dict[str, Any] | None]:
    """The events before the first invalid item, and that item's rejection if any."""
    events: list[Event] = []
    for index, item in enumerate(items):
        try:
            event = validate_event(item)
            check_chaos_reject(state, event)
        except InvalidEvent as exc:
            return events, {"index": index, **invalid_event(exc).body, "status": 400}
        except BadRequest as exc:
            return events, {"index": index, **exc.body, "status": exc.status}
        events.append(event)
    return events, None


def conflict(exc: Conflict) -> BadRequest:
    return BadRequest(409, "conflict", "conflict", id=exc.event_id, detail=str(exc))


def check_chaos_reject(state: SinkState, event: Event) -> None:
    if event["sku"] in state.reject_skus:
        raise BadRequest(400, "invalid", "unknown sku", field="sku", detail="chaos: rejected")


def chaos_after_commit(state: SinkState, event_id: str) -> bool:
    """Count a commit against the chaos budgets; True if this reply is to be dropped."""
    if state.exit_after_commit > 0:
        state.exit_after_commit -= 1
        if state.exit_after_commit == 0:
            exit_after_commit(event_id)
    if state.drop_after_commit > 0:
        state.drop_after_commit -= 1
        return True
    return False


def exit_after_commit(event_id: str) -> None:
    """Chaos: die right after the commit, before any reply."""
    print(
        f"chaos: committed {event_id}, exiting with status 73 before the reply",
        file=sys.stderr,
        flush=True,
    )
    os._exit(CHAOS_EXIT_STATUS)


def drop_connection(request: web.Request, event_id: str) -> web.StreamResponse:
    """Chaos: close the connection after the commit, with no reply."""
    log.warning("chaos: dropping the connection after commit", extra={"event_id": event_id})
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=200)


async def get_event(request: web.Request) -> web.Response:
    """The inbox record of one event: received when, delivered how many times."""
    event_id = _checked(validate_event_id, request.match_info["id"], "id")
    record = await request.app[INBOX].record(event_id)
    if record is None:
        raise BadRequest(404, "unknown", "this sink has not received the event", id=event_id)
    return web.json_response(
        {
            "id": record.id,
            "sha256": record.digest,
            "received_at": record.received_at,
            "deliveries": record.deliveries,
            "last_delivery_at": record.last_delivery_at,
        }
    )


async def get_inventory(request: web.Request) -> web.Response:
    sku = _checked(validate_sku, request.match_info["sku"], "sku")
    return web.json_response({"sku": sku, "qty": await request.app[INBOX].inventory(sku)})


async def get_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    metrics.events.set(await request.app[INBOX].count())
    return metrics_response(metrics.registry)


def _checked(validate: Callable[[object], str], value: str, field: str) -> str:
    try:
        return validate(value)
    except InvalidEvent as exc:
        raise BadRequest(
            400, "invalid", f"invalid {field}", field=field, detail=exc.problem
        ) from exc
