"""The publisher service (`publisher serve`): the intake API, the status, metrics and
probe routes, the console, and the relay, in one aiohttp application.

On PostgreSQL any number of these processes may share one outbox: each is a relay
worker (publisher.leases) delivering the lines whose leases it holds. On SQLite
one process delivers from an outbox (its relay lock refuses a second one)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from aiohttp import hdrs, web
from prometheus_client import Gauge

from plumbing.bodies import read_json
from plumbing.host_guard import HttpGuard, http_guard
from plumbing.http_errors import BadRequest, error, invalid_event, json_errors
from plumbing.net import bearer_matches
from plumbing.openapi import add_openapi_route
from plumbing.probes import WriteHealth, healthz, metrics_response, readiness
from plumbing.storage import parse_location
from publisher.console import CONSOLE_PATH, ConsoleSettings, Source, add_console
from publisher.driver import AfterDelivery
from publisher.http import CONNECT_TIMEOUT_S, DEFAULT_SOURCE, TIMEOUT_S, HttpSender
from publisher.intake import (
    EVENTS_BATCH_BODY_BYTES,
    MAX_BATCH_BODY_BYTES,
    ORDER_MAX_BODY_BYTES,
    RESULTS,
    SchemaCheck,
    batch_items,
    batch_reply,
    event_body_bytes,
    event_check,
)
from publisher.lines_view import lines_view
from publisher.metrics import PublisherMetrics
from publisher.relay import Relay
from publisher.settings import DEFAULT_LEASE_TTL_S, RelaySettings, for_location
from publisher.store import EventCheck, IntakeOutcome, Outbox
from shared import ORDER_PLACED, Conflict, InvalidEvent
from shared.event import MAX_DATA_BYTES, MAX_DATA_BYTES_LIMIT


@dataclass(frozen=True)
class ServiceSettings:
    """How `publisher serve` runs: where it reads and sends, what its intake takes,
    and how its relay delivers (`relay`, passed to the relay as it is; its worker ID,
    if not given, is the one `publisher serve` takes on this database)."""

    db: str
    sink: str | Sequence[str]  # one URL, or the nodes of one sink cluster in order
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    send_timeout_s: float = TIMEOUT_S
    max_body_bytes: int = ORDER_MAX_BODY_BYTES  # POST /orders
    max_batch_body_bytes: int = MAX_BATCH_BODY_BYTES  # POST /orders/batch
    max_data_bytes: int = MAX_DATA_BYTES  # an event's canonical data (POST /events)
    schemas: SchemaCheck | None = None  # the JSON Schemas of event types, if any
    source: str = DEFAULT_SOURCE  # the CloudEvents `source` of the events it sends
    intake_token: str | None = None  # bearer token intake (orders, events) needs, if set
    guard: HttpGuard = field(default_factory=HttpGuard)
    relay: RelaySettings = field(default_factory=RelaySettings)
    console: ConsoleSettings | None = field(default_factory=ConsoleSettings)  # None: off

    def __post_init__(self) -> None:
        parse_location(self.db)  # BadLocation now, before anything opens
        if not 1 <= self.max_data_bytes <= MAX_DATA_BYTES_LIMIT:
            raise ValueError(f"max_data_bytes must be 1 to {MAX_DATA_BYTES_LIMIT:,}")
        if self.relay.worker is None:
            # Several services may share a PostgreSQL outbox: each delivers a line only
            # under its lease, never without one.
            raise ValueError("the service's relay delivers under leases: give it a worker")

    @property
    def sinks(self) -> tuple[str, ...]:
        return (self.sink,) if isinstance(self.sink, str) else tuple(self.sink)

    @property
    def event_body_bytes(self) -> int:
        """The largest body of POST /events."""
        return event_body_bytes(self.max_data_bytes)

    @property
    def check(self) -> EventCheck:
        """How intake checks an event of a body or a file (parsed by plumbing.bodies):
        its limits, then its type's schema."""
        return event_check(self.max_data_bytes, self.schemas, parsed=True)

    @property
    def lease_ttl_s(self) -> float:
        worker = self.relay.worker
        return DEFAULT_LEASE_TTL_S if worker is None else worker.lease_ttl_s


OUTBOX: Final = web.AppKey("outbox", Outbox)
RELAY: Final = web.AppKey("relay", Relay)
METRICS: Final = web.AppKey("metrics", PublisherMetrics)
SETTINGS: Final = web.AppKey("settings", ServiceSettings)
READY: Final = web.AppKey("ready", Gauge)
SENDER: Final = web.AppKey("sender", HttpSender)
# What intake's real writes last said of the outbox: /readyz believes them
# (plumbing.probes).
WRITES: Final = web.AppKey("writes", WriteHealth)


def create_app(
    settings: ServiceSettings, *, after_delivery: AfterDelivery | None = None
) -> web.Application:
    """Intake API plus relay; the outbox, sender and relay start with the app.

    `after_delivery` runs after each verified ACK, before its mark (the chaos option
    installs one that ends the process there).
    """
    HttpSender(settings.sinks, allowed_hosts=settings.allowed_hosts)  # refuse a bad URL now
    guard = settings.guard
    if settings.console is not None:  # the console's page calls its own routes
        # Served over TLS by a proxy in front (--cookie-secure): its Origin says https.
        scheme = "https" if settings.console.cookie_secure else "http"
        guard = dataclasses.replace(guard, own_page_paths=(f"{CONSOLE_PATH}/",), own_scheme=scheme)
    app = web.Application(
        client_max_size=max(
            settings.max_body_bytes,
            settings.max_batch_body_bytes,
            settings.event_body_bytes,
            EVENTS_BATCH_BODY_BYTES,
        ),
        middlewares=[json_errors, http_guard(guard)],
    )
    app[SETTINGS] = settings
    app[METRICS] = PublisherMetrics()
    app[WRITES] = WriteHealth()
    app[READY] = Gauge(
        "publisher_ready",
        "1 while the source database takes a write (as GET /readyz says), else 0.",
        registry=app[METRICS].registry,
    )
    app.cleanup_ctx.append(functools.partial(_run_relay, after_delivery=after_delivery))
    app.router.add_post("/orders", post_order)
    app.router.add_post("/orders/batch", post_orders)
    app.router.add_post("/events", post_event)
    app.router.add_post("/events/batch", post_events)
    app.router.add_get("/status", get_status)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", get_readyz)
    add_openapi_route(app, "publisher")
    if settings.console is not None:
        source = Source(
            lambda: app[OUTBOX], lambda: app[SENDER], sink_protected=settings.token is not None
        )
        add_console(app, settings.console, source)
    return app


async def _run_relay(
    app: web.Application, after_delivery: AfterDelivery | None
) -> AsyncIterator[None]:
    settings, metrics = app[SETTINGS], app[METRICS]
    sender = HttpSender(
        settings.sinks,
        allowed_hosts=settings.allowed_hosts,
        connect_timeout_s=min(CONNECT_TIMEOUT_S, settings.send_timeout_s),
        timeout_s=settings.send_timeout_s,
        token=settings.token,
        on_failover=metrics.failover,
        source=settings.source,
    )
    async with Outbox.open(settings.db) as outbox, one_relay(outbox, settings.db), sender:
        relay = Relay(
            outbox,
            sender,
            for_location(settings.relay, settings.db),
            observer=metrics,
            after_delivery=after_delivery,
            lease_observer=metrics,
        )
        app[OUTBOX], app[RELAY], app[SENDER] = outbox, relay, sender
        task = asyncio.create_task(relay.run(), name="relay")
        yield
        # Intake has stopped by now; let the send in flight finish or time out.
        relay.stop()
        await task


def one_relay(outbox: Outbox, db: str) -> contextlib.AbstractAsyncContextManager[None]:
    """On SQLite, one relay per outbox: a second `publisher serve` on the same file
    stops here (RelayAlreadyRunning, one line, exit status 1) before it delivers
    anything. On PostgreSQL workers share the outbox by leases: nothing to take."""
    if parse_location(db).backend == "postgres":
        return contextlib.nullcontext()
    return outbox.relay_lock("outbox-publisher serve")


def unauthorized(request: web.Request) -> web.Response | None:
    """401 if the service has an intake token and the request does not carry it."""
    token = request.app[SETTINGS].intake_token
    if token is None or bearer_matches(request.headers.get(hdrs.AUTHORIZATION), token):
        return None
    request.app[METRICS].intake.labels("unauthorized").inc()
    reply = error(401, "missing or wrong bearer token")
    reply.headers[hdrs.WWW_AUTHENTICATE] = "Bearer"
    return reply


async def post_order(request: web.Request) -> web.Response:
    """Record an order and its outbox entry (the event order.placed); 201 accepted,
    200 duplicate. The outbox validates the order (once: the body goes to it as parsed)."""
    settings = request.app[SETTINGS]
    return await _intake_one(request, settings.max_body_bytes, request.app[OUTBOX].accept_many)


async def post_event(request: web.Request) -> web.Response:
    """Record an event's outbox entry; 201 accepted, 200 duplicate, 409 conflict."""
    settings, outbox = request.app[SETTINGS], request.app[OUTBOX]
    check = settings.check
    return await _intake_one(
        request, settings.event_body_bytes, lambda events: outbox.publish_many(events, check)
    )


async def post_orders(request: web.Request) -> web.Response:
    """Record 1 to 500 orders in one transaction; 200 with one result per order, in
    the request's order, once they are durable. A body that is not a batch is
    refused whole (400, 413), as is the batch when storage fails (503): nothing
    of it is written then."""
    settings = request.app[SETTINGS]
    return await _intake_many(
        request, "orders", settings.max_batch_body_bytes, request.app[OUTBOX].accept_many
    )


async def post_events(request: web.Request) -> web.Response:
    """Record 1 to 500 events in one transaction, as POST /orders/batch does orders."""
    settings, outbox = request.app[SETTINGS], request.app[OUTBOX]
    check = settings.check
    return await _intake_many(
        request, "events", EVENTS_BATCH_BODY_BYTES, lambda items: outbox.publish_many(items, check)
    )


Record = Callable[[Sequence[object]], Awaitable[list[IntakeOutcome]]]


async def _intake_one(request: web.Request, max_bytes: int, record: Record) -> web.Response:
    app = request.app
    intake = app[METRICS].intake
    refused = unauthorized(request)
    if refused is not None:
        return refused
    try:
        with app[OUTBOX].arriving():  # how it commits is the outbox's own choice
            body = await read_json(request, max_bytes)
            [result] = await _recorded(app[WRITES], record, [body])
            if isinstance(result, Exception):
                raise result
    except BadRequest as exc:
        intake.labels(exc.kind).inc()
        raise
    except InvalidEvent as exc:
        intake.labels("invalid").inc()
        raise invalid_event(exc) from exc
    except Conflict as exc:
        intake.labels("conflict").inc()
        raise BadRequest(409, "conflict", "conflict", id=exc.event_id, detail=str(exc)) from exc
    intake.labels(result).inc()
    assert isinstance(body, dict)  # recorded: an object with an ID
    if result == "accepted":
        app[METRICS].published.count(_type_of(body))
        app[RELAY].wake()
    return web.json_response(
        {"id": body["id"], "result": result}, status=201 if result == "accepted" else 200
    )


async def _intake_many(
    request: web.Request, name: str, max_bytes: int, record: Record
) -> web.Response:
    app = request.app
    intake = app[METRICS].intake
    refused = unauthorized(request)
    if refused is not None:
        return refused
    with app[OUTBOX].arriving():
        try:
            items = batch_items(await read_json(request, max_bytes), name)
        except BadRequest as exc:
            intake.labels(exc.kind).inc()
            raise
        outcomes = await _recorded(app[WRITES], record, items)
        reply = batch_reply(items, outcomes)
    for item, outcome in zip(items, outcomes, strict=True):
        if outcome == "accepted" and isinstance(item, dict):
            app[METRICS].published.count(_type_of(item))
    for result in RESULTS:
        if reply[result]:
            intake.labels(result).inc(reply[result])
    if reply["accepted"]:
        app[RELAY].wake()  # once for the batch
    return web.json_response(reply)


async def _recorded(
    writes: WriteHealth, record: Record, items: Sequence[object]
) -> list[IntakeOutcome]:
    """`record(items)`, its outcome told to `writes` (readiness): StorageError a
    failure; an outcome that the database gave (not an invalid item's) a success."""
    with writes.watching():
        outcomes = await record(items)
    if any(not isinstance(outcome, InvalidEvent) for outcome in outcomes):
        writes.succeeded()
    return outcomes


def _type_of(recorded: dict[str, object]) -> str:
    """The type of an event or order the intake recorded (an order has none of its
    own: it is recorded as an order.placed event)."""
    event_type = recorded.get("type", ORDER_PLACED)
    return event_type if isinstance(event_type, str) else ORDER_PLACED


async def get_status(request: web.Request) -> web.Response:
    outbox, ttl_s = request.app[OUTBOX], request.app[SETTINGS].lease_ttl_s
    snapshot = await outbox.snapshot()
    lines = await lines_view(outbox, ttl_s)
    return web.json_response({**snapshot.to_dict(), **lines.to_dict()})


async def get_metrics(request: web.Request) -> web.Response:
    metrics, outbox = request.app[METRICS], request.app[OUTBOX]
    await readiness(
        outbox.check_writable, request.app[READY], request.app[WRITES], outbox.check_real_writes
    )
    metrics.observe(await outbox.snapshot())
    return metrics_response(metrics.registry)


async def get_readyz(request: web.Request) -> web.Response:
    """200 while the outbox can be written, 503 with the reason while it cannot: its
    probe row cannot be written, or an intake failed since one last succeeded and
    intake's and the relay's writes, tried, still fail."""
    outbox = request.app[OUTBOX]
    return await readiness(
        outbox.check_writable, request.app[READY], request.app[WRITES], outbox.check_real_writes
    )
