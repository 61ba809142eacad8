"""`python -m bench.ackserver --port 0`: the transport ceiling's server.

POST /events answers with a well-formed ACK (the ID and the digest of the event's
canonical form) without touching a database, so a client measured against it sees
only HTTP, JSON and the ACK check. It takes what the relay sends, a structured-mode
CloudEvent, and what the end-to-end ceiling's clients send, an order `{id, sku, qty}`
(digested as its `order.placed` event) or a plain event. POST /events/batch does the
same for a batch (a batched-mode array, or `{"events": [...]}`), one ACK per event.
Nothing is validated: the relay and the clients send only valid events here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from plumbing import event_loop
from plumbing.serving import serve_app
from shared import Receipt, canonical_json, digest_of, make_ack, order_canonical
from shared.cloudevents import from_structured


def ack(item: Any) -> dict[str, str]:
    """The ACK of one item of a request body, as the sink would write it."""
    if "specversion" in item:
        item = from_structured(item)
    canonical = canonical_json(item) if "type" in item else order_canonical(item)
    return make_ack(item["id"], Receipt.APPLIED, digest_of(canonical))


async def post_event(request: web.Request) -> web.Response:
    return web.json_response(ack(json.loads(await request.read())))


async def post_batch(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    items = body if isinstance(body, list) else body["events"]
    return web.json_response({"acks": [ack(item) for item in items], "rejected": None})


def create_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/events", post_event)
    app.router.add_post("/events/batch", post_batch)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ackserver", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    # On asyncio's own loop, as when the targets were set against it: the yardstick
    # stays where it was while the services' loop changes (on uvloop this server
    # answered 8 clients no faster, and 1 within this machine's spread: README, End
    # to end, "The yardstick stays on asyncio's loop").
    serving = serve_app(create_app(), "127.0.0.1", args.port, "ack server", "/events")
    event_loop.run(serving, event_loop.ASYNCIO)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
