"""`publisher serve`: the intake API and the relay loop in one process."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from plumbing.web import (
    BadRequest,
    healthz,
    json_errors,
    metrics_response,
    read_event,
)
from publisher.http import CONNECT_TIMEOUT_S, TIMEOUT_S, HttpSender
from publisher.metrics import PublisherMetrics
from publisher.pipeline import DEFAULT_DEPTH
from publisher.relay import MAX_LANES, POLL_INTERVAL_S, Ordering, Relay
from publisher.retry import RetryPolicy
from publisher.store import Outbox
from shared import MAX_BATCH, MAX_BODY_BYTES, Conflict

log = logging.getLogger(__name__)

CHAOS_EXIT_STATUS: Final = 73


@dataclass(frozen=True)
class ServiceSettings:
    db: str
    sink: str
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    limit: int = MAX_BATCH
    poll_interval_s: float = POLL_INTERVAL_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    send_timeout_s: float = TIMEOUT_S
    max_body_bytes: int = MAX_BODY_BYTES
    chaos_exit_after_ack: int = 0  # N: exit right after the Nth verified ACK
    batch_delivery: bool = True
    ordering: Ordering = "global"
    max_lanes: int = MAX_LANES
    pipeline: int = DEFAULT_DEPTH  # used once the sink says it enforces Outbox-After


OUTBOX: Final = web.AppKey("outbox", Outbox)
RELAY: Final = web.AppKey("relay", Relay)
METRICS: Final = web.AppKey("metrics", PublisherMetrics)
SETTINGS: Final = web.AppKey("settings", ServiceSettings)


def create_app(settings: ServiceSettings) -> web.Application:
    """Intake API plus relay; the outbox, sender and relay start with the app."""
    HttpSender(settings.sink, allowed_hosts=settings.allowed_hosts)  # refuse a bad URL now
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[json_errors])
    app[SETTINGS] = settings
    app[METRICS] = PublisherMetrics()
    app.cleanup_ctx.append(_run_relay)
    app.router.add_post("/orders", post_order)
    app.router.add_get("/status", get_status)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def _run_relay(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    sender = HttpSender(
        settings.sink,
        allowed_hosts=settings.allowed_hosts,
        connect_timeout_s=min(CONNECT_TIMEOUT_S, settings.send_timeout_s),
        timeout_s=settings.send_timeout_s,
        token=settings.token,
    )
    async with Outbox.open(settings.db) as outbox, sender:
        relay = Relay(
            outbox,
            sender.deliver,
            limit=settings.limit,
            poll_interval_s=settings.poll_interval_s,
            policy=settings.retry,
            observer=app[METRICS],
            after_delivery=(
                exit_after_ack(settings.chaos_exit_after_ack)
                if settings.chaos_exit_after_ack
                else None
            ),
            deliver_batch=sender.deliver_batch if settings.batch_delivery else None,
            ordering=settings.ordering,
            max_lanes=settings.max_lanes,
            pipeline=settings.pipeline,
            fencing=sender.fenced_reply,
        )
        app[OUTBOX], app[RELAY] = outbox, relay
        task = asyncio.create_task(relay.run(), name="relay")
        yield
        # Intake has stopped by now; let the send in flight finish or time out.
        relay.stop()
        await task


def exit_after_ack(count: int = 1) -> Callable[[str], None]:
    """Chaos hook: end the process between the `count`th verified ACK and its mark."""
    seen = 0

    def hook(event_id: str) -> None:
        nonlocal seen
        seen += 1
        if seen < count:
            return
        print(
            f"chaos: ACK verified for {event_id}, exiting with status 73 before the mark",
            file=sys.stderr,
            flush=True,
        )
        os._exit(CHAOS_EXIT_STATUS)  # no finally, no close: a crash at exactly this point

    return hook


async def post_order(request: web.Request) -> web.Response:
    """Record an order and its outbox entry; 201 accepted, 200 duplicate."""
    app = request.app
    intake = app[METRICS].intake
    try:
        event = await read_event(request, app[SETTINGS].max_body_bytes)
        result = await app[OUTBOX].accept(event)
    except BadRequest as exc:
        intake.labels(exc.kind).inc()
        raise
    except Conflict as exc:
        intake.labels("conflict").inc()
        raise BadRequest(409, "conflict", "conflict", id=exc.event_id, detail=str(exc)) from exc
    intake.labels(result).inc()
    if result == "accepted":
        app[RELAY].wake()
    return web.json_response(
        {"id": event["id"], "result": result}, status=201 if result == "accepted" else 200
    )


async def get_status(request: web.Request) -> web.Response:
    snapshot = await request.app[OUTBOX].snapshot()
    return web.json_response(snapshot.to_dict())


async def get_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    metrics.observe(await request.app[OUTBOX].snapshot())
    return metrics_response(metrics.registry)
