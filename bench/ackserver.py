"""`python -m bench.ackserver --port 0`: the transport ceiling's server.

POST /events answers with a well-formed ACK (the ID and the digest of the payload)
without touching a database, so a client measured against it sees only HTTP, JSON
and the ACK check. POST /events/batch does the same for a batch, one ACK per event.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from aiohttp import web

from plumbing import event_loop
from plumbing.serving import serve_app
from shared import Receipt, make_ack, payload_digest


async def post_event(request: web.Request) -> web.Response:
    event = json.loads(await request.read())
    return web.json_response(make_ack(event["id"], Receipt.APPLIED, payload_digest(event)))


async def post_batch(request: web.Request) -> web.Response:
    events = json.loads(await request.read())["events"]
    acks = [make_ack(e["id"], Receipt.APPLIED, payload_digest(e)) for e in events]
    return web.json_response({"acks": acks, "rejected": None})


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
