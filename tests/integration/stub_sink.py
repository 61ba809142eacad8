"""What the transport's tests share: a sink stand-in on loopback that ACKs every event
(or answers one fixed status) and keeps each request's path and Outbox-Lease, and
servers that a test stops and starts on a port it keeps."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from support import LOOPBACK, sent_events

from shared import LEASE_HEADER, make_ack, payload_digest
from shared.ack import Receipt


@dataclass
class StubSink:
    """ACKs every event sent to POST /events and /events/batch, or answers `status`
    with a JSON error when it is not 200."""

    status: int = 200
    leases: list[str | None] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.paths)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self._one)
        app.router.add_post("/events/batch", self._batch)
        return app

    async def _one(self, request: web.Request) -> web.Response:
        [sent] = sent_events(await self._record(request))
        if self.status != 200:
            return web.json_response({"error": "stub"}, status=self.status)
        return web.json_response(make_ack(sent["id"], Receipt.APPLIED, payload_digest(sent)))

    async def _batch(self, request: web.Request) -> web.Response:
        sent = sent_events(await self._record(request))
        if self.status != 200:
            return web.json_response({"error": "stub"}, status=self.status)
        acks = [make_ack(e["id"], Receipt.APPLIED, payload_digest(e)) for e in sent]
        return web.json_response({"acks": acks, "rejected": None})

    async def _record(self, request: web.Request) -> Any:
        self.leases.append(request.headers.get(LEASE_HEADER))
        self.paths.append(request.path)
        return await request.json()


class Port:
    """A loopback port held by this test: refused (bound, not listening) until `serve`
    starts an application on it, and refused again after `stop`."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((LOOPBACK, 0))
        self.number: int = self._sock.getsockname()[1]
        self.url = f"http://{LOOPBACK}:{self.number}/events"
        self._runner: web.AppRunner | None = None

    async def serve(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def stop(self) -> None:
        """Stop serving: connections to the port are refused from now on (the socket
        is closed, and the port is not reused by this test)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._sock.close()

    async def close(self) -> None:
        await self.stop()
