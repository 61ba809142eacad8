"""What a service answers its probes with: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from plumbing.http_errors import error
from plumbing.storage import StorageError


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
