"""Faults the sink injects on purpose, for the chaos runner, the demo and the tests.

Installed by `python -m sink --chaos ...` (or `chaos_app` in a test) and absent from
the production app. Stall and the after-commit faults are a middleware around the
write routes, inside the report of writes in progress, so a stalled request counts
as in progress as any slow one would. `reject-sku` and `reject-key` go through the
app's admission check: a batch applies the items before a refused one, as for any
refused item.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web

from plumbing.cli import CHAOS_EXIT_STATUS
from plumbing.host_guard import HttpGuard
from plumbing.http_errors import Handler, Middleware
from shared import MAX_BODY_BYTES, validate_key, validate_sku
from sink.app import Admit, Refusal, create_app, is_write
from sink.handlers import Handlers
from sink.store import Incoming

log = logging.getLogger(__name__)

CHAOS_COUNTS: Final = ("drop-after-commit", "exit-after-commit")
CHAOS_HELP: Final = (
    "comma-separated: drop-after-commit=N closes the connection with no reply after each "
    "of the first N commits; exit-after-commit=N ends the process with status 73 right "
    "after the Nth commit; stall=SECONDS waits that long before handling each event; "
    "reject-sku=SKU answers 400 for an order of that SKU (an order.placed event); "
    "reject-key=KEY answers 400 for any event of that key"
)
UNKNOWN_SKU: Final = Refusal("unknown sku", "sku", "chaos: rejected")
UNKNOWN_KEY: Final = Refusal("unknown key", "key", "chaos: rejected")


@dataclass(frozen=True)
class Chaos:
    """What `--chaos` asks for. Counts are of commits that would be acknowledged."""

    drop_after_commit: int = 0
    exit_after_commit: int = 0
    stall_s: float = 0.0
    reject_skus: frozenset[str] = frozenset()
    reject_keys: frozenset[str] = frozenset()

    @property
    def refuses(self) -> bool:
        """Whether any event is to be refused (the admission check's part)."""
        return bool(self.reject_skus or self.reject_keys)

    @property
    def faults(self) -> bool:
        """Whether anything but rejections is asked for (the middleware's part)."""
        return self.drop_after_commit > 0 or self.exit_after_commit > 0 or self.stall_s > 0


_ASCII_INT: Final = re.compile(r"[0-9]+")
_ASCII_DECIMAL: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_chaos(text: str) -> Chaos:
    """argparse type for --chaos, e.g. 'drop-after-commit=1,stall=0.5'."""
    counts = {"drop-after-commit": 0, "exit-after-commit": 0}
    stall_s, skus, keys = 0.0, set(), set()
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        try:
            if name in CHAOS_COUNTS and _ASCII_INT.fullmatch(value) and int(value) >= 1:
                counts[name] = int(value)
            elif name == "stall" and _seconds(value) is not None:
                stall_s = float(value)
            elif name == "reject-sku" and value:
                skus.add(validate_sku(value))
            elif name == "reject-key" and value:
                keys.add(validate_key(value))
            else:
                raise ValueError(part)
        except ValueError:  # InvalidEvent of a SKU or a key is one too
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r}: expected drop-after-commit=N, exit-after-commit=N (N >= 1),"
                " stall=SECONDS, reject-sku=SKU or reject-key=KEY"
            ) from None
    return Chaos(
        counts["drop-after-commit"],
        counts["exit-after-commit"],
        stall_s,
        frozenset(skus),
        frozenset(keys),
    )


def _seconds(text: str) -> float | None:
    if _ASCII_DECIMAL.fullmatch(text) is None:  # float() takes 1_0, " 5" and other digits
        return None
    value = float(text)
    return value if 0 < value < 3600 else None


def chaos_app(
    db: str | Path,
    chaos: Chaos,
    *,
    handlers: Handlers | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    guard: HttpGuard | None = None,
) -> web.Application:
    """The production app of `sink.app.create_app` with `chaos` installed."""
    admit = refusing(chaos.reject_skus, chaos.reject_keys) if chaos.refuses else None
    app = create_app(
        db,
        handlers=handlers,
        token=token,
        max_body_bytes=max_body_bytes,
        admit=admit,
        guard=guard,
    )
    if chaos.faults:
        app.middlewares.append(faults(chaos))  # last: inside the token check and the report
    return app


def refusing(skus: frozenset[str], keys: frozenset[str] = frozenset()) -> Admit:
    """An admission check that refuses the orders of these SKUs (a product this
    warehouse does not know yet: a poison entry until the sink is fixed), and any
    event of these keys."""

    def admit(item: Incoming) -> Refusal | None:
        if item.order is not None and item.order["sku"] in skus:
            return UNKNOWN_SKU
        if item.event.get("key") in keys:
            return UNKNOWN_KEY
        return None

    return admit


@dataclass
class Budgets:
    """The after-commit faults left, counted down per acknowledged commit."""

    drop: int
    exit: int

    def spend(self, event_id: str) -> bool:
        """Count one commit; end the process on the last of the exit budget. True if
        this reply is to be dropped."""
        if self.exit > 0:
            self.exit -= 1
            if self.exit == 0:
                exit_after_commit(event_id)
        if self.drop > 0:
            self.drop -= 1
            return True
        return False


def faults(chaos: Chaos) -> Middleware:
    """Stall each write request, then count its commit against the budgets."""
    budgets = Budgets(chaos.drop_after_commit, chaos.exit_after_commit)

    @web.middleware
    async def inject(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_write(request):
            return await handler(request)
        if chaos.stall_s > 0:
            await take_in(request)
            await asyncio.sleep(chaos.stall_s)
        response = await handler(request)
        committed = acknowledged(response)
        if committed is not None and budgets.spend(committed):
            return drop_connection(request, committed)
        return response

    return inject


async def take_in(request: web.Request) -> None:
    """Read a body that has already arrived whole, as a slow sink has read the request
    it is busy with: the handler gets it from aiohttp's cache after the stall, even if
    the sender is gone by then (an unread body is lost with its connection). A body
    still arriving, chunked, or over the size cap is left to the handler's own checks."""
    length = request.content_length
    if request.content.is_eof() and length is not None and length <= request.client_max_size:
        await request.read()


def acknowledged(response: web.StreamResponse) -> str | None:
    """The last event ID the reply acknowledges, None if it acknowledges none: a
    reply with an ACK comes only after its commit."""
    body = response.body if isinstance(response, web.Response) else None
    if response.status != 200 or not isinstance(body, bytes):
        return None
    reply = json.loads(body)
    acks = reply.get("acks", [reply])
    return str(acks[-1]["ack"]) if acks else None


def exit_after_commit(event_id: str) -> None:
    """Die right after the commit, before any reply."""
    print(
        f"chaos: committed {event_id}, exiting with status {CHAOS_EXIT_STATUS} before the reply",
        file=sys.stderr,
        flush=True,
    )
    os._exit(CHAOS_EXIT_STATUS)


def drop_connection(request: web.Request, event_id: str) -> web.StreamResponse:
    """Close the connection after the commit, with no reply."""
    log.warning("chaos: dropping the connection after commit", extra={"event_id": event_id})
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=200)
